"""The Python client through shared memory (shared_memory="require") against
the same client on the socket ("off"), one caller, serial apply_rope calls,
alternating rounds, against its own posenc-server (loopback, shared memory
on, room for the 80 MiB prefill). Prints p50 and p99 per workload, round and
path, in microseconds.

    python bench/python_shared_memory_bench.py build/server/posenc-server [ROUNDS]
(in the venv of scripts/install-python-client.sh). Results: SHARED_MEMORY.md."""

from __future__ import annotations

import os
import pathlib
import sys
import time

import ml_dtypes
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "client/python/tests"))
os.environ["POSENC_SERVER"] = sys.argv[1] if len(sys.argv) > 1 else "build/server/posenc-server"
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3

import posenc  # noqa: E402
from conftest import ServerProcess  # noqa: E402

bf16 = ml_dtypes.bfloat16
CASES = [  # name, query, key, calls
    ("decode 32x1x(32+8)x128 bf16", np.ones((32, 1, 32, 128), bf16),
     np.ones((32, 1, 8, 128), bf16), 300),
    ("1 MiB 1x128x32x128 bf16", np.ones((1, 128, 32, 128), bf16), None, 200),
    ("prefill 4096x(32+8)x128 f32", np.ones((1, 4096, 32, 128), np.float32),
     np.ones((1, 4096, 8, 128), np.float32), 15),
]

server = ServerProcess("--enable_system_shared_memory", f"--max_request_bytes={128 << 20}",
                       "--threads=2")
try:
    clients = {path: posenc.Client(server.target, shared_memory=mode)
               for path, mode in (("socket", "off"), ("shared_memory", "require"))}
    print("workload,round,path,p50_us,p99_us")
    for name, q, k, calls in CASES:
        offsets = np.full(q.shape[0], 1000, np.int64)
        for r in range(1, rounds + 1):
            for path, c in clients.items():
                for _ in range(3):
                    c.apply_rope(q, k, offsets=offsets)
                times = []
                for _ in range(calls):
                    start = time.perf_counter()
                    c.apply_rope(q, k, offsets=offsets)
                    times.append(time.perf_counter() - start)
                s = np.sort(times) * 1e6
                print(f"{name},{r},{path},{s[len(s) // 2]:.0f},{s[int(len(s) * 0.99) - 1]:.0f}",
                      flush=True)
    for c in clients.values():
        c.close()
finally:
    server.stop()
