"""The KServe model repository (--model_dir) through a real posenc-server
and the real Triton client: the example files under deploy/models listed by
RepositoryIndex, a bad file listed UNAVAILABLE with its reason, repository
models answering like the reference for the parameters their files fix
(Llama 3.1 llama3 scaling, Qwen2-VL M-RoPE, ALiBi), a file embedding an HF
config.json answering bit for bit as the rope model given the same config as
its hf_config parameter, fixed parameters refused
in requests, RepositoryModelLoad (tritonclient's load_model) rescanning
the directory, and RepositoryModelUnload (unload_model) taking a model out
until it is loaded again. Seeded like test_kserve_clients.py (POSENC_SEED replays)."""

import glob
import json
import math
import os
import shutil
import subprocess
import tempfile
import time

import numpy as np
import pytest
import tritonclient.grpc as tc
from tritonclient.utils import InferenceServerException

from test_kserve_clients import SEED, alibi_slopes, assert_close, input_of

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")


@pytest.fixture(scope="module")
def repo():
    work = tempfile.mkdtemp(prefix="posenc-models-")
    models = os.path.join(work, "models")
    os.mkdir(models)
    for f in glob.glob(os.path.join(ROOT, "deploy", "models", "*.json")):
        shutil.copy(f, models)
    with open(os.path.join(models, "typo.json"), "w") as f:
        f.write('{"operation": "rope", "parameters": {"bsae": 10000}}')
    port_file = os.path.join(work, "port")
    proc = subprocess.Popen(
        [os.environ["POSENC_SERVER"], "--listen=127.0.0.1:0", f"--port_file={port_file}",
         "--metrics_listen=", f"--model_dir={models}", "--log_level=warn", "--threads=2"],
    )
    deadline = time.time() + 30
    while not (os.path.exists(port_file) and open(port_file).read().strip()):
        assert proc.poll() is None, "posenc-server exited at start-up"
        assert time.time() < deadline, "posenc-server did not start in 30 s"
        time.sleep(0.05)
    client = tc.InferenceServerClient(url="127.0.0.1:" + open(port_file).read().strip())
    yield {"client": client, "dir": models}
    client.close()
    proc.terminate()
    assert proc.wait(timeout=30) == 0
    shutil.rmtree(work)


# --- references (from the models' published configs, not posenc's code) ---


def llama3_inv_freq(base, dim, factor, low, high, original):
    """transformers' _compute_llama3_parameters."""
    inv_freq = base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
    low_wavelen, high_wavelen = original / low, original / high
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled)


def rotate_neox(x, angles):
    """x [b, s, h, d] float64, angles [b, s, d/2]: NeoX-style rotation."""
    half = x.shape[-1] // 2
    cos, sin = np.cos(angles)[:, :, None, :], np.sin(angles)[:, :, None, :]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


# --- the index -----------------------------------------------------------------


def test_index_lists_repository_models_and_the_bad_file(repo):
    c = repo["client"]
    index = {m["name"]: m for m in c.get_model_repository_index(as_json=True)["models"]}
    for name in ("rope", "llama-3.1-8b-rope", "qwen2-vl-7b-mrope", "qwen2.5-7b-yarn-hf",
                 "alibi-8-heads"):
        assert index[name]["state"] == "READY", index[name]
        assert c.is_model_ready(name)
    assert index["typo"]["state"] == "UNAVAILABLE"
    assert 'no parameter "bsae"' in index["typo"]["reason"], index["typo"]
    assert not c.is_model_ready("typo")  # known, not ready (as Triton's UNAVAILABLE)
    with pytest.raises(InferenceServerException) as e:
        c.get_model_metadata("typo")
    assert e.value.status() == "StatusCode.NOT_FOUND"
    assert "bsae" in e.value.message()  # says why the file did not load
    # The model's own description: head size in the metadata, fixed values in the config.
    meta = c.get_model_metadata("llama-3.1-8b-rope", as_json=True)
    assert {t["name"]: t["shape"] for t in meta["inputs"]}["query"] == ["-1", "-1", "-1", "128"]
    config = c.get_model_config("llama-3.1-8b-rope", as_json=True)["config"]
    fixed = {k: v["string_value"] for k, v in config["parameters"].items()}
    assert fixed["base"] == "500000" and fixed["scaling"] == "llama3"
    assert fixed["factor"] == "8" and fixed["original_max_position"] == "8192"


# --- inference against the reference --------------------------------------------


def test_llama_model_applies_its_llama3_scaling(repo):
    rng = np.random.default_rng([SEED, 101])
    b, s, hq, hk = 2, int(rng.integers(1, 40)), 4, 2
    q = rng.standard_normal((b, s, hq, 128)).astype(np.float32)
    k = rng.standard_normal((b, s, hk, 128)).astype(np.float32)
    pos = rng.integers(0, 131072, (b, s)).astype(np.int64)  # long-context positions
    r = repo["client"].infer("llama-3.1-8b-rope", [
        input_of("query", q, "FP32"), input_of("key", k, "FP32"),
        input_of("position_ids", pos, "INT64")])
    inv_freq = llama3_inv_freq(500000.0, 128, 8.0, 1.0, 4.0, 8192.0)
    angles = pos[:, :, None].astype(np.float64) * inv_freq
    for name, x in (("query_out", q), ("key_out", k)):
        want = rotate_neox(x.astype(np.float64), angles)
        assert_close(r.as_numpy(name).astype(np.float64), want, "FP32", f"llama {name}")


def test_qwen2_vl_model_rotates_by_mrope_sections(repo):
    rng = np.random.default_rng([SEED, 102])
    b, s, h = 1, int(rng.integers(1, 30)), 2
    q = rng.standard_normal((b, s, h, 128)).astype(np.float32)
    pos = rng.integers(0, 64, (b, s, 3)).astype(np.int64)  # temporal, height, width
    r = repo["client"].infer("qwen2-vl-7b-mrope", [
        input_of("query", q, "FP32"), input_of("position_ids", pos, "INT64")])
    inv_freq = 1000000.0 ** (-np.arange(0, 128, 2, dtype=np.float64) / 128)
    axis = np.repeat([0, 1, 2], [16, 24, 24])  # mrope_section of config.json
    angles = pos[:, :, axis].astype(np.float64) * inv_freq
    want = rotate_neox(q.astype(np.float64), angles)
    assert_close(r.as_numpy("query_out").astype(np.float64), want, "FP32", "qwen2-vl mrope")


def test_hf_config_model_answers_as_the_request_level_hf_config(repo):
    rng = np.random.default_rng([SEED, 103])
    c = repo["client"]
    with open(os.path.join(ROOT, "deploy", "models", "qwen2.5-7b-yarn-hf.json")) as f:
        hf_config = json.dumps(json.load(f)["hf_config"])
    b, s, h = 2, int(rng.integers(1, 40)), 4
    q = rng.standard_normal((b, s, h, 128)).astype(np.float32)
    k = rng.standard_normal((b, s, 1, 128)).astype(np.float32)
    pos = rng.integers(0, 131072, (b, s)).astype(np.int64)  # past the original 32k
    inputs = lambda: [input_of("query", q, "FP32"), input_of("key", k, "FP32"),
                      input_of("position_ids", pos, "INT64")]
    from_file = c.infer("qwen2.5-7b-yarn-hf", inputs())
    from_request = c.infer("rope", inputs(), parameters={"hf_config": hf_config})
    for name in ("query_out", "key_out"):
        np.testing.assert_array_equal(from_file.as_numpy(name), from_request.as_numpy(name),
                                      err_msg=f"{name} (seed {SEED})")
    assert not np.allclose(from_file.as_numpy("query_out"), q)
    # The metadata and config say what the config resolved to.
    meta = c.get_model_metadata("qwen2.5-7b-yarn-hf", as_json=True)
    assert {t["name"]: t["shape"] for t in meta["inputs"]}["query"] == ["-1", "-1", "-1", "128"]
    config = c.get_model_config("qwen2.5-7b-yarn-hf", as_json=True)["config"]
    fixed = {k: v["string_value"] for k, v in config["parameters"].items()}
    assert fixed["scaling"] == "yarn" and fixed["factor"] == "4" and fixed["base"] == "1000000"
    # The scaling is the config's, also what it leaves to defaults.
    for parameters in ({"factor": "2"}, {"beta_fast": "16"}):
        with pytest.raises(InferenceServerException) as e:
            c.infer("qwen2.5-7b-yarn-hf", inputs(), parameters=parameters)
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert next(iter(parameters)) in e.value.message()
    # A query of another head size is refused, as beside a request's hf_config.
    with pytest.raises(InferenceServerException) as e:
        c.infer("qwen2.5-7b-yarn-hf", [input_of("query", q[..., :64], "FP32")])
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_alibi_model_fixes_heads_and_form(repo):
    b, q_len, k_len = 2, 3, 7
    r = repo["client"].infer("alibi-8-heads", [], parameters={
        "batch": b, "q_len": q_len, "k_len": k_len})
    slopes = alibi_slopes(8)
    np.testing.assert_allclose(r.as_numpy("slopes"), slopes, rtol=1e-15)
    i = (k_len - q_len + np.arange(q_len))[:, None]
    j = np.arange(k_len)[None, :]
    want = np.broadcast_to(-slopes[:, None, None] * (i - j), (b, 8, q_len, k_len)).copy()
    want[:, :, j[0][None, :] > i[:, 0][:, None]] = -np.inf  # causal mask
    got = r.as_numpy("bias").astype(np.float64)
    assert got.shape == want.shape
    finite = np.isfinite(want)
    assert np.array_equal(np.isfinite(got), finite), "the masked keys differ"
    assert_close(got[finite], want[finite], "FP32", "alibi-8-heads")


# --- what requests may and may not say -------------------------------------------


def test_fixed_parameters_and_head_size_are_enforced(repo):
    c = repo["client"]
    q = np.zeros((1, 4, 1, 128), np.float32)
    with pytest.raises(InferenceServerException) as e:
        c.infer("llama-3.1-8b-rope", [input_of("query", q, "FP32")],
                parameters={"base": "10000"})
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert '"base" is fixed by model llama-3.1-8b-rope (500000)' in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        c.infer("llama-3.1-8b-rope", [input_of("query", np.zeros((1, 4, 1, 64), np.float32),
                                               "FP32")])
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "head_dim 128" in e.value.message()
    # What the file leaves open a request may still give.
    r = c.infer("llama-3.1-8b-rope", [input_of("query", q, "FP32")],
                parameters={"layout": "BSHD"})
    assert r.as_numpy("query_out").shape == q.shape


# --- RepositoryModelLoad rescans the directory -----------------------------------


def test_load_model_rescans_the_directory(repo):
    c, models = repo["client"], repo["dir"]
    with pytest.raises(InferenceServerException) as e:
        c.is_model_ready("gptj-6b-rope")
    assert e.value.status() == "StatusCode.NOT_FOUND"
    with open(os.path.join(models, "gptj-6b-rope.json"), "w") as f:
        f.write('{"operation": "rope", "head_dim": 256,'
                ' "parameters": {"style": "gptj", "rotary_dim": 64, "base": 10000}}')
    c.load_model("gptj-6b-rope")
    assert c.is_model_ready("gptj-6b-rope")
    # A file that does not load: the call fails with its reason.
    with pytest.raises(InferenceServerException) as e:
        c.load_model("typo")
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "bsae" in e.value.message()
    with open(os.path.join(models, "typo.json"), "w") as f:
        f.write('{"operation": "rope", "parameters": {"base": 10000}}')
    c.load_model("typo")
    assert c.is_model_ready("typo")
    with pytest.raises(InferenceServerException) as e:
        c.load_model("absent")
    assert e.value.status() == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException) as e:
        c.load_model("rope", config='{"backend": "python"}')
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    os.remove(os.path.join(models, "gptj-6b-rope.json"))
    c.load_model("typo")  # any load rescans: the removed file's model is gone
    with pytest.raises(InferenceServerException):
        c.get_model_metadata("gptj-6b-rope")


def test_unload_model_takes_it_out_until_it_is_loaded(repo):
    c = repo["client"]
    name = "alibi-8-heads"
    assert c.is_model_ready(name)
    logits = input_of("logits", np.zeros((1, 8, 4, 4), np.float32), "FP32")
    c.infer(name, [logits])
    c.unload_model(name)
    assert not c.is_model_ready(name)
    index = {m["name"]: m for m in c.get_model_repository_index(as_json=True)["models"]}
    assert index[name]["state"] == "UNAVAILABLE"
    assert "unloaded by RepositoryModelUnload" in index[name]["reason"]
    with pytest.raises(InferenceServerException) as e:
        c.infer(name, [logits])
    assert e.value.status() == "StatusCode.NOT_FOUND"
    assert "unloaded by RepositoryModelUnload" in e.value.message()
    # Other loads rescan without bringing it back; unloading it again, or a
    # model that is not loaded, does nothing (as Triton); built-ins stay.
    c.load_model("llama-3.1-8b-rope")
    assert not c.is_model_ready(name)
    c.unload_model(name, unload_dependents=True)
    c.unload_model("absent")
    with pytest.raises(InferenceServerException) as e:
        c.unload_model("rope")
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "built in" in e.value.message()
    assert c.is_model_ready("rope")
    c.load_model(name)
    assert c.is_model_ready(name)
    c.infer(name, [logits])
