"""The Python clients against a server that misbehaves: a scripted
posenc.v1 servicer on a Unix socket (so the clients use shared memory)
answers as told, as tests/system/client_hostile_server_test.cc does for the
C++ client. No answer the client cannot trust is returned as a result, no
region the server may still write into carries another call, no
registration is left behind when an answer is lost, and calls in flight
together do not blow up the regions asked for."""

from __future__ import annotations

import asyncio
import mmap
import os
import shutil
import tempfile
import threading
import time
from concurrent import futures

import grpc
import numpy as np
import pytest

import posenc
from posenc._proto.posenc.v1 import posenc_pb2 as pb
from posenc._proto.posenc.v1 import posenc_pb2_grpc as pb_grpc


class Scripted(pb_grpc.PositionalEncodingServicer):
    """What it does with ApplyRope, by the request id's first word:
    echo (the right answer of an identity rotation), slow-echo and pause
    (the same, 400 or 20 ms later), bytes (OK, result in the answer's bytes
    though sent in shared memory), dtype (the answer described as the other
    16-bit float), late-write (answers after 1.5 s, past the caller's 1 s
    deadline, then writes 0xAB over the slice), after-late (the right
    answer once a late write has landed)."""

    def __init__(self):
        self.shares_memory = True
        self.info_unavailable = False
        self.register_code = grpc.StatusCode.OK
        self.registered, self.unregistered = [], []
        self.tensor_calls, self.late_writes = 0, 0
        self._maps = {}
        self._lock = threading.Lock()

    def GetServerInfo(self, request, context):
        if self.info_unavailable:
            context.abort(grpc.StatusCode.UNAVAILABLE, "still starting")
        return pb.ServerInfo(shared_memory_enabled=self.shares_memory)

    def RegisterSharedMemory(self, request, context):
        with self._lock:
            self.registered.append((request.name, request.byte_size))
            if request.key:  # mapped as a server maps it, to write there later
                fd = os.open("/dev/shm" + request.key, os.O_RDWR)
                try:
                    self._maps[request.name] = mmap.mmap(fd, request.byte_size)
                finally:
                    os.close(fd)
        if self.register_code != grpc.StatusCode.OK:
            context.abort(self.register_code, "scripted")
        return pb.SharedMemoryStatus()

    def UnregisterSharedMemory(self, request, context):
        with self._lock:
            self.unregistered.append(request.name)
        return pb.SharedMemoryStatus()

    def ApplyRope(self, request, context):
        with self._lock:
            self.tensor_calls += 1
        script = request.request_id.split(" ")[0]
        resp = pb.RopeResponse(query=request.query)
        if not request.HasField("query_shm"):
            resp.query_data = request.query_data
        if script == "bytes":
            resp.query_data = b"\x5a" * request.query_shm.byte_size
        elif script == "dtype":
            resp.query.dtype = (pb.DATA_TYPE_BFLOAT16 if request.query.dtype == pb.DATA_TYPE_FLOAT16
                                else pb.DATA_TYPE_FLOAT16)
        elif script == "slow-echo":
            time.sleep(0.4)
        elif script == "pause":
            time.sleep(0.02)
        elif script == "after-late":
            eventually(lambda: self.late_writes > 0, 20)
        elif script == "late-write":
            time.sleep(1.5)
            s = request.query_shm
            with self._lock:
                self._maps[s.region][s.offset:s.offset + s.byte_size] = b"\xab" * s.byte_size
                self.late_writes += 1
        elif script != "echo":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"no script {script}")
        return resp

    def AttentionBias(self, request, context):
        with self._lock:
            self.tensor_calls += 1
        context.abort(grpc.StatusCode.INTERNAL, "not scripted")

    def GetEncodingTable(self, request, context):
        with self._lock:
            self.tensor_calls += 1
        context.abort(grpc.StatusCode.INTERNAL, "not scripted")

    def close(self) -> None:
        with self._lock:
            for m in self._maps.values():
                m.close()
            self._maps.clear()

    def was_unregistered(self, name) -> bool:
        with self._lock:
            return name in self.unregistered


def eventually(f, seconds=10.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if f():
            return True
        time.sleep(0.005)
    return f()


@pytest.fixture
def scripted():
    service = Scripted()
    server = grpc.server(futures.ThreadPoolExecutor(16))
    pb_grpc.add_PositionalEncodingServicer_to_server(service, server)
    folder = tempfile.mkdtemp()
    server.add_insecure_port("unix:" + os.path.join(folder, "hostile.sock"))
    server.start()
    yield service, "unix:" + os.path.join(folder, "hostile.sock")
    server.stop(None)
    service.close()
    shutil.rmtree(folder, ignore_errors=True)


def tensor(rng, dtype=np.float32, tokens=64):
    return rng.uniform(-1, 1, (1, tokens, 2, 64)).astype(dtype)


def client(target, mode="auto"):
    return posenc.Client(target, shared_memory=mode, health_check_service="")


def test_an_in_place_answer_carrying_bytes_is_refused(scripted, rng):
    service, target = scripted
    with client(target) as c:
        q = tensor(rng)
        with pytest.raises(posenc.PosencError) as e:
            c.apply_rope(q, request_id="bytes call")
        assert e.value.code == grpc.StatusCode.INTERNAL
        assert service.registered, "shared memory was not used"
        np.testing.assert_array_equal(c.apply_rope(q, request_id="echo call").query, q)


def test_an_answer_of_another_dtype_of_the_same_size_is_refused(scripted, rng):
    _, target = scripted
    for mode in ("off", "auto"):
        with client(target, mode) as c:
            with pytest.raises(posenc.PosencError) as e:
                c.apply_rope(tensor(rng, np.float16), request_id="dtype call")
            assert e.value.code == grpc.StatusCode.INTERNAL
            assert "BFLOAT16" in e.value.message


def test_a_region_a_call_ran_out_of_time_on_is_never_reused(scripted, rng):
    service, target = scripted
    with client(target) as c:
        with pytest.raises(posenc.PosencError) as e:
            c.apply_rope(tensor(rng, tokens=256), request_id="late-write call", timeout=1.0)
        assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert len(service.registered) == 1
        first = service.registered[0][0]
        q = tensor(rng, tokens=256)
        # Answered only after the first call's late write has landed.
        np.testing.assert_array_equal(c.apply_rope(q, request_id="after-late call").query, q,
                                      "the first call's late write came back as the second's")
        assert service.late_writes == 1
        assert len(service.registered) == 2 and service.registered[1][0] != first
        assert eventually(lambda: service.was_unregistered(first))
        c.apply_rope(q, request_id="echo call")
        assert len(service.registered) == 2, "a region whose call was answered is reused"


def test_an_async_call_cancelled_leaves_its_region_unpooled(scripted, rng):
    service, target = scripted

    async def run():
        async with posenc.AsyncClient(target, health_check_service="") as c:
            task = asyncio.ensure_future(c.apply_rope(tensor(rng), request_id="slow-echo call"))
            for _ in range(2000):  # until the call is on the server, however slow the machine
                if service.tensor_calls:
                    break
                await asyncio.sleep(0.005)
            assert service.tensor_calls == 1
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert eventually(lambda: service.was_unregistered(service.registered[0][0]))
            q = tensor(rng)
            np.testing.assert_array_equal((await c.apply_rope(q, request_id="echo call")).query,
                                          q)
            assert len(service.registered) == 2

    asyncio.run(run())


def test_calls_in_flight_together_get_regions_of_their_own_size(scripted, rng):
    service, target = scripted
    with client(target) as c:
        qs = [tensor(rng, tokens=2048) for _ in range(8)]  # 1 MiB each
        with futures.ThreadPoolExecutor(8) as pool:
            results = list(pool.map(
                lambda q: c.apply_rope(q, request_id="slow-echo call").query, qs))
        for q, r in zip(qs, results):
            np.testing.assert_array_equal(r, q)
        assert service.registered
        assert max(size for _, size in service.registered) <= 2 << 20, service.registered


def test_a_registration_whose_answer_is_lost_is_unregistered(scripted, rng):
    service, target = scripted
    service.register_code = grpc.StatusCode.UNAVAILABLE
    with client(target) as c:
        q = tensor(rng)
        np.testing.assert_array_equal(c.apply_rope(q, request_id="echo call").query, q)
        assert service.registered
        lost = service.registered[0][0]
        assert eventually(lambda: service.was_unregistered(lost))
        service.register_code = grpc.StatusCode.OK
        n = len(service.registered)
        assert eventually(lambda: c.apply_rope(q, request_id="echo call") is not None
                          and len(service.registered) > n), "not asked for again"
        assert c.uses_shared_memory


def test_a_server_that_could_not_be_asked_is_asked_again(scripted, rng):
    service, target = scripted
    service.info_unavailable = True
    with client(target) as c:
        q = tensor(rng)
        c.apply_rope(q, request_id="echo call")
        assert not service.registered
        service.info_unavailable = False
        # Not at once (a backoff), but soon.
        assert eventually(lambda: c.apply_rope(q, request_id="echo call") is not None
                          and len(service.registered) == 1), "shared memory stayed off"


def test_a_retried_registration_that_finds_itself_is_taken(scripted, rng):
    service, target = scripted
    service.register_code = grpc.StatusCode.ALREADY_EXISTS
    with client(target) as c:
        q = tensor(rng)
        np.testing.assert_array_equal(c.apply_rope(q, request_id="echo call").query, q)
        assert c.uses_shared_memory
        assert len(service.registered) == 1 and not service.unregistered


def test_callers_of_mixed_sizes_keep_their_regions(scripted, rng):
    service, target = scripted
    with client(target) as c:
        def caller(q, calls):
            for _ in range(calls):
                np.testing.assert_array_equal(c.apply_rope(q, request_id="pause call").query, q)
        large, small = tensor(rng, tokens=16384), tensor(rng, tokens=2048)  # 8 MiB, 1 MiB
        with futures.ThreadPoolExecutor(2) as pool:
            done = [pool.submit(caller, large, 10), pool.submit(caller, small, 20)]
            for f in done:
                f.result()
        assert len(service.registered) <= 4, service.registered


def test_require_refuses_built_tensors_it_cannot_place(scripted):
    service, target = scripted
    service.shares_memory = False
    with client(target, "require") as c:
        for call in (lambda: c.attention_bias(num_heads=2, q_len=4, k_len=4),
                     lambda: c.sinusoidal_table(16, 4)):
            with pytest.raises(posenc.PosencError) as e:
                call()
            assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    service.shares_memory = True
    with client(target, "require") as c:
        with pytest.raises(posenc.PosencError) as e:
            c.attention_bias(num_heads=2, q_len=0, k_len=4)
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "not known" in e.value.message
    assert service.tensor_calls == 0, "a call went over the socket under 'require'"
