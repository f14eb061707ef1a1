"""The synchronous client. Every method takes `timeout` (seconds; default the
client's) and `request_id` (sent as x-request-id, so the server's log lines
about the call carry it) and raises PosencError on failure."""

from __future__ import annotations

import collections
import itertools
import os
import secrets
import threading
from collections.abc import Iterable, Iterator

import grpc

from posenc import _cuda, _ops, _shm
from posenc._channel import ChannelConfig
from posenc._proto.posenc.v1 import posenc_pb2 as pb
from posenc._proto.posenc.v1 import posenc_pb2_grpc as pb_grpc
from posenc.errors import PosencError


def _new_call_ids() -> None:
    """A nonce and count of this process's own; a forked child (a model
    server's workers) makes new ones, or its calls' ids would be its
    parent's and siblings', and the server would refuse them as retries."""
    global _CALL_NONCE, _call_count
    _CALL_NONCE = f"{os.getpid():x}-{secrets.token_hex(8)}"
    _call_count = itertools.count()


_new_call_ids()
os.register_at_fork(after_in_child=_new_call_ids)


def _metadata(request_id: str):
    """A call's metadata: its request id, and an id of its own that is the
    same on every attempt gRPC makes of it, so a server that already started
    an in-place call (shared or device memory) refuses a retry of it
    (ABORTED) rather than compute on its result."""
    call_id = ("posenc-call-id", f"{_CALL_NONCE}-{next(_call_count)}")
    return (("x-request-id", request_id), call_id) if request_id else (call_id,)


class Client:
    """Client("host:port") or Client("dns:///name:port") for every replica a
    name resolves to; keyword arguments are ChannelConfig's fields."""

    def __init__(self, target: str = "localhost:50051", **config):
        self.config = ChannelConfig(target=target, **config)
        self.config.validate()
        creds = self.config.credentials()
        opts = self.config.options()
        self._channel = (grpc.secure_channel(target, creds, opts) if creds
                         else grpc.insecure_channel(target, opts))
        self._stub = pb_grpc.PositionalEncodingStub(self._channel)
        self._shm = _shm.Pool(self.config.shared_memory, target.startswith("unix:"))
        self._device = _cuda.DeviceRegions(self.config.shared_memory, target.startswith("unix:"))
        self._info_asked = False
        self._info_lock = threading.Lock()

    def close(self) -> None:
        self._device.close(self._stub)
        self._shm.close()
        self._channel.close()

    @property
    def uses_shared_memory(self) -> bool:
        """Whether tensors now go through shared memory ("auto" decides on
        the first tensor call and stops at the first failure of a region)."""
        return self._shm.usable

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def channel(self) -> grpc.Channel:
        return self._channel

    def _timeout(self, timeout):
        return self.config.timeout if timeout is None else timeout

    def _call(self, method: str, request, timeout, request_id: str):
        try:
            return getattr(self._stub, method)(request, timeout=self._timeout(timeout),
                                               metadata=_metadata(request_id))
        except grpc.RpcError as e:
            raise PosencError.from_rpc_error(e) from None

    def _decide(self) -> None:
        """Asks the server what it shares with this process, until it answers
        (one caller at a time: the others wait for the answer rather than
        finding it undecided)."""
        if self._info_asked or not self._shm.may_ask():
            return
        with self._info_lock:
            if self._info_asked or not self._shm.may_ask():
                return
            try:
                info = self._stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=10)
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNIMPLEMENTED:
                    self._shm.undecided(e.details() or str(e.code()))  # asked again later
                    return
                info = None
            self._shm.decide(info)
            self._device.decide(info)
            self._info_asked = True

    def _on_device(self, op: _ops.Op) -> bool:
        """Names the call's torch CUDA tensors in registered device memory
        (_cuda.py), when the server computes on their GPU on this node."""
        if self.config.shared_memory == "off" or _cuda.device_tensors(op) is None:
            return False
        self._decide()
        return self._device.place(op, self._stub)

    def _lease(self, op: _ops.Op) -> _shm.Lease | None:
        """A region for the call's tensors, when shared memory is in use."""
        needed = _shm.bytes_needed(op)
        if self.config.shared_memory == "off":
            return None
        if needed <= 0:
            if op.builds and self.config.shared_memory == "require":
                raise _shm.size_unknown(op)
            return None
        self._decide()
        lease = (self._shm.take(self._stub, needed)
                 if self._shm.usable else None)
        if lease is None and self.config.shared_memory == "require":
            raise self._shm.error()
        return lease

    def _run(self, op: _ops.Op, timeout, request_id: str = ""):
        if self._on_device(op):
            try:
                response = self._call(op.method, op.request, timeout, request_id)
                return op.parse(response, _cuda.in_place_reader)
            except PosencError as e:
                if not _shm.region_failed(e.code, e.message):
                    raise
                # The device memory failed (the server restarted, say), not
                # the tensors: host memory from now on.
                self._device.disable(e.message)
                _shm.unplace(op)
        lease = self._lease(op)
        if lease is not None:
            try:
                _shm.place(op, lease)
                response = self._call(op.method, op.request, timeout, request_id)
                return op.parse(response, _shm.reader(lease, op.request))
            except PosencError as e:
                if not _shm.region_failed(e.code, e.message):
                    lease.discard = _shm.outcome_unknown(e.code)
                    raise
                # The region failed, not the tensors: the socket from now on.
                lease.discard = True
                if self.config.shared_memory == "require":
                    raise
                self._shm.disable()
                _shm.unplace(op)
            except BaseException:  # interrupted: the server may be computing there
                lease.discard = True
                raise
            finally:
                lease.release()
        response = self._call(op.method, op.on_socket(), timeout, request_id)
        return op.parse(response, _ops.socket_reader)

    # ------------------------------------------------------------ RoPE ----

    def apply_rope(self, query, key=None, *, timeout=None, request_id: str = "",
                   hf_config: _ops.HfConfig | None = None, **options) -> _ops.RopeResult:
        """Rotates query (and key). Options are RopeRequest's fields: layout,
        position_ids, offsets, cu_seqlens, style, rotary_dim, base, inverse,
        scaling (a dict of RopeScaling fields), axis_mode, axis_dims,
        sections, backend. hf_config: the model's HF config.json (JSON text,
        a dict, or a pathlib.Path to the file), which the server resolves
        into base, rotary_dim, scaling, and style and M-RoPE sections where
        the family implies them; scaling must then be left unset, and the
        other fields, if given, must agree with it."""
        op = _ops.apply_rope(query, key, request_id=request_id, hf_config=hf_config, **options)
        return self._run(op, timeout, request_id)

    def stream_rope(self, items: Iterable, *, timeout=None,
                    request_id: str = "") -> Iterator[_ops.RopeResult]:
        """Many RoPE batches on one call, answers in order. Each item is a
        dict of apply_rope's arguments (or a RopeRequest); a failed item
        yields a RopeResult whose `error` is set while the stream goes on."""
        origins = collections.deque()
        refused = []  # an item the client could not send ends the call; say why

        def requests():
            try:
                for item in items:
                    request, qo, ko = _ops.stream_item(item)
                    origins.append((qo, ko, _ops.socket_reader, _ops.rope_expects(request)))
                    yield request
            except PosencError as e:
                refused.append(e)
                raise

        call = self._stub.StreamRope(requests(), timeout=self._timeout(timeout),
                                     metadata=_metadata(request_id))
        try:
            for response in call:
                yield _ops.rope_result(response, *origins.popleft())
            if refused:
                raise refused[0]
        except grpc.RpcError as e:
            raise (refused[0] if refused else PosencError.from_rpc_error(e)) from None
        finally:
            call.cancel()

    # --------------------------------------------- absolute encodings ----

    def add_sinusoidal(self, x, *, layout=None, base=None, timeout=None, request_id: str = "",
                       **options):
        """x * x_scale + PE[pos] with the sinusoidal table; options:
        position_ids, offsets, cu_seqlens, x_scale, backend."""
        op = _ops.add_absolute(x, layout=layout, base=base, request_id=request_id, **options)
        return self._run(op, timeout, request_id)

    def add_learned(self, x, table: str, *, timeout=None, request_id: str = "", **options):
        """x * x_scale + PE[pos] with a learned table (see list_tables)."""
        op = _ops.add_absolute(x, table=table, request_id=request_id, **options)
        return self._run(op, timeout, request_id)

    def sinusoidal_table(self, dim: int, count: int = 0, *, positions=None, layout=None,
                         base=None, dtype="float32", backend=None, timeout=None):
        """PE rows [n, dim] for `positions`, or for 0 .. count - 1."""
        op = _ops.encoding_table(dim=dim, count=count, positions=positions, layout=layout,
                                 base=base, dtype=dtype, backend=backend)
        return self._run(op, timeout)

    def learned_table(self, table: str, *, positions=None, count: int = 0, dim: int = 0,
                      dtype="float32", backend=None, timeout=None):
        """Rows of a learned table; count 0 without positions: all of it."""
        op = _ops.encoding_table(table=table, dim=dim, count=count, positions=positions,
                                 dtype=dtype, backend=backend)
        return self._run(op, timeout)

    # ------------------------------------------------- attention bias ----

    def attention_bias(self, *, timeout=None, **options) -> _ops.BiasResult:
        """ALiBi-style bias [batch, heads, q_len, k_len], or logits + bias when
        `logits` is given. Options are AttentionBiasRequest's fields."""
        return self._run(_ops.attention_bias(**options), timeout)

    # -------------------------------------------------- control plane ----

    def list_tables(self, *, timeout=None) -> pb.ListTablesResponse:
        return self._run(_ops.control("ListTables"), timeout)

    def reload_tables(self, *, timeout=None) -> pb.ListTablesResponse:
        return self._run(_ops.control("ReloadTables"), timeout)

    def server_info(self, *, timeout=None) -> pb.ServerInfo:
        return self._run(_ops.control("GetServerInfo"), timeout)
