"""Each posenc.v1 operation as (method, request, parse): the sync and asyncio
clients share these and differ only in how they wait for the answer.

Options take the proto's enum names without their prefix, case-insensitive
("bshd", "gptj", "yarn"), or the enum's number; None leaves the field unset
(the server's default).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

from posenc import _tensors as T
from posenc._proto.posenc.v1 import posenc_pb2 as pb
from posenc.errors import PosencError, invalid


@dataclass
class RopeResult:
    """Rotated query and key (None when no key was sent), as the inputs came
    (numpy or torch, same dtype); where it ran; and, for StreamRope only, the
    error of a message that failed while the stream went on."""

    query: Any
    key: Any
    backend: str = ""
    request_id: str = ""
    error: PosencError | None = None


@dataclass
class BiasResult:
    """The bias [batch, heads, q_len, k_len] (or the logits with it added) and
    the per-head slopes used (flash-attn's alibi_slopes)."""

    bias: Any
    slopes: list[float]
    backend: str = ""


# Reads a tensor of an answer: (response, data field, descriptor field, the
# request's shared-memory slice field, what it must be: (DataType, shape or
# None) or None) -> array. On the socket the bytes are the answer's data
# field; through shared memory, the region's slice.
Reader = Callable[[Any, str, str, str, Any], Any]


def socket_reader(response, data: str, desc: str, _slice: str, expect=None):
    T.check_desc(getattr(response, desc), expect, desc)
    return T.from_desc(getattr(response, desc), getattr(response, data), desc)


@dataclass
class Op:
    """One call: the request with its large tensors not yet attached (they
    go into the message, on_socket, or into a shared-memory region, _shm),
    and how to read the answer."""

    method: str
    request: Any
    parse: Callable[[Any, Reader], Any]
    # (array, data field, shared-memory slice field) of each large tensor.
    tensors: tuple = ()
    # (slice field, bytes) of a tensor the server builds, when its size is
    # known from the request.
    output: tuple | None = None
    # It builds a tensor (a table, a bias without logits): without `output`
    # its size is the server's to decide, and it cannot use shared memory.
    builds: bool = False

    def on_socket(self):
        """The request with its tensors in the message."""
        _attach(self.request, self.tensors)
        return self.request


def _attach(request, tensors) -> None:
    for a, data, _ in tensors:
        setattr(request, data, a.tobytes())


def enum_value(enum, prefix: str, value, field: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool):
        raise invalid(f"{field}: expected a name or number, got {value!r}")
    if isinstance(value, int):
        if value in enum.values():
            return value
    elif isinstance(value, str):
        name = prefix + value.strip().upper()
        if name in enum.keys():
            return enum.Value(name)
    choices = ", ".join(k[len(prefix):].lower() for k in enum.keys() if not k.endswith("UNSPECIFIED"))
    raise invalid(f"{field}: {value!r} is not one of {choices}")


def _backend(value) -> int:
    return enum_value(pb.Backend, "BACKEND_", value, "backend")


_SCALING_ENUMS = {"type": (pb.ScalingType, "SCALING_TYPE_"),
                  "longrope_mode": (pb.LongRopeMode, "LONGROPE_MODE_")}


def scaling_message(scaling) -> pb.RopeScaling:
    """A RopeScaling from a dict of its fields ({"type": "yarn", "factor": 4,
    "original_max_position": 4096}) or the message itself."""
    if isinstance(scaling, pb.RopeScaling):
        return scaling
    if not isinstance(scaling, Mapping):
        raise invalid(f"scaling: expected a dict of RopeScaling fields, got {type(scaling).__name__}")
    out = pb.RopeScaling()
    fields = out.DESCRIPTOR.fields_by_name
    for key, value in scaling.items():
        if key not in fields:
            raise invalid(f"scaling.{key}: no such field; expected one of {', '.join(fields)}")
        if value is None:
            continue
        if key in _SCALING_ENUMS:
            value = enum_value(*_SCALING_ENUMS[key], value, f"scaling.{key}")
        try:
            if fields[key].is_repeated:
                getattr(out, key).extend(float(v) for v in value)
            else:
                setattr(out, key, value)
        except (TypeError, ValueError) as e:
            raise invalid(f"scaling.{key}: {e}") from e
    return out


HfConfig = Union[str, Mapping[str, Any], os.PathLike]
"""A model's Hugging Face config.json for RopeRequest.hf_config: its JSON
text, the parsed dict (json.load of config.json, or just its RoPE fields),
or the path of the file (a pathlib.Path; a str is always JSON text)."""


def hf_config_text(hf_config: HfConfig) -> str:
    """The JSON text RopeRequest.hf_config carries. Only the client's part of
    the checking: the server resolves the config and names a bad field
    (hf_config.rope_scaling.factor ...)."""
    if isinstance(hf_config, str):
        return hf_config
    if isinstance(hf_config, os.PathLike):
        try:
            with open(hf_config, encoding="utf-8") as f:
                return f.read()
        except OSError as e:
            raise invalid(f"hf_config: cannot read {os.fspath(hf_config)!r}: {e}") from e
    if isinstance(hf_config, Mapping):
        try:
            # allow_nan=False: NaN is not JSON; the server would refuse it anyway.
            return json.dumps(hf_config, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise invalid(f"hf_config: not JSON-serializable: {e}") from e
    raise invalid(f"hf_config: expected JSON text, a dict or a path, got "
                  f"{type(hf_config).__name__}")


def _positions(request, position_ids, offsets, cu_seqlens) -> None:
    if position_ids is not None:
        request.position_ids.CopyFrom(T.small_tensor(T.positions(position_ids, "position_ids")))
    if offsets is not None:
        request.offsets.CopyFrom(T.small_tensor(T.positions(offsets, "offsets")))
    if cu_seqlens is not None:
        request.cu_seqlens.CopyFrom(T.small_tensor(T.positions(cu_seqlens, "cu_seqlens")))


def _rope_parts(query, key=None, *, layout=None, position_ids=None, offsets=None,
                cu_seqlens=None, style=None, rotary_dim: int = 0, base: float | None = None,
                inverse: bool = False, scaling=None, axis_mode=None,
                axis_dims: Sequence[int] = (), sections: Sequence[int] = (), backend=None,
                request_id: str = "", hf_config: HfConfig | None = None):
    q, q_origin = T.as_array(query, "query", T.FLOATS)
    r = pb.RopeRequest(
        layout=enum_value(pb.RopeLayout, "ROPE_LAYOUT_", layout, "layout"),
        style=enum_value(pb.RopeStyle, "ROPE_STYLE_", style, "style"),
        rotary_dim=int(rotary_dim), inverse=bool(inverse),
        axis_mode=enum_value(pb.AxisMode, "AXIS_MODE_", axis_mode, "axis_mode"),
        axis_dims=[int(d) for d in axis_dims], sections=[int(s) for s in sections],
        backend=_backend(backend), request_id=request_id)
    T.set_desc(q, r.query)
    tensors = [(q, "query_data", "query_shm")]
    k_origin = None
    if key is not None:
        k, k_origin = T.as_array(key, "key", T.FLOATS)
        T.set_desc(k, r.key)
        tensors.append((k, "key_data", "key_shm"))
    _positions(r, position_ids, offsets, cu_seqlens)
    if base is not None:
        r.base = float(base)
    if scaling is not None:
        r.scaling.CopyFrom(scaling_message(scaling))
    if hf_config is not None:
        r.hf_config = hf_config_text(hf_config)
    return r, tuple(tensors), q_origin, k_origin


def rope_request(query, key=None, **options) -> tuple[pb.RopeRequest, T.Origin, T.Origin | None]:
    """A whole RopeRequest (tensors in the message) and where its query and
    key came from; apply_rope's arguments."""
    r, tensors, q_origin, k_origin = _rope_parts(query, key, **options)
    _attach(r, tensors)
    return r, q_origin, k_origin


def rope_expects(request: pb.RopeRequest) -> tuple:
    """What a RoPE answer must describe: the query and key as sent."""
    return T.expect_of(request.query), T.expect_of(request.key)


def rope_result(resp: pb.RopeResponse, q_origin: T.Origin, k_origin: T.Origin | None,
                read: Reader = socket_reader, expects: tuple = (None, None)) -> RopeResult:
    """`expects`: rope_expects of the request (None checks nothing)."""
    if resp.error_code != 0:
        return RopeResult(None, None, resp.backend, resp.request_id,
                          PosencError.from_status(resp.error_code, resp.error_message))
    q_expect, k_expect = expects
    query = q_origin.restore(read(resp, "query_data", "query", "query_shm", q_expect))
    key = None
    if k_origin is not None:
        key = k_origin.restore(read(resp, "key_data", "key", "key_shm", k_expect))
    return RopeResult(query, key, resp.backend, resp.request_id)


def apply_rope(query, key=None, **options) -> Op:
    r, tensors, qo, ko = _rope_parts(query, key, **options)
    expects = rope_expects(r)
    return Op("ApplyRope", r, lambda resp, read: rope_result(resp, qo, ko, read, expects),
              tensors)


def _encoding(request, table: str | None, layout, base) -> None:
    if table is not None:
        if layout is not None or base is not None:
            raise invalid("layout and base apply to sinusoidal encodings, not a learned table")
        request.learned.table_name = table
        return
    request.sinusoidal.layout = enum_value(pb.SinusoidalLayout, "SINUSOIDAL_LAYOUT_", layout,
                                           "sinusoidal.layout")
    if base is not None:
        request.sinusoidal.base = float(base)


def add_absolute(x, *, table: str | None = None, layout=None, base=None, position_ids=None,
                 offsets=None, cu_seqlens=None, x_scale: float | None = None, backend=None,
                 request_id: str = "") -> Op:
    a, origin = T.as_array(x, "x", T.FLOATS)
    r = pb.AbsoluteEncodingRequest(backend=_backend(backend), request_id=request_id)
    T.set_desc(a, r.x)
    _encoding(r, table, layout, base)
    _positions(r, position_ids, offsets, cu_seqlens)
    if x_scale is not None:
        r.x_scale = float(x_scale)
    expect = T.expect_of(r.x)
    return Op("AddAbsoluteEncoding", r,
              lambda resp, read: origin.restore(read(resp, "y_data", "y", "x_shm", expect)),
              ((a, "x_data", "x_shm"),))


def encoding_table(*, table: str | None = None, dim: int = 0, count: int = 0, positions=None,
                   layout=None, base=None, dtype="float32", backend=None) -> Op:
    r = pb.EncodingTableRequest(dim=int(dim), count=int(count),
                                dtype=T.dtype_proto(dtype, "dtype"), backend=_backend(backend))
    _encoding(r, table, layout, base)
    rows = int(count)
    if positions is not None:
        p = T.positions(positions, "positions")
        r.positions.CopyFrom(T.small_tensor(p))
        rows = p.shape[0] if p.ndim == 1 else 0
    # Its size is known unless a learned table's own dim or rows decide it.
    nbytes = rows * int(dim) * T.itemsize(r.dtype)
    expect = (r.dtype, (rows, int(dim)) if nbytes > 0 else None)
    return Op("GetEncodingTable", r,
              lambda resp, read: read(resp, "table_data", "table", "table_shm", expect),
              output=("table_shm", nbytes) if nbytes > 0 else None, builds=True)


def attention_bias(*, num_heads: int = 0, q_len: int = 0, k_len: int = 0, form=None,
                   slopes: Sequence[float] | None = None, batch: int = 0,
                   q_offset: int | None = None, causal: bool = False, window: int = 0,
                   k_lens=None, k_starts=None, dtype="float32", logits=None,
                   backend=None) -> Op:
    r = pb.AttentionBiasRequest(
        form=enum_value(pb.BiasForm, "BIAS_FORM_", form, "form"),
        slopes=[float(s) for s in (slopes or ())], batch=int(batch), num_heads=int(num_heads),
        q_len=int(q_len), k_len=int(k_len), causal=bool(causal), window=int(window),
        dtype=T.dtype_proto(dtype, "dtype"), backend=_backend(backend))
    if q_offset is not None:
        r.q_offset = int(q_offset)
    if k_lens is not None:
        r.k_lens.CopyFrom(T.small_tensor(T.positions(k_lens, "k_lens")))
    if k_starts is not None:
        r.k_starts.CopyFrom(T.small_tensor(T.positions(k_starts, "k_starts")))
    origin = T.Origin()
    tensors, output = (), None
    if logits is not None:
        a, origin = T.as_array(logits, "logits", T.FLOATS)
        T.set_desc(a, r.logits)
        tensors = ((a, "logits_data", "logits_shm"),)
        expect = T.expect_of(r.logits)
    else:
        rows = int(batch) or (r.k_lens.shape[0] if r.k_lens.shape else
                              r.k_starts.shape[0] if r.k_starts.shape else 1)
        dims = (rows, int(num_heads), int(q_len), int(k_len))
        expect = (r.dtype, None)
        if min(dims) > 0:
            output = ("bias_shm", math.prod(dims) * T.itemsize(r.dtype))
            expect = (r.dtype, dims)
    where = "logits_shm" if logits is not None else "bias_shm"

    def parse(resp, read):
        bias = origin.restore(read(resp, "bias_data", "bias", where, expect))
        return BiasResult(bias, list(resp.slopes), resp.backend)

    return Op("AttentionBias", r, parse, tensors, output, builds=logits is None)


def control(method: str) -> Op:
    requests = {"ListTables": pb.ListTablesRequest, "ReloadTables": pb.ReloadTablesRequest,
                "GetServerInfo": pb.GetServerInfoRequest}
    return Op(method, requests[method](), lambda resp, _read: resp)


def stream_item(item) -> tuple[pb.RopeRequest, T.Origin, T.Origin | None]:
    """One StreamRope message: a dict of apply_rope's arguments, or a RopeRequest."""
    if isinstance(item, pb.RopeRequest):
        return item, T.Origin(), (T.Origin() if item.HasField("key") else None)
    if isinstance(item, Mapping):
        item = dict(item)
        if "query" not in item:
            raise invalid("stream_rope: each item needs a 'query'")
        try:
            return rope_request(item.pop("query"), item.pop("key", None), **item)
        except TypeError as e:  # an argument apply_rope does not take
            raise invalid(f"stream_rope: {e}") from e
    raise invalid(f"stream_rope: expected dicts of apply_rope arguments or RopeRequest messages, "
                  f"got {type(item).__name__}")
