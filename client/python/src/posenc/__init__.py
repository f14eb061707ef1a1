"""posenc: a Python client for the posenc positional-encoding service.

    import numpy as np, posenc
    with posenc.Client("localhost:50051") as client:
        q = np.random.randn(1, 16, 8, 64).astype(np.float32)
        rotated = client.apply_rope(q, base=500000).query

Arrays in and out are numpy (float32, float16, ml_dtypes.bfloat16) or, when
torch is installed, torch tensors. Failures raise PosencError(code, message).
"""

from posenc._channel import ChannelConfig
from posenc._ops import BiasResult, HfConfig, RopeResult, rope_request, scaling_message
from posenc._proto.posenc.v1 import posenc_pb2 as v1
from posenc._tensors import BFLOAT16 as bfloat16
from posenc.aio import AsyncClient
from posenc.client import Client
from posenc.errors import PosencError

__all__ = ["AsyncClient", "BiasResult", "ChannelConfig", "Client", "HfConfig", "PosencError",
           "RopeResult", "bfloat16", "rope_request", "scaling_message", "v1"]
__version__ = "0.1.0"
