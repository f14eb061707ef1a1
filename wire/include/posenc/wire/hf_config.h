// A model's Hugging Face config (config.json, or just its RoPE fields) read
// into the kernel library's RoPE options, resolving every default and
// inferred value the way HF transformers (5.x, modeling_rope_utils.py and the
// families' config classes) does, so a caller never works out a YaRN factor
// or a partial rotary dimension by hand.
//
// Self-contained: the JSON is parsed with protobuf's JSON parser into a
// google.protobuf.Struct; nothing here knows gRPC. Used by RopeRequest's
// hf_config field, the KServe front's "hf_config" parameter and the KServe
// model repository (model files that embed an HF config).
#ifndef POSENC_WIRE_HF_CONFIG_H_
#define POSENC_WIRE_HF_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "posenc/rope.h"

namespace posenc::wire {

// Refused above these (INVALID_ARGUMENT): a Phi-3 config with its LongRoPE
// factors is ~10 KiB, DeepSeek-V3's ~2 KiB.
inline constexpr size_t kMaxHfConfigBytes = size_t{1} << 20;
inline constexpr int kMaxHfConfigDepth = 16;  // objects/arrays nested

struct HfRope {
  // base, rotary_dim (never 0), scaling with every parameter HF would use
  // (factor, original_max_position, ... filled in), axis_mode and sections
  // for M-RoPE, and style: NEOX (HF's rotate_half) unless the family rotates
  // pairs (style_implied). layout and inverse stay at their defaults: they
  // describe the caller's tensors, not the model.
  RopeOptions options;
  int64_t head_dim = 0;            // the per-head size the config implies
  bool style_implied = false;      // GPT-J, DeepSeek (rope_interleave)
  bool axis_mode_implied = false;  // mrope_section given (Qwen2-VL, Qwen3-VL)
  // HF's attention_scaling (cos and sin are multiplied by it): YaRN's mscale
  // rule or LongRoPE's sqrt(1 + ln(factor)/ln(original)); 1 otherwise.
  double attention_scale = 1.0;
  std::string model_type;  // "" when the config names none
  std::string rope_type;   // HF's name after its own renames ("default", "yarn", ...)
};

// Parses `config_json` (a JSON object) and resolves it. Errors are
// INVALID_ARGUMENT naming the field as a path ("hf_config.rope_scaling.factor
// must be a number, got a string"). Which fields are read, and how missing
// ones are inferred, is documented in docs/hf-configs.md.
[[nodiscard]] absl::StatusOr<HfRope> ResolveHfRope(absl::string_view config_json);

// ResolveHfRope through a small process-wide cache of the last resolved
// configs (kHfCacheEntries, each at most kHfCacheMaxBytes of JSON; errors are
// not cached). Callers resend the same config with every request, and
// protobuf's JSON parser costs 20-100 us per config (bench/HF_CONFIG.md); a
// hit costs a string compare. Thread-safe. RopeOptionsOf uses it.
inline constexpr size_t kHfCacheEntries = 32;
inline constexpr size_t kHfCacheMaxBytes = size_t{64} << 10;
[[nodiscard]] absl::StatusOr<HfRope> ResolveHfRopeCached(absl::string_view config_json);

// Which RoPE options a request set itself, beside an hf_config.
struct ExplicitRopeFields {
  bool style = false, rotary_dim = false, base = false, scaling = false, axis_mode = false,
       sections = false;
};

// Puts the config's options into *o (a request's options, explicit fields
// already in it): base, rotary_dim and scaling always, style and
// axis_mode/sections when the config implies them. An explicit field that
// differs from the config's value is INVALID_ARGUMENT naming both; explicit
// scaling is always refused (the config determines scaling). A query
// head_dim (> 0) other than the config's is refused too: the config's
// rotary_dim means nothing for another head size.
[[nodiscard]] absl::Status MergeHfRope(const HfRope& hf, const ExplicitRopeFields& given,
                                       int64_t query_head_dim, RopeOptions* o);

}  // namespace posenc::wire

#endif  // POSENC_WIRE_HF_CONFIG_H_
