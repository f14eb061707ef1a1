"""torch CUDA tensors by CUDA IPC handle (posenc/_cuda.py), without a GPU or
torch: a fake CUDA runtime (allocations, handles, UUIDs) and fake CUDA
tensors stand in for torch's, and a fake stub for the server, so what the
client decides and sends is checked exactly. (With a GPU, the server side is
proven by kserve_cuda_shared_memory_test in scripts/gpu-check.sh.)"""

from __future__ import annotations

import grpc
import numpy as np
import pytest

import posenc
from posenc import _cuda, _shm
from posenc import _tensors as T
from posenc._proto.posenc.v1 import posenc_pb2 as pb

UUID = "GPU-11111111-2222-3333-4444-555555555555"


class FakeDevice:
    def __init__(self, kind):
        self.type, self.index = kind, 0

    def __str__(self):
        return f"{self.type}:{self.index}"


class FakeCudaTensor:
    """What the client reads of a torch CUDA tensor."""

    __module__ = "torch.fake"

    def __init__(self, base, offset, shape, dtype="torch.float32", itemsize=4, uuid=UUID,
                 contiguous=True):
        self.base, self.offset, self.shape = base, offset, tuple(shape)
        self.dtype, self._itemsize, self.uuid = dtype, itemsize, uuid
        self.is_cuda, self.device, self._contiguous = True, FakeDevice("cuda"), contiguous

    def detach(self):
        return self

    def data_ptr(self):
        return self.base + self.offset

    def is_contiguous(self):
        return self._contiguous

    def numel(self):
        return int(np.prod(self.shape))

    def element_size(self):
        return self._itemsize


class FakeRuntime:
    """Allocations of 1 MiB each at the tensors' bases."""

    def __init__(self):
        self.synchronized = 0

    def uuid(self, tensor):
        return tensor.uuid

    def allocation(self, tensor):
        return tensor.base, 1 << 20, tensor.base.to_bytes(8, "little") * 8

    def synchronize(self, tensor):
        self.synchronized += 1


class RpcError(grpc.RpcError):
    def __init__(self, code, details):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


class FakeStub:
    """The server: records what the client sends."""

    def __init__(self, enabled=True, refuse=None):
        self.enabled, self.refuse = enabled, refuse
        self.registered, self.unregistered, self.calls = {}, [], []

    def GetServerInfo(self, request, timeout=None):
        info = pb.ServerInfo(cuda_shared_memory_enabled=self.enabled)
        info.backends.add(device_uuid=UUID, device_index=3)
        return info

    def RegisterSharedMemory(self, request, timeout=None):
        if self.refuse is not None:
            raise RpcError(self.refuse, "refused")
        self.registered[request.name] = request
        return pb.SharedMemoryStatus()

    def UnregisterSharedMemory(self, request, timeout=None):
        self.unregistered.append(request.name)
        return pb.SharedMemoryStatus()

    def ApplyRope(self, request, timeout=None, metadata=None):
        self.calls.append(request)
        # In place: the tensors described as sent, none of their bytes.
        return pb.RopeResponse(query=request.query, key=request.key, backend="cuda:3")

    def AddAbsoluteEncoding(self, request, timeout=None, metadata=None):
        self.calls.append(request)
        return pb.AbsoluteEncodingResponse(y=request.x, backend="cuda:3")


def regions(stub=None, unix=True):
    r = _cuda.DeviceRegions("auto", unix, FakeRuntime())
    r.decide((stub or FakeStub()).GetServerInfo(None))
    return r


def test_allocations_register_once_and_slices_name_the_tensors():
    stub, r = FakeStub(), regions()
    a = FakeCudaTensor(0x7000_0000, 4096, (1, 8, 4, 64))
    b = FakeCudaTensor(0x7000_0000, 65536, (1, 8, 2, 64))
    slices = r.slices(stub, [a, b])
    assert [(s.offset, s.byte_size) for s in slices] == [(4096, 8192), (65536, 4096)]
    assert slices[0].region == slices[1].region
    assert len(stub.registered) == 1, "one allocation, one registration"
    (req,) = stub.registered.values()
    assert req.cuda_device == 3, "the server's own index for the GPU"
    assert req.byte_size == 1 << 20 and len(req.cuda_handle) == 64 and not req.key
    assert r.slices(stub, [a])[0].region == slices[0].region
    assert len(stub.registered) == 1
    assert r.runtime.synchronized == 3


def test_least_recently_used_registrations_go_past_the_cap():
    stub, r = FakeStub(), regions()
    for i in range(_cuda._MAX_REGIONS + 3):
        assert r.slices(stub, [FakeCudaTensor(0x1_0000_0000 * (i + 1), 0, (4,))]) is not None
    assert len(stub.registered) == _cuda._MAX_REGIONS + 3
    assert len(stub.unregistered) == 3
    r.close(stub)
    assert len(stub.unregistered) == _cuda._MAX_REGIONS + 3


def test_what_cannot_go_by_handle_goes_by_the_host():
    stub = FakeStub()
    r = regions(stub)
    assert r.slices(stub, [FakeCudaTensor(1 << 32, 0, (4,), uuid="GPU-other")]) is None
    assert r.slices(stub, [FakeCudaTensor(1 << 32, 0, (4,), contiguous=False)]) is None
    assert not stub.registered
    # Not enabled, or not on this node: never.
    off = regions(FakeStub(enabled=False))
    assert off.slices(stub, [FakeCudaTensor(1 << 32, 0, (4,))]) is None
    remote = regions(unix=False)  # and no shared-memory domain in common
    assert remote.slices(stub, [FakeCudaTensor(1 << 32, 0, (4,))]) is None
    assert not stub.registered


def test_a_refusal_for_room_is_temporary_any_other_is_final():
    busy = FakeStub(refuse=grpc.StatusCode.RESOURCE_EXHAUSTED)
    r = regions(busy)
    t = FakeCudaTensor(1 << 32, 0, (4,))
    assert r.slices(busy, [t]) is None
    busy.refuse = None
    assert r.slices(busy, [t]) is not None, "asked again"
    wrong = FakeStub(refuse=grpc.StatusCode.INVALID_ARGUMENT)
    r = regions(wrong)
    assert r.slices(wrong, [t]) is None
    wrong.refuse = None
    assert r.slices(wrong, [t]) is None, "given up"
    assert "refused" in r.why_not


def test_the_client_sends_slices_not_bytes_and_returns_the_callers_tensors(monkeypatch):
    # No torch here: a CUDA tensor that goes by the host would need it, so a
    # host copy is an error in this test.
    monkeypatch.setattr(T, "_torch_to_numpy",
                        lambda t: pytest.fail("copied to the host"))
    with posenc.Client("unix:/nonexistent.sock") as c:
        stub = FakeStub()
        c._stub = stub
        c._device.runtime = FakeRuntime()
        q = FakeCudaTensor(0x5000_0000, 512, (1, 3, 4, 64))
        k = FakeCudaTensor(0x5000_0000, 8192, (1, 3, 2, 64), dtype="torch.bfloat16", itemsize=2)
        result = c.apply_rope(q, k, offsets=[7])
        assert result.query is q and result.key is k, "computed in place"
        assert result.backend == "cuda:3"
        (req,) = stub.calls
        assert not req.query_data and not req.key_data
        assert (req.query_shm.offset, req.query_shm.byte_size) == (512, 3 * 4 * 64 * 4)
        assert (req.key_shm.offset, req.key_shm.byte_size) == (8192, 3 * 2 * 64 * 2)
        assert req.query.dtype == pb.DATA_TYPE_FLOAT32 and list(req.query.shape) == [1, 3, 4, 64]
        assert req.key.dtype == pb.DATA_TYPE_BFLOAT16
        x = FakeCudaTensor(0x6000_0000, 0, (5, 64))
        assert c.add_sinusoidal(x, position_ids=[0, 1, 2, 3, 4]) is x
        assert stub.calls[-1].x_shm.byte_size == 5 * 64 * 4
        assert len(stub.registered) == 2
        names = set(stub.registered)
    assert set(stub.unregistered) == names, "closing the client lets them go"


def test_restore_of_an_in_place_result_is_the_source():
    src = object()
    assert T.Origin(source=src).restore(_cuda.IN_PLACE) is src
    a = np.zeros(3, np.float32)
    assert T.Origin().restore(a) is a


def test_device_memory_lost_mid_way_is_a_region_failure():
    assert _shm.region_failed(grpc.StatusCode.NOT_FOUND,
                              'query_shm: no shared memory region "x" is registered')


def test_the_async_client_sends_slices_too(monkeypatch):
    import asyncio

    monkeypatch.setattr(T, "_torch_to_numpy",
                        lambda t: pytest.fail("copied to the host"))

    class AsyncStub:
        """The server for AsyncClient: awaitable tensor calls."""

        def __init__(self, inner):
            self.inner = inner

        async def GetServerInfo(self, request, timeout=None):
            return self.inner.GetServerInfo(request, timeout)

        async def ApplyRope(self, request, timeout=None, metadata=None):
            return self.inner.ApplyRope(request, timeout, metadata)

    async def main():
        c = posenc.AsyncClient("unix:/nonexistent.sock")
        stub = FakeStub()
        c._stub = AsyncStub(stub)
        c._control_stub = lambda: stub  # registrations: blocking, on their own channel
        c._control = (None, stub)
        c._device.runtime = FakeRuntime()
        q = FakeCudaTensor(0x5000_0000, 0, (1, 2, 4, 64))
        result = await c.apply_rope(q)
        assert result.query is q
        (req,) = stub.calls
        assert not req.query_data and req.query_shm.byte_size == 2 * 4 * 64 * 4
        assert len(stub.registered) == 1
        c._device.close(stub)
        assert len(stub.unregistered) == 1

    asyncio.run(main())
