"""The KServe v2 sinusoidal model with x in one slice of a system
shared-memory region and y asked for in another (tritonclient over gRPC,
one caller, serial calls), against one or more posenc-server binaries in
alternating rounds: p50 and p99 latency and the server's CPU time a call
(user + system from /proc over the timed calls). perf_analyzer cannot drive
this (the sinusoidal model has optional inputs, which it refuses with
--shared-memory=system), so this stands in for it. The attention_bias
model (causal ALiBi added to logits in one slice, the bias asked for in
another) likewise, with --model=attention_bias.

    build/kserve-venv/bin/python bench/kserve_absolute_shm.py [--model=M] ROUNDS NAME=SERVER...
(after scripts/install-kserve-tools.sh; M: sinusoidal, the default, or
attention_bias). Prints CSV: server,workload,round,p50_us,p99_us,
server_cpu_us_per_call."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm

# model: (input, output, parameters, [(name, shape, calls)])
MODELS = {
    "sinusoidal": ("x", "y", {}, [
        ("1 MiB [1,256,1024] fp32", (1, 256, 1024), 400),
        ("64 MiB [1,4096,4096] fp32", (1, 4096, 4096), 30),
    ]),
    "attention_bias": ("logits", "bias", {"causal": True}, [
        ("1 MiB [1,4,256,256] fp32", (1, 4, 256, 256), 400),
        ("64 MiB [1,16,1024,1024] fp32", (1, 16, 1024, 1024), 30),
    ]),
}


def cpu_seconds(pid: int) -> float:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start(binary: str, work: str) -> tuple[subprocess.Popen, str]:
    port_file = os.path.join(work, "port")
    proc = subprocess.Popen(
        [binary, "--listen=127.0.0.1:0", f"--port_file={port_file}", "--metrics_listen=",
         "--enable_system_shared_memory", f"--max_request_bytes={128 << 20}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        if os.path.exists(port_file) and os.path.getsize(port_file) > 0:
            break
        time.sleep(0.1)
    return proc, "127.0.0.1:" + pathlib.Path(port_file).read_text().strip()


def run(target: str, pid: int, model: str, shape, calls: int, seed: int):
    in_name, out_name, parameters, _ = MODELS[model]
    client = grpcclient.InferenceServerClient(target)
    x = np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)
    nbytes = x.nbytes
    key = f"/posenc-absolute-bench-{os.getpid()}"
    handle = shm.create_shared_memory_region("r", key, 2 * nbytes)
    try:
        shm.set_shared_memory_region(handle, [x])
        client.unregister_system_shared_memory("r")
        client.register_system_shared_memory("r", key, 2 * nbytes)
        inp = grpcclient.InferInput(in_name, list(shape), "FP32")
        inp.set_shared_memory("r", nbytes, offset=0)
        out = grpcclient.InferRequestedOutput(out_name)
        out.set_shared_memory("r", nbytes, offset=nbytes)
        for _ in range(3):  # warm-up: the connection, the server's buffers
            client.infer(model, [inp], outputs=[out], parameters=parameters)
        times = []
        cpu0 = cpu_seconds(pid)
        for _ in range(calls):
            start_s = time.perf_counter()
            client.infer(model, [inp], outputs=[out], parameters=parameters)
            times.append(time.perf_counter() - start_s)
        cpu = cpu_seconds(pid) - cpu0
        y = shm.get_contents_as_numpy(handle, np.float32, list(shape), offset=nbytes)
        assert not np.array_equal(y, x), "y was not written"
        client.unregister_system_shared_memory("r")
    finally:
        shm.destroy_shared_memory_region(handle)
    times.sort()
    return times[len(times) // 2] * 1e6, times[len(times) * 99 // 100] * 1e6, cpu * 1e6 / calls


def main() -> None:
    args = sys.argv[1:]
    model = "sinusoidal"
    if args and args[0].startswith("--model="):
        model = args.pop(0).split("=", 1)[1]
    rounds = int(args[0])
    servers = [arg.split("=", 1) for arg in args[1:]]
    print("server,workload,round,p50_us,p99_us,server_cpu_us_per_call", flush=True)
    for name, shape, calls in MODELS[model][3]:
        for r in range(1, rounds + 1):
            for label, binary in servers:
                with tempfile.TemporaryDirectory() as work:
                    proc, target = start(binary, work)
                    try:
                        p50, p99, cpu = run(target, proc.pid, model, shape, calls, seed=r)
                    finally:
                        proc.terminate()
                        proc.wait()
                print(f"{label},{name},{r},{p50:.0f},{p99:.0f},{cpu:.0f}", flush=True)


if __name__ == "__main__":
    main()
