"""Checks that posenc's v2 front and the KServe peer give the same RoPE.

  python check.py POSENC_ADDR PEER_ADDR [--seed N]   (tritonclient's venv)

Each case is sent to both servers with tritonclient.grpc and both answers are
compared with a float64 numpy reference and with each other (NEOX pairing, base 10000, exact
theta^(-2i/R)); then a few bad requests must be refused by both with
INVALID_ARGUMENT. Exits non-zero, saying what differed, on any failure.
"""
import argparse
import sys

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

# Outputs are fp32 rounded once from a float32-or-better computation; inputs
# are standard normal, |x| < ~6, positions < 2^12: a few ulps of 8.
TOLERANCE = 2e-5


def reference(x, pos, rotary_dim=0, base=10000.0, style="NEOX"):
    """x [B, S, H, D] float32, pos [B, S] -> float64 rotation (BSHD)."""
    d = x.shape[-1]
    rd = rotary_dim or d
    inv = base ** (-np.arange(0, rd, 2, dtype=np.float64) / rd)
    a = pos.astype(np.float64)[:, :, None, None] * inv
    c, s = np.cos(a), np.sin(a)
    y = x.astype(np.float64).copy()
    if style == "NEOX":
        x1, x2 = y[..., : rd // 2].copy(), y[..., rd // 2: rd].copy()
        y[..., : rd // 2], y[..., rd // 2: rd] = x1 * c - x2 * s, x2 * c + x1 * s
    else:
        x1, x2 = y[..., 0:rd:2].copy(), y[..., 1:rd:2].copy()
        y[..., 0:rd:2], y[..., 1:rd:2] = x1 * c - x2 * s, x2 * c + x1 * s
    return y


def infer(client, tensors, parameters=None):
    inputs = []
    for name, arr in tensors.items():
        dt = "FP32" if arr.dtype == np.float32 else "INT64"
        i = grpcclient.InferInput(name, list(arr.shape), dt)
        i.set_data_from_numpy(arr)
        inputs.append(i)
    r = client.infer("rope", inputs, parameters=parameters)
    return {n: r.as_numpy(n) for n in ("query_out", "key_out") if r.as_numpy(n) is not None}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("posenc")
    ap.add_argument("peer")
    ap.add_argument("--seed", type=int, default=12)
    a = ap.parse_args()
    print(f"check seed {a.seed}")
    rng = np.random.default_rng(a.seed)
    servers = {"posenc": grpcclient.InferenceServerClient(a.posenc),
               "kserve peer": grpcclient.InferenceServerClient(a.peer)}
    failures = []
    # The benchmark's request (default positions), GQA with position_ids,
    # per-sequence offsets, and a partial rotary GPT-J case.
    b, s = 2, 37
    cases = [
        ("1 MiB query, default positions", {"query": [1, 128, 16, 128]}, None, {}),
        ("decode 32x1, query + key, position_ids",
         {"query": [32, 1, 32, 128], "key": [32, 1, 8, 128]},
         rng.integers(0, 4096, size=(32, 1)), {}),
        ("offsets", {"query": [b, s, 4, 64], "key": [b, s, 2, 64]}, np.array([5, 900]), {}),
        ("GPTJ, rotary_dim 32", {"query": [b, s, 3, 64]}, None,
         {"style": "GPTJ", "rotary_dim": 32}),
    ]
    for name, shapes, pos, params in cases:
        tensors = {k: rng.standard_normal(v).astype(np.float32) for k, v in shapes.items()}
        q = tensors["query"]
        batch, seq = q.shape[:2]
        if pos is None:
            positions = np.broadcast_to(np.arange(seq), (batch, seq))
        elif name == "offsets":
            tensors["offsets"] = pos.astype(np.int64)
            positions = pos[:, None] + np.arange(seq)[None, :]
        else:
            tensors["position_ids"] = pos.astype(np.int64)
            positions = pos
        want = {k + "_out": reference(v, positions, params.get("rotary_dim", 0),
                                      style=params.get("style", "NEOX"))
                for k, v in tensors.items() if k in ("query", "key")}
        answers = {}
        for server, client in servers.items():
            got = answers[server] = infer(client, tensors, params or None)
            for out, ref in want.items():
                if out not in got or got[out].shape != ref.shape or got[out].dtype != np.float32:
                    failures.append(f"{server} {name}: {out} missing or misshapen")
                    continue
                err = float(np.max(np.abs(got[out] - ref))) if ref.size else 0.0
                print(f"  {server:12s} {name:40s} {out:9s} max |err| vs float64 {err:.2e}")
                if not err <= TOLERANCE:
                    failures.append(f"{server} {name}: {out} max |err| {err:.2e} > {TOLERANCE}")
        a, b = answers["posenc"], answers["kserve peer"]
        for out in want:
            if out in a and out in b and a[out].shape == b[out].shape:
                diff = float(np.max(np.abs(a[out] - b[out]))) if a[out].size else 0.0
                print(f"  posenc vs peer {name:38s} {out:9s} max |diff| {diff:.2e}")
                if not diff <= 2 * TOLERANCE:
                    failures.append(f"posenc and peer differ on {name} {out}: {diff:.2e}")
    bad = [
        ("unknown parameter", {"query": np.zeros([1, 2, 1, 8], np.float32)}, {"nope": 1}),
        ("odd rotary_dim", {"query": np.zeros([1, 2, 1, 8], np.float32)}, {"rotary_dim": 3}),
        ("position_ids of the wrong shape", {"query": np.zeros([1, 2, 1, 8], np.float32),
                                             "position_ids": np.zeros([1, 3], np.int64)}, None),
    ]
    for name, tensors, params in bad:
        for server, client in servers.items():
            try:
                infer(client, tensors, params)
                failures.append(f"{server} accepted a request with {name}")
            except InferenceServerException as e:
                print(f"  {server:12s} refuses {name}: {e.status()} {e.message()[:90]}")
                if e.status() != "StatusCode.INVALID_ARGUMENT":
                    failures.append(f"{server} {name}: {e.status()}, want INVALID_ARGUMENT")
    for f in failures:
        print("FAIL:", f)
    print("check:", "ok" if not failures else f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
