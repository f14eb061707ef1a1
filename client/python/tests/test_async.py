"""AsyncClient: concurrent calls on one channel, streams, errors and
deadlines, checked against the same references."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np

import posenc
import reference as ref


def run(coro):
    return asyncio.run(coro)


def test_concurrent_rope_calls(server, rng):
    qs = [rng.standard_normal((1, 6 + i, 2, 32)).astype(np.float32) for i in range(8)]

    async def main():
        async with posenc.AsyncClient(server.target, timeout=10) as client:
            return await asyncio.gather(*(client.apply_rope(q, base=1e4, request_id=f"r{i}")
                                          for i, q in enumerate(qs)))

    for q, out in zip(qs, run(main())):
        np.testing.assert_allclose(out.query, ref.rope(q, np.arange(q.shape[1])[None]),
                                   atol=2e-5, rtol=1e-5)


def test_stream_from_an_async_generator(server, rng):
    qs = [rng.standard_normal((2, 5, 2, 16)).astype(np.float32) for _ in range(4)]

    async def items():
        for i, q in enumerate(qs):
            yield {"query": q, "request_id": str(i), "style": "gptj"}

    async def main():
        async with posenc.AsyncClient(server.target) as client:
            return [r async for r in client.stream_rope(items())]

    results = run(main())
    assert [r.request_id for r in results] == ["0", "1", "2", "3"]
    for q, r in zip(qs, results):
        assert r.error is None
        want = ref.rope(q, np.tile(np.arange(5), (2, 1)), style="gptj")
        np.testing.assert_allclose(r.query, want, atol=2e-5)


def test_the_other_operations(server, table):
    async def main():
        async with posenc.AsyncClient(server.target) as client:
            return await asyncio.gather(
                client.sinusoidal_table(8, count=4),
                client.learned_table("gpt2/wpe", count=3),
                client.add_sinusoidal(np.zeros((4, 8), np.float32)),
                client.add_learned(np.zeros((3, 32), np.float32), "gpt2/wpe"),
                client.attention_bias(num_heads=2, q_len=2, k_len=2),
                client.list_tables(), client.reload_tables(), client.server_info())

    tab, learned, y, y2, bias, tables, reloaded, info = run(main())
    np.testing.assert_allclose(tab, ref.sinusoidal(np.arange(4), 8), atol=1e-6)
    np.testing.assert_allclose(y, tab, atol=1e-6)
    np.testing.assert_array_equal(learned, table[:3])
    np.testing.assert_array_equal(y2, table[:3])
    assert bias.bias.shape == (1, 2, 2, 2) and len(bias.slopes) == 2
    assert len(tables.tables) == len(reloaded.tables) == 1 and info.version


def test_errors_and_deadlines(server):
    async def main():
        async with posenc.AsyncClient(server.target) as client:
            errors = []
            for call in (client.apply_rope(np.zeros((1, 2, 1, 8), np.float32), rotary_dim=10),
                         client.apply_rope(np.zeros((8, 512, 8, 64), np.float32), timeout=1e-6)):
                try:
                    await call
                except posenc.PosencError as e:
                    errors.append(e)
            return errors

    invalid, late = run(main())
    assert invalid.code == grpc.StatusCode.INVALID_ARGUMENT and "rotary_dim" in invalid.message
    assert late.code == grpc.StatusCode.DEADLINE_EXCEEDED


def test_a_stream_item_the_client_refuses(server):
    items = [{"query": np.ones((1, 2, 1, 8), np.float32)}, {"query": np.ones((1, 2, 1, 8))}]

    async def main():
        async with posenc.AsyncClient(server.target, timeout=10) as client:
            try:
                return [r async for r in client.stream_rope(items)]
            except posenc.PosencError as e:
                return e

    error = run(main())
    assert isinstance(error, posenc.PosencError), error
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT and "float64" in error.message
