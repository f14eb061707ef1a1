"""apply_rope's hf_config against a real server: a model's HF config.json
(as text, dict or path) rotates exactly as the explicit options transformers
resolves it to; conflicts and bad configs come back as INVALID_ARGUMENT
naming the field. The configs are those of tests/conformance/hf/hf_fixtures.json (the
ones tests/conformance/hf_config_agreement_test.cc checks against transformers)."""

from __future__ import annotations

import json

import grpc
import numpy as np
import pytest

import posenc
from conftest import ROOT


def fixture_config(name: str) -> str:
    fixtures = json.loads((ROOT / "tests" / "conformance" / "hf" / "hf_fixtures.json").read_text())
    return next(c["config"] for c in fixtures["configs"] if c["name"] == name)


# What each config resolves to, written out from the model cards (Llama 3.1:
# llama3 scaling; GPT-J: GPT-J-style pairs over the first 64 of 256 dims).
EXPLICIT = {
    "llama-3.1-8b": dict(base=500000, rotary_dim=128, scaling={
        "type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4,
        "original_max_position": 8192}),
    "gpt-j-6b": dict(base=10000, rotary_dim=64, style="gptj"),
}
HEAD_DIM = {"llama-3.1-8b": 128, "gpt-j-6b": 256}


@pytest.fixture(scope="module")
def client(server):
    with posenc.Client(server.target, timeout=10) as c:
        yield c


@pytest.mark.parametrize("family", sorted(EXPLICIT))
def test_hf_config_matches_explicit_options(client, rng, tmp_path, family):
    text = fixture_config(family)
    path = tmp_path / "config.json"
    path.write_text(text)
    q = rng.standard_normal((2, 7, 3, HEAD_DIM[family])).astype(np.float32)
    k = rng.standard_normal((2, 7, 1, HEAD_DIM[family])).astype(np.float32)
    offsets = rng.integers(0, 100000, size=2)  # past Llama's original 8192 too
    want = client.apply_rope(q, k, offsets=offsets, **EXPLICIT[family])
    assert not np.allclose(want.query, q), "the rotation did nothing"
    for form in (text, json.loads(text), path):
        got = client.apply_rope(q, k, offsets=offsets, hf_config=form)
        np.testing.assert_array_equal(got.query, want.query, err_msg=f"{type(form).__name__}")
        np.testing.assert_array_equal(got.key, want.key)
    # Fields given beside it with the config's own values are accepted.
    explicit = {f: v for f, v in EXPLICIT[family].items() if f != "scaling"}
    both = client.apply_rope(q, offsets=offsets, hf_config=text, **explicit)
    np.testing.assert_array_equal(both.query, want.query)


def test_hf_config_in_stream_and_async(server, client, rng):
    text = fixture_config("llama-3.1-8b")
    q = rng.standard_normal((1, 5, 2, 128)).astype(np.float32)
    want = client.apply_rope(q, offsets=[9000], **EXPLICIT["llama-3.1-8b"]).query
    (streamed,) = client.stream_rope([{"query": q, "offsets": [9000], "hf_config": text}])
    assert streamed.error is None, streamed.error
    np.testing.assert_array_equal(streamed.query, want)

    import asyncio

    async def run():
        async with posenc.AsyncClient(server.target, timeout=10) as c:
            return (await c.apply_rope(q, offsets=[9000], hf_config=json.loads(text))).query

    np.testing.assert_array_equal(asyncio.run(run()), want)


def test_hf_config_conflicts_and_bad_configs_are_refused(client, rng):
    llama = fixture_config("llama-3.1-8b")
    q = rng.standard_normal((1, 4, 2, 128)).astype(np.float32)
    cases = [
        (dict(hf_config=llama, base=10000), "base is 10000 but hf_config gives 500000"),
        (dict(hf_config=llama, scaling={"type": "linear", "factor": 2}),
         "scaling and hf_config are both set"),
        (dict(hf_config={"head_dim": 128, "rope_scaling": {"type": "linear", "factor": "8"}}),
         "hf_config.rope_scaling.factor must be a number, got a string"),
        (dict(hf_config="{not json"), "hf_config"),
    ]
    for kwargs, mentions in cases:
        with pytest.raises(posenc.PosencError) as e:
            client.apply_rope(q, **kwargs)
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT, e.value
        assert mentions in e.value.message, e.value.message
    # The query's head size must be the config's.
    with pytest.raises(posenc.PosencError) as e:
        client.apply_rope(q[..., :64], hf_config=llama)
    assert "head_dim is 64 but hf_config gives 128" in e.value.message
    # Refused before sending: a value that is no config at all.
    for bad, mentions in ((5, "expected JSON text, a dict or a path, got int"),
                          ({"rope_theta": float("nan")}, "not JSON-serializable")):
        with pytest.raises(posenc.PosencError) as e:
            client.apply_rope(q, hf_config=bad)
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert mentions in e.value.message, e.value.message
