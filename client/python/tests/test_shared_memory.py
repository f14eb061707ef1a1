"""The Python clients move tensors through shared memory on their own
(shared_memory="auto", the default) when the server shares this node: the
results are bit for bit the socket's for every operation and dtype, numpy
and torch alike; a region the server lost falls back to the socket;
"require" refuses what "auto" falls back from; "off" never registers."""

from __future__ import annotations

import asyncio
import time

import grpc
import numpy as np
import pytest

import posenc
from conftest import ServerProcess

DTYPES = [np.float32, np.float16, posenc.bfloat16]


@pytest.fixture(scope="module")
def shm_server():
    s = ServerProcess("--enable_system_shared_memory")
    yield s
    s.stop()


def regions(target: str) -> int:
    with posenc.Client(target, shared_memory="off") as c:
        return len(c._stub.GetSharedMemoryStatus(posenc.v1.SharedMemoryStatusRequest()).regions)


def same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float16", "bfloat16"])
def test_every_operation_matches_the_socket_bit_for_bit(shm_server, rng, dtype):
    q = rng.standard_normal((2, 9, 6, 64)).astype(dtype)
    k = rng.standard_normal((2, 9, 2, 64)).astype(dtype)
    x = rng.standard_normal((3, 17, 96)).astype(dtype)
    logits = rng.standard_normal((2, 4, 7, 11)).astype(dtype)
    name = np.dtype(dtype).name if dtype is not posenc.bfloat16 else "bfloat16"
    with posenc.Client(shm_server.target) as shm, \
            posenc.Client(shm_server.target, shared_memory="off") as socket:
        for c in (shm, socket):
            c.results = [
                c.apply_rope(q, k, offsets=[0, 4093], base=500000, scaling={"type": "llama3"}),
                c.add_sinusoidal(x, x_scale=2.0),
                c.attention_bias(logits=logits, causal=True, window=5),
                c.attention_bias(num_heads=4, q_len=7, k_len=11, batch=2, causal=True,
                                 dtype=name),
                c.sinusoidal_table(48, 33, dtype=name),
            ]
        assert shm.uses_shared_memory and not socket.uses_shared_memory
        a, b = shm.results, socket.results
        assert same(a[0].query, b[0].query) and same(a[0].key, b[0].key)
        assert not same(a[0].query, q), "rotated"
        assert same(a[1], b[1])
        assert same(a[2].bias, b[2].bias) and a[2].slopes == b[2].slopes
        assert same(a[3].bias, b[3].bias) and a[3].slopes == b[3].slopes
        assert same(a[4], b[4])
        # The inputs are the caller's and stay as they were.
        assert same(q, q.copy())
        assert 0 < regions(shm_server.target) <= 4, "regions are reused across calls"


def test_torch_cpu_tensors_too(shm_server, rng):
    torch = pytest.importorskip("torch")
    q = torch.from_numpy(rng.standard_normal((1, 8, 4, 32)).astype(np.float32)).bfloat16()
    with posenc.Client(shm_server.target) as shm, \
            posenc.Client(shm_server.target, shared_memory="off") as socket:
        a = shm.apply_rope(q).query
        b = socket.apply_rope(q).query
        assert shm.uses_shared_memory
        assert isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16
        assert torch.equal(a, b)


def test_asyncio_client_too(shm_server, rng):
    q = rng.standard_normal((1, 32, 8, 64)).astype(posenc.bfloat16)

    async def both():
        async with posenc.AsyncClient(shm_server.target) as shm, \
                posenc.AsyncClient(shm_server.target, shared_memory="off") as socket:
            a = await shm.apply_rope(q, base=10000)
            b = await socket.apply_rope(q, base=10000)
            t1 = await shm.sinusoidal_table(32, 10)
            t2 = await socket.sinusoidal_table(32, 10)
            return shm.uses_shared_memory, a, b, t1, t2

    used, a, b, t1, t2 = asyncio.run(both())
    assert used
    assert same(a.query, b.query) and same(t1, t2)


def test_a_lost_region_falls_back_to_the_socket(shm_server, rng):
    q = rng.standard_normal((1, 4, 8, 64)).astype(np.float32)
    with posenc.Client(shm_server.target) as shm, \
            posenc.Client(shm_server.target, shared_memory="off") as socket:
        shm.apply_rope(q)
        assert shm.uses_shared_memory
        # As after a server restart: the client's region is unknown now.
        socket._stub.UnregisterSharedMemory(posenc.v1.UnregisterSharedMemoryRequest(name=""))
        a = shm.apply_rope(q).query
        assert same(a, socket.apply_rope(q).query)
        assert not shm.uses_shared_memory


def test_require_refuses_where_auto_falls_back(server, rng):
    # `server` (conftest) serves no shared memory.
    q = rng.standard_normal((1, 4, 8, 64)).astype(np.float32)
    with posenc.Client(server.target) as auto:
        auto.apply_rope(q)
        assert not auto.uses_shared_memory
    with posenc.Client(server.target, shared_memory="require") as required:
        with pytest.raises(posenc.PosencError) as e:
            required.apply_rope(q)
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(posenc.PosencError):
        posenc.Client(server.target, shared_memory="sometimes")


def test_a_region_refused_for_room_is_asked_for_again_later(rng):
    # Room for one region: the second client is refused (RESOURCE_EXHAUSTED),
    # uses the socket meanwhile and gets a region once the first gives its
    # back, instead of giving shared memory up for good.
    s = ServerProcess("--enable_system_shared_memory", "--max_shared_memory_regions=1")
    try:
        q = rng.standard_normal((1, 4, 8, 64)).astype(np.float32)
        with posenc.Client(s.target, shared_memory="off") as socket:
            expected = socket.apply_rope(q).query
            first = posenc.Client(s.target)
            assert same(first.apply_rope(q).query, expected) and first.uses_shared_memory
            with posenc.Client(s.target) as second, \
                    posenc.Client(s.target, shared_memory="require") as required:
                assert same(second.apply_rope(q).query, expected)
                assert second.uses_shared_memory, "still on, only deferred"
                assert regions(s.target) == 1
                with pytest.raises(posenc.PosencError) as e:
                    required.apply_rope(q)
                assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "--max_shared_memory_regions" in e.value.message
                first.close()
                assert regions(s.target) == 0
                time.sleep(0.25)  # past the first back-off (100 ms)
                assert same(second.apply_rope(q).query, expected)
                assert regions(s.target) == 1, "the second client registered its region"
    finally:
        s.stop()
