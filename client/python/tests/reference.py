"""numpy float64 references of what the server computes (the formulas of
proto/posenc/v1/posenc.proto), for the tests to compare against."""

from __future__ import annotations

import numpy as np


def rope(x, positions, *, base=10000.0, rotary_dim=0, style="neox", factor=1.0, layout="bshd"):
    """x: [batch, seq, heads, d] (bshd) or [batch, heads, seq, d] (bhsd);
    positions [batch or 1, seq]."""
    x = np.asarray(x, np.float64)
    if layout == "bhsd":
        x = x.transpose(0, 2, 1, 3)
    d = x.shape[-1]
    r = rotary_dim or d
    inv_freq = base ** (-np.arange(0, r, 2, dtype=np.float64) / r) / factor
    angle = np.asarray(positions, np.float64)[:, :, None, None] * inv_freq  # [b, s, 1, r/2]
    c, s = np.cos(angle), np.sin(angle)
    out = x.copy()
    if style == "neox":
        a, b = x[..., : r // 2], x[..., r // 2 : r]
        out[..., : r // 2] = a * c - b * s
        out[..., r // 2 : r] = b * c + a * s
    else:
        a, b = x[..., 0:r:2], x[..., 1:r:2]
        out[..., 0:r:2] = a * c - b * s
        out[..., 1:r:2] = b * c + a * s
    return out.transpose(0, 2, 1, 3) if layout == "bhsd" else out


def sinusoidal(positions, d, base=10000.0):
    """Interleaved (Vaswani) PE rows [n, d]."""
    p = np.asarray(positions, np.float64)[:, None]
    w = base ** (-2.0 * np.arange((d + 1) // 2) / d)
    pe = np.zeros((p.shape[0], d))
    pe[:, 0::2] = np.sin(p * w)
    pe[:, 1::2] = np.cos(p * w[: d // 2])
    return pe


def alibi_slopes(heads):
    """The ALiBi paper's geometric slopes (heads a power of two)."""
    return 2.0 ** (-8.0 * np.arange(1, heads + 1) / heads)


def causal_alibi(heads, q_len, k_len):
    """[1, heads, q_len, k_len]: -m (i' - j) with i' = k_len - q_len + i, -inf where j > i'."""
    i = (k_len - q_len + np.arange(q_len))[:, None]
    j = np.arange(k_len)[None, :]
    dist = (i - j).astype(np.float64)
    bias = -alibi_slopes(heads)[:, None, None] * dist
    return np.where(j > i, -np.inf, bias)[None]
