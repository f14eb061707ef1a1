// HF config -> RopeOptions, mirroring transformers 5.x: the config classes'
// convert_rope_params_to_dict / standardize_rope_params (where rope_theta,
// partial_rotary_factor and original_max_position_embeddings come from) and
// modeling_rope_utils' _compute_*_parameters (which factors are inferred).
// Comments name the HF code a rule follows. tests/conformance/hf/ checks every family
// against transformers itself.
#include "posenc/wire/hf_config.h"

#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "hf_fields.h"
#include "posenc/limits.h"
#include "posenc/status_macros.h"
#include "posenc/wire/enums.h"

namespace posenc::wire {
namespace {

using google::protobuf::Struct;
using hf::Fields;

// HF RotaryEmbeddingConfigMixin.default_theta, and the classes that differ.
double DefaultTheta(absl::string_view model_type) {
  if (absl::StartsWith(model_type, "qwen3_vl")) return 500000.0;
  if (absl::StartsWith(model_type, "qwen2_vl") || absl::StartsWith(model_type, "qwen2_5_vl") ||
      model_type == "phimoe") {
    return 1000000.0;
  }
  return 10000.0;
}

bool IsDeepSeekMla(absl::string_view model_type) {
  return model_type == "deepseek_v2" || model_type == "deepseek_v3";
}

absl::Status InRange(absl::string_view path, double v, double lo, double hi) {
  if (!(v > lo && v <= hi)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " must be in (", lo, ", ", hi, "], got ", v));
  }
  return absl::OkStatus();
}

// HF get_mscale (YaRN).
double Mscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// The config's own RoPE dict and where it is: HF convert_rope_params_to_dict
// takes `rope_scaling or rope_parameters` (a non-empty rope_scaling wins).
struct RopeDict {
  const Struct* fields = nullptr;
  std::string path;
};

absl::StatusOr<RopeDict> FindRopeDict(const Fields& cfg) {
  RopeDict d;
  POSENC_ASSIGN_OR_RETURN(d.fields, cfg.Object("rope_scaling", &d.path));
  if (d.fields == nullptr || d.fields->fields().empty()) {
    POSENC_ASSIGN_OR_RETURN(d.fields, cfg.Object("rope_parameters", &d.path));
  }
  if (d.fields == nullptr) return d;
  // Per-layer-type dicts (Gemma 3's {"full_attention": {...}, ...}).
  for (const auto& [key, value] : d.fields->fields()) {
    if (value.kind_case() == google::protobuf::Value::kStructValue) {
      return absl::InvalidArgumentError(
          absl::StrCat(d.path, ".", key.substr(0, 64),
                       " is an object: RoPE parameters per layer type are not supported; send the "
                       "parameters of one layer type as rope_parameters"));
    }
  }
  return d;
}

// head_dim as the family's attention uses it.
absl::StatusOr<int64_t> HeadDim(const Fields& cfg, absl::string_view model_type) {
  if (IsDeepSeekMla(model_type)) {  // DeepseekV3Config: head_dim = qk_rope_head_dim
    POSENC_ASSIGN_OR_RETURN(std::optional<int64_t> d, cfg.Integer("qk_rope_head_dim"));
    return d.value_or(64);
  }
  if (model_type != "gptj") {
    POSENC_ASSIGN_OR_RETURN(std::optional<int64_t> d, cfg.Integer("head_dim"));
    if (d.has_value()) return *d;
  }
  // GPT-J / GPT-2 style names are HF attribute_map aliases.
  POSENC_ASSIGN_OR_RETURN(std::optional<int64_t> hidden, cfg.Integer("hidden_size"));
  if (!hidden) {
    POSENC_ASSIGN_OR_RETURN(hidden, cfg.Integer("n_embd"));
  }
  POSENC_ASSIGN_OR_RETURN(std::optional<int64_t> heads, cfg.Integer("num_attention_heads"));
  if (!heads) {
    POSENC_ASSIGN_OR_RETURN(heads, cfg.Integer("n_head"));
  }
  if (!hidden || !heads) {
    return absl::InvalidArgumentError(
        absl::StrCat("hf_config must give ", cfg.Path("head_dim"), ", or ", cfg.Path("hidden_size"),
                     " and ", cfg.Path("num_attention_heads"), " (the head size RoPE rotates)"));
  }
  if (*heads == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(cfg.Path("num_attention_heads"), " must be positive, got 0"));
  }
  return *hidden / *heads;  // Python's //
}

absl::StatusOr<double> Theta(const Fields& cfg, const Fields& rope, absl::string_view model_type) {
  POSENC_ASSIGN_OR_RETURN(std::optional<double> theta, rope.Number("rope_theta"));
  std::string path = rope.Path("rope_theta");
  // GPT-J hard-codes 10000 (create_sinusoidal_positions).
  if (model_type == "gptj") return 10000.0;
  // GPTNeoXConfig: rope_theta from rotary_emb_base.
  if (!theta && model_type == "gpt_neox") {
    POSENC_ASSIGN_OR_RETURN(theta, cfg.Number("rotary_emb_base"));
    path = cfg.Path("rotary_emb_base");
  }
  if (!theta) {
    POSENC_ASSIGN_OR_RETURN(theta, cfg.Number("rope_theta"));
    path = cfg.Path("rope_theta");
  }
  if (!theta) return DefaultTheta(model_type);
  // > 1: base 1 makes every frequency 1 and YaRN divide by ln(1) = 0.
  POSENC_RETURN_IF_ERROR(InRange(path, *theta, 1.0, kMaxBase));
  return *theta;
}

// Families whose own default RoPE (compute_default_rope_parameters) rotates
// only partial_rotary_factor of the head; the others (Llama, Qwen2, Mistral,
// ...) ignore the factor for rope_type "default" and rotate the whole head,
// while the shared scaled types (linear, yarn, ...) honour it for every
// family. A config without model_type is taken at its word.
bool DefaultRopeHonoursPartial(absl::string_view model_type) {
  static constexpr absl::string_view kFamilies[] = {"",
                                                    "bamba",
                                                    "glm",
                                                    "glm4",
                                                    "glm4_moe",
                                                    "glm4v",
                                                    "glm4v_moe",
                                                    "gpt_neox",
                                                    "gpt_neox_japanese",
                                                    "minimax_m2",
                                                    "nemotron",
                                                    "persimmon",
                                                    "phi",
                                                    "phi3",
                                                    "phi4_multimodal",
                                                    "qwen3_5",
                                                    "qwen3_5_moe",
                                                    "qwen3_next",
                                                    "recurrent_gemma",
                                                    "stablelm"};
  for (absl::string_view f : kFamilies) {
    if (f == model_type) return true;
  }
  return false;
}

absl::StatusOr<double> PartialRotaryFactor(const Fields& cfg, const Fields& rope,
                                           absl::string_view model_type,
                                           absl::string_view rope_type) {
  if (rope_type == "default" && !DefaultRopeHonoursPartial(model_type)) return 1.0;
  POSENC_ASSIGN_OR_RETURN(std::optional<double> p, rope.Number("partial_rotary_factor"));
  if (!p && model_type == "gpt_neox") {  // GPTNeoXConfig: rotary_pct, default 0.25
    POSENC_ASSIGN_OR_RETURN(p, cfg.Number("rotary_pct"));
    p = p.value_or(0.25);
  }
  if (!p) {
    POSENC_ASSIGN_OR_RETURN(p, cfg.Number("partial_rotary_factor"));
  }
  if (!p && model_type == "phi") p = 0.5;  // PhiConfig's default
  const double v = p.value_or(1.0);
  POSENC_RETURN_IF_ERROR(InRange("hf_config partial_rotary_factor", v, 0.0, 1.0));
  return v;
}

// original_max_position_embeddings for llama3 / yarn / longrope, as HF
// standardize_rope_params sets it: a top-level value wins (Phi-3 keeps it
// there; Phi3Config defaults it to 4096), then the RoPE dict's, then
// max_position_embeddings.
absl::StatusOr<int64_t> OriginalMax(const Fields& cfg, const Fields& rope,
                                    absl::string_view model_type,
                                    std::optional<int64_t> max_position) {
  POSENC_ASSIGN_OR_RETURN(std::optional<int64_t> v,
                          cfg.Integer("original_max_position_embeddings"));
  if (!v && model_type == "phi3") v = 4096;
  if (!v) {
    POSENC_ASSIGN_OR_RETURN(v, rope.Integer("original_max_position_embeddings"));
  }
  if (!v) v = max_position;
  if (!v) {
    return absl::InvalidArgumentError(
        absl::StrCat("hf_config must give ", rope.Path("original_max_position_embeddings"), " or ",
                     cfg.Path("max_position_embeddings"), " for this rope_type"));
  }
  if (*v < 1 || *v > kMaxAbsPosition) {
    return absl::InvalidArgumentError(
        absl::StrCat("hf_config original_max_position_embeddings must be in [1, 2^31], got ", *v));
  }
  return *v;
}

absl::StatusOr<double> RequiredNumber(const Fields& rope, absl::string_view key,
                                      absl::string_view rope_type) {
  POSENC_ASSIGN_OR_RETURN(std::optional<double> v, rope.Number(key));
  if (!v) {
    return absl::InvalidArgumentError(
        absl::StrCat(rope.Path(key), " is required for rope_type \"", rope_type, "\""));
  }
  POSENC_RETURN_IF_ERROR(InRange(rope.Path(key), *v, 0.0, kMaxScalingFactor));
  return *v;
}

// YaRN and LongRoPE: an unset factor is max_position_embeddings / original.
absl::StatusOr<double> FactorOrRatio(const Fields& rope, std::optional<int64_t> max_position,
                                     int64_t original, absl::string_view rope_type) {
  POSENC_ASSIGN_OR_RETURN(std::optional<double> f, rope.Number("factor"));
  if (f) {
    POSENC_RETURN_IF_ERROR(InRange(rope.Path("factor"), *f, 0.0, kMaxScalingFactor));
    return *f;
  }
  if (!max_position) {
    return absl::InvalidArgumentError(
        absl::StrCat("hf_config must give ", rope.Path("factor"),
                     " or max_position_embeddings (the factor is then max_position_embeddings / "
                     "original_max_position_embeddings) for rope_type \"",
                     rope_type, "\""));
  }
  const double ratio = static_cast<double>(*max_position) / static_cast<double>(original);
  POSENC_RETURN_IF_ERROR(
      InRange("max_position_embeddings / original_max_position_embeddings (the inferred factor)",
              ratio, 0.0, kMaxScalingFactor));
  return ratio;
}

// Optional non-negative parameters: finite by JSON, bounded here.
absl::StatusOr<std::optional<double>> Bounded(const Fields& rope, absl::string_view key,
                                              double hi) {
  POSENC_ASSIGN_OR_RETURN(std::optional<double> v, rope.Number(key));
  if (v && !(*v >= 0 && *v <= hi)) {
    return absl::InvalidArgumentError(
        absl::StrCat(rope.Path(key), " must be in [0, ", hi, "], got ", *v));
  }
  return v;
}

absl::Status ResolveScaling(const Fields& cfg, const Fields& rope, absl::string_view model_type,
                            HfRope& out) {
  RopeScaling& s = out.options.scaling;
  const std::string& type = out.rope_type;
  POSENC_ASSIGN_OR_RETURN(std::optional<int64_t> max_position,
                          cfg.Integer("max_position_embeddings"));
  if (!max_position && model_type == "gptj") {
    POSENC_ASSIGN_OR_RETURN(max_position, cfg.Integer("n_positions"));
  }
  if (type == "default") {
    s.type = ScalingType::kNone;
  } else if (type == "linear") {  // _compute_linear_scaling_rope_parameters
    s.type = ScalingType::kLinear;
    POSENC_ASSIGN_OR_RETURN(s.factor, RequiredNumber(rope, "factor", type));
  } else if (type == "dynamic") {  // _compute_dynamic_ntk_parameters
    s.type = ScalingType::kDynamicNtk;
    POSENC_ASSIGN_OR_RETURN(s.factor, RequiredNumber(rope, "factor", type));
    // HF's original length here is max_position_embeddings itself (and the
    // rotary module resets to it below that length).
    if (!max_position || *max_position < 1 || *max_position > kMaxAbsPosition) {
      return absl::InvalidArgumentError(absl::StrCat(
          cfg.Path("max_position_embeddings"),
          " must be in [1, 2^31] for rope_type \"dynamic\" (it is the original length)"));
    }
    s.original_max_position = *max_position;
  } else if (type == "yarn") {  // _compute_yarn_parameters
    s.type = ScalingType::kYarn;
    POSENC_ASSIGN_OR_RETURN(const int64_t orig, OriginalMax(cfg, rope, model_type, max_position));
    s.original_max_position = orig;
    POSENC_ASSIGN_OR_RETURN(const double factor, FactorOrRatio(rope, max_position, orig, type));
    s.factor = factor;
    POSENC_ASSIGN_OR_RETURN(s.attention_factor,
                            Bounded(rope, "attention_factor", kMaxAttentionScale));
    POSENC_ASSIGN_OR_RETURN(s.mscale, Bounded(rope, "mscale", kMaxYarnMscale));
    POSENC_ASSIGN_OR_RETURN(s.mscale_all_dim, Bounded(rope, "mscale_all_dim", kMaxYarnMscale));
    // `get("beta_fast") or 32`: 0 means the default too.
    POSENC_ASSIGN_OR_RETURN(std::optional<double> fast, Bounded(rope, "beta_fast", kMaxYarnBeta));
    POSENC_ASSIGN_OR_RETURN(std::optional<double> slow, Bounded(rope, "beta_slow", kMaxYarnBeta));
    if (fast.value_or(0) != 0) s.beta_fast = fast;
    if (slow.value_or(0) != 0) s.beta_slow = slow;
    // `get("truncate", True)`: absent is true, an explicit null is falsy.
    POSENC_ASSIGN_OR_RETURN(std::optional<bool> truncate, rope.Bool("truncate"));
    s.truncate = truncate.value_or(!rope.IsNull("truncate"));
    if (s.attention_factor) {
      out.attention_scale = *s.attention_factor;
    } else if (s.mscale.value_or(0) != 0 && s.mscale_all_dim.value_or(0) != 0) {
      out.attention_scale = Mscale(factor, *s.mscale) / Mscale(factor, *s.mscale_all_dim);
    } else {
      out.attention_scale = Mscale(factor, 1.0);
    }
  } else if (type == "longrope") {  // _compute_longrope_parameters
    s.type = ScalingType::kLongRope;
    POSENC_ASSIGN_OR_RETURN(const int64_t orig, OriginalMax(cfg, rope, model_type, max_position));
    s.original_max_position = orig;
    POSENC_ASSIGN_OR_RETURN(const double factor, FactorOrRatio(rope, max_position, orig, type));
    s.factor = factor;
    for (auto [key, dst] :
         {std::pair{"short_factor", &s.short_factor}, {"long_factor", &s.long_factor}}) {
      POSENC_ASSIGN_OR_RETURN(std::optional<std::vector<double>> v, rope.Numbers(key));
      if (!v) {
        return absl::InvalidArgumentError(
            absl::StrCat(rope.Path(key), " is required for rope_type \"longrope\""));
      }
      *dst = std::move(*v);
    }
    POSENC_ASSIGN_OR_RETURN(s.attention_factor,
                            Bounded(rope, "attention_factor", kMaxAttentionScale));
    if (s.attention_factor) {
      out.attention_scale = *s.attention_factor;
    } else if (factor > 1.0 && orig >= 2) {
      out.attention_scale = std::sqrt(1.0 + std::log(factor) / std::log(static_cast<double>(orig)));
    }
  } else if (type == "llama3") {  // _compute_llama3_parameters
    s.type = ScalingType::kLlama3;
    POSENC_ASSIGN_OR_RETURN(s.factor, RequiredNumber(rope, "factor", type));
    POSENC_ASSIGN_OR_RETURN(s.low_freq_factor, RequiredNumber(rope, "low_freq_factor", type));
    POSENC_ASSIGN_OR_RETURN(s.high_freq_factor, RequiredNumber(rope, "high_freq_factor", type));
    POSENC_ASSIGN_OR_RETURN(s.original_max_position,
                            OriginalMax(cfg, rope, model_type, max_position));
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(rope.Path("rope_type"),
                     " must be one of default, linear, dynamic, yarn, longrope, "
                     "llama3 (or mrope, Qwen2-VL's name for default), got \"",
                     type.substr(0, 64), "\""));
  }
  return absl::OkStatus();
}

// Qwen2-VL / Qwen2.5-VL M-RoPE (mrope_section, contiguous) and Qwen3-VL
// (interleaved). Their text rotary modules default the sections to
// [16, 24, 24] and [24, 20, 20]; other families take M-RoPE only from an
// explicit mrope_section.
absl::Status ResolveAxes(const Fields& rope, absl::string_view model_type, HfRope& out) {
  POSENC_ASSIGN_OR_RETURN(std::optional<std::vector<int64_t>> sections,
                          rope.Integers("mrope_section"));
  POSENC_ASSIGN_OR_RETURN(std::optional<bool> interleaved, rope.Bool("mrope_interleaved"));
  const bool qwen3_vl = absl::StartsWith(model_type, "qwen3_vl");
  const bool qwen2_vl =
      absl::StartsWith(model_type, "qwen2_vl") || absl::StartsWith(model_type, "qwen2_5_vl");
  if (!sections && qwen3_vl) sections = std::vector<int64_t>{24, 20, 20};
  if (!sections && qwen2_vl) sections = std::vector<int64_t>{16, 24, 24};
  if (!sections) return absl::OkStatus();
  if (sections->empty() || sections->size() > static_cast<size_t>(kMaxAxes)) {
    return absl::InvalidArgumentError(absl::StrCat(rope.Path("mrope_section"), " must have 1 to ",
                                                   kMaxAxes, " values, got ", sections->size()));
  }
  out.options.axis_mode =
      (qwen3_vl || interleaved.value_or(false)) ? AxisMode::kMropeInterleaved : AxisMode::kMrope;
  out.options.sections = std::move(*sections);
  out.axis_mode_implied = true;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<HfRope> ResolveHfRope(absl::string_view config_json) {
  Struct root;
  POSENC_RETURN_IF_ERROR(hf::ParseConfig(config_json, &root));
  const Fields top(&root, "hf_config");
  HfRope out;
  POSENC_ASSIGN_OR_RETURN(std::optional<std::string> model_type, top.String("model_type"));
  // Multimodal configs keep the language model's fields in text_config.
  std::string text_path;
  POSENC_ASSIGN_OR_RETURN(const Struct* text, top.Object("text_config", &text_path));
  const Fields cfg = text != nullptr ? Fields(text, text_path, &root, "hf_config") : top;
  if (!model_type) {
    POSENC_ASSIGN_OR_RETURN(model_type, cfg.String("model_type"));
  }
  out.model_type = model_type.value_or("");
  const std::string& family = out.model_type;

  POSENC_ASSIGN_OR_RETURN(RopeDict dict, FindRopeDict(cfg));
  const Struct empty;
  const Fields rope(dict.fields != nullptr ? dict.fields : &empty,
                    dict.fields != nullptr ? dict.path : "hf_config.rope_parameters");

  // rope_type, else the legacy "type", else default (standardize_rope_params).
  POSENC_ASSIGN_OR_RETURN(std::optional<std::string> rope_type, rope.String("rope_type"));
  if (!rope_type) {
    POSENC_ASSIGN_OR_RETURN(rope_type, rope.String("type"));
  }
  out.rope_type = rope_type.value_or("default");
  if (out.rope_type == "mrope") out.rope_type = "default";  // Qwen2VLTextConfig
  if (family == "phi3" && (out.rope_type == "su" || out.rope_type == "yarn")) {
    out.rope_type = "longrope";  // Phi3Config: legacy names
  }

  POSENC_ASSIGN_OR_RETURN(out.options.base, Theta(cfg, rope, family));
  POSENC_ASSIGN_OR_RETURN(out.head_dim, HeadDim(cfg, family));
  if (out.head_dim < 2 || out.head_dim > kMaxDim) {
    return absl::InvalidArgumentError(
        absl::StrCat("hf_config's head_dim must be in [2, ", kMaxDim, "], got ", out.head_dim));
  }
  if (family == "gptj") {  // GPTJConfig.rotary_dim, default 64
    POSENC_ASSIGN_OR_RETURN(std::optional<int64_t> r, cfg.Integer("rotary_dim"));
    if (!r && cfg.IsNull("rotary_dim")) {
      return absl::InvalidArgumentError(
          "hf_config.rotary_dim is null: GPT-J then rotates with frequencies over hidden_size, "
          "which posenc does not model; give rotary_dim");
    }
    out.options.rotary_dim = r.value_or(64);
  } else {
    POSENC_ASSIGN_OR_RETURN(const double partial,
                            PartialRotaryFactor(cfg, rope, family, out.rope_type));
    // HF: dim = int(head_dim * partial_rotary_factor), truncating.
    out.options.rotary_dim = static_cast<int64_t>(static_cast<double>(out.head_dim) * partial);
  }
  const int64_t R = out.options.rotary_dim;
  if (R < 2 || R % 2 != 0 || R > out.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hf_config gives rotary dimension ", R, " (head_dim ", out.head_dim,
        " times partial_rotary_factor, or GPT-J's rotary_dim); it must be even and in [2, ",
        out.head_dim, "]"));
  }

  POSENC_RETURN_IF_ERROR(ResolveScaling(cfg, rope, family, out));
  POSENC_RETURN_IF_ERROR(ResolveAxes(rope, family, out));

  // GPT-J rotates pairs (rotate_every_two); DeepSeek's MLA does too
  // (rope_interleave, default true for V3; V2 multiplies complex pairs).
  if (family == "gptj") {
    out.options.style = RopeStyle::kGptj;
    out.style_implied = true;
  } else if (IsDeepSeekMla(family)) {
    POSENC_ASSIGN_OR_RETURN(std::optional<bool> interleave, cfg.Bool("rope_interleave"));
    out.options.style = interleave.value_or(true) ? RopeStyle::kGptj : RopeStyle::kNeox;
    out.style_implied = true;
  }
  return out;
}

absl::Status MergeHfRope(const HfRope& hf, const ExplicitRopeFields& given, int64_t query_head_dim,
                         RopeOptions* o) {
  const RopeOptions& c = hf.options;
  auto conflict = [](absl::string_view field, const auto& mine, const auto& theirs) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is ", mine, " but hf_config gives ",
                                                   theirs, "; send one or make them agree"));
  };
  if (given.scaling) {
    return absl::InvalidArgumentError(
        "scaling and hf_config are both set; hf_config determines the scaling, so leave scaling "
        "unset");
  }
  if (query_head_dim > 0 && query_head_dim != hf.head_dim) {
    return conflict("the query's head_dim", query_head_dim, hf.head_dim);
  }
  if (given.base && o->base != c.base) return conflict("base", o->base, c.base);
  if (given.rotary_dim && o->rotary_dim != c.rotary_dim) {
    return conflict("rotary_dim", o->rotary_dim, c.rotary_dim);
  }
  if (hf.style_implied && given.style && o->style != c.style) {
    return conflict("style", NameOf(o->style), NameOf(c.style));
  }
  if (hf.axis_mode_implied) {
    if (given.axis_mode && o->axis_mode != c.axis_mode) {
      return conflict("axis_mode", NameOf(o->axis_mode), NameOf(c.axis_mode));
    }
    if (given.sections && o->sections != c.sections) {
      return conflict("sections", absl::StrJoin(o->sections, ","), absl::StrJoin(c.sections, ","));
    }
    o->axis_mode = c.axis_mode;
    o->sections = c.sections;
    o->axis_dims.clear();
  }
  if (hf.style_implied) o->style = c.style;
  o->base = c.base;
  o->rotary_dim = c.rotary_dim;
  o->scaling = c.scaling;
  return absl::OkStatus();
}

}  // namespace posenc::wire
