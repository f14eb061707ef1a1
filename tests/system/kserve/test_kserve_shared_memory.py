"""The system shared-memory extension driven by the real Triton client
(tritonclient 2.40.0 and its tritonclient.utils.shared_memory) and by
perf_analyzer --shared-memory=system, against a posenc-server started with
--enable_system_shared_memory (and two repository models perf_analyzer can
drive): tensors in and out of /dev/shm checked
against the float64 reference, mixed with the socket, the registry's
status, hostile registrations and references, a caller truncating its
object after registering it, and unregistering while requests use a region.
Seeded (the seed is printed; POSENC_SEED replays).

Environment: as test_kserve_clients.py (run_kserve_tests.sh sets it).
"""

import base64
import json
import os
import re
import subprocess
import tempfile
import threading
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as tc
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from test_kserve_clients import SEED, assert_close, input_of, quantize, rope_reference

PREFIX = f"posenc_shm_{os.getpid()}"


# Repository models taking only the tensor worked on, each required, so
# that perf_analyzer (which refuses optional inputs with shared memory) can
# drive the sinusoidal encoding and the bias too.
MODEL_FILES = {
    "sinusoidal-x": {"operation": "sinusoidal", "inputs": ["x"]},
    "alibi-add": {"operation": "attention_bias", "inputs": ["logits"],
                  "parameters": {"causal": True}},
}


@pytest.fixture(scope="module")
def shm_server():
    work = tempfile.mkdtemp(prefix="posenc-kserve-shm-")
    models = os.path.join(work, "models")
    os.mkdir(models)
    for name, model in MODEL_FILES.items():
        with open(os.path.join(models, name + ".json"), "w") as f:
            json.dump(model, f)
    port_file = os.path.join(work, "port")
    log = open(os.path.join(work, "server.log"), "w+")
    proc = subprocess.Popen(
        [os.environ["POSENC_SERVER"], "--listen=127.0.0.1:0", f"--port_file={port_file}",
         "--metrics_listen=127.0.0.1:0", "--log_level=info", "--threads=2",
         "--enable_system_shared_memory", "--enable_cuda_shared_memory",
         "--max_shared_memory_regions=16", f"--model_dir={models}"],
        stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 30
    while not (os.path.exists(port_file) and open(port_file).read().strip()):
        assert proc.poll() is None, "posenc-server exited at start-up"
        assert time.time() < deadline, "posenc-server did not start in 30 s"
        time.sleep(0.05)
    metrics_port = None
    while metrics_port is None and time.time() < deadline:
        log.seek(0)
        m = re.search(r"metrics on port (\d+)", log.read())
        metrics_port = m and m.group(1)
        time.sleep(0.05)
    yield {"url": "127.0.0.1:" + open(port_file).read().strip(),
           "metrics": f"http://127.0.0.1:{metrics_port}/metrics"}
    proc.terminate()
    assert proc.wait(timeout=30) == 0


@pytest.fixture
def client(shm_server):
    c = tc.InferenceServerClient(url=shm_server["url"])
    c.unregister_system_shared_memory()
    yield c
    c.unregister_system_shared_memory()
    c.close()


class Region:
    """A /dev/shm object made with tritonclient's own helper; removed after."""

    def __init__(self, name, size):
        self.name, self.key, self.size = name, f"/{PREFIX}_{name}", size
        self.handle = shm.create_shared_memory_region(name, self.key, size)

    def put(self, arrays, offset=0):
        shm.set_shared_memory_region(self.handle, arrays, offset)

    def get(self, dtype, shape, offset=0):
        return shm.get_contents_as_numpy(self.handle, dtype, shape, offset).copy()

    def close(self):
        shm.destroy_shared_memory_region(self.handle)


@pytest.fixture
def regions():
    made = []

    def make(name, size):
        made.append(Region(name, size))
        return made[-1]

    yield make
    for r in made:
        r.close()


def shm_input(name, array, datatype, region, offset=0):
    t = tc.InferInput(name, list(array.shape), datatype)
    t.set_shared_memory(region, array.nbytes, offset)
    return t


def shm_output(name, region, size, offset=0):
    o = tc.InferRequestedOutput(name)
    o.set_shared_memory(region, size, offset)
    return o


def infer_error(client, *args, **kw):
    with pytest.raises(InferenceServerException) as e:
        client.infer(*args, **kw)
    return e.value.status(), e.value.message()


def test_server_advertises_the_extension(client):
    extensions = client.get_server_metadata().extensions
    assert "system_shared_memory" in extensions
    assert "cuda_shared_memory" in extensions


def test_cuda_shared_memory_without_a_gpu_says_why(client, regions):
    # This server has no GPU (CI; on a GPU host the handle, all zeros, is a
    # forged one and refused as such). Either way nothing is registered and
    # system regions keep working beside it.
    handle = base64.b64encode(bytes(64))
    with pytest.raises(InferenceServerException) as e:
        client.register_cuda_shared_memory("g", handle, 0, 1024)
    assert e.value.status() in ("StatusCode.FAILED_PRECONDITION", "StatusCode.INVALID_ARGUMENT")
    assert '"g"' in e.value.message()
    if e.value.status() == "StatusCode.FAILED_PRECONDITION":
        assert "no GPU" in e.value.message()
    assert client.get_cuda_shared_memory_status(as_json=True) in ({}, {"regions": {}})
    client.unregister_cuda_shared_memory("g")  # not registered: not an error, as in Triton
    client.unregister_cuda_shared_memory()
    with pytest.raises(InferenceServerException) as e:
        client.get_cuda_shared_memory_status("g")
    assert e.value.status() == "StatusCode.NOT_FOUND"
    r = regions("beside_cuda", 64)
    client.register_system_shared_memory("beside_cuda", r.key, r.size)
    assert list(client.get_system_shared_memory_status(as_json=True)["regions"]) == ["beside_cuda"]
    assert client.get_cuda_shared_memory_status(as_json=True) in ({}, {"regions": {}})


@pytest.mark.parametrize("datatype", ["FP32", "FP16"])
def test_rope_in_and_out_of_shared_memory(client, regions, datatype):
    rng = np.random.default_rng([SEED, 20, len(datatype)])
    np_type = {"FP32": np.float32, "FP16": np.float16}[datatype]
    q = quantize(rng.standard_normal((2, 33, 4, 64)), datatype).astype(np_type)
    k = quantize(rng.standard_normal((2, 33, 2, 64)), datatype).astype(np_type)
    # Both inputs in one region (key after query, at an offset), both
    # outputs in another, which starts as poison.
    inp = regions("in", q.nbytes + k.nbytes + 128)
    inp.put([q, k], 128)
    out = regions("out", q.nbytes + k.nbytes)
    out.put([np.full(q.size + k.size, np.nan, np_type)])
    client.register_system_shared_memory("in", inp.key, inp.size)
    client.register_system_shared_memory("out", out.key, out.size)
    r = client.infer("rope",
                     [shm_input("query", q, datatype, "in", 128),
                      shm_input("key", k, datatype, "in", 128 + q.nbytes)],
                     outputs=[shm_output("query_out", "out", q.nbytes),
                              shm_output("key_out", "out", k.nbytes, q.nbytes)],
                     parameters={"base": "10000", "style": "gptj"})
    resp = r.get_response()
    # One raw entry per output, empty for those in shared memory (the C++
    # client reads entry i for output i).
    assert list(resp.raw_output_contents) == [b"", b""]
    for o, x, off in ((resp.outputs[0], q, 0), (resp.outputs[1], k, q.nbytes)):
        assert list(o.shape) == list(x.shape) and o.datatype == datatype
        assert o.parameters["shared_memory_region"].string_param == "out"
        assert o.parameters["shared_memory_byte_size"].int64_param == x.nbytes
        assert o.parameters["shared_memory_offset"].int64_param == off
    pos = np.broadcast_to(np.arange(33, dtype=np.float64), (2, 33))
    for name, x, off in (("query_out", q, 0), ("key_out", k, q.nbytes)):
        got = out.get(np_type, x.shape, off).astype(np.float64)
        want = rope_reference(x.astype(np.float64), pos, 10000.0, 64, "gptj")
        assert_close(got, want, datatype, f"shared memory {name}")
    # The inputs are the caller's: left as they were.
    np.testing.assert_array_equal(inp.get(np_type, q.shape, 128), q)


def test_shared_memory_mixed_with_the_socket(client, regions):
    rng = np.random.default_rng([SEED, 21])
    q = rng.standard_normal((1, 9, 2, 16)).astype(np.float32)
    k = rng.standard_normal((1, 9, 1, 16)).astype(np.float32)
    pos = rng.integers(0, 1000, (1, 9)).astype(np.int64)
    inp = regions("min", k.nbytes)
    inp.put([k])
    out = regions("mout", q.nbytes)
    client.register_system_shared_memory("min", inp.key, inp.size)
    client.register_system_shared_memory("mout", out.key, out.size)
    # key from shared memory between two inputs on the socket; query_out to
    # shared memory, key_out on the socket.
    r = client.infer("rope",
                     [input_of("query", q, "FP32"), shm_input("key", k, "FP32", "min"),
                      input_of("position_ids", pos, "INT64")],
                     outputs=[shm_output("query_out", "mout", q.nbytes),
                              tc.InferRequestedOutput("key_out")],
                     parameters={"base": "500"})
    resp = r.get_response()
    assert [o.name for o in resp.outputs] == ["query_out", "key_out"]
    assert resp.raw_output_contents[0] == b"" and len(resp.raw_output_contents[1]) == k.nbytes
    p = pos.astype(np.float64)
    assert_close(r.as_numpy("key_out").astype(np.float64),
                 rope_reference(k.astype(np.float64), p, 500.0, 16, "neox"), "FP32", "key_out")
    assert_close(out.get(np.float32, q.shape).astype(np.float64),
                 rope_reference(q.astype(np.float64), p, 500.0, 16, "neox"), "FP32", "query_out")


def test_bias_from_one_slice_into_another(client, regions):
    # Logits in one region, the bias asked for in another (the CPU adds it
    # block by block): the answer the same logits get over the socket, bit
    # for bit, and the logits as they were. Also through a repository model
    # taking only logits, which refuses the inputs it leaves out.
    rng = np.random.default_rng([SEED, 22])
    logits = rng.standard_normal((2, 4, 33, 40)).astype(np.float32)
    want = client.infer("attention_bias", [input_of("logits", logits, "FP32")],
                        parameters={"causal": True}).as_numpy("bias")
    inp = regions("lin", logits.nbytes)
    inp.put([logits])
    out = regions("lout", logits.nbytes)
    client.register_system_shared_memory("lin", inp.key, inp.size)
    client.register_system_shared_memory("lout", out.key, out.size)
    for model, parameters in (("attention_bias", {"causal": True}), ("alibi-add", {})):
        out.put([np.full(logits.size, np.nan, np.float32)])
        r = client.infer(model, [shm_input("logits", logits, "FP32", "lin")],
                         outputs=[shm_output("bias", "lout", logits.nbytes)],
                         parameters=parameters)
        assert r.get_response().raw_output_contents[0] == b""
        np.testing.assert_array_equal(out.get(np.float32, logits.shape), want, err_msg=model)
        np.testing.assert_array_equal(inp.get(np.float32, logits.shape), logits)
    k_lens = np.array([40, 30], dtype=np.int64)
    status, message = infer_error(
        client, "alibi-add",
        [shm_input("logits", logits, "FP32", "lin"), input_of("k_lens", k_lens, "INT64")])
    assert status == "StatusCode.INVALID_ARGUMENT" and "k_lens" in message, message


def test_status_and_unregister(client, regions):
    a, b = regions("sa", 4096), regions("sb", 1024)
    client.register_system_shared_memory("sa", a.key, 1000, offset=96)
    client.register_system_shared_memory("sb", b.key, 1024)
    status = client.get_system_shared_memory_status()
    assert sorted(status.regions) == ["sa", "sb"]
    s = status.regions["sa"]
    assert (s.name, s.key, s.offset, s.byte_size) == ("sa", a.key, 96, 1000)
    assert list(client.get_system_shared_memory_status("sb").regions) == ["sb"]
    client.unregister_system_shared_memory("sa")
    client.unregister_system_shared_memory("sa")  # again: not an error
    assert list(client.get_system_shared_memory_status().regions) == ["sb"]
    with pytest.raises(InferenceServerException) as e:
        client.get_system_shared_memory_status("sa")
    assert e.value.status() == "StatusCode.NOT_FOUND"
    client.unregister_system_shared_memory()
    assert len(client.get_system_shared_memory_status().regions) == 0


def test_hostile_registrations_are_refused(client, regions):
    r = regions("h", 4096)

    def register(name, key, size, offset=0):
        with pytest.raises(InferenceServerException) as e:
            client.register_system_shared_memory(name, key, size, offset=offset)
        return e.value.status(), e.value.message()

    for key in ["/../etc/passwd", "/a/b", "..", "/", "/dev/shm" + r.key, "/x y"]:
        code, msg = register("bad", key, 1)
        assert code == "StatusCode.INVALID_ARGUMENT", (key, msg)
        assert "/dev/shm" in msg, msg
    assert register("bad", f"/{PREFIX}_nothing_here", 1)[0] == "StatusCode.NOT_FOUND"
    assert register("big", r.key, 4097)[0] == "StatusCode.INVALID_ARGUMENT"
    assert register("big", r.key, 1, offset=4096)[0] == "StatusCode.INVALID_ARGUMENT"
    assert register("big", r.key, 2**63, offset=2**63)[0] == "StatusCode.INVALID_ARGUMENT"
    client.register_system_shared_memory("h", r.key, 4096)
    assert register("h", r.key, 16)[0] == "StatusCode.ALREADY_EXISTS"
    # The cap on regions (--max_shared_memory_regions=16).
    for i in range(15):
        client.register_system_shared_memory(f"h{i}", r.key, 16)
    code, msg = register("h15", r.key, 16)
    assert code == "StatusCode.RESOURCE_EXHAUSTED" and "--max_shared_memory_regions" in msg
    assert len(client.get_system_shared_memory_status().regions) == 16


def test_hostile_references_are_refused(client, regions):
    q = np.ones((1, 4, 2, 8), np.float32)
    r = regions("ref", q.nbytes)
    r.put([q])
    client.register_system_shared_memory("ref", r.key, q.nbytes)
    half = tc.InferInput("query", list(q.shape), "FP32")
    half.set_shared_memory("ref", q.nbytes // 2)
    cases = [
        ([shm_input("query", q, "FP32", "nobody")], None, "NOT_FOUND", "nobody"),
        # A slice beyond the region, and a size that does not match the shape.
        ([shm_input("query", q, "FP32", "ref", 4)], None, "INVALID_ARGUMENT", "within"),
        ([half], None, "INVALID_ARGUMENT", "query"),
        ([shm_input("query", q, "FP32", "ref")], [shm_output("query_out", "ref", q.nbytes - 4)],
         "INVALID_ARGUMENT", "shared_memory_byte_size"),
        ([shm_input("query", q, "FP32", "ref")], [shm_output("query_out", "ref", 8, q.nbytes)],
         "INVALID_ARGUMENT", "within"),
    ]
    for inputs, outputs, code, word in cases:
        got, msg = infer_error(client, "rope", inputs, outputs=outputs)
        assert got == f"StatusCode.{code}" and word in msg, (code, got, msg)
    # Refused calls wrote nothing, in place either (the output too small for
    # the query it shares its slice with was once refused after the rotation).
    np.testing.assert_array_equal(r.get(np.float32, q.shape), q)
    # Raw contents must then cover exactly the inputs on the socket.
    bad = tc.InferInput("query", list(q.shape), "FP32")
    bad.set_shared_memory("ref", q.nbytes)
    bad._raw_content = q.tobytes()  # both ways at once
    code, msg = infer_error(client, "rope", [bad])
    assert code == "StatusCode.INVALID_ARGUMENT" and "raw_input_contents" in msg, msg


def test_a_refused_output_leaves_every_slice_as_it_was(client, regions):
    """An output whose slice is too small is found before any work, so a
    refused call has not already rotated (or written) another output that
    fitted: a caller who fixes the slice and calls again must not rotate
    its query twice."""
    rng = np.random.default_rng([SEED, 31])
    q = rng.standard_normal((1, 4, 2, 8)).astype(np.float32)
    k = rng.standard_normal((1, 4, 1, 8)).astype(np.float32)
    r = regions("refused", 2 * q.nbytes)
    r.put([q])
    client.register_system_shared_memory("refused", r.key, 2 * q.nbytes)
    # query in place in its slice, key from the socket into a slice too small.
    code, msg = infer_error(
        client, "rope", [shm_input("query", q, "FP32", "refused"), input_of("key", k, "FP32")],
        outputs=[shm_output("query_out", "refused", q.nbytes),
                 shm_output("key_out", "refused", k.nbytes - 4, q.nbytes)])
    assert code == "StatusCode.INVALID_ARGUMENT" and "key_out" in msg, msg
    np.testing.assert_array_equal(r.get(np.float32, q.shape), q)
    # Both from the socket, query_out's slice right and key_out's too small.
    poison = np.full(q.shape, 7.5, np.float32)
    r.put([poison])
    code, msg = infer_error(
        client, "rope", [input_of("query", q, "FP32"), input_of("key", k, "FP32")],
        outputs=[shm_output("query_out", "refused", q.nbytes),
                 shm_output("key_out", "refused", k.nbytes - 4, q.nbytes)])
    assert code == "StatusCode.INVALID_ARGUMENT" and "key_out" in msg, msg
    np.testing.assert_array_equal(r.get(np.float32, q.shape), poison)
    # The bias added to logits in place, its slopes' slice too small.
    logits = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    r.put([logits])
    code, msg = infer_error(
        client, "attention_bias", [shm_input("logits", logits, "FP32", "refused")],
        outputs=[shm_output("bias", "refused", logits.nbytes),
                 shm_output("slopes", "refused", 8, logits.nbytes)],
        parameters={"causal": True})
    assert code == "StatusCode.INVALID_ARGUMENT" and "slopes" in msg, msg
    np.testing.assert_array_equal(r.get(np.float32, logits.shape), logits)
    # With room for both, the same call adds the bias in place.
    result = client.infer(
        "attention_bias", [shm_input("logits", logits, "FP32", "refused")],
        outputs=[shm_output("bias", "refused", logits.nbytes),
                 shm_output("slopes", "refused", 16, logits.nbytes)],
        parameters={"causal": True})
    assert result.get_output("slopes") is not None
    assert not np.array_equal(r.get(np.float32, logits.shape), logits)
    client.unregister_system_shared_memory("refused")


def test_outputs_sharing_bytes_are_refused_before_any_work(client, regions):
    """Two outputs whose slices share bytes cannot both hold their results
    (one would land over the other): refused up front, as posenc.v1 refuses
    them, with every slice left as it was; slices side by side work."""
    rng = np.random.default_rng([SEED, 32])
    q = rng.standard_normal((1, 4, 2, 8)).astype(np.float32)
    k = rng.standard_normal((1, 4, 1, 8)).astype(np.float32)
    r = regions("apart", 3 * q.nbytes)
    client.register_system_shared_memory("apart", r.key, r.size)
    poison = np.full(3 * q.size, 7.5, np.float32)
    # query in place at 0; key_out's slice starts inside query's.
    r.put([q])
    code, msg = infer_error(
        client, "rope", [shm_input("query", q, "FP32", "apart"), input_of("key", k, "FP32")],
        outputs=[shm_output("query_out", "apart", q.nbytes),
                 shm_output("key_out", "apart", k.nbytes, q.nbytes - 4)])
    assert code == "StatusCode.INVALID_ARGUMENT", msg
    assert "query_out" in msg and "key_out" in msg and "share bytes" in msg, msg
    np.testing.assert_array_equal(r.get(np.float32, q.shape), q)
    # Both from the socket, both outputs on one slice.
    r.put([poison])
    code, msg = infer_error(
        client, "rope", [input_of("query", q, "FP32"), input_of("key", k, "FP32")],
        outputs=[shm_output("query_out", "apart", q.nbytes, 8),
                 shm_output("key_out", "apart", k.nbytes, 8)])
    assert code == "StatusCode.INVALID_ARGUMENT" and "share bytes" in msg, msg
    np.testing.assert_array_equal(r.get(np.float32, poison.shape), poison)
    # The bias built into a slice that holds the slopes' too.
    code, msg = infer_error(
        client, "attention_bias", [],
        outputs=[shm_output("bias", "apart", r.size), shm_output("slopes", "apart", 16, 64)],
        parameters={"causal": True, "num_heads": 2, "q_len": 4, "k_len": 4})
    assert code == "StatusCode.INVALID_ARGUMENT" and "share bytes" in msg, msg
    np.testing.assert_array_equal(r.get(np.float32, poison.shape), poison)
    # Side by side, the RoPE call writes both.
    result = client.infer(
        "rope", [input_of("query", q, "FP32"), input_of("key", k, "FP32")],
        outputs=[shm_output("query_out", "apart", q.nbytes),
                 shm_output("key_out", "apart", k.nbytes, q.nbytes)])
    assert result.get_output("key_out") is not None
    assert not np.array_equal(r.get(np.float32, q.shape), q)
    assert not np.array_equal(r.get(np.float32, k.shape, q.nbytes), k)
    assert np.array_equal(r.get(np.float32, (4,), q.nbytes + k.nbytes), poison[:4])
    client.unregister_system_shared_memory("apart")


def test_truncated_after_registering(client, regions):
    rng = np.random.default_rng([SEED, 22])
    q = rng.standard_normal((1, 64, 4, 64)).astype(np.float32)
    r = regions("trunc", q.nbytes)
    r.put([q])
    client.register_system_shared_memory("trunc", r.key, q.nbytes)
    os.truncate("/dev/shm" + r.key, 4096)
    # The server maps the region; the pages past the new end fault, and the
    # region is void from then on (FAILED_PRECONDITION), never a signal.
    code, msg = infer_error(client, "rope", [shm_input("query", q, "FP32", "trunc")],
                            outputs=[shm_output("query_out", "trunc", q.nbytes)])
    assert code == "StatusCode.FAILED_PRECONDITION" and "truncated" in msg, msg
    # Outputs too: the input read from the socket, the output region void.
    code, msg = infer_error(client, "rope", [input_of("query", q, "FP32")],
                            outputs=[shm_output("query_out", "trunc", q.nbytes)])
    assert code == "StatusCode.FAILED_PRECONDITION" and "truncated" in msg, msg
    assert os.stat("/dev/shm" + r.key).st_size == 4096  # not grown back
    assert client.is_server_live()
    # Registered again, the object works as before.
    client.unregister_system_shared_memory("trunc")
    os.truncate("/dev/shm" + r.key, q.nbytes)
    r.put([q])
    client.register_system_shared_memory("trunc", r.key, q.nbytes)
    client.infer("rope", [shm_input("query", q, "FP32", "trunc")],
                 outputs=[shm_output("query_out", "trunc", q.nbytes)])
    client.unregister_system_shared_memory("trunc")


def test_unregister_while_requests_use_the_region(client, regions, shm_server):
    rng = np.random.default_rng([SEED, 23])
    q = rng.standard_normal((1, 256, 8, 64)).astype(np.float32)
    r = regions("busy", 2 * q.nbytes)
    r.put([q])
    want = rope_reference(q.astype(np.float64),
                          np.arange(256, dtype=np.float64)[None, :], 10000.0, 64, "neox")
    outcomes = []

    def caller():
        c = tc.InferenceServerClient(url=shm_server["url"])
        for _ in range(30):
            try:
                c.infer("rope", [shm_input("query", q, "FP32", "busy")],
                        outputs=[shm_output("query_out", "busy", q.nbytes, q.nbytes)])
                outcomes.append("OK")
            except InferenceServerException as e:
                outcomes.append(e.status())
        c.close()

    callers = [threading.Thread(target=caller) for _ in range(3)]
    for t in callers:
        t.start()
    for _ in range(60):
        client.register_system_shared_memory("busy", r.key, r.size)
        time.sleep(0.002)
        client.unregister_system_shared_memory("busy")
    for t in callers:
        t.join(timeout=60)
    assert set(outcomes) <= {"OK", "StatusCode.NOT_FOUND"}, outcomes
    assert len(outcomes) == 90
    if "OK" in outcomes:
        assert_close(r.get(np.float32, q.shape, q.nbytes).astype(np.float64), want, "FP32",
                     "rope through a region unregistered meanwhile")
    assert client.is_server_live()


def test_callers_sharing_one_output_slice_only_ever_see_results(client, regions, shm_server):
    # perf_analyzer gives all its concurrent requests one output region per
    # output. As with Triton, every call writes only finished values there:
    # each caller, reading the slice right after its own call while the
    # others keep writing it, finds the rotated query (each input is the
    # same), never the raw input nor a query rotated twice.
    rng = np.random.default_rng([SEED, 26])
    q = rng.standard_normal((1, 128, 8, 64)).astype(np.float32)
    r = regions("shared_out", 2 * q.nbytes)
    r.put([q])
    client.register_system_shared_memory("shared_out", r.key, r.size)
    want = rope_reference(q.astype(np.float64),
                          np.arange(128, dtype=np.float64)[None, :], 10000.0, 64, "neox")
    errors = []

    def caller():
        c = tc.InferenceServerClient(url=shm_server["url"])
        for _ in range(40):
            c.infer("rope", [shm_input("query", q, "FP32", "shared_out")],
                    outputs=[shm_output("query_out", "shared_out", q.nbytes, q.nbytes)])
            got = r.get(np.float32, q.shape, q.nbytes).astype(np.float64)
            err = np.max(np.abs(got - want) / (1.0 + np.abs(want)))
            if err > 2e-5:
                errors.append(err)
        c.close()

    callers = [threading.Thread(target=caller) for _ in range(4)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(timeout=120)
    assert not errors, f"{len(errors)} of 160 reads were not the rotated query (seed {SEED})"
    assert_close(r.get(np.float32, q.shape).astype(np.float64), q.astype(np.float64), "FP32",
                 "the input slice, which the calls only read")


def test_metrics_count_shared_memory_bytes(client, regions, shm_server):
    def bytes_in():
        text = urllib.request.urlopen(shm_server["metrics"], timeout=10).read().decode()
        return sum(float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith("posenc_bytes_total{")
                   and 'method="ModelInfer"' in line and 'direction="in"' in line)

    q = np.ones((1, 128, 8, 64), np.float32)
    r = regions("met", q.nbytes)
    r.put([q])
    client.register_system_shared_memory("met", r.key, q.nbytes)
    before = bytes_in()
    client.infer("rope", [shm_input("query", q, "FP32", "met")],
                 outputs=[shm_output("query_out", "met", q.nbytes)])
    assert bytes_in() - before >= q.nbytes


@pytest.mark.parametrize("model,shapes", [
    ("rope_qk", {"query": [1, 128, 8, 64], "key": [1, 128, 2, 64]}),
    ("sinusoidal-x", {"x": [1, 128, 512]}),
    ("alibi-add", {"logits": [1, 8, 128, 128]}),
])
def test_perf_analyzer_with_system_shared_memory(shm_server, client, model, shapes):
    # perf_analyzer refuses shared memory for models with optional inputs,
    # so it drives rope_qk (query and key, both required) and repository
    # models that take only their tensor (MODEL_FILES); random data.
    largest = max(int(np.prod(shape)) * 4 for shape in shapes.values())
    cmd = [os.environ["PERF_ANALYZER"], "-m", model, "-i", "grpc", "-u", shm_server["url"]]
    for name, shape in shapes.items():
        cmd += ["--shape", f"{name}:" + ",".join(map(str, shape))]
    cmd += ["--shared-memory=system", f"--output-shared-memory-size={largest}",
           "--concurrency-range=1:2", "--measurement-interval=1000",
           "--stability-percentage=999", "--max-trials=3"]
    print(" ".join(cmd))
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    print(run.stdout[-1500:], run.stderr[-2000:])
    assert run.returncode == 0, run.stdout[-1500:] + run.stderr
    rates = [float(x) for x in re.findall(r"Concurrency: \d+, throughput: ([\d.]+) infer/sec",
                                          run.stdout)]
    assert len(rates) == 2 and min(rates) > 0, run.stdout
    assert re.search(r"Successful request count: [1-9]", run.stdout), run.stdout
    # Its requests went through shared memory: what it registered was
    # unregistered again, and the server counted the tensor bytes.
    assert len(client.get_system_shared_memory_status().regions) == 0
