"""What the Python client adds to a call: posenc.Client.apply_rope against
the bare generated stub on the same channel settings (the stub call is what
any hand-written gRPC Python caller pays), serial calls, for a decode-size
and a prefill-size request; and AsyncClient's throughput at 16 concurrent
calls. Starts its own posenc-server (loopback, --threads=1).

    python bench/python_client_bench.py build/server/posenc-server
(in the venv of scripts/install-python-client.sh). Results: PYTHON_CLIENT.md."""

from __future__ import annotations

import asyncio
import os
import pathlib
import sys
import time

import ml_dtypes
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "client/python/tests"))
os.environ["POSENC_SERVER"] = sys.argv[1] if len(sys.argv) > 1 else "build/server/posenc-server"

import posenc  # noqa: E402
from conftest import ServerProcess  # noqa: E402
from posenc._proto.posenc.v1 import posenc_pb2 as pb  # noqa: E402
from posenc._proto.posenc.v1 import posenc_pb2_grpc as pb_grpc  # noqa: E402

CASES = {
    "decode fp32 [1,1,32,128] (16 KiB)": np.ones((1, 1, 32, 128), np.float32),
    "prefill bf16 [1,512,32,128] (4 MiB)": np.ones((1, 512, 32, 128), ml_dtypes.bfloat16),
}


def percentiles(samples):
    s = np.sort(np.asarray(samples)) * 1e6
    return s[len(s) // 2], s[int(len(s) * 0.99) - 1]


def serial(fn, n):
    for _ in range(n // 10):
        fn()  # warm-up
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return percentiles(times)


def main():
    server = ServerProcess()
    client = posenc.Client(server.target)
    stub = pb_grpc.PositionalEncodingStub(client.channel)
    print(f"| request | calls | stub p50 / p99 (us) | posenc.Client p50 / p99 (us) |")
    print("|---|---|---|---|")
    for name, q in CASES.items():
        n = 2000 if q.nbytes < 1 << 20 else 200
        dtype = pb.DATA_TYPE_BFLOAT16 if q.dtype == ml_dtypes.bfloat16 else pb.DATA_TYPE_FLOAT32

        def bare():
            r = pb.RopeRequest(query=pb.TensorDesc(dtype=dtype, shape=q.shape),
                               query_data=q.tobytes())
            a = stub.ApplyRope(r, timeout=30)
            return np.frombuffer(a.query_data, q.dtype).reshape(q.shape)

        def wrapped():
            return client.apply_rope(q).query

        (s50, s99), (c50, c99) = serial(bare, n), serial(wrapped, n)
        print(f"| {name} | {n} | {s50:.0f} / {s99:.0f} | {c50:.0f} / {c99:.0f} |")

    async def concurrent(q, calls=2000, width=16):
        async with posenc.AsyncClient(server.target) as aclient:
            await aclient.apply_rope(q)
            start = time.perf_counter()
            for _ in range(calls // width):
                await asyncio.gather(*(aclient.apply_rope(q) for _ in range(width)))
            return calls / (time.perf_counter() - start)

    rate = asyncio.run(concurrent(CASES["decode fp32 [1,1,32,128] (16 KiB)"]))
    print(f"\nAsyncClient, decode fp32, 16 concurrent: {rate:.0f} calls/s")
    client.close()
    server.stop()


if __name__ == "__main__":
    main()
