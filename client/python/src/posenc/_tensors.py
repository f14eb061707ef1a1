"""Arrays to posenc.v1 tensors and back.

numpy arrays go as they are (float32, float16, ml_dtypes.bfloat16; int32 or
int64 for positions); torch tensors are accepted when torch is importable and
come back as torch tensors of the same dtype on the same device. Nothing is
cast silently: a float64 query is refused, naming the field, because the
server would compute in a precision the caller did not ask for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import grpc
import ml_dtypes
import numpy as np

from posenc._proto.posenc.v1 import posenc_pb2 as pb
from posenc.errors import PosencError, invalid

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)

_TO_PROTO = {
    np.dtype(np.float32): pb.DATA_TYPE_FLOAT32,
    np.dtype(np.float16): pb.DATA_TYPE_FLOAT16,
    BFLOAT16: pb.DATA_TYPE_BFLOAT16,
    np.dtype(np.int32): pb.DATA_TYPE_INT32,
    np.dtype(np.int64): pb.DATA_TYPE_INT64,
}
_FROM_PROTO = {v: k for k, v in _TO_PROTO.items()}
FLOATS = (np.dtype(np.float32), np.dtype(np.float16), BFLOAT16)
INTEGERS = (np.dtype(np.int32), np.dtype(np.int64))


@dataclass(frozen=True)
class Origin:
    """Where an input came from, so its result goes back the same way."""

    torch_device: Any = None  # a torch.device when the input was a torch tensor
    source: Any = None  # a torch CUDA tensor, which a call may compute in place

    def restore(self, array):
        from posenc._cuda import IN_PLACE

        if array is IN_PLACE:
            return self.source  # computed where it was (_cuda.py)
        if self.torch_device is None:
            return array
        return _numpy_to_torch(array).to(self.torch_device)


_TORCH_FLOATS = {"torch.float32": np.dtype(np.float32), "torch.float16": np.dtype(np.float16),
                 "torch.bfloat16": BFLOAT16}


class CudaTensor:
    """A torch CUDA tensor as an input: its dtype and shape now, its bytes
    (a copy to the host) only if the call does not pass it by CUDA IPC
    handle (_cuda.py), so a call that does copies nothing."""

    def __init__(self, tensor, dtype: np.dtype):
        self.tensor, self.dtype, self.shape = tensor, dtype, tuple(tensor.shape)
        self.ndim = len(self.shape)
        self.size = math.prod(self.shape)
        self.nbytes = self.size * dtype.itemsize
        self._host = None

    def host(self) -> np.ndarray:
        if self._host is None:
            self._host = _torch_to_numpy(self.tensor)
        return self._host

    def tobytes(self) -> bytes:
        return self.host().tobytes()

    def reshape(self, *shape):
        return self.host().reshape(*shape)

    def __array__(self, dtype=None, copy=None):
        a = self.host()
        return a if dtype is None else a.astype(dtype)


def _is_torch(x) -> bool:
    # No import of torch here: a caller who never uses it never pays for it.
    return type(x).__module__.startswith("torch") and hasattr(x, "detach")


def _torch_to_numpy(t) -> np.ndarray:
    import torch

    t = t.detach().to("cpu").contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(BFLOAT16)
    return t.numpy()


def _numpy_to_torch(a: np.ndarray):
    import torch

    if a.dtype == BFLOAT16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def as_array(x, field: str, allowed) -> tuple[np.ndarray, Origin]:
    """A C-contiguous little-endian array of an allowed dtype, or PosencError."""
    origin = Origin()
    if _is_torch(x):
        dtype = _TORCH_FLOATS.get(str(x.dtype))
        if getattr(x, "is_cuda", False) and dtype is not None and dtype in allowed:
            return CudaTensor(x, dtype), Origin(torch_device=x.device, source=x)
        origin = Origin(torch_device=x.device)
        x = _torch_to_numpy(x)
    a = np.asarray(x)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    if a.dtype not in allowed:
        names = ", ".join(_name(d) for d in allowed)
        raise invalid(f"{field}: dtype {a.dtype} is not supported; expected one of {names}")
    return np.ascontiguousarray(a), origin


def _name(d: np.dtype) -> str:
    return "bfloat16" if d == BFLOAT16 else str(d)


def positions(x, field: str) -> np.ndarray:
    """Integer positions (a list of Python ints is int64; floats are refused,
    never truncated)."""
    if not _is_torch(x) and not isinstance(x, np.ndarray):
        x = np.asarray(x)
        if x.size == 0:
            x = x.astype(np.int64)
    a, _ = as_array(x, field, INTEGERS)
    return a


def set_desc(a: np.ndarray, desc: pb.TensorDesc) -> None:
    desc.dtype = _TO_PROTO[a.dtype]
    desc.shape.extend(a.shape)


def itemsize(data_type: int) -> int:
    """Bytes of one element of a DataType (UNSPECIFIED: float32, the default)."""
    return _FROM_PROTO.get(data_type or pb.DATA_TYPE_FLOAT32, np.dtype(np.float32)).itemsize


def dtype_of(data_type: int):
    return _FROM_PROTO.get(data_type)


def small_tensor(a: np.ndarray) -> pb.Tensor:
    return pb.Tensor(dtype=_TO_PROTO[a.dtype], shape=list(a.shape), data=a.tobytes())


def dtype_proto(dtype, field: str) -> int:
    """A requested output dtype (numpy dtype, "bfloat16", ...) as DataType."""
    try:
        d = BFLOAT16 if dtype in ("bfloat16", "bf16") else np.dtype(dtype)
    except TypeError as e:
        raise invalid(f"{field}: {dtype!r} is not a dtype") from e
    if d not in FLOATS:
        raise invalid(f"{field}: dtype {d} is not supported; expected float32, float16 or bfloat16")
    return _TO_PROTO[d]


def expect_of(desc: pb.TensorDesc) -> tuple[int, tuple]:
    """What an answer must describe for a tensor sent as `desc`."""
    return desc.dtype, tuple(desc.shape)


def check_desc(desc: pb.TensorDesc, expect: tuple[int, tuple | None] | None, field: str) -> None:
    """Refuses an answer's tensor that is not the one asked for: another
    dtype (float16 bytes read as bfloat16 would be silently wrong) or another
    shape. `expect` is (DataType, shape, or None when the server decides it);
    None checks nothing."""
    if expect is None:
        return
    dtype, shape = expect[0] or pb.DATA_TYPE_FLOAT32, expect[1]
    if desc.dtype != dtype or (shape is not None and tuple(desc.shape) != tuple(shape)):
        want = pb.DataType.Name(dtype) + (f" {list(shape)}" if shape is not None else "")
        got = (pb.DataType.Name(desc.dtype) if desc.dtype in pb.DataType.values()
               else str(desc.dtype))
        raise PosencError(grpc.StatusCode.INTERNAL,
                          f"the server's answer is malformed: {field} is {got} "
                          f"{list(desc.shape)}; expected {want}")


def from_desc(desc: pb.TensorDesc, data: bytes, field: str) -> np.ndarray:
    """The server's tensor as a writable array, checked against its description."""
    dtype = _FROM_PROTO.get(desc.dtype)
    shape = tuple(desc.shape)
    if dtype is None or any(d < 0 for d in shape):
        raise PosencError(grpc.StatusCode.INTERNAL,
                          f"the server's answer is malformed: {field} has dtype {desc.dtype}, "
                          f"shape {list(shape)}")
    expected = math.prod(shape) * dtype.itemsize
    if expected != len(data):
        raise PosencError(grpc.StatusCode.INTERNAL,
                          f"the server's answer is malformed: {field} of shape {list(shape)} "
                          f"needs {expected} bytes; {len(data)} came")
    return np.frombuffer(data, dtype=dtype).reshape(shape).copy()
