"""The asyncio client: AsyncClient has Client's methods as coroutines
(stream_rope is an async generator) on a grpc.aio channel."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator

import grpc
import grpc.aio

from posenc import _cuda, _ops, _shm
from posenc._channel import ChannelConfig
from posenc._proto.posenc.v1 import posenc_pb2 as pb
from posenc._proto.posenc.v1 import posenc_pb2_grpc as pb_grpc
from posenc.client import _metadata
from posenc.errors import PosencError


async def _off_loop(f, *args):
    """f(*args) on a worker thread, carried through even if the awaiting task
    is cancelled meanwhile (a Lease it returns is then released)."""
    done = asyncio.ensure_future(asyncio.to_thread(f, *args))
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        def release(fut):
            if not fut.cancelled() and fut.exception() is None and \
                    isinstance(fut.result(), _shm.Lease):
                fut.result().release()
        done.add_done_callback(release)
        raise


class AsyncClient:
    """AsyncClient("host:port", **ChannelConfig fields); use `async with` or
    `await close()`."""

    def __init__(self, target: str = "localhost:50051", **config):
        self.config = ChannelConfig(target=target, **config)
        self.config.validate()
        creds = self.config.credentials()
        opts = self.config.options()
        self._channel = (grpc.aio.secure_channel(target, creds, opts) if creds
                         else grpc.aio.insecure_channel(target, opts))
        self._stub = pb_grpc.PositionalEncodingStub(self._channel)
        self._shm = _shm.Pool(self.config.shared_memory, target.startswith("unix:"))
        self._device = _cuda.DeviceRegions(self.config.shared_memory, target.startswith("unix:"))
        self._info_asked = False
        self._info_lock: asyncio.Lock | None = None  # made in the loop, on first use
        # Registering and unregistering regions (rare: first use, growth, a
        # call that ran out of time) go over a small blocking channel of
        # their own, on a worker thread: never in the event loop.
        self._control = None

    async def close(self) -> None:
        if self._control is not None:
            await asyncio.to_thread(self._device.close, self._control_stub())
        await asyncio.to_thread(self._shm.close)
        if self._control is not None:
            self._control[0].close()
        await self._channel.close()

    @property
    def uses_shared_memory(self) -> bool:
        """Client.uses_shared_memory."""
        return self._shm.usable

    def _control_stub(self):
        if self._control is None:
            creds = self.config.credentials()
            opts = self.config.options()
            channel = (grpc.secure_channel(self.config.target, creds, opts) if creds
                       else grpc.insecure_channel(self.config.target, opts))
            self._control = (channel, pb_grpc.PositionalEncodingStub(channel))
        return self._control[1]

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    def _timeout(self, timeout):
        return self.config.timeout if timeout is None else timeout

    async def _call(self, method: str, request, timeout, request_id: str):
        try:
            return await getattr(self._stub, method)(
                request, timeout=self._timeout(timeout), metadata=_metadata(request_id))
        except grpc.RpcError as e:
            raise PosencError.from_rpc_error(e) from None

    async def _decide(self) -> None:
        """Client._decide: asked until the server answers, one task at a time."""
        if self._info_asked or not self._shm.may_ask():
            return
        if self._info_lock is None:
            self._info_lock = asyncio.Lock()
        async with self._info_lock:
            if self._info_asked or not self._shm.may_ask():
                return
            try:
                info = await self._stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=10)
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNIMPLEMENTED:
                    self._shm.undecided(e.details() or str(e.code()))
                    return
                info = None
            self._shm.decide(info)
            self._device.decide(info)
            self._info_asked = True

    async def _on_device(self, op: _ops.Op) -> bool:
        """Client._on_device: the registrations are blocking calls (rare:
        once per allocation) on the control channel."""
        if self.config.shared_memory == "off" or _cuda.device_tensors(op) is None:
            return False
        await self._decide()
        # In the loop's thread: it synchronizes the caller's current CUDA
        # stream, which is per thread.
        return self._device.place(op, self._control_stub())

    async def _lease(self, op: _ops.Op) -> _shm.Lease | None:
        """A region for the call's tensors, when shared memory is in use."""
        needed = _shm.bytes_needed(op)
        if self.config.shared_memory == "off":
            return None
        if needed <= 0:
            if op.builds and self.config.shared_memory == "require":
                raise _shm.size_unknown(op)
            return None
        await self._decide()
        lease = None
        if self._shm.usable:
            # An idle region at once; making one (a registration) off the loop.
            lease = self._shm.take_idle(needed) or await _off_loop(
                self._shm.take, self._control_stub(), needed)
        if lease is None and self.config.shared_memory == "require":
            raise self._shm.error()
        return lease

    async def _run(self, op: _ops.Op, timeout, request_id: str = ""):
        if await self._on_device(op):
            try:
                response = await self._call(op.method, op.request, timeout, request_id)
                return op.parse(response, _cuda.in_place_reader)
            except PosencError as e:
                if not _shm.region_failed(e.code, e.message):
                    raise
                self._device.disable(e.message)
                _shm.unplace(op)
        lease = await self._lease(op)
        if lease is not None:
            try:
                _shm.place(op, lease)
                response = await self._call(op.method, op.request, timeout, request_id)
                return op.parse(response, _shm.reader(lease, op.request))
            except PosencError as e:
                if not _shm.region_failed(e.code, e.message):
                    lease.discard = _shm.outcome_unknown(e.code)
                    raise
                # The region failed, not the tensors: the socket from now on.
                lease.discard = True
                if self.config.shared_memory == "require":
                    raise
                await asyncio.to_thread(self._shm.disable)
                _shm.unplace(op)
            except BaseException:  # cancelled: the server may be computing there
                lease.discard = True
                raise
            finally:
                if lease.discard:
                    # Unregistering waits for the server: off the loop, and
                    # done even if this task is cancelled.
                    await _off_loop(lease.release)
                else:
                    lease.release()  # back to the pool
        response = await self._call(op.method, op.on_socket(), timeout, request_id)
        return op.parse(response, _ops.socket_reader)

    async def apply_rope(self, query, key=None, *, timeout=None, request_id: str = "",
                         hf_config: _ops.HfConfig | None = None,
                         **options) -> _ops.RopeResult:
        """Client.apply_rope's arguments (hf_config included)."""
        op = _ops.apply_rope(query, key, request_id=request_id, hf_config=hf_config, **options)
        return await self._run(op, timeout, request_id)

    async def stream_rope(self, items, *, timeout=None,
                          request_id: str = "") -> AsyncIterator[_ops.RopeResult]:
        """items: an iterable or async iterable of apply_rope argument dicts
        (or RopeRequests)."""
        origins = collections.deque()
        refused = []  # an item the client could not send ends the call; say why

        async def each():
            if hasattr(items, "__aiter__"):
                async for item in items:
                    yield item
            else:
                for item in items:
                    yield item

        async def requests():
            try:
                async for item in each():
                    request, qo, ko = _ops.stream_item(item)
                    origins.append((qo, ko, _ops.socket_reader, _ops.rope_expects(request)))
                    yield request
            except PosencError as e:
                refused.append(e)
                raise

        call = self._stub.StreamRope(requests(), timeout=self._timeout(timeout),
                                     metadata=_metadata(request_id))
        try:
            async for response in call:
                yield _ops.rope_result(response, *origins.popleft())
            if refused:
                raise refused[0]
        except grpc.RpcError as e:
            raise (refused[0] if refused else PosencError.from_rpc_error(e)) from None
        except asyncio.CancelledError:
            # grpc.aio cancels the call when the request iterator raises.
            if refused:
                raise refused[0] from None
            raise
        finally:
            call.cancel()

    async def add_sinusoidal(self, x, *, layout=None, base=None, timeout=None,
                             request_id: str = "", **options):
        op = _ops.add_absolute(x, layout=layout, base=base, request_id=request_id, **options)
        return await self._run(op, timeout, request_id)

    async def add_learned(self, x, table: str, *, timeout=None, request_id: str = "", **options):
        op = _ops.add_absolute(x, table=table, request_id=request_id, **options)
        return await self._run(op, timeout, request_id)

    async def sinusoidal_table(self, dim: int, count: int = 0, *, positions=None, layout=None,
                               base=None, dtype="float32", backend=None, timeout=None):
        op = _ops.encoding_table(dim=dim, count=count, positions=positions, layout=layout,
                                 base=base, dtype=dtype, backend=backend)
        return await self._run(op, timeout)

    async def learned_table(self, table: str, *, positions=None, count: int = 0, dim: int = 0,
                            dtype="float32", backend=None, timeout=None):
        op = _ops.encoding_table(table=table, dim=dim, count=count, positions=positions,
                                 dtype=dtype, backend=backend)
        return await self._run(op, timeout)

    async def attention_bias(self, *, timeout=None, **options) -> _ops.BiasResult:
        return await self._run(_ops.attention_bias(**options), timeout)

    async def list_tables(self, *, timeout=None) -> pb.ListTablesResponse:
        return await self._run(_ops.control("ListTables"), timeout)

    async def reload_tables(self, *, timeout=None) -> pb.ListTablesResponse:
        return await self._run(_ops.control("ReloadTables"), timeout)

    async def server_info(self, *, timeout=None) -> pb.ServerInfo:
        return await self._run(_ops.control("GetServerInfo"), timeout)
