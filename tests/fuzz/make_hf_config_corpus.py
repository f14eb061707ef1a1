#!/usr/bin/env python3
"""Writes the seed corpus of the hf_config_fuzz harness to tests/fuzz/hf_config_fuzz/.

Every real family's config from tests/conformance/hf/hf_fixtures.json (the configs
transformers resolved), plus one of each malformed class ResolveHfRope must
refuse. Standard library only.
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "hf_config_fuzz")
FIXTURES = os.path.join(HERE, "..", "conformance", "hf", "hf_fixtures.json")

BAD = {
    "bad_not_object": "[1, 2, 3]",
    "bad_truncated": '{"head_dim": 128, "rope_scaling": {"rope_type": "yarn"',
    "bad_nesting": "[" * 40 + "]" * 40,
    "bad_type_head_dim": '{"head_dim": "128"}',
    "bad_fraction": '{"head_dim": 127.5}',
    "bad_huge": '{"head_dim": 128, "rope_theta": 1e308}',
    "bad_odd_rotary": '{"head_dim": 100, "partial_rotary_factor": 0.25}',
    "bad_rope_type": '{"head_dim": 64, "rope_scaling": {"rope_type": "ntk-by-parts", "factor": 2}}',
    "bad_per_layer": '{"head_dim": 64, "rope_parameters": {"full_attention": {"rope_type": "default"}}}',
    "bad_longrope_list": ('{"head_dim": 8, "max_position_embeddings": 64, "rope_scaling": '
                          '{"rope_type": "longrope", "original_max_position_embeddings": 16, '
                          '"short_factor": [1, 1], "long_factor": [1, "x"]}}'),
    "edge_yarn_null_truncate": ('{"head_dim": 64, "max_position_embeddings": 8192, "rope_scaling": '
                                '{"rope_type": "yarn", "factor": null, "truncate": null, '
                                '"original_max_position_embeddings": 2048, "beta_fast": 0}}'),
    "edge_su": ('{"model_type": "phi3", "head_dim": 4, "max_position_embeddings": 8192, '
                '"rope_scaling": {"type": "su", "short_factor": [1, 1], "long_factor": [2, 3]}}'),
}


def main():
    os.makedirs(OUT, exist_ok=True)
    with open(FIXTURES) as f:
        fixtures = json.load(f)
    for case in fixtures["configs"]:
        with open(os.path.join(OUT, case["name"] + ".json"), "w") as f:
            f.write(case["config"])
    for name, text in BAD.items():
        with open(os.path.join(OUT, name), "w") as f:
            f.write(text)
    print(f"wrote {len(fixtures['configs']) + len(BAD)} inputs to {OUT}")


if __name__ == "__main__":
    main()
