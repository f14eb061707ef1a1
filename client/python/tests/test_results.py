"""Every posenc.v1 operation through the sync Client, against the numpy
float64 references; bf16 and fp16 round trips; torch when importable."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

import posenc
import reference as ref


@pytest.fixture(scope="module")
def client(server):
    with posenc.Client(server.target, timeout=10) as c:
        yield c


def test_apply_rope_neox_query_and_key_with_offsets(client, rng):
    q = rng.standard_normal((2, 12, 4, 64)).astype(np.float32)
    k = rng.standard_normal((2, 12, 2, 64)).astype(np.float32)  # GQA: fewer key heads
    offsets = np.array([0, 100], np.int64)
    out = client.apply_rope(q, k, offsets=offsets, base=500000)
    pos = offsets[:, None] + np.arange(12)[None, :]
    assert out.query.dtype == np.float32 and out.query.shape == q.shape
    np.testing.assert_allclose(out.query, ref.rope(q, pos, base=500000), atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(out.key, ref.rope(k, pos, base=500000), atol=2e-5, rtol=1e-5)
    assert re.fullmatch(r"cpu|cuda:\d+", out.backend), out.backend  # where it ran
    assert not np.allclose(out.query, q), "the rotation did nothing"


def test_apply_rope_gptj_partial_bhsd_linear_scaling(client, rng):
    q = rng.standard_normal((1, 3, 9, 48)).astype(np.float32)  # [batch, heads, seq, d]
    pos = rng.integers(0, 4096, size=(1, 9))
    out = client.apply_rope(q, layout="BHSD", style="gptj", rotary_dim=32, position_ids=pos,
                            scaling={"type": "linear", "factor": 4.0}).query
    want = ref.rope(q, pos, rotary_dim=32, style="gptj", factor=4.0, layout="bhsd")
    np.testing.assert_allclose(out, want, atol=1e-4, rtol=1e-4)
    np.testing.assert_array_equal(out[..., 32:], q[..., 32:])  # dims >= R pass through
    back = client.apply_rope(out, layout="bhsd", style="gptj", rotary_dim=32, position_ids=pos,
                             scaling={"type": "linear", "factor": 4.0}, inverse=True).query
    np.testing.assert_allclose(back, q, atol=1e-4)


def test_bf16_round_trip(client, rng):
    q = rng.standard_normal((1, 16, 4, 64)).astype(ml_dtypes.bfloat16)
    out = client.apply_rope(q).query
    assert out.dtype == posenc.bfloat16 and out.shape == q.shape
    want = ref.rope(q.astype(np.float64), np.arange(16)[None])
    # One bf16 rounding of the result: relative error <= 2^-8 per element.
    np.testing.assert_allclose(out.astype(np.float64), want, atol=2 ** -7, rtol=2 ** -7)
    # The bits are bf16's: casting the reference to bf16 agrees within one ulp.
    ulps = np.abs(out.view(np.int16).astype(np.int32)
                  - want.astype(ml_dtypes.bfloat16).view(np.int16).astype(np.int32))
    assert np.percentile(ulps, 99) <= 1


def test_fp16_native(client, rng):
    q = rng.standard_normal((1, 8, 2, 32)).astype(np.float16)
    out = client.apply_rope(q, base=10000).query
    assert out.dtype == np.float16
    np.testing.assert_allclose(out.astype(np.float64), ref.rope(q, np.arange(8)[None]),
                               atol=4e-3, rtol=4e-3)


def test_torch_tensors_when_installed(client, rng):
    torch = pytest.importorskip("torch")
    q = torch.from_numpy(rng.standard_normal((1, 8, 2, 32)).astype(np.float32)).bfloat16()
    out = client.apply_rope(q).query
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16
    want = ref.rope(q.float().numpy(), np.arange(8)[None])
    np.testing.assert_allclose(out.float().numpy(), want, atol=2 ** -7, rtol=2 ** -7)


def test_sinusoidal_add_and_table(client, rng):
    x = rng.standard_normal((2, 10, 30)).astype(np.float32)
    pos = rng.integers(0, 2000, size=(2, 10))
    y = client.add_sinusoidal(x, position_ids=pos, x_scale=2.0)
    want = 2.0 * x + ref.sinusoidal(pos.reshape(-1), 30).reshape(2, 10, 30)
    np.testing.assert_allclose(y, want, atol=1e-4, rtol=1e-5)
    t = client.sinusoidal_table(31, count=50)
    assert t.shape == (50, 31) and t.dtype == np.float32
    np.testing.assert_allclose(t, ref.sinusoidal(np.arange(50), 31), atol=1e-5)
    t16 = client.sinusoidal_table(16, positions=[3, 1, 4], dtype="bfloat16")
    assert t16.dtype == posenc.bfloat16
    np.testing.assert_allclose(t16.astype(np.float64), ref.sinusoidal([3, 1, 4], 16), atol=2 ** -8)


def test_learned_table_add_and_list(client, table, rng):
    tables = client.list_tables()
    info = {t.name: t for t in tables.tables}["gpt2/wpe"]
    assert (info.rows, info.dim) == table.shape
    np.testing.assert_array_equal(client.learned_table("gpt2/wpe"), table)
    np.testing.assert_array_equal(client.learned_table("gpt2/wpe", positions=[5, 0]),
                                  table[[5, 0]])
    x = rng.standard_normal((7, 32)).astype(np.float32)
    pos = rng.integers(0, 64, size=7)
    y = client.add_learned(x, "gpt2/wpe", position_ids=pos)
    np.testing.assert_allclose(y, x + table[pos], atol=1e-6)
    assert [t.name for t in client.reload_tables().tables] == ["gpt2/wpe"]


def test_attention_bias_and_logits(client, rng):
    b = client.attention_bias(num_heads=8, q_len=5, k_len=9, causal=True)
    want = ref.causal_alibi(8, 5, 9)
    assert b.bias.shape == (1, 8, 5, 9)
    np.testing.assert_array_equal(np.isinf(b.bias), np.isinf(want))
    finite = ~np.isinf(want)
    np.testing.assert_allclose(b.bias[finite], want[finite], rtol=1e-6)
    np.testing.assert_allclose(b.slopes, ref.alibi_slopes(8), rtol=1e-12)
    logits = rng.standard_normal((2, 4, 3, 3)).astype(np.float32)
    out = client.attention_bias(num_heads=4, q_len=3, k_len=3, form="symmetric", logits=logits)
    i = np.arange(3)
    sym = -ref.alibi_slopes(4)[:, None, None] * np.abs(i[:, None] - i[None, :])
    np.testing.assert_allclose(out.bias, logits + sym[None], atol=1e-6)


def test_stream_rope_in_order_with_a_failed_message(client, rng):
    qs = [rng.standard_normal((1, 4 + n, 2, 16)).astype(np.float32) for n in range(3)]
    items = [{"query": qs[0], "request_id": "a"},
             {"query": np.zeros((1, 4, 2, 15), np.float32), "request_id": "bad"},  # odd head_dim
             {"query": qs[2], "request_id": "c", "base": 1000}]
    results = list(client.stream_rope(items))
    assert [r.request_id for r in results] == ["a", "bad", "c"]
    np.testing.assert_allclose(results[0].query, ref.rope(qs[0], np.arange(4)[None]), atol=2e-5)
    assert results[1].error is not None
    assert results[1].error.code.name == "INVALID_ARGUMENT"
    np.testing.assert_allclose(results[2].query, ref.rope(qs[2], np.arange(6)[None], base=1000),
                               atol=2e-5)


def test_server_info(client):
    info = client.server_info()
    assert info.version
    assert {"ApplyRope", "StreamRope", "AttentionBias", "GetServerInfo"} <= set(info.operations)
    assert info.limits.max_inflight_requests > 0
    assert posenc.v1.DATA_TYPE_BFLOAT16 in info.dtypes
