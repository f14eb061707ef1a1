"""The RoPE model a user would write for KServe instead of running posenc.

A kserve.Model named "rope" with posenc's built-in rope model's interface
(server/kserve/models.cc, server/kserve/parameters.cc), so one perf_analyzer
command and one input file drive both servers:
  inputs  query FP32 [B, S, H, D] (BSHD) or [B, H, S, D] (BHSD), key (optional,
          same layout, its own head count), position_ids INT64 [B, S] or
          [1, S] (optional), offsets INT64 [B] (optional);
  outputs query_out, key_out (FP32, the inputs' shapes);
  parameters layout (BSHD | BHSD), style (NEOX | GPTJ), rotary_dim (0 = D),
          base (default 10000), inverse (bool). posenc's frequency scalings
          (scaling, factor, ...) are refused: this peer does default RoPE only.

Arithmetic: angles and their cos/sin in float64 (positions * theta^(-2i/R)),
cast once to float32; the rotation itself in float32 numpy, as HF's
q * cos + rotate_half(q) * sin does it. predict() is synchronous, as KServe's
examples write it, so it runs on the server's event loop.
"""
import asyncio
import math

import numpy as np
from kserve import Model
from kserve.errors import InvalidInput
from kserve.protocol.infer_type import InferOutput, InferResponse

INPUTS = [
    {"name": "query", "datatype": "FP32", "shape": [-1, -1, -1, -1]},
    {"name": "key", "datatype": "FP32", "shape": [-1, -1, -1, -1]},
    {"name": "position_ids", "datatype": "INT64", "shape": [-1, -1]},
    {"name": "offsets", "datatype": "INT64", "shape": [-1]},
]
OUTPUTS = [
    {"name": "query_out", "datatype": "FP32", "shape": [-1, -1, -1, -1]},
    {"name": "key_out", "datatype": "FP32", "shape": [-1, -1, -1, -1]},
]
# Parameters the protocol reserves for schedulers; clients send them by
# default and they change nothing here (as in posenc).
IGNORED = {"priority", "timeout", "binary_data_output", "triton_enable_empty_final_response"}
READS = ("layout", "style", "rotary_dim", "base", "inverse")


def _param(p):
    """An InferParameter (gRPC) or a plain value (REST) as a Python value."""
    if hasattr(p, "WhichOneof"):
        kind = p.WhichOneof("parameter_choice")
        return None if kind is None else getattr(p, kind)
    return p


def read_options(parameters):
    o = {"layout": "BSHD", "style": "NEOX", "rotary_dim": 0, "base": 10000.0, "inverse": False}
    for name, raw in (parameters or {}).items():
        if name in IGNORED:
            continue
        if name not in READS:
            raise InvalidInput(f'model rope has no parameter "{name[:64]}"; it reads '
                               + ", ".join(READS))
        v = _param(raw)
        if name in ("layout", "style"):
            allowed = ("BSHD", "BHSD") if name == "layout" else ("NEOX", "GPTJ")
            if not isinstance(v, str) or v.upper() not in allowed:
                raise InvalidInput(f'parameter "{name}" must be one of {", ".join(allowed)}, '
                                   f"got {v!r:.64}")
            o[name] = v.upper()
        elif name == "rotary_dim":
            try:
                o[name] = int(v)
            except (TypeError, ValueError):
                raise InvalidInput(f'parameter "rotary_dim" must be an integer, got {v!r:.64}')
        elif name == "base":
            try:
                o[name] = float(v)
            except (TypeError, ValueError):
                raise InvalidInput(f'parameter "base" must be a number, got {v!r:.64}')
            if not np.isfinite(o[name]) or o[name] <= 0:
                raise InvalidInput(f'parameter "base" must be a finite number > 0, got {v!r:.64}')
        elif name == "inverse":
            if not isinstance(v, bool):
                raise InvalidInput(f'parameter "inverse" must be a bool, got {v!r:.64}')
            o[name] = v
    return o


def _tensor(inp, dtype, rank):
    if inp.datatype != dtype:
        raise InvalidInput(f'input "{inp.name}" must be {dtype}, got {inp.datatype[:16]}')
    shape = list(inp.shape)
    if len(shape) != rank or any(d < 0 for d in shape):
        raise InvalidInput(f'input "{inp.name}" must have {rank} dimensions >= 0, got {shape}')
    raw = getattr(inp, "_raw_data", None)
    want = math.prod(shape) * (4 if dtype == "FP32" else 8)  # Python ints: no overflow
    if raw is not None and len(raw) != want:
        raise InvalidInput(f'input "{inp.name}" of shape {shape} needs {want} bytes, '
                           f"got {len(raw)}")
    if raw is None and len(inp.data or []) != want // (4 if dtype == "FP32" else 8):
        raise InvalidInput(f'input "{inp.name}" of shape {shape} needs {want} bytes '
                           "in raw_input_contents (or as many typed contents)")
    return inp.as_numpy()


def positions_for(batch, seq, position_ids, offsets):
    """Positions [batch, seq] as float64 (exact for |p| < 2^53)."""
    if position_ids is not None and offsets is not None:
        raise InvalidInput("give position_ids or offsets, not both")
    if position_ids is not None:
        if position_ids.shape not in ((batch, seq), (1, seq)):
            raise InvalidInput(f"position_ids must be [{batch}, {seq}] or [1, {seq}], "
                               f"got {list(position_ids.shape)}")
        return np.broadcast_to(position_ids.astype(np.float64), (batch, seq))
    index = np.arange(seq, dtype=np.float64)[None, :]
    if offsets is not None:
        if offsets.shape != (batch,):
            raise InvalidInput(f"offsets must be [{batch}], got {list(offsets.shape)}")
        return offsets.astype(np.float64)[:, None] + index
    return np.broadcast_to(index, (batch, seq))


def rotate(x, cos, sin, o):
    """x [B, S, H, D] (or BHSD), cos/sin float32 [B, S, R/2] -> a rotated copy."""
    rd = cos.shape[-1] * 2
    # Broadcast cos/sin over heads: [B, S, 1, R/2] for BSHD, [B, 1, S, R/2] for BHSD.
    c = cos[:, :, None, :] if o["layout"] == "BSHD" else cos[:, None, :, :]
    s = sin[:, :, None, :] if o["layout"] == "BSHD" else sin[:, None, :, :]
    out = np.empty_like(x)
    if o["style"] == "NEOX":
        x1, x2 = x[..., : rd // 2], x[..., rd // 2: rd]
        out[..., : rd // 2] = x1 * c - x2 * s
        out[..., rd // 2: rd] = x2 * c + x1 * s
    else:
        x1, x2 = x[..., 0:rd:2], x[..., 1:rd:2]
        out[..., 0:rd:2] = x1 * c - x2 * s
        out[..., 1:rd:2] = x2 * c + x1 * s
    out[..., rd:] = x[..., rd:]
    return out


class RopeModel(Model):
    def __init__(self, name="rope"):
        super().__init__(name)
        self.ready = True

    def get_input_types(self):
        return INPUTS

    def get_output_types(self):
        return OUTPUTS

    def predict(self, payload, headers=None):
        o = read_options(payload.parameters)
        given = {i.name: i for i in payload.inputs}
        for name in given:
            if name not in {t["name"] for t in INPUTS}:
                raise InvalidInput(f'model rope has no input "{name[:64]}"; its inputs are '
                                   + ", ".join(t["name"] for t in INPUTS))
        if "query" not in given:
            raise InvalidInput('model rope needs the input "query"')
        q = _tensor(given["query"], "FP32", 4)
        k = _tensor(given["key"], "FP32", 4) if "key" in given else None
        pid = _tensor(given["position_ids"], "INT64", 2) if "position_ids" in given else None
        off = _tensor(given["offsets"], "INT64", 1) if "offsets" in given else None
        b, s = (q.shape[0], q.shape[1]) if o["layout"] == "BSHD" else (q.shape[0], q.shape[2])
        d = q.shape[3]
        rd = o["rotary_dim"] or d
        if rd < 0 or rd > d or rd % 2:
            raise InvalidInput(f"rotary_dim must be even and <= head_dim {d}, got {rd}")
        if k is not None:
            kb, ks = (k.shape[0], k.shape[1]) if o["layout"] == "BSHD" else (k.shape[0], k.shape[2])
            if (kb, ks, k.shape[3]) != (b, s, d):
                raise InvalidInput(f"key {list(k.shape)} must match query {list(q.shape)} "
                                   "in batch, sequence and head_dim")
        pos = positions_for(b, s, pid, off)
        inv_freq = o["base"] ** (-np.arange(0, rd, 2, dtype=np.float64) / rd)
        angle = pos[..., None] * inv_freq  # [B, S, R/2], float64
        if o["inverse"]:
            angle = -angle
        cos, sin = np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)
        wanted = {r.name for r in payload.request_outputs or []}
        outputs = []
        for name, x in (("query_out", q), ("key_out", k)):
            if x is None or (wanted and name not in wanted):
                continue
            out = InferOutput(name=name, shape=list(x.shape), datatype="FP32")
            out.set_data_from_numpy(rotate(x, cos, sin, o), binary_data=True)
            outputs.append(out)
        return InferResponse(response_id=payload.id, model_name=self.name,
                             infer_outputs=outputs, use_binary_outputs=True)


class ThreadedRopeModel(RopeModel):
    """The same model with predict() moved off the event loop onto kserve's
    thread pool (asyncio.to_thread): numpy's arithmetic drops the GIL, so
    with two cores one request's rotation can overlap the next one's
    transport. The tuned variant (server.py --predict_in_threads)."""

    async def predict(self, payload, headers=None):
        return await asyncio.to_thread(RopeModel.predict, self, payload, headers)


class EchoModel(RopeModel):
    """"rope_echo": rope's interface and input checks, answering query (and
    key) unchanged: kserve's own cost per call, without the numpy RoPE."""

    def __init__(self, name="rope_echo"):
        super().__init__(name)

    def predict(self, payload, headers=None):
        read_options(payload.parameters)
        outputs = []
        for inp in payload.inputs:
            if inp.name in ("query", "key"):
                x = _tensor(inp, "FP32", 4)
                out = InferOutput(name=inp.name + "_out", shape=list(x.shape), datatype="FP32")
                out.set_data_from_numpy(x, binary_data=True)
                outputs.append(out)
        return InferResponse(response_id=payload.id, model_name=self.name,
                             infer_outputs=outputs, use_binary_outputs=True)
