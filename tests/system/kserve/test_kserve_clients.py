"""posenc's KServe v2 front driven by the real Triton client (tritonclient
2.40.0 from PyPI) against a real posenc-server process: health, metadata,
configuration, statistics, every model checked against a float64 numpy
reference on seeded random inputs (the seed is printed; set POSENC_SEED to
replay), errors by code, the stream, typed contents, and perf_analyzer.

Environment: POSENC_SERVER (the binary), PERF_ANALYZER (the binary, with
LD_LIBRARY_PATH reaching libcudart.so.12). run_kserve_tests.sh sets both.
"""

import base64
import contextlib
import json
import os
import random
import re
import struct
import subprocess
import tempfile
import time

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tc
from google.protobuf import descriptor_pb2
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

SEED = int(os.environ.get("POSENC_SEED", random.SystemRandom().randrange(2**31)))
print(f"kserve tests: seed {SEED} (POSENC_SEED={SEED} replays)")

TABLE_ROWS, TABLE_DIM = 64, 24


def write_safetensors(path, name, table):
    """A one-tensor .safetensors file (8-byte header size, JSON, data)."""
    data = table.astype("<f4").tobytes()
    header = json.dumps(
        {name: {"dtype": "F32", "shape": list(table.shape), "data_offsets": [0, len(data)]}}
    ).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + data)


@pytest.fixture(scope="module")
def server():
    work = tempfile.mkdtemp(prefix="posenc-kserve-")
    tables = os.path.join(work, "tables")
    os.mkdir(tables)
    table = np.random.default_rng(SEED).standard_normal((TABLE_ROWS, TABLE_DIM))
    write_safetensors(os.path.join(tables, "t.safetensors"), "wpe", table)
    port_file = os.path.join(work, "port")
    proc = subprocess.Popen(
        [os.environ["POSENC_SERVER"], "--listen=127.0.0.1:0", f"--port_file={port_file}",
         "--metrics_listen=", f"--table_dir={tables}", "--log_level=warn", "--threads=2"],
    )
    deadline = time.time() + 30
    while not (os.path.exists(port_file) and open(port_file).read().strip()):
        assert proc.poll() is None, "posenc-server exited at start-up"
        assert time.time() < deadline, "posenc-server did not start in 30 s"
        time.sleep(0.05)
    url = "127.0.0.1:" + open(port_file).read().strip()
    yield {"url": url, "table": table.astype(np.float32).astype(np.float64)}
    proc.terminate()
    assert proc.wait(timeout=30) == 0


@pytest.fixture(scope="module")
def client(server):
    c = tc.InferenceServerClient(url=server["url"])
    yield c
    c.close()


# --- float64 references (written from SPEC §2, not from posenc's code) ----


def to_bf16(x):
    """float32 -> bfloat16 bits, round to nearest even, as float32 values."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return (u.astype(np.uint32) << 16).view(np.float32)


def quantize(x, datatype):
    if datatype == "FP16":
        return x.astype(np.float16).astype(np.float64)
    if datatype == "BF16":
        return to_bf16(x).astype(np.float64)
    return x.astype(np.float32).astype(np.float64)


def rope_reference(x, pos, base, rotary_dim, style):
    """x [b, s, h, d] float64, pos [b, s]: rotate the first rotary_dim dims."""
    half = rotary_dim // 2
    inv_freq = base ** (-np.arange(half, dtype=np.float64) * 2.0 / rotary_dim)
    ang = pos[:, :, None, None] * inv_freq  # [b, s, 1, half]
    cos, sin = np.cos(ang), np.sin(ang)
    y = x.copy()
    if style == "neox":
        a, b = x[..., :half], x[..., half:rotary_dim]
        y[..., :half] = a * cos - b * sin
        y[..., half:rotary_dim] = b * cos + a * sin
    else:
        a, b = x[..., 0:rotary_dim:2], x[..., 1:rotary_dim:2]
        y[..., 0:rotary_dim:2] = a * cos - b * sin
        y[..., 1:rotary_dim:2] = b * cos + a * sin
    return y


def sinusoidal_reference(x, pos, base, x_scale):
    """Interleaved (Vaswani) PE on x [b, s, d], d even."""
    d = x.shape[-1]
    w = base ** (-np.arange(d // 2, dtype=np.float64) * 2.0 / d)
    pe = np.zeros(x.shape[:2] + (d,))
    pe[..., 0::2] = np.sin(pos[..., None] * w)
    pe[..., 1::2] = np.cos(pos[..., None] * w)
    return x * x_scale + pe


def alibi_slopes(n):
    """n a power of two: 2^(-8h/n), h = 1..n."""
    return np.array([2.0 ** (-8.0 * h / n) for h in range(1, n + 1)])


TOLERANCE = {"FP32": 2e-5, "FP16": 2e-3, "BF16": 1.6e-2}


def assert_close(got, want, datatype, what):
    err = np.max(np.abs(got - want) / (1.0 + np.abs(want))) if want.size else 0.0
    assert err <= TOLERANCE[datatype], f"{what}: max relative error {err} (seed {SEED})"


def input_of(name, array, datatype):
    t = tc.InferInput(name, list(array.shape), datatype)
    t.set_data_from_numpy(array.astype(np.float32) if datatype == "BF16" else array)
    return t


NP_TYPE = {"FP32": np.float32, "FP16": np.float16, "BF16": np.float32}

# --- the protocol itself ---------------------------------------------------


def messages_of(file_protos):
    """Every message (nested ones and map entries too) by full name."""
    out = {}

    def walk(prefix, types):
        for m in types:
            out[f"{prefix}.{m.name}"] = m
            walk(f"{prefix}.{m.name}", m.nested_type)

    for f in file_protos:
        walk(f.package, f.message_type)
    return out


def test_our_proto_is_wire_compatible_with_tritonclients():
    """Each message, field, enum value and method of proto/kserve exists in
    the protocol tritonclient was generated from, with the same number,
    type, label and message type (ours may leave fields out, never differ)."""
    with open(os.environ["POSENC_KSERVE_DESCRIPTORS"], "rb") as f:
        ours = [p for p in descriptor_pb2.FileDescriptorSet.FromString(f.read()).file
                if p.package == "inference"]
    theirs = []
    for module in (service_pb2, model_config_pb2):
        p = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(p)
        theirs.append(p)
    our_messages, their_messages = messages_of(ours), messages_of(theirs)
    assert len(our_messages) >= 35
    for name, mine in our_messages.items():
        assert name in their_messages, f"{name} is not in the protocol"
        fields = {f.name: f for f in their_messages[name].field}
        for f in mine.field:
            t = fields.get(f.name)
            assert t is not None, f"{name}.{f.name} is not in the protocol"
            assert (f.number, f.type, f.label, f.type_name, f.oneof_index) == (
                t.number, t.type, t.label, t.type_name, t.oneof_index), f"{name}.{f.name}"
    our_enum = {v.name: v.number for p in ours for e in p.enum_type for v in e.value}
    their_enum = {v.name: v.number for p in theirs for e in p.enum_type if e.name == "DataType"
                  for v in e.value}
    assert our_enum == their_enum
    (service,) = [s for p in ours for s in p.service]
    (their_service,) = [s for p in theirs for s in p.service]
    assert service.name == their_service.name == "GRPCInferenceService"
    methods = {m.name: m for m in their_service.method}
    assert len(service.method) == 20
    for m in service.method:
        t = methods[m.name]
        assert (m.input_type, m.output_type, m.client_streaming, m.server_streaming) == (
            t.input_type, t.output_type, t.client_streaming, t.server_streaming), m.name


def test_every_method_of_the_protocol_is_served_and_no_other(server):
    with grpc.insecure_channel(server["url"]) as ch:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
        for name in service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods_by_name:
            if name in ("ModelInfer", "ModelStreamInfer"):
                continue
            request = getattr(service_pb2, name + "Request", None)
            if request is None:  # the request type does not follow the name
                continue
            try:
                getattr(stub, name)(request(), timeout=10)
            except grpc.RpcError as e:
                assert e.code() != grpc.StatusCode.UNIMPLEMENTED, name
        made_up = ch.unary_unary("/inference.GRPCInferenceService/ModelTrain")
        with pytest.raises(grpc.RpcError) as e:
            made_up(b"", timeout=10)
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED


@contextlib.contextmanager
def server_with_log(tmp_path, log_level):
    """A posenc-server of its own (one thread, any free port) whose log goes
    to tmp_path/log.txt: yields a client and the log's path, then stops the
    server, which must exit 0."""
    port_file, log = tmp_path / "port", tmp_path / "log.txt"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [os.environ["POSENC_SERVER"], "--listen=127.0.0.1:0", f"--port_file={port_file}",
             "--metrics_listen=", f"--log_level={log_level}", "--threads=1"],
            stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            assert proc.poll() is None, "posenc-server exited at start-up"
            assert time.time() < deadline, "posenc-server did not start in 30 s"
            time.sleep(0.05)
        c = tc.InferenceServerClient(url="127.0.0.1:" + port_file.read_text().strip())
        try:
            yield c, log
        finally:
            c.close()
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0


def test_log_settings_turn_rejection_lines_on_and_off(tmp_path):
    """Triton's logging extension on a server started at --log_level=warn:
    the settings read back, verbose logging shows why a call was rejected
    (with its request id) until it is turned off again, the change is
    logged with the caller, and what posenc cannot do is refused by name."""
    with server_with_log(tmp_path, "warn") as (c, log):
        assert "logging" in c.get_server_metadata().extensions

        def settings(resp):
            return {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in resp.settings.items()}

        assert settings(c.get_log_settings()) == {
            "log_file": "", "log_info": False, "log_warning": True, "log_error": True,
            "log_verbose_level": 0, "log_format": "text", "log_level": "warn"}

        def reject(request_id):
            q = tc.InferInput("query", [1, 2, 1, 4], "FP32")
            q.set_data_from_numpy(np.zeros((1, 2, 1, 4), np.float32))
            with pytest.raises(InferenceServerException) as e:  # base must exceed 1
                c.infer("rope", [q], parameters={"base": "0.5"}, request_id=request_id)
            assert e.value.status() == "StatusCode.INVALID_ARGUMENT"

        reject("quiet-1")
        after = settings(c.update_log_settings({"log_info": True, "log_verbose_level": 1}))
        assert (after["log_level"], after["log_verbose_level"], after["log_info"]) == ("debug", 1, True)
        reject("loud-2")
        deadline = time.time() + 10
        while "request_id=loud-2" not in log.read_text(errors="replace"):
            assert time.time() < deadline, log.read_text(errors="replace")
            time.sleep(0.05)
        text = log.read_text(errors="replace")
        assert "ModelInfer rejected: INVALID_ARGUMENT" in text
        assert "quiet-1" not in text
        assert re.search(r"log settings changed by ipv4:127\.0\.0\.1:\d+: level warn -> debug", text)

        for bad, words in (({"log_file": "/tmp/posenc.log"}, "log_file must be empty"),
                           ({"log_warning": False}, "threshold"),
                           ({"log_format": "ISO8601"}, "log_format must be text or json"),
                           ({"log_rotation": True}, "unknown log setting 'log_rotation'")):
            with pytest.raises(InferenceServerException) as e:
                c.update_log_settings(bad)
            assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
            assert words in e.value.message()
        assert settings(c.get_log_settings())["log_level"] == "debug"

        c.update_log_settings({"log_verbose_level": 0, "log_info": False})
        assert settings(c.get_log_settings())["log_level"] == "warn"
        reject("quiet-3")
    assert "quiet-3" not in log.read_text(errors="replace")


def test_trace_settings_sample_calls_into_the_log(tmp_path):
    """Triton's trace extension: one call in trace_rate is logged (at info)
    with where its time went, for trace_count calls; what posenc does not
    trace is refused by name."""
    with server_with_log(tmp_path, "info") as (c, log):
        assert "trace" in c.get_server_metadata().extensions

        def settings(resp):
            return {k: list(v.value) for k, v in resp.settings.items()}

        assert settings(c.get_trace_settings()) == {
            "trace_level": ["OFF"], "trace_rate": ["1000"], "trace_count": ["-1"],
            "log_frequency": ["0"], "trace_file": [], "trace_mode": ["triton"]}
        after = settings(c.update_trace_settings(settings={
            "trace_level": ["TIMESTAMPS"], "trace_rate": "2", "trace_count": "3"}))
        assert (after["trace_level"], after["trace_rate"], after["trace_count"]) == (
            ["TIMESTAMPS"], ["2"], ["3"])
        q = tc.InferInput("query", [1, 4, 2, 8], "FP32")
        q.set_data_from_numpy(np.zeros((1, 4, 2, 8), np.float32))
        # Every call counts, the TraceSetting call itself first: calls 0, 2
        # and 4 of these are traced, then none.
        for i in range(10):
            c.infer("rope", [q], request_id=f"call-{i}")
        deadline = time.time() + 10
        while log.read_text(errors="replace").count("ModelInfer traced") < 3:
            assert time.time() < deadline, log.read_text(errors="replace")
            time.sleep(0.05)
        time.sleep(0.2)
        traced = [l for l in log.read_text(errors="replace").splitlines() if " traced: " in l]
        assert [re.search(r"request_id=(\S+)", l).group(1) for l in traced] == [
            "call-0", "call-2", "call-4"], traced
        for line in traced:
            for field in ("memory_s=", "read_s=", "queue_s=", "work_s="):
                assert field in line, line
        assert settings(c.get_trace_settings())["trace_count"] == ["0"]
        for bad, words in (({"trace_file": "/tmp/trace.json"}, "trace_file must be empty"),
                           ({"trace_level": ["TENSORS"]}, "not TENSORS"),
                           ({"trace_rate": "0"}, "trace_rate must be an integer"),
                           ({"trace_mode": "opentelemetry"}, "trace_mode must be triton")):
            with pytest.raises(InferenceServerException) as e:
                c.update_trace_settings(settings=bad)
            assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
            assert words in e.value.message()
        with pytest.raises(InferenceServerException) as e:
            c.update_trace_settings(model_name="rope", settings={"trace_rate": "1"})
        assert "give no model_name" in e.value.message()
        c.update_trace_settings(settings={"trace_level": None})  # back to OFF
        assert settings(c.get_trace_settings())["trace_level"] == ["OFF"]


def test_cuda_shared_memory_is_off_unless_enabled(client):
    # Served only with --enable_cuda_shared_memory (and a GPU):
    # test_kserve_shared_memory.py has the rest.
    handle = base64.b64encode(bytes(64))
    for call in (lambda: client.get_cuda_shared_memory_status(),
                 lambda: client.register_cuda_shared_memory("g", handle, 0, 64),
                 lambda: client.unregister_cuda_shared_memory()):
        with pytest.raises(InferenceServerException) as e:
            call()
        assert e.value.status() == "StatusCode.FAILED_PRECONDITION"
        assert "--enable_cuda_shared_memory" in e.value.message()
    assert "cuda_shared_memory" not in client.get_server_metadata().extensions


def test_system_shared_memory_is_off_unless_enabled(client):
    # Served (test_kserve_shared_memory.py) only with --enable_system_shared_memory.
    for call in (lambda: client.get_system_shared_memory_status(),
                 lambda: client.register_system_shared_memory("r", "/posenc_r", 64),
                 lambda: client.unregister_system_shared_memory()):
        with pytest.raises(InferenceServerException) as e:
            call()
        assert e.value.status() == "StatusCode.FAILED_PRECONDITION"
        assert "--enable_system_shared_memory" in e.value.message()
    assert "system_shared_memory" not in client.get_server_metadata().extensions
    q = tc.InferInput("query", [1, 2, 1, 4], "FP32")
    q.set_shared_memory("r", 32)
    with pytest.raises(InferenceServerException) as e:
        client.infer("rope", [q])
    assert e.value.status() == "StatusCode.FAILED_PRECONDITION"
    assert "--enable_system_shared_memory" in e.value.message()


# --- health, metadata, configuration -------------------------------------


def test_server_live_ready_and_metadata(client):
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "posenc"
    assert "model_configuration" in meta["extensions"]
    index = client.get_model_repository_index(as_json=True)
    names = sorted(m["name"] for m in index["models"])
    assert names == ["attention_bias", "learned", "rope", "rope_qk", "sinusoidal"]
    for name in names:
        assert client.is_model_ready(name)
        assert client.is_model_ready(name, "1")


def test_model_metadata_and_config_describe_tensors(client):
    meta = client.get_model_metadata("rope", as_json=True)
    inputs = {t["name"]: t for t in meta["inputs"]}
    assert inputs["query"]["datatype"] == "FP32"
    assert inputs["query"]["shape"] == ["-1", "-1", "-1", "-1"]  # int64 as JSON strings
    assert {"key", "position_ids", "offsets", "cu_seqlens"} <= set(inputs)
    assert [t["name"] for t in meta["outputs"]] == ["query_out", "key_out"]
    config = client.get_model_config("rope", as_json=True)["config"]
    assert config["name"] == "rope"
    assert config.get("max_batch_size", 0) == 0
    cfg_inputs = {t["name"]: t for t in config["input"]}
    assert cfg_inputs["query"]["data_type"] == "TYPE_FP32"
    assert cfg_inputs["query"]["dims"] == ["-1", "-1", "-1", "-1"]
    assert cfg_inputs["key"]["optional"] is True
    assert "optional" not in cfg_inputs["query"]  # false: proto3 leaves it out
    bias = client.get_model_metadata("attention_bias", as_json=True)
    assert [(t["name"], t["datatype"]) for t in bias["outputs"]] == [
        ("bias", "FP32"), ("slopes", "FP64")]


def test_unknown_model_and_version_are_refused(client):
    with pytest.raises(InferenceServerException) as e:
        client.get_model_metadata("llama")
    assert e.value.status() == "StatusCode.NOT_FOUND"
    assert "rope" in e.value.message()  # lists the models
    with pytest.raises(InferenceServerException) as e:
        client.get_model_config("rope", "2")
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"


# --- inference against the reference ---------------------------------------


@pytest.mark.parametrize("datatype", ["FP32", "FP16", "BF16"])
def test_rope_matches_reference(client, datatype):
    rng = np.random.default_rng([SEED, 1, len(datatype)])
    for trial in range(4):
        b, s, hq, hk = (int(rng.integers(1, 4)), int(rng.integers(1, 40)), int(rng.integers(1, 5)),
                        int(rng.integers(1, 3)))
        d = 2 * int(rng.integers(1, 40))
        rotary = 2 * int(rng.integers(1, d // 2 + 1))
        style = ["neox", "gptj"][trial % 2]
        base = float(rng.choice([100.0, 10000.0, 500000.0]))
        q = quantize(rng.standard_normal((b, s, hq, d)), datatype)
        k = quantize(rng.standard_normal((b, s, hk, d)), datatype)
        inputs = [input_of("query", q.astype(NP_TYPE[datatype]), datatype),
                  input_of("key", k.astype(NP_TYPE[datatype]), datatype)]
        if trial >= 2:
            pos = rng.integers(0, 4096, (b, s)).astype(np.int64)
            inputs.append(input_of("position_ids", pos, "INT64"))
        else:
            pos = np.broadcast_to(np.arange(s, dtype=np.int64), (b, s))
        # tritonclient 2.40 sends no float parameters: numbers go as strings.
        params = {"base": str(base), "style": style, "rotary_dim": rotary}
        r = client.infer("rope", inputs, parameters=params, request_id=f"t{trial}")
        what = f"rope {datatype} b={b} s={s} hq={hq} hk={hk} d={d} R={rotary} {style} base={base}"
        assert r.get_response().id == f"t{trial}"
        for name, x in (("query_out", q), ("key_out", k)):
            got = r.as_numpy(name)
            assert got.shape == x.shape, what
            want = rope_reference(x, pos.astype(np.float64), base, rotary, style)
            assert_close(got.astype(np.float64), want, datatype, f"{what} {name}")


def test_rope_bhsd_layout_and_requested_output(client):
    rng = np.random.default_rng([SEED, 2])
    q = rng.standard_normal((2, 3, 17, 16)).astype(np.float32)  # [b, h, s, d]
    out = [tc.InferRequestedOutput("query_out")]
    r = client.infer("rope", [input_of("query", q, "FP32")], outputs=out,
                     parameters={"layout": "BHSD", "base": "10000"})
    assert [o.name for o in r.get_response().outputs] == ["query_out"]
    pos = np.broadcast_to(np.arange(17, dtype=np.float64), (2, 17))
    want = rope_reference(q.transpose(0, 2, 1, 3).astype(np.float64), pos, 10000.0, 16, "neox")
    assert_close(r.as_numpy("query_out").astype(np.float64), want.transpose(0, 2, 1, 3), "FP32",
                 "rope BHSD")


@pytest.mark.parametrize("datatype", ["FP32", "BF16"])
def test_sinusoidal_matches_reference(client, datatype):
    rng = np.random.default_rng([SEED, 3, len(datatype)])
    b, s, d = int(rng.integers(1, 4)), int(rng.integers(1, 50)), 2 * int(rng.integers(1, 33))
    x = quantize(rng.standard_normal((b, s, d)), datatype)
    offsets = rng.integers(0, 1000, (b,)).astype(np.int64)
    r = client.infer("sinusoidal", [input_of("x", x.astype(NP_TYPE[datatype]), datatype),
                                    input_of("offsets", offsets, "INT64")],
                     parameters={"base": "10000", "x_scale": "2.5"})
    pos = offsets[:, None].astype(np.float64) + np.arange(s)
    want = sinusoidal_reference(x, pos, 10000.0, 2.5)
    assert_close(r.as_numpy("y").astype(np.float64), want, datatype, f"sinusoidal {b}x{s}x{d}")


def test_learned_matches_table(client, server):
    rng = np.random.default_rng([SEED, 4])
    b, s = 2, int(rng.integers(1, TABLE_ROWS))
    x = rng.standard_normal((b, s, TABLE_DIM)).astype(np.float32)
    pos = rng.integers(0, TABLE_ROWS, (b, s)).astype(np.int64)
    r = client.infer("learned", [input_of("x", x, "FP32"), input_of("position_ids", pos, "INT64")],
                     parameters={"table": "t/wpe"})  # file/tensor
    want = x.astype(np.float64) + server["table"][pos]
    assert_close(r.as_numpy("y").astype(np.float64), want, "FP32", "learned")
    with pytest.raises(InferenceServerException) as e:
        client.infer("learned", [input_of("x", x, "FP32")], parameters={"table": "nope"})
    assert e.value.status() == "StatusCode.NOT_FOUND"


def test_attention_bias_matches_reference(client):
    rng = np.random.default_rng([SEED, 5])
    b, h = int(rng.integers(1, 4)), int(2 ** rng.integers(0, 4))
    q_len, k_len = int(rng.integers(1, 9)), int(rng.integers(9, 30))
    k_lens = rng.integers(1, k_len + 1, (b,)).astype(np.int64)
    r = client.infer("attention_bias", [input_of("k_lens", k_lens, "INT64")],
                     parameters={"batch": b, "num_heads": h, "q_len": q_len, "k_len": k_len,
                                 "form": "causal"})
    slopes = alibi_slopes(h)
    np.testing.assert_allclose(r.as_numpy("slopes"), slopes, rtol=1e-15)
    i = (k_len - q_len + np.arange(q_len))[:, None]
    j = np.arange(k_len)[None, :]
    want = np.broadcast_to(-slopes[:, None, None] * (i - j), (b, h, q_len, k_len)).copy()
    padded = np.arange(k_len)[None, None, None, :] >= k_lens[:, None, None, None]
    want[np.broadcast_to(padded, want.shape)] = -np.inf
    got = r.as_numpy("bias").astype(np.float64)
    assert got.shape == want.shape
    finite = np.isfinite(want)
    assert np.array_equal(np.isfinite(got), finite), "the masked keys differ"
    assert np.all(got[~finite] == -np.inf)
    assert_close(got[finite], want[finite], "FP32", "attention_bias")

    # Added in place to logits the caller sends.
    logits = rng.standard_normal((b, h, q_len, k_len)).astype(np.float32)
    r = client.infer("attention_bias", [input_of("logits", logits, "FP32")],
                     parameters={"form": "symmetric"})
    want = logits + np.broadcast_to(-slopes[:, None, None] * np.abs(i - j), logits.shape)
    assert_close(r.as_numpy("bias").astype(np.float64), want, "FP32", "bias added to logits")


def test_typed_fp32_contents_and_raw_grpc(server):
    """A client that sends fp32_contents instead of raw bytes (the protocol's
    other encoding), through the protocol's own generated stubs."""
    rng = np.random.default_rng([SEED, 6])
    q = rng.standard_normal((1, 5, 2, 8))
    req = service_pb2.ModelInferRequest(model_name="rope", id="typed")
    req.parameters["base"].double_param = 500.0  # a double, as newer clients send
    t = req.inputs.add(name="query", datatype="FP32", shape=list(q.shape))
    t.contents.fp32_contents.extend(q.astype(np.float32).ravel().tolist())
    with grpc.insecure_channel(server["url"]) as ch:
        resp = service_pb2_grpc.GRPCInferenceServiceStub(ch).ModelInfer(req, timeout=10)
    assert resp.id == "typed" and resp.model_name == "rope"
    got = np.frombuffer(resp.raw_output_contents[0], "<f4").reshape(q.shape)
    pos = np.arange(5, dtype=np.float64)[None, :]
    want = rope_reference(q.astype(np.float32).astype(np.float64), pos, 500.0, 8, "neox")
    assert_close(got.astype(np.float64), want, "FP32", "typed contents")


# --- errors -----------------------------------------------------------------


def infer_error(client, model, inputs, **kw):
    with pytest.raises(InferenceServerException) as e:
        client.infer(model, inputs, **kw)
    return e.value.status(), e.value.message()


def test_errors_name_the_field(client):
    q = np.zeros((1, 4, 2, 8), np.float32)
    code, msg = infer_error(client, "rope", [input_of("query", q, "FP32")],
                            parameters={"rotary_dm": 4})
    assert code == "StatusCode.INVALID_ARGUMENT" and "rotary_dm" in msg
    code, msg = infer_error(client, "rope", [input_of("query", q, "FP32")],
                            parameters={"style": "sideways"})
    assert code == "StatusCode.INVALID_ARGUMENT" and "sideways" in msg and "gptj" in msg
    code, msg = infer_error(client, "rope", [input_of("query", q, "FP32")],
                            parameters={"base": "big"})
    assert code == "StatusCode.INVALID_ARGUMENT" and "base" in msg
    code, msg = infer_error(client, "rope", [input_of("query", q, "FP32")],
                            parameters={"rotary_dim": 7})
    assert code == "StatusCode.INVALID_ARGUMENT" and "rotary_dim" in msg
    code, msg = infer_error(client, "rope", [input_of("qeury", q, "FP32")])
    assert code == "StatusCode.INVALID_ARGUMENT" and "qeury" in msg
    code, msg = infer_error(client, "rope", [input_of("key", q, "FP32")])
    assert code == "StatusCode.INVALID_ARGUMENT" and "query" in msg
    # Bytes that do not match the shape.
    t = tc.InferInput("query", [1, 4, 2, 9], "FP32")
    t.set_data_from_numpy(np.zeros((1, 4, 2, 9), np.float32))
    t._raw_content = t._raw_content[:-4]
    code, msg = infer_error(client, "rope", [t])
    assert code == "StatusCode.INVALID_ARGUMENT" and "query" in msg
    code, msg = infer_error(client, "rope", [input_of("query", q.astype(np.float64), "FP64")])
    assert code == "StatusCode.INVALID_ARGUMENT" and "FP64" in msg
    code, _ = infer_error(client, "nope", [input_of("query", q, "FP32")])
    assert code == "StatusCode.NOT_FOUND"
    assert client.is_server_live()  # and the server goes on


def test_malformed_requests_are_refused_by_name(server):
    """What no well-behaved client sends: each refused with INVALID_ARGUMENT
    naming what is wrong, and the server goes on."""
    def call(req):
        with grpc.insecure_channel(server["url"]) as ch:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
            with pytest.raises(grpc.RpcError) as e:
                stub.ModelInfer(req, timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
        return e.value.details()

    def rope(**kw):
        req = service_pb2.ModelInferRequest(model_name="rope")
        req.inputs.add(name="query", datatype="FP32", shape=kw.get("shape", [1, 2, 1, 4]))
        return req

    req = rope()
    req.raw_input_contents.extend([b"\0" * 32, b"\0" * 32])  # two contents, one input
    assert "raw_input_contents" in call(req)
    req = rope()
    req.inputs[0].contents.int64_contents.extend([1] * 8)  # wrong field for FP32
    assert "fp32_contents" in call(req)
    req = rope(shape=[1 << 40, 1 << 40, 1, 4])  # no memory for this, no overflow either
    req.raw_input_contents.append(b"\0" * 32)
    assert "query" in call(req)
    req = rope(shape=[1, 2, 1, -4])
    req.raw_input_contents.append(b"")
    assert "query" in call(req)
    req = rope()
    req.raw_input_contents.append(b"\0" * 32)
    req.inputs.add(name="query", datatype="FP32", shape=[1, 2, 1, 4])
    req.raw_input_contents.append(b"\0" * 32)
    assert "twice" in call(req)
    req = rope()
    req.raw_input_contents.append(b"\0" * 32)
    req.parameters["base"].double_param = float("nan")
    assert "base" in call(req)
    req = rope()
    req.raw_input_contents.append(b"\0" * 32)
    req.outputs.add(name="query_out").parameters["classification"].int64_param = 3
    assert "classification" in call(req)


def test_parameters_are_bounded_before_they_are_parsed(server):
    """A list parameter is counted, and a string measured, before anything
    is parsed or copied out of it: a 3 MiB string of commas once became
    hundreds of MiB of doubles, none of it admitted."""
    def call(model, inputs, parameters):
        req = service_pb2.ModelInferRequest(model_name=model)
        for name, array in inputs:
            req.inputs.add(name=name, datatype="FP32", shape=list(array.shape))
            req.raw_input_contents.append(array.tobytes())
        for name, value in parameters.items():
            req.parameters[name].string_param = value
        with grpc.insecure_channel(server["url"],
                                   options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
            with pytest.raises(grpc.RpcError) as e:
                stub.ModelInfer(req, timeout=30)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
        return e.value.details()

    logits = np.zeros((1, 4, 2, 2), np.float32)
    q = np.zeros((1, 2, 1, 8), np.float32)
    msg = call("attention_bias", [("logits", logits)], {"slopes": "0," * 70000 + "0"})
    assert "slopes" in msg and "at most 65536 values, got 70001" in msg, msg
    msg = call("attention_bias", [("logits", logits)], {"slopes": "0" * (3 << 20)})
    assert "slopes" in msg and "at most 2097152 bytes" in msg, msg
    msg = call("rope", [("query", q)], {"sections": "1," * 8 + "1"})
    assert "sections" in msg and "at most 8 values" in msg, msg
    msg = call("rope", [("query", q)], {"short_factor": ",".join(["1"] * 40000)})
    assert "short_factor" in msg and "at most 32768 values" in msg, msg
    msg = call("rope", [("query", q)], {f"p{i}": "x" for i in range(65)})
    assert "at most 64 parameters, got 65" in msg, msg


def test_statistics_count_requests(client):
    before = client.get_inference_statistics("sinusoidal", as_json=True)["model_stats"][0]
    x = np.zeros((1, 3, 4), np.float32)
    client.infer("sinusoidal", [input_of("x", x, "FP32")])
    infer_error(client, "sinusoidal", [input_of("x", x, "FP32")], parameters={"bogus": 1})
    after = client.get_inference_statistics("sinusoidal", as_json=True)["model_stats"][0]
    count = lambda s, k: int(s.get("inference_stats", {}).get(k, {}).get("count", 0))
    assert count(after, "success") == count(before, "success") + 1
    assert count(after, "fail") == count(before, "fail") + 1
    everything = client.get_inference_statistics(as_json=True)["model_stats"]
    assert len(everything) == 5


# --- the stream ---------------------------------------------------------------


def test_stream_answers_in_order_and_survives_a_bad_request(client):
    rng = np.random.default_rng([SEED, 7])
    results = []
    client.start_stream(callback=lambda result, error: results.append((result, error)))
    try:
        qs = [rng.standard_normal((1, int(rng.integers(1, 20)), 2, 8)).astype(np.float32)
              for _ in range(3)]
        for n, q in enumerate(qs):
            params = {"base": "500"} if n != 1 else {"base": "-1"}
            client.async_stream_infer("rope", [input_of("query", q, "FP32")], request_id=str(n),
                                      parameters=params)
        deadline = time.time() + 20
        while len(results) < 3 and time.time() < deadline:
            time.sleep(0.01)
    finally:
        client.stop_stream()
    assert len(results) == 3
    assert results[1][0] is None and "base" in results[1][1].message()
    for n in (0, 2):
        result, error = results[n]
        assert error is None, error
        assert result.get_response().id == str(n)
        # Each request's only answer says it is its last, as Triton's do.
        assert result.get_response().parameters["triton_final_response"].bool_param
        q = qs[n].astype(np.float64)
        pos = np.arange(q.shape[1], dtype=np.float64)[None, :]
        assert_close(result.as_numpy("query_out").astype(np.float64),
                     rope_reference(q, pos, 500.0, 8, "neox"), "FP32", f"stream request {n}")


# --- perf_analyzer, unchanged -------------------------------------------------


def test_perf_analyzer_drives_rope(server, tmp_path):
    # perf_analyzer fills every input with random data unless --input-data
    # names the ones to send; from a file it leaves the optional ones out.
    shape = [1, 128, 8, 64]
    q = np.random.default_rng([SEED, 8]).standard_normal(shape).astype("<f4")
    data = tmp_path / "query.json"
    data.write_text(json.dumps({"data": [{"query": {
        "b64": base64.b64encode(q.tobytes()).decode(), "shape": shape}}]}))
    cmd = [os.environ["PERF_ANALYZER"], "-m", "rope", "-i", "grpc", "-u", server["url"],
           "--shape", "query:" + ",".join(map(str, shape)), f"--input-data={data}",
           "--concurrency-range=1:2", "--measurement-interval=1000",
           # A check that it runs, not a measurement: windows up to ~10x apart
           # count as stable, so a busy CI machine cannot fail it.
           "--stability-percentage=999", "--max-trials=3"]
    print(" ".join(cmd))
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    print(run.stdout[-1500:], run.stderr[-2000:])
    assert run.returncode == 0, run.stdout[-1500:] + run.stderr
    rates = [float(x) for x in re.findall(r"Concurrency: \d+, throughput: ([\d.]+) infer/sec",
                                          run.stdout)]
    assert len(rates) == 2 and min(rates) > 0, run.stdout
    # The server's own statistics, as perf_analyzer read them: every request
    # it sent succeeded.
    assert re.search(r"Successful request count: [1-9]", run.stdout), run.stdout
