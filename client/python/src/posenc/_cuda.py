"""torch CUDA tensors by CUDA IPC handle (CUDA shared memory).

When the server serves CUDA shared memory (ServerInfo.cuda_shared_memory_enabled)
on this node (a ``unix:`` target, or the same shared-memory domain) and on the
very GPU a call's tensors live on (a backend whose device_uuid is the
tensor's device's UUID), the call's tensors are not copied anywhere: each
one's allocation is registered once by its IPC handle (RegisterSharedMemory
with cuda_handle), the request names slices of it, the server computes in
place on the device, and the call returns the caller's own tensors, now
holding the results. Anything else (another GPU, no CUDA shared memory, a
non-contiguous tensor, a registration the server refuses) goes the way host
tensors go: copied to the host, then shared memory or the socket.

CUDA is reached through torch and, for the two calls torch does not expose
(cudaIpcGetMemHandle for the allocation a pointer lies in, and
cuMemGetAddressRange for that allocation's start and size), through the
CUDA runtime and driver libraries torch itself loaded (ctypes). Tests put a
fake Runtime in its place.
"""

from __future__ import annotations

import collections
import ctypes
import os
import secrets
import threading

import grpc

from posenc import _shm
from posenc import _tensors as T
from posenc._proto.posenc.v1 import posenc_pb2 as pb
from posenc.errors import PosencError

# Registrations kept (least recently used first out): each holds the
# server's mapping of one allocation, which keeps that device memory alive
# until it is unregistered.
_MAX_REGIONS = 16

# What a Reader returns for a result computed in place: Origin.restore
# then hands back the caller's own tensor.
IN_PLACE = object()


def in_place_reader(response, data: str, desc: str, _slice: str, expect=None):
    """The answer must describe the tensor as sent and carry none of its
    bytes; the result is the caller's tensor, computed in place."""
    T.check_desc(getattr(response, desc), expect, desc)
    if getattr(response, data):
        raise PosencError(grpc.StatusCode.INTERNAL,
                          f"the server's answer is malformed: {desc} was computed in place in "
                          f"device memory, yet the answer carries {len(getattr(response, data))} "
                          f"bytes of it")
    return IN_PLACE


class Runtime:
    """The CUDA calls this module makes, through torch and ctypes."""

    def __init__(self):
        self._rt = self._driver = None

    def _load(self):
        if self._rt is None:
            # torch has loaded both; by soname, dlopen returns those.
            for name in ("libcudart.so.12", "libcudart.so.13", "libcudart.so"):
                try:
                    self._rt = ctypes.CDLL(name)
                    break
                except OSError:
                    continue
            self._driver = ctypes.CDLL("libcuda.so.1")
            if self._rt is None:
                raise OSError("libcudart is not loaded")

    def uuid(self, tensor) -> str:
        """"GPU-xxxxxxxx-..." of the tensor's device, as nvidia-smi and the
        server print it."""
        import torch

        u = str(torch.cuda.get_device_properties(tensor.device).uuid)
        return u if u.startswith("GPU-") else "GPU-" + u

    def allocation(self, tensor) -> tuple[int, int, bytes]:
        """(start, size, IPC handle) of the allocation the tensor lies in."""
        import torch

        self._load()
        ptr = tensor.data_ptr()
        with torch.cuda.device(tensor.device):
            base, size = ctypes.c_uint64(), ctypes.c_size_t()
            if self._driver.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size),
                                                    ctypes.c_uint64(ptr)) != 0:
                raise OSError("cuMemGetAddressRange failed")
            handle = (ctypes.c_char * 64)()
            if self._rt.cudaIpcGetMemHandle(handle, ctypes.c_void_p(base.value)) != 0:
                raise OSError("cudaIpcGetMemHandle failed")
        return base.value, size.value, bytes(handle)

    def synchronize(self, tensor) -> None:
        """Waits for the work queued on the tensor's current stream: the
        server's stream is another process's and does not wait for ours."""
        import torch

        torch.cuda.current_stream(tensor.device).synchronize()


class DeviceRegions:
    """The allocations this client registered, and whether to use them."""

    def __init__(self, mode: str, unix_target: bool, runtime: Runtime | None = None):
        self.mode, self.unix_target = mode, unix_target
        self.runtime = runtime or Runtime()
        self._lock = threading.Lock()
        # Held across a registration (lookup, RPC, insert): two threads with
        # the same allocation must not both register it (the second entry
        # would replace the first, whose name no one would unregister).
        # Registrations are rare: once per allocation.
        self._registering = threading.Lock()
        self._usable: bool | None = None if mode != "off" else False
        self._devices: dict[str, int] = {}  # the server's GPUs: uuid -> its index
        self._regions: collections.OrderedDict[int, tuple[str, int]] = collections.OrderedDict()
        self._created = 0
        self._nonce = secrets.token_hex(8)
        self.why_not = ""

    def decide(self, info: pb.ServerInfo | None) -> None:
        with self._lock:
            if self._usable is not None:
                return
            same_node = info is not None and (
                self.unix_target or (info.shared_memory_domain and
                                     info.shared_memory_domain == _shm.local_domain()))
            self._usable = bool(same_node and info.cuda_shared_memory_enabled)
            if self._usable:
                self._devices = {b.device_uuid: b.device_index for b in info.backends
                                 if b.device_uuid}
            else:
                self.why_not = "the server does not serve CUDA shared memory on this node"

    @property
    def decided(self) -> bool:
        return self._usable is not None

    def disable(self, why: str) -> None:
        with self._lock:
            self._usable, self.why_not = False, why

    def slices(self, stub, tensors) -> list[pb.SharedMemorySlice] | None:
        """Slices naming `tensors` (torch CUDA tensors) in registered device
        memory, registering their allocations as needed; None when they
        cannot go this way (the caller then copies them to the host)."""
        if not self._usable or not tensors:
            return None
        out = []
        for t in tensors:
            if not t.is_contiguous():
                return None
            index = self._devices.get(self.runtime.uuid(t))
            if index is None:
                return None  # a GPU the server does not compute on
            try:
                base, size, handle = self.runtime.allocation(t)
            except OSError as e:
                self.disable(f"CUDA IPC is not available here: {e}")
                return None
            name = self._region(stub, base, size, handle, index)
            if name is None:
                return None
            nbytes = t.numel() * t.element_size()
            out.append(pb.SharedMemorySlice(region=name, offset=t.data_ptr() - base,
                                            byte_size=nbytes))
        for t in tensors:
            self.runtime.synchronize(t)
        return out

    def place(self, op, stub) -> bool:
        """Names an Op's torch CUDA tensors in registered device memory (its
        *_shm fields), when they can go that way; else leaves it alone."""
        tensors = device_tensors(op)
        slices = self.slices(stub, tensors) if tensors is not None else None
        if slices is None:
            return False
        for (_, _, slice_field), s in zip(op.tensors, slices):
            getattr(op.request, slice_field).CopyFrom(s)
        return True

    def _region(self, stub, base: int, size: int, handle: bytes, index: int) -> str | None:
        with self._lock:  # known: no wait behind another allocation's registration
            known = self._regions.get(base)
            if known is not None and known[1] == size:
                self._regions.move_to_end(base)
                return known[0]
        with self._registering:
            return self._region_locked(stub, base, size, handle, index)

    def _region_locked(self, stub, base: int, size: int, handle: bytes,
                       index: int) -> str | None:
        with self._lock:
            known = self._regions.get(base)
            if known is not None and known[1] == size:
                self._regions.move_to_end(base)
                return known[0]
            # Names are the server's to share among all its clients: the pid
            # and a nonce keep ours apart from other processes' and clients'.
            name = f"/posenc-py-cuda-{os.getpid()}-{self._nonce}-{self._created}"
            self._created += 1
            if known is not None:  # freed and allocated again, of another size
                del self._regions[base]
        if known is not None:
            self._unregister(stub, known[0])
        try:
            stub.RegisterSharedMemory(
                pb.RegisterSharedMemoryRequest(name=name, cuda_handle=handle, cuda_device=index,
                                               byte_size=size), timeout=10)
        except grpc.RpcError as e:
            # Taken means an attempt of this very registration got through
            # and its answer was lost before gRPC retried it (the name is
            # ours alone): registered.
            if e.code() != grpc.StatusCode.ALREADY_EXISTS:
                # The server may have registered it and the answer been lost.
                if _shm.outcome_unknown(e.code()):
                    self._unregister(stub, name)
                # Refused for room, or a moment's trouble: another time.
                # Anything else: host memory from now on.
                if e.code() not in _shm.TRANSIENT:
                    self.disable(f"the server refused device memory: {e.details()}")
                return None
        evicted = []
        with self._lock:
            self._regions[base] = (name, size)
            while len(self._regions) > _MAX_REGIONS:
                evicted.append(self._regions.popitem(last=False)[1][0])
        for n in evicted:
            self._unregister(stub, n)
        return name

    @staticmethod
    def _unregister(stub, name: str) -> None:
        try:
            stub.UnregisterSharedMemory(pb.UnregisterSharedMemoryRequest(name=name), timeout=2)
        except (grpc.RpcError, ValueError):  # ValueError: the channel is closed
            pass

    def close(self, stub) -> None:
        with self._lock:
            names = [n for n, _ in self._regions.values()]
            self._regions.clear()
        for n in names:
            self._unregister(stub, n)


def device_tensors(op) -> list | None:
    """The torch CUDA tensors an Op carries, when every large tensor of it is
    one and it builds no tensor of its own; else None."""
    if op.output is not None or not op.tensors:
        return None
    from posenc._tensors import CudaTensor

    if not all(isinstance(a, CudaTensor) for a, _, _ in op.tensors):
        return None
    return [a.tensor for a, _, _ in op.tensors]
