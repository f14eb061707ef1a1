"""Where the peer's time goes, without sockets: one 1 MiB rope request through
kserve's own request/response conversion and RopeModel.predict, in process.

  build/kserve-peer-venv/bin/python bench/peers/kserve_numpy/inprocess.py [N]

Prints the median over N (default 200) of: parsing the serialised
ModelInferRequest; InferRequest.from_grpc + predict (the numpy RoPE, cos/sin
included); InferResponse.to_grpc + serialising the answer.
"""
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb  # noqa: E402
from kserve.protocol.infer_type import InferRequest  # noqa: E402
from rope_model import RopeModel  # noqa: E402


def median_us(fn, n):
    fn()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
q = np.random.default_rng(0).standard_normal((1, 128, 16, 128)).astype(np.float32)
req = pb.ModelInferRequest(
    model_name="rope", raw_input_contents=[q.tobytes()],
    inputs=[pb.ModelInferRequest.InferInputTensor(name="query", datatype="FP32", shape=q.shape)])
wire = req.SerializeToString()
model = RopeModel()
answer = model.predict(InferRequest.from_grpc(req))
print(f"parse request        {median_us(lambda: pb.ModelInferRequest.FromString(wire), n):8.0f} us")
print(f"from_grpc + predict  {median_us(lambda: model.predict(InferRequest.from_grpc(req)), n):8.0f} us")
print(f"to_grpc + serialise  {median_us(lambda: answer.to_grpc().SerializeToString(), n):8.0f} us")
