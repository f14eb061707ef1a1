#!/usr/bin/env python3
"""RoPE peers on the GPU, for issue 3's side-by-side comparison.

Measures, on the same device and shapes as posenc-bench-gpu (bf16, 16384
tokens x (32 query + 8 key heads) x 128, NEOX pairing):
  * PyTorch eager: HF-style q*cos + rotate_half(q)*sin;
  * torch.compile of the same function;
  * Liger-Kernel's Triton RoPE (liger_kernel.ops.rope), when importable;
  * a device-to-device copy of the same bytes, the bandwidth baseline.
Effective bandwidth counts q and k read plus written, as posenc-bench-gpu does.

Usage: python3 rope_peers.py [--device cuda|cpu] [--tokens N] [--json OUT]
"""
import argparse
import json
import statistics
import time

import torch


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def eager_rope(q, k, cos, sin):
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def timed_ms(fn, device, reps=30):
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    dev, T, Hq, Hk, D = a.device, a.tokens, 32, 8, 128
    # HF layout [batch, heads, seq, head_dim].
    q = torch.randn(1, Hq, T, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(1, Hk, T, D, device=dev, dtype=torch.bfloat16)
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, device=dev, dtype=torch.float32) / D))
    freqs = torch.outer(torch.arange(T, device=dev, dtype=torch.float32), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(torch.bfloat16)[None, None], emb.sin().to(torch.bfloat16)[None, None]
    moved = 2 * (q.numel() + k.numel()) * q.element_size()
    rows = []

    def add(name, ms):
        rows.append({"name": name, "ms": ms, "gbps": moved / (ms * 1e-3) / 1e9})

    src = torch.empty(q.numel() + k.numel(), device=dev, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    add("d2d copy of the same bytes", timed_ms(lambda: dst.copy_(src), dev))
    add("pytorch eager", timed_ms(lambda: eager_rope(q, k, cos, sin), dev))
    try:
        compiled = torch.compile(eager_rope)
        add("torch.compile", timed_ms(lambda: compiled(q, k, cos, sin), dev))
    except Exception as e:  # no compiler toolchain on this machine
        print(f"torch.compile unavailable: {e}")
    try:
        from liger_kernel.ops.rope import LigerRopeFunction
        add("liger-kernel rope", timed_ms(lambda: LigerRopeFunction.apply(q, k, cos, sin), dev))
    except Exception as e:
        print(f"liger-kernel unavailable: {e}")

    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    print(f"RoPE peers on {name}, bf16 {T} x ({Hq}+{Hk}) x {D}, torch {torch.__version__}")
    for r in rows:
        print(f"{r['name']:<32} {r['ms'] * 1e3:10.1f} us {r['gbps']:8.0f} GB/s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": name, "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
