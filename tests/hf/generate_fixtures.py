#!/usr/bin/env python3
"""Writes hf_fixtures.json: what HF transformers itself computes for RoPE.

posenc's compatibility target for RoPE is HF transformers (SPEC §2.1). This
script runs HF's own code and records
  * frequencies: the inv_freq and attention scaling of HF's rotary embedding
    module for each scaling type, after a forward pass over positions
    0..L-1 (so dynamic NTK and LongRoPE see sequence length L);
  * conventions: HF's own apply_* functions (rotate_half with partial rotary,
    GPT-J's interleave, Qwen2-VL M-RoPE and vision RoPE, Qwen3-VL interleaved
    M-RoPE) on float64 inputs, with cos/sin formed in float64 from HF's
    inv_freq.
tests/hf_agreement_test.cc replays every case through posenc. The fixtures
are committed, so CI checks agreement without PyTorch.

Usage: python3 generate_fixtures.py OUT.json   (needs torch and transformers)
"""
import json
import math
import sys

import torch
import transformers
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

torch.manual_seed(0)


def rotary(head_dim, theta, max_pos, rope_scaling=None, partial=1.0, extra=None):
    kw = dict(hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim,
              max_position_embeddings=max_pos, rope_theta=theta, partial_rotary_factor=partial)
    if rope_scaling is not None:
        kw["rope_scaling"] = rope_scaling
    kw.update(extra or {})
    config = LlamaConfig(**kw)
    return config, LlamaRotaryEmbedding(config=config)


def frequency_case(name, head_dim, theta, max_pos, seq_len, rope_scaling, posenc_scaling,
                   partial=1.0, extra=None):
    config, emb = rotary(head_dim, theta, max_pos, rope_scaling, partial, extra)
    x = torch.zeros(1, seq_len, 4, head_dim)
    pos = torch.arange(seq_len).unsqueeze(0)
    emb(x, pos)  # dynamic types update inv_freq for this length
    return {
        "name": name,
        "rotary_dim": int(round(head_dim * partial)),
        "base": theta,
        "seq_len": seq_len,
        "scaling": posenc_scaling,
        "inv_freq": [float(v) for v in emb.inv_freq.double()],
        "attention_scale": float(emb.attention_scaling),
    }


def frequencies():
    cases = []
    cases.append(frequency_case("default", 128, 10000.0, 4096, 16, None, {"type": "none"}))
    cases.append(frequency_case("default-partial-phi", 80, 10000.0, 2048, 16, None,
                                {"type": "none"}, partial=0.4))
    cases.append(frequency_case("linear", 128, 10000.0, 4096, 16,
                                {"rope_type": "linear", "factor": 4.0},
                                {"type": "linear", "factor": 4.0}))
    for L in (1024, 4096, 10000):
        cases.append(frequency_case(f"dynamic-L{L}", 128, 10000.0, 2048, L,
                                    {"rope_type": "dynamic", "factor": 2.0},
                                    {"type": "dynamic", "factor": 2.0, "original_max_position": 2048}))
    cases.append(frequency_case("yarn-factor4", 128, 1000000.0, 32768, 16,
                                {"rope_type": "yarn", "factor": 4.0},
                                {"type": "yarn", "factor": 4.0, "original_max_position": 32768}))
    cases.append(frequency_case("yarn-deepseek-mscale", 64, 10000.0, 4096, 16,
                                {"rope_type": "yarn", "factor": 40.0, "mscale": 1.0,
                                 "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1},
                                {"type": "yarn", "factor": 40.0, "original_max_position": 4096,
                                 "mscale": 1.0, "mscale_all_dim": 1.0}))
    cases.append(frequency_case("yarn-mscale-ratio", 64, 10000.0, 4096, 16,
                                {"rope_type": "yarn", "factor": 40.0, "mscale": 1.0,
                                 "mscale_all_dim": 0.707},
                                {"type": "yarn", "factor": 40.0, "original_max_position": 4096,
                                 "mscale": 1.0, "mscale_all_dim": 0.707}))
    cases.append(frequency_case("yarn-attention-factor", 128, 10000.0, 8192, 16,
                                {"rope_type": "yarn", "factor": 8.0, "attention_factor": 1.25,
                                 "beta_fast": 16.0, "beta_slow": 2.0},
                                {"type": "yarn", "factor": 8.0, "original_max_position": 8192,
                                 "attention_factor": 1.25, "beta_fast": 16, "beta_slow": 2}))
    cases.append(frequency_case("llama3.1", 128, 500000.0, 131072, 16,
                                {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                                {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position": 8192}))
    cases.append(frequency_case("llama3.2-factor32", 64, 500000.0, 131072, 16,
                                {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                                {"type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position": 8192}))
    g = torch.Generator().manual_seed(1)
    short = [float(v) for v in (1.0 + torch.rand(48, generator=g, dtype=torch.float64))]
    long = [float(v) for v in (1.0 + 40 * torch.rand(48, generator=g, dtype=torch.float64))]
    for L in (100, 5000):
        # Phi-3: max_position 131072 over an original 4096 -> factor 32.
        cases.append(frequency_case(
            f"longrope-phi3-L{L}", 96, 10000.0, 131072, L,
            {"rope_type": "longrope", "short_factor": short, "long_factor": long},
            {"type": "longrope", "factor": 131072 / 4096, "original_max_position": 4096,
             "short_factor": short, "long_factor": long},
            extra={"original_max_position_embeddings": 4096}))
    return cases


def rand(*shape):
    return torch.rand(*shape, dtype=torch.float64) * 2 - 1


def cos_sin(inv_freq, positions):
    """[..., n] positions -> cos, sin [..., 2n] in float64, HF's cat(freqs, freqs)."""
    freqs = positions.double().unsqueeze(-1) * inv_freq.double()
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def tolist(t):
    return [float(v) for v in t.reshape(-1)]


def conventions():
    cases = []
    from transformers.models.llama import modeling_llama

    # Llama / NeoX: rotate_half, BHSD, with partial rotary like GPT-NeoX/Phi.
    B, H, S, D, R = 2, 3, 5, 64, 32
    inv = 1.0 / (10000.0 ** (torch.arange(0, R, 2, dtype=torch.float64) / R))
    pos = torch.randint(0, 3000, (B, S))
    q = rand(B, H, S, D)
    cos, sin = cos_sin(inv, pos)
    q_rot, q_pass = q[..., :R], q[..., R:]
    out, _ = modeling_llama.apply_rotary_pos_emb(q_rot, q_rot, cos, sin)
    cases.append({"name": "neox-partial-bhsd", "layout": "BHSD", "style": "NEOX", "shape": [B, H, S, D],
                  "rotary_dim": R, "position_ids": tolist(pos), "position_shape": [B, S],
                  "query": tolist(q), "expected": tolist(torch.cat((out, q_pass), dim=-1))})

    # GPT-J: rotate_every_two on interleaved pairs, BSHD.
    from transformers.models.gptj import modeling_gptj
    B, S, H, D = 2, 4, 3, 32
    pos = torch.randint(0, 3000, (B, S))
    q = rand(B, S, H, D)
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    sinusoid = pos.double().unsqueeze(-1) * inv
    sin = torch.repeat_interleave(sinusoid.sin()[:, :, None, :], 2, 3)
    cos = torch.repeat_interleave(sinusoid.cos()[:, :, None, :], 2, 3)
    out = (q * cos) + (modeling_gptj.rotate_every_two(q) * sin)
    cases.append({"name": "gptj-bshd", "layout": "BSHD", "style": "GPTJ", "shape": [B, S, H, D],
                  "rotary_dim": D, "position_ids": tolist(pos), "position_shape": [B, S],
                  "query": tolist(q), "expected": tolist(out)})

    # Qwen2-VL M-RoPE: position_ids [3, B, S], sections [16, 24, 24].
    from transformers.models.qwen2_vl import modeling_qwen2_vl
    B, H, S, D = 1, 2, 6, 128
    section = [16, 24, 24]
    inv = 1.0 / (1000000.0 ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    pos3 = torch.randint(0, 500, (3, B, S))
    cos, sin = cos_sin(inv, pos3)  # [3, B, S, D]
    q = rand(B, H, S, D)
    out, _ = modeling_qwen2_vl.apply_multimodal_rotary_pos_emb(q, q, cos, sin, section)
    cases.append({"name": "qwen2-vl-mrope", "layout": "BHSD", "style": "NEOX", "shape": [B, H, S, D],
                  "rotary_dim": D, "base": 1000000.0, "axis_mode": "MROPE", "sections": section,
                  "position_ids": tolist(pos3.permute(1, 2, 0)), "position_shape": [B, S, 3],
                  "query": tolist(q), "expected": tolist(out)})

    # Qwen2-VL vision: 2-D positions, per-axis frequencies over head_dim/2.
    T, H, D = 7, 2, 80
    vis = modeling_qwen2_vl.VisionRotaryEmbedding(D // 2)
    hw = torch.randint(0, 40, (T, 2))
    freqs = hw.double().unsqueeze(-1) * vis.inv_freq.double()  # [T, 2, D/4]
    rot = freqs.flatten(1)  # [T, D/2]: h freqs then w freqs
    emb = torch.cat((rot, rot), dim=-1)
    q = rand(T, H, D)
    out, _ = modeling_qwen2_vl.apply_rotary_pos_emb_vision(q, q, emb.cos(), emb.sin())
    cases.append({"name": "qwen2-vl-vision", "layout": "THD", "style": "NEOX", "shape": [T, H, D],
                  "rotary_dim": D, "axis_mode": "AXIAL", "axis_dims": [D // 2, D // 2],
                  "position_ids": tolist(hw), "position_shape": [T, 2],
                  "query": tolist(q), "expected": tolist(out.double())})

    # Qwen3-VL interleaved M-RoPE, when this transformers has it.
    try:
        from transformers.models.qwen3_vl import modeling_qwen3_vl
        B, H, S, D = 1, 2, 5, 128
        section = [24, 20, 20]
        inv = 1.0 / (5000000.0 ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
        pos3 = torch.randint(0, 500, (3, B, S))
        freqs = pos3.double().unsqueeze(-1) * inv  # [3, B, S, D/2]
        rope = modeling_qwen3_vl.Qwen3VLTextRotaryEmbedding.apply_interleaved_mrope(None, freqs, section)
        emb = torch.cat((rope, rope), dim=-1)
        q = rand(B, H, S, D)
        out, _ = modeling_llama.apply_rotary_pos_emb(q, q, emb.cos(), emb.sin())
        cases.append({"name": "qwen3-vl-interleaved", "layout": "BHSD", "style": "NEOX",
                      "shape": [B, H, S, D], "rotary_dim": D, "base": 5000000.0,
                      "axis_mode": "MROPE_INTERLEAVED", "sections": section,
                      "position_ids": tolist(pos3.permute(1, 2, 0)), "position_shape": [B, S, 3],
                      "query": tolist(q), "expected": tolist(out)})
    except (ImportError, AttributeError) as e:
        print(f"skipping qwen3-vl: {e}", file=sys.stderr)
    return cases


def main():
    out = {"transformers": transformers.__version__, "torch": torch.__version__,
           "frequencies": frequencies(), "conventions": conventions()}
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {len(out['frequencies'])} frequency and {len(out['conventions'])} convention cases "
          f"from transformers {transformers.__version__}")


if __name__ == "__main__":
    main()
