"""Tensors through shared memory, as the C++ client moves them
(client/src/shared_memory.h): when the server shares this node and its
/dev/shm (a ``unix:`` target, or the shared_memory_domain GetServerInfo
advertises equal to this process's), a request's tensors go into a region
this client owns, the server works on them in place there, and the results
are read back out of it. Regions are made on first need, reused across calls,
replaced by one at least twice as large when a call needs more, registered
once and unlinked from /dev/shm at once (the server's mapping and ours keep
them alive). The first failure of a region turns shared memory off for the
client, which then uses the socket.

A region goes back to the pool only after a call the server finished with
(outcome_unknown): after a call that ended on the client's side (a deadline, a
cancellation, a lost connection) the server may still be computing into it,
so it is unregistered and never carries another call. An answer is trusted
only if it describes each tensor as sent and carries none of its bytes.
"""

from __future__ import annotations

import mmap
import os
import secrets
import threading
import time

import math

import grpc
import numpy as np

from posenc import _tensors as T
from posenc._proto.posenc.v1 import posenc_pb2 as pb
from posenc.errors import PosencError

MODES = ("auto", "off", "require")
_MIN_REGION = 1 << 20
_MAX_IDLE = 4
# A region refused for want of room (the server's budget or caps, a full
# /dev/shm) is no reason to give shared memory up: the socket for a while,
# 100 ms doubling to 5 s while refusals go on, then ask again.
_FIRST_BACKOFF_S, _MAX_BACKOFF_S = 0.1, 5.0
_ALIGN = 64

def local_domain() -> str:
    """This process's shared-memory domain, computed as the server computes
    its own: "<boot id>/<device>:<inode>" of /dev/shm ("" when unknown)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip() or "unknown"
        st = os.stat("/dev/shm")
    except OSError:
        return ""
    return f"{boot}/{st.st_dev}:{st.st_ino}"


# Refusals that leave shared memory worth asking for again later: no room
# now, or a moment's trouble (the server starting, a registration out of time).
TRANSIENT = (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE,
             grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
             grpc.StatusCode.ABORTED)

# Failures the server sends having finished with a call (it refused it
# before any work, or did it).
_SERVER_DONE = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED,
                grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION,
                grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.ALREADY_EXISTS,
                grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED,
                grpc.StatusCode.UNIMPLEMENTED)


def outcome_unknown(code) -> bool:
    """Whether a call that failed with `code` may still be running on the
    server or have taken effect there (any failure but _SERVER_DONE's: a
    deadline, a cancellation, a lost connection, an unreadable answer): its
    region may still be written, its registration may have been made."""
    return code not in _SERVER_DONE


def region_failed(code, message: str) -> bool:
    """Whether a call failed for its region, not its tensors: then the same
    call goes over the socket."""
    return (code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION)
            and "shared memory" in message)


class Region:
    def __init__(self, name: str, mapping: mmap.mmap):
        self.name = name
        self.map = mapping
        self.size = len(mapping)


class Lease:
    """A region held for one call; laid out front to back, 64-byte aligned."""

    def __init__(self, pool: "Pool", region: Region):
        self.pool, self.region, self.next, self.discard = pool, region, 0, False

    def reserve(self, nbytes: int, slice_: pb.SharedMemorySlice) -> int:
        slice_.region = self.region.name
        slice_.offset = self.next
        slice_.byte_size = nbytes
        at = self.next
        self.next += (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
        return at

    def put(self, a: np.ndarray, slice_: pb.SharedMemorySlice) -> None:
        """Copies a C-contiguous array into the region (the one copy)."""
        at = self.reserve(a.nbytes, slice_)
        if a.nbytes:
            np.frombuffer(self.region.map, np.uint8, a.nbytes, at)[:] = a.reshape(-1).view(np.uint8)

    def array(self, slice_: pb.SharedMemorySlice, desc: pb.TensorDesc, field: str,
              data: bytes = b"", expect=None) -> np.ndarray:
        """The server's result in the region, as the socket would have
        returned it (a copy: the region is reused by the next call). The
        answer must describe what was sent (`expect`), fill the slice and
        carry none of the bytes (`data`): bytes the server did not write are
        the caller's input, or an earlier call's result."""
        T.check_desc(desc, expect, field)
        dtype = T.dtype_of(desc.dtype)
        shape = tuple(desc.shape)
        if dtype is None or any(d < 0 for d in shape) or data or \
                math.prod(shape) * dtype.itemsize != slice_.byte_size:
            raise PosencError(grpc.StatusCode.INTERNAL,
                              f"the server's answer is malformed: {field} of dtype {desc.dtype}, "
                              f"shape {list(shape)} ({len(data)} bytes in the answer) is not the "
                              f"{slice_.byte_size} bytes of its shared-memory slice")
        n = math.prod(shape)
        return np.frombuffer(self.region.map, dtype, n, slice_.offset).reshape(shape).copy()

    def release(self) -> None:
        if self.region is not None:
            self.pool._give_back(self.region, self.discard)
            self.region = None


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class Pool:
    """The client's regions; `register` and `unregister` are the stub's
    RegisterSharedMemory and UnregisterSharedMemory (blocking calls)."""

    def __init__(self, mode: str, unix_target: bool):
        self.mode, self.unix_target = mode, unix_target
        self._lock = threading.Lock()
        self._usable: bool | None = None if mode != "off" else False
        self._idle: list[Region] = []
        self._largest = 0
        self._created = 0
        self._nonce = secrets.token_hex(8)
        self._stub = None
        self._retry_at = 0.0
        self._backoff = _FIRST_BACKOFF_S
        self._ask_at, self._ask_backoff = 0.0, _FIRST_BACKOFF_S
        self.why_not: tuple[grpc.StatusCode, str] | None = None  # the last refusal

    def error(self) -> PosencError:
        """For shared_memory='require' when take() declined: why."""
        code, why = self.why_not or (
            grpc.StatusCode.FAILED_PRECONDITION,
            "this server cannot share memory with this process (not on this node, another "
            "/dev/shm, or turned off)")
        if code != grpc.StatusCode.RESOURCE_EXHAUSTED:
            # Deferred, or not asked yet: worth trying again.
            code = (grpc.StatusCode.UNAVAILABLE if code in TRANSIENT
                    else grpc.StatusCode.FAILED_PRECONDITION)
        return PosencError(code, f"shared_memory='require' but {why}")

    def _defer(self, code: grpc.StatusCode, why: str) -> None:
        with self._lock:
            self.why_not = (code, why)
            self._retry_at = time.monotonic() + self._backoff
            self._backoff = min(2 * self._backoff, _MAX_BACKOFF_S)

    # -- deciding and registering (the caller passes its blocking stub) --

    def may_ask(self) -> bool:
        """Whether the server may be asked what it shares (GetServerInfo)
        now: not within the backoff after it got no answer, so a server that
        is down does not cost every call an extra round trip."""
        return time.monotonic() >= self._ask_at

    def undecided(self, why: str) -> None:
        """The server could not be asked (starting, unreachable): this call
        uses the socket, and one after a backoff (0.1 s doubling to 5 s)
        asks again."""
        with self._lock:
            self.why_not = (grpc.StatusCode.UNAVAILABLE,
                            f"could not ask the server whether it shares memory: {why}")
            self._ask_at = time.monotonic() + self._ask_backoff
            self._ask_backoff = min(2 * self._ask_backoff, _MAX_BACKOFF_S)

    def decide(self, info: pb.ServerInfo | None) -> bool:
        same = bool(info is not None and info.shared_memory_enabled and
                    (self.unix_target or (info.shared_memory_domain and
                                          info.shared_memory_domain == local_domain())))
        with self._lock:
            if self._usable is None:
                self._usable = same
                self.why_not = None  # the answer, not an earlier failure to ask
            return self._usable

    @property
    def decided(self) -> bool:
        return self._usable is not None

    @property
    def usable(self) -> bool:
        return bool(self._usable)

    def disable(self, why: str = "") -> None:
        with self._lock:
            self._usable = False
            if why:
                self.why_not = (grpc.StatusCode.FAILED_PRECONDITION, why)
            idle, self._idle = self._idle, []
        for r in idle:
            self._drop(r)

    def take(self, stub, nbytes: int) -> Lease | None:
        self._stub = stub
        with self._lock:
            if not self._usable:
                return None
            lease = self._pop_idle_locked(nbytes)
            if lease is not None:
                return lease
            if time.monotonic() < self._retry_at:
                return None  # deferred
            # Geometric growth for a caller whose tensors grow, but at most
            # twice this call's bytes: calls in flight together need a region
            # each, and growth from the largest alone doubled with each.
            size = max(nbytes, min(2 * self._largest, 2 * nbytes), _MIN_REGION)
            size = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE
            n = self._created
            self._created += 1
        region = self._create(size, n)
        if region is None:
            return None
        # Idle regions too small for this call are outgrown (a caller whose
        # tensors grow keeps one region); those that would have held it stay,
        # for callers of other sizes.
        with self._lock:
            self._largest = max(self._largest, size)
            outgrown = [r for r in self._idle if r.size < nbytes]
            self._idle = [r for r in self._idle if r.size >= nbytes]
        for r in outgrown:
            self._drop(r)
        return Lease(self, region)

    def _create(self, size: int, n: int) -> Region | None:
        name = f"/posenc-py-{os.getpid()}-{self._nonce}-{n}"
        path = "/dev/shm" + name
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except OSError as e:
            self.disable(f"creating {path}: {e}")
            return None
        try:
            # The object's pages now, not at first touch: a full /dev/shm
            # (a pod's sizeLimit) is ENOSPC here, not SIGBUS in a copy.
            os.posix_fallocate(fd, 0, size)
            mapping = mmap.mmap(fd, size)
        except OSError as e:
            os.close(fd)
            os.unlink(path)
            self._defer(grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"could not size or map a region of {size} bytes: {e}")
            return None
        os.close(fd)
        try:
            self._stub.RegisterSharedMemory(
                pb.RegisterSharedMemoryRequest(name=name, key=name, byte_size=size), timeout=10)
        except grpc.RpcError as e:
            # The name is ours alone (the nonce): taken means an attempt of
            # this very registration got through and its answer was lost
            # before gRPC retried it.
            if e.code() != grpc.StatusCode.ALREADY_EXISTS:
                mapping.close()
                # The server may have registered it and the answer been lost.
                if outcome_unknown(e.code()):
                    self._unregister(name)
                if e.code() in TRANSIENT:
                    self._defer(e.code(), e.details() or "the server refused a region")
                else:
                    self.disable(f"the server refused a region: {e.details()}")
                return None
        finally:
            # Registered, the server maps the object; no file is needed now.
            try:
                os.unlink(path)
            except OSError:
                pass
        with self._lock:
            self._backoff, self.why_not = _FIRST_BACKOFF_S, None
        return Region(name, mapping)

    def _give_back(self, region: Region, discard: bool) -> None:
        with self._lock:
            # Kept while shared memory is in use; a full pool gives back its
            # smallest region (this one, or an idle one smaller).
            if not discard and self._usable:
                self._idle.append(region)
                if len(self._idle) <= _MAX_IDLE:
                    return
                region = min(self._idle, key=lambda r: r.size)
                self._idle.remove(region)
        self._drop(region)

    def _unregister(self, name: str) -> None:
        try:
            if self._stub is not None:
                self._stub.UnregisterSharedMemory(
                    pb.UnregisterSharedMemoryRequest(name=name), timeout=2)
        except (grpc.RpcError, ValueError):  # ValueError: the channel is closed
            pass

    def _drop(self, region: Region) -> None:
        self._unregister(region.name)
        try:
            region.map.close()
        except (BufferError, ValueError):
            pass

    def take_idle(self, nbytes: int) -> Lease | None:
        """An idle region that holds `nbytes`, without any call to the server
        (None: take() would have to make one)."""
        with self._lock:
            return self._pop_idle_locked(nbytes) if self._usable else None

    def _pop_idle_locked(self, nbytes: int) -> Lease | None:
        """The smallest idle region that holds `nbytes`, leased."""
        fits = [r for r in self._idle if r.size >= nbytes]
        if not fits:
            return None
        region = min(fits, key=lambda r: r.size)
        self._idle.remove(region)
        return Lease(self, region)

    def close(self) -> None:
        with self._lock:
            self._usable = False  # a lease released after this is dropped, not pooled
            idle, self._idle = self._idle, []
        for r in idle:
            self._drop(r)


def size_unknown(op) -> PosencError:
    """shared_memory='require', and a built tensor whose size the server
    decides (a learned table's own rows or dim, a bias without every
    dimension): it cannot be placed in a region."""
    return PosencError(grpc.StatusCode.FAILED_PRECONDITION,
                       f"shared_memory='require' but the size of {op.method}'s result is not "
                       f"known before the server builds it (give every dimension), so it cannot "
                       f"be placed in shared memory")


def bytes_needed(op) -> int:
    """The region bytes an Op's tensors take (0: nothing to carry)."""
    total = sum(_align(a.nbytes) for a, _, _ in op.tensors)
    if op.output is not None:
        total += _align(op.output[1])
    return total


def place(op, lease: Lease) -> None:
    """Puts an Op's tensors in the lease's region (and room for a tensor the
    server builds), naming the slices in its request."""
    for a, _, slice_field in op.tensors:
        lease.put(a, getattr(op.request, slice_field))
    if op.output is not None:
        field, nbytes = op.output
        lease.reserve(nbytes, getattr(op.request, field))


def unplace(op) -> None:
    """The request as it was before place (for the socket)."""
    for _, _, slice_field in op.tensors:
        op.request.ClearField(slice_field)
    if op.output is not None:
        op.request.ClearField(op.output[0])


def reader(lease: Lease, request):
    """An _ops.Reader taking the answer's tensors out of the region."""
    def read(response, data: str, desc: str, slice_field: str, expect=None):
        return lease.array(getattr(request, slice_field), getattr(response, desc), desc,
                           getattr(response, data), expect)
    return read
