#!/usr/bin/env python3
"""RoPE peers for issue 3's side-by-side comparison: time and accuracy.

Same device and shapes as posenc-bench-gpu: bf16, T tokens x (32 query + 8 key
heads) x 128, NEOX pairing (rotate_half), theta 10000, positions 1000 + t.

Each peer gets q and k in the layout it documents, so no transpose or copy is
timed. They are stored token-major, [T, heads, head_dim]:
  * FlashInfer takes that storage as is (its ragged [nnz, heads, head_dim]);
  * the HF-style peers see it as [1, heads, T, head_dim] views, which is what
    HF attention hands them (q_proj(x).view(b, s, h, d).transpose(1, 2)) and
    what Liger-Kernel's kernel wants: it transposes back to [b, s, h, d] and
    calls .contiguous(), free on this storage but a full copy of a contiguous
    [b, h, s, d] tensor.

Peers:
  * PyTorch eager: HF's q * cos + rotate_half(q) * sin, with cos/sin from HF's
    default rotary embedding (float32 inv_freq and angles, cast to bf16);
  * torch.compile of the same function;
  * Liger-Kernel's liger_rotary_pos_emb (Triton, in place), the same cos/sin
    as [1, T, head_dim], when importable;
  * FlashInfer's apply_rope (indptr/offsets) and apply_rope_pos_ids (cos/sin
    computed in the kernel from positions), in-place variants where the
    installed version has them, when importable;
  * a device-to-device copy of the same bytes: the bandwidth baseline.
Effective bandwidth counts q and k read plus written, as posenc-bench-gpu does.

Accuracy: each peer also rotates tokens at positions P .. P + n - 1 for P = 1e6
and 1e7 (n = min(T, 256)); the error is the max abs difference of its q and k
from a float64 reference computed in torch from the same bf16 inputs and the
exact frequencies theta^(-2i/D). The "bf16 rounding" row is the reference
rounded to bf16: the floor for any bf16 output.

Usage: python3 rope_peers.py [--device cuda|cpu] [--tokens N] [--json OUT]
CPU smoke test: python3 rope_peers.py --device cpu --tokens 64
"""
import argparse
import json
import statistics
import time

import torch

HQ, HK, D, THETA = 32, 8, 128, 10000.0
DTYPE = torch.bfloat16
ACCURACY_POSITIONS = (10**6, 10**7)


def label(p):
    return f"1e{len(str(p)) - 1}"  # 10**6 -> "1e6"


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def eager_rope(q, k, cos, sin):
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def hf_cos_sin(pos):
    """cos, sin [T, D] as HF's default rotary embedding computes them: float32
    inverse frequencies and angles, then cast to the activations' dtype."""
    inv = 1.0 / (THETA ** (torch.arange(0, D, 2, dtype=torch.int64, device=pos.device).float() / D))
    freqs = pos.float()[:, None] * inv[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(DTYPE), emb.sin().to(DTYPE)


def reference(q, k, pos):
    """float64 RoPE of the bf16 inputs q, k [n, heads, D] at positions pos."""
    inv = THETA ** (-torch.arange(0, D, 2, dtype=torch.float64, device=pos.device) / D)
    angle = pos.double()[:, None] * inv[None, :]
    cos = torch.cat((angle.cos(), angle.cos()), dim=-1)[:, None, :]
    sin = torch.cat((angle.sin(), angle.sin()), dim=-1)[:, None, :]

    def rot(x):
        x = x.double()
        return x * cos + rotate_half(x) * sin

    return rot(q), rot(k)


def hf_views(q, k):
    """[T, H, D] storage as HF's [1, H, T, D] views (no copy)."""
    return q.unsqueeze(0).transpose(1, 2), k.unsqueeze(0).transpose(1, 2)


def from_hf(x):
    return x[0].transpose(0, 1)


# A peer's prepare(q, k, pos) takes q [T, HQ, D] and k [T, HK, D] (bf16, on
# the device; in-place peers overwrite them) and int64 positions [T], and
# returns (run, result): run() does the work (what is timed), result() gives
# the rotated q and k as [T, heads, D].


def prepare_eager(fn):
    def prepare(q, k, pos):
        cos, sin = hf_cos_sin(pos)
        qv, kv = hf_views(q, k)
        cos, sin = cos[None, None], sin[None, None]
        out = {}

        def run():
            out["q"], out["k"] = fn(qv, kv, cos, sin)

        return run, lambda: (from_hf(out["q"]), from_hf(out["k"]))

    return prepare


def prepare_liger(q, k, pos):
    try:
        from liger_kernel.transformers.rope import liger_rotary_pos_emb
    except ImportError:  # older releases: only the ops module
        from liger_kernel.ops.rope import LigerRopeFunction

        liger_rotary_pos_emb = LigerRopeFunction.apply
    cos, sin = hf_cos_sin(pos)
    cos, sin = cos[None], sin[None]  # [1, T, D], as documented
    qv, kv = hf_views(q, k)

    def run():
        liger_rotary_pos_emb(qv, kv, cos, sin)  # in place on q and k

    return run, lambda: (q, k)


def prepare_flashinfer(by_pos_ids):
    def prepare(q, k, pos):
        import flashinfer.rope as fr

        out = {}
        if by_pos_ids:
            pos_ids = pos.to(torch.int32)
            inplace = getattr(fr, "apply_rope_pos_ids_inplace", None)
            args = (pos_ids,)
            outplace = fr.apply_rope_pos_ids
        else:
            # One sequence: token t sits at offsets[0] + t.
            indptr = torch.tensor([0, q.shape[0]], dtype=torch.int32, device=q.device)
            offsets = pos[:1].to(torch.int32)
            inplace = getattr(fr, "apply_rope_inplace", None)
            args = (indptr, offsets)
            outplace = fr.apply_rope
        kw = {"interleave": False, "rope_theta": THETA}
        if inplace is not None:

            def run():
                inplace(q, k, *args, **kw)

            return run, lambda: (q, k)

        def run():
            out["q"], out["k"] = outplace(q, k, *args, **kw)

        return run, lambda: (out["q"], out["k"])

    return prepare


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


def random_qk(tokens, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(tokens, HQ, D, generator=g).to(device=device, dtype=DTYPE)
    k = torch.randn(tokens, HK, D, generator=g).to(device=device, dtype=DTYPE)
    return q, k


def max_error(prepare, q, k, pos):
    """Max abs error of a peer's q and k at `pos` against the float64 reference."""
    ref_q, ref_k = reference(q, k, pos)
    run, result = prepare(q.clone(), k.clone(), pos)
    run()
    out_q, out_k = result()
    return max((out_q.double() - ref_q).abs().max().item(),
               (out_k.double() - ref_k).abs().max().item())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    dev, T = a.device, a.tokens
    if dev == "cuda" and not torch.cuda.is_available():
        raise SystemExit("rope_peers: --device cuda but torch sees no CUDA device")

    q, k = random_qk(T, dev, seed=1)
    pos = 1000 + torch.arange(T, device=dev, dtype=torch.int64)
    moved = 2 * (q.numel() + k.numel()) * q.element_size()
    n_acc = min(T, 256)
    acc_q, acc_k = random_qk(n_acc, dev, seed=2)
    acc_pos = {
        p: p + torch.arange(n_acc, device=dev, dtype=torch.int64) for p in ACCURACY_POSITIONS
    }
    rows = []

    def add(name, ms, errors):
        gbps = moved / (ms * 1e-3) / 1e9 if ms else None
        rows.append({"name": name, "ms": ms, "gbps": gbps, "max_abs_error": errors})

    src = torch.empty(q.numel() + k.numel(), device=dev, dtype=DTYPE)
    dst = torch.empty_like(src)
    add("d2d copy of the same bytes", timed_ms(lambda: dst.copy_(src), dev), None)
    floor = {}
    for p, pp in acc_pos.items():
        rq, rk = reference(acc_q, acc_k, pp)
        floor[label(p)] = max((rq.to(DTYPE).double() - rq).abs().max().item(),
                              (rk.to(DTYPE).double() - rk).abs().max().item())
    add("bf16 rounding of the exact result", None, floor)

    peers = [
        ("pytorch eager", lambda: prepare_eager(eager_rope)),
        ("torch.compile", lambda: prepare_eager(torch.compile(eager_rope))),
        ("liger-kernel liger_rotary_pos_emb", lambda: prepare_liger),
        ("flashinfer apply_rope (indptr/offsets)", lambda: prepare_flashinfer(False)),
        ("flashinfer apply_rope_pos_ids", lambda: prepare_flashinfer(True)),
    ]
    for name, make in peers:
        try:
            prepare = make()
            errors = {label(p): max_error(prepare, acc_q, acc_k, pp) for p, pp in acc_pos.items()}
            run, _ = prepare(q.clone(), k.clone(), pos)
            add(name, timed_ms(run, dev), errors)
        except Exception as e:  # not installed, no Triton or C++ toolchain, no GPU
            first_line = str(e).splitlines()[0] if str(e) else ""
            print(f"{name} unavailable: {type(e).__name__}: {first_line}")

    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    print(f"RoPE peers on {name}, bf16 {T} x ({HQ}+{HK}) x {D} NEOX, torch {torch.__version__}")
    keys = [label(p) for p in ACCURACY_POSITIONS]
    print(f"{'':<40} {'us':>10} {'GB/s':>8}" + "".join(f" {'err@' + key:>10}" for key in keys))
    for r in rows:
        us = f"{r['ms'] * 1e3:10.1f}" if r["ms"] else f"{'-':>10}"
        gbps = f"{r['gbps']:8.0f}" if r["gbps"] else f"{'-':>8}"
        errs = "".join(f" {r['max_abs_error'][key]:10.3g}" if r["max_abs_error"] else f" {'-':>10}"
                       for key in keys)
        print(f"{r['name']:<40} {us} {gbps}{errs}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": name, "torch": torch.__version__, "tokens": T,
                       "accuracy_tokens": n_acc, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
