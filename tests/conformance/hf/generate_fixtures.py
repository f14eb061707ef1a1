#!/usr/bin/env python3
"""Writes hf_fixtures.json: what HF transformers itself computes for RoPE.

posenc's compatibility target for RoPE is HF transformers (SPEC §2.1). This
script runs HF's own code and records
  * frequencies: the inv_freq and attention scaling of HF's rotary embedding
    module for each scaling type, after a forward pass over positions
    0..L-1 (so dynamic NTK and LongRoPE see sequence length L);
  * configs: real model families' config.json RoPE fields, loaded the way
    from_pretrained loads them and run through the family's own rotary
    module (what posenc's ResolveHfRope must reproduce);
  * conventions: HF's own apply_* functions (rotate_half with partial rotary,
    GPT-J's interleave, Qwen2-VL M-RoPE and vision RoPE, Qwen3-VL interleaved
    M-RoPE) on float64 inputs, with cos/sin formed in float64 from HF's
    inv_freq.
tests/conformance/hf_agreement_test.cc replays every case through posenc. The fixtures
are committed, so CI checks agreement without PyTorch.

Usage: python3 generate_fixtures.py OUT.json   (needs torch and transformers)
"""
import json
import math
import sys
from types import SimpleNamespace

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
    if partial != 1.0:
        # Llama's default RoPE ignores partial_rotary_factor since
        # transformers 5; Phi's honours it.
        from transformers import PhiConfig
        from transformers.models.phi.modeling_phi import PhiRotaryEmbedding
        del kw["head_dim"]
        config = PhiConfig(**kw)
        return config, PhiRotaryEmbedding(config=config)
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
    q = rand(B, H, S, D)
    if hasattr(modeling_qwen2_vl, "apply_multimodal_rotary_pos_emb"):  # transformers 4.x
        cos, sin = cos_sin(inv, pos3)  # [3, B, S, D]
        out, _ = modeling_qwen2_vl.apply_multimodal_rotary_pos_emb(q, q, cos, sin, section)
    else:  # 5.x: the rotary module recomposes the sections itself
        freqs = pos3.double().unsqueeze(-1) * inv  # [3, B, S, D/2]
        module = SimpleNamespace(mrope_section=section)
        recompose = modeling_qwen2_vl.Qwen2VLRotaryEmbedding.recomposition_frequencies
        out, _ = modeling_qwen2_vl.apply_rotary_pos_emb(
            q, q, recompose(module, freqs.cos()), recompose(module, freqs.sin()))
    cases.append({"name": "qwen2-vl-mrope", "layout": "BHSD", "style": "NEOX", "shape": [B, H, S, D],
                  "rotary_dim": D, "base": 1000000.0, "axis_mode": "MROPE", "sections": section,
                  "position_ids": tolist(pos3.permute(1, 2, 0)), "position_shape": [B, S, 3],
                  "query": tolist(q), "expected": tolist(out)})

    # Qwen2-VL vision: 2-D positions, per-axis frequencies over head_dim/2.
    T, H, D = 7, 2, 80
    if hasattr(modeling_qwen2_vl, "VisionRotaryEmbedding"):  # transformers 4.x
        vis = modeling_qwen2_vl.VisionRotaryEmbedding(D // 2)
    else:
        from transformers import Qwen2VLConfig
        vision = Qwen2VLConfig().vision_config
        vision.embed_dim, vision.num_heads = D * H, H  # head_dim D
        vis = modeling_qwen2_vl.Qwen2VLVisionRotaryEmbedding(vision)
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
        cls = modeling_qwen3_vl.Qwen3VLTextRotaryEmbedding
        q = rand(B, H, S, D)
        if hasattr(cls, "apply_interleaved_mrope"):  # transformers 4.x
            rope = cls.apply_interleaved_mrope(None, freqs, section)
            emb = torch.cat((rope, rope), dim=-1)
            cos, sin = emb.cos(), emb.sin()
        else:  # 5.x: recomposes cos and sin (in place of axis 0, hence the clones)
            module = SimpleNamespace(mrope_section=section)
            cos = cls.recomposition_frequencies(module, freqs.cos().clone())
            sin = cls.recomposition_frequencies(module, freqs.sin().clone())
        out, _ = modeling_llama.apply_rotary_pos_emb(q, q, cos, sin)
        cases.append({"name": "qwen3-vl-interleaved", "layout": "BHSD", "style": "NEOX",
                      "shape": [B, H, S, D], "rotary_dim": D, "base": 5000000.0,
                      "axis_mode": "MROPE_INTERLEAVED", "sections": section,
                      "position_ids": tolist(pos3.permute(1, 2, 0)), "position_shape": [B, S, 3],
                      "query": tolist(q), "expected": tolist(out)})
    except (ImportError, AttributeError) as e:
        print(f"skipping qwen3-vl: {e}", file=sys.stderr)

    # DeepSeek-V3 rope_interleave: HF rotates the interleaved pairs (2i, 2i+1)
    # and writes the results de-interleaved (evens, then odds), the same for
    # q and k, so q.k is GPT-J's. Re-interleaved, HF's output is posenc GPTJ's.
    try:
        from transformers.models.deepseek_v3 import modeling_deepseek_v3
        B, H, S, D = 1, 2, 5, 64
        inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
        pos = torch.randint(0, 3000, (B, S))
        cos, sin = cos_sin(inv, pos)
        q = rand(B, H, S, D)
        out, _ = modeling_deepseek_v3.apply_rotary_pos_emb_interleave(q, q, cos, sin)
        interleaved = out.view(B, H, S, 2, D // 2).transpose(-1, -2).reshape(B, H, S, D)
        cases.append({"name": "deepseek-v3-interleave", "layout": "BHSD", "style": "GPTJ",
                      "shape": [B, H, S, D], "rotary_dim": D, "position_ids": tolist(pos),
                      "position_shape": [B, S], "query": tolist(q),
                      "expected": tolist(interleaved)})
    except (ImportError, AttributeError) as e:
        print(f"skipping deepseek-v3 interleave: {e}", file=sys.stderr)
    return cases


# ------------------------------------------------ HF configs as they are ----
#
# The RoPE fields of real model families' config.json files, written from
# knowledge of the published files (not downloaded: no network here). The
# structure, names and numbers are the published ones; the 48-value LongRoPE
# short/long factor lists of Phi-3 are illustrative stand-ins of the right
# length and shape, not the published values. Each config goes through HF's
# own loading path (CONFIG_MAPPING[model_type].from_dict, as from_pretrained
# does) and the family's own rotary module; the fixture records what that
# module computes after a forward pass over positions 0..L-1.

def phi3_factors():
    short = [round(1.0 + 0.05 * (i // 4), 4) for i in range(48)]
    long = [round(1.0 + 46.0 * (i / 47.0) ** 2, 4) for i in range(48)]
    return short, long


def family_configs():
    short, long = phi3_factors()
    return [
        # name, config.json fields, sequence lengths, the facts posenc must derive
        ("llama-3.1-8b", {
            "model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
            "num_key_value_heads": 8, "num_hidden_layers": 32, "intermediate_size": 14336,
            "max_position_embeddings": 131072, "rope_theta": 500000.0, "vocab_size": 128256,
            "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192, "rope_type": "llama3"},
            "torch_dtype": "bfloat16"}, [16, 9000]),
        # The same, as transformers 5 saves it (rope_parameters, theta inside).
        ("llama-3.1-8b-rope-parameters", {
            "model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
            "num_key_value_heads": 8, "max_position_embeddings": 131072,
            "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 8192}}, [16]),
        ("llama-3.2-1b", {
            "model_type": "llama", "hidden_size": 2048, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 64, "num_hidden_layers": 16,
            "intermediate_size": 8192, "max_position_embeddings": 131072, "rope_theta": 500000.0,
            "rope_scaling": {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192, "rope_type": "llama3"},
            "tie_word_embeddings": True}, [16]),
        # Qwen2.5 with the YaRN block its model card says to add for 128K.
        ("qwen2.5-7b-yarn", {
            "model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28,
            "num_key_value_heads": 4, "num_hidden_layers": 28, "intermediate_size": 18944,
            "max_position_embeddings": 32768, "rope_theta": 1000000.0, "sliding_window": 131072,
            "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768,
                             "type": "yarn"}}, [16, 40000]),
        # YaRN with factor unset: transformers infers max_position / original.
        ("qwen2.5-yarn-factor-unset", {
            "model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28,
            "num_key_value_heads": 4, "max_position_embeddings": 131072,
            "rope_theta": 1000000.0,
            "rope_scaling": {"factor": None, "original_max_position_embeddings": 32768,
                             "rope_type": "yarn"}}, [16]),
        ("phi-3-mini-128k", {
            "model_type": "phi3", "hidden_size": 3072, "num_attention_heads": 32,
            "num_key_value_heads": 32, "num_hidden_layers": 32, "intermediate_size": 8192,
            "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
            "rope_theta": 10000.0, "sliding_window": 262144,
            "rope_scaling": {"long_factor": long, "short_factor": short, "type": "longrope"}},
         [100, 4096, 4097, 9000]),
        # (The first Phi-3 128k files named the type "su"; Phi3Config renames
        # it to longrope, but transformers 5.24 then fails validation for the
        # missing original_max_position_embeddings, so there is no case here.
        # posenc reads "su" as longrope, as transformers 4.x did.)
        ("deepseek-v3", {
            "model_type": "deepseek_v3", "hidden_size": 7168, "num_attention_heads": 128,
            "num_key_value_heads": 128, "num_hidden_layers": 61, "q_lora_rank": 1536,
            "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
            "v_head_dim": 128, "max_position_embeddings": 163840, "rope_theta": 10000,
            "n_routed_experts": 256, "num_experts_per_tok": 8,
            "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                             "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                             "type": "yarn"}}, [16]),
        # Synthetic: DeepSeek-V3's block with mscale != mscale_all_dim, so the
        # attention scale is the ratio of the two mscales (published V2/V3
        # files have them equal, giving 1).
        ("deepseek-v3-mscale-ratio", {
            "model_type": "deepseek_v3", "hidden_size": 2048, "num_attention_heads": 16,
            "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
            "kv_lora_rank": 512, "q_lora_rank": None, "max_position_embeddings": 163840,
            "rope_theta": 10000,
            "rope_scaling": {"factor": 40, "mscale": 1.0, "mscale_all_dim": 0.707,
                             "original_max_position_embeddings": 4096, "type": "yarn"}}, [16]),
        # Kimi K2 ships as deepseek_v3 with its own YaRN numbers.
        ("kimi-k2", {
            "model_type": "deepseek_v3", "hidden_size": 7168, "num_attention_heads": 64,
            "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
            "kv_lora_rank": 512, "q_lora_rank": 1536, "max_position_embeddings": 131072,
            "rope_theta": 50000.0,
            "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0,
                             "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                             "type": "yarn"}}, [16]),
        ("qwen2-vl-7b", {
            "model_type": "qwen2_vl", "hidden_size": 3584, "num_attention_heads": 28,
            "num_key_value_heads": 4, "num_hidden_layers": 28, "intermediate_size": 18944,
            "max_position_embeddings": 32768, "rope_theta": 1000000.0,
            "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
            "vision_config": {"depth": 32, "embed_dim": 1280, "num_heads": 16}}, [16]),
        ("qwen3-vl-8b", {
            "model_type": "qwen3_vl",
            "text_config": {"model_type": "qwen3_vl_text", "hidden_size": 4096,
                            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                            "max_position_embeddings": 262144, "rope_theta": 5000000,
                            "rope_scaling": {"rope_type": "default", "mrope_interleaved": True,
                                             "mrope_section": [24, 20, 20]}}}, [16]),
        ("gpt-neox-20b", {
            "model_type": "gpt_neox", "hidden_size": 6144, "num_attention_heads": 64,
            "num_hidden_layers": 44, "intermediate_size": 24576, "max_position_embeddings": 2048,
            "rotary_pct": 0.25, "rotary_emb_base": 10000, "use_parallel_residual": True}, [16]),
        ("pythia-160m", {
            "model_type": "gpt_neox", "hidden_size": 768, "num_attention_heads": 12,
            "num_hidden_layers": 12, "max_position_embeddings": 2048, "rotary_pct": 0.25,
            "rotary_emb_base": 10000}, [16]),
        ("phi-2", {
            "model_type": "phi", "hidden_size": 2560, "num_attention_heads": 32,
            "num_hidden_layers": 32, "max_position_embeddings": 2048,
            "partial_rotary_factor": 0.4, "rope_theta": 10000.0}, [16]),
        ("gpt-j-6b", {
            "model_type": "gptj", "n_embd": 4096, "n_head": 16, "n_layer": 28,
            "n_positions": 2048, "rotary_dim": 64, "vocab_size": 50400}, [16]),
        ("vicuna-7b-v1.5-16k-linear", {
            "model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
            "max_position_embeddings": 4096, "rope_theta": 10000.0,
            "rope_scaling": {"factor": 4.0, "type": "linear"}}, [16]),
        ("llama-dynamic-ntk", {
            "model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
            "max_position_embeddings": 4096, "rope_theta": 10000.0,
            "rope_scaling": {"factor": 2.0, "type": "dynamic"}}, [1000, 4096, 10000]),
    ]


def rotary_module(config):
    """The family's own text rotary module, as its model builds it."""
    import importlib
    mt = config.model_type
    if mt == "gptj":
        return None
    if mt == "qwen3_vl":
        from transformers.models.qwen3_vl import modeling_qwen3_vl
        return modeling_qwen3_vl.Qwen3VLTextRotaryEmbedding(config.text_config)
    if mt == "qwen2_vl":
        from transformers.models.qwen2_vl import modeling_qwen2_vl
        return modeling_qwen2_vl.Qwen2VLRotaryEmbedding(config.text_config)
    module = importlib.import_module(f"transformers.models.{mt}.modeling_{mt}")
    cls = [getattr(module, n) for n in dir(module)
           if n.endswith("RotaryEmbedding") and "Vision" not in n]
    assert len(cls) == 1, (mt, cls)
    return cls[0](config)


def config_case(name, fields, seq_lens):
    from transformers import CONFIG_MAPPING
    case = {"name": name, "config": json.dumps(fields), "results": []}
    for L in seq_lens:
        # A fresh config and module per length: dynamic NTK caches the
        # longest length seen, and posenc resolves each sequence alone.
        config = CONFIG_MAPPING[fields["model_type"]].from_dict(dict(json.loads(case["config"])))
        emb = rotary_module(config)
        if emb is None:  # GPT-J: a sin/cos table; row 1 holds sin(f_k) with f_k <= 1
            from transformers.models.gptj import modeling_gptj
            table = modeling_gptj.create_sinusoidal_positions(2, config.rotary_dim).double()
            inv = torch.asin(table[1, : config.rotary_dim // 2])
            case["results"].append({"seq_len": L, "inv_freq": tolist(inv), "attention_scale": 1.0})
            case.update(head_dim=config.hidden_size // config.num_attention_heads,
                        rotary_dim=config.rotary_dim, style="gptj")
            continue
        pos = torch.arange(L).unsqueeze(0)
        if fields["model_type"] in ("qwen2_vl", "qwen3_vl"):
            pos = pos.unsqueeze(0).expand(3, 1, L)
        x = torch.zeros(1, L, 1, 8)
        emb(x, pos)
        case["results"].append({"seq_len": L, "inv_freq": tolist(emb.inv_freq.double()),
                                "attention_scale": float(emb.attention_scaling)})
        text = getattr(config, "text_config", None) or config
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        case.update(head_dim=head_dim, rotary_dim=2 * len(emb.inv_freq))
        if hasattr(emb, "mrope_section"):
            case["sections"] = list(emb.mrope_section)
            case["axis_mode"] = "mrope_interleaved" if fields["model_type"] == "qwen3_vl" else "mrope"
        if fields["model_type"] == "deepseek_v3":
            # rope_interleave (default True): q and k de-interleaved before
            # rotate_half, the same scores as rotating pairs (2i, 2i+1).
            case["style"] = "gptj" if getattr(config, "rope_interleave", True) else "neox"
    case.setdefault("style", "neox")
    return case


def configs():
    return [config_case(*c) for c in family_configs()]


def main():
    out = {"transformers": transformers.__version__, "torch": torch.__version__,
           "frequencies": frequencies(), "conventions": conventions(), "configs": configs()}
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {len(out['frequencies'])} frequency, {len(out['conventions'])} convention and "
          f"{len(out['configs'])} config cases "
          f"from transformers {transformers.__version__}")


if __name__ == "__main__":
    main()
