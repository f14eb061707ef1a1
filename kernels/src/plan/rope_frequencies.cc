// Frequency resolution for every RoPE scaling, in float64. Each formula
// follows HF transformers' modeling_rope_utils.py (the compatibility target of
// SPEC §2.1); comments name the HF function a branch mirrors.
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "posenc/limits.h"
#include "posenc/rope.h"
#include "posenc/status_macros.h"

namespace posenc {
namespace {

// A scaling factor: finite, in (0, kMaxScalingFactor].
absl::Status Factor(absl::string_view field, double v) {
  return CheckFiniteInRange(field, v, 0.0, kMaxScalingFactor);
}

absl::StatusOr<double> Required(absl::string_view field, const std::optional<double>& v,
                                absl::string_view type) {
  if (!v.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is required for ", type, " scaling"));
  }
  POSENC_RETURN_IF_ERROR(Factor(field, *v));
  return *v;
}

absl::Status AttentionScale(absl::string_view field, double v) {
  return CheckFiniteInRange(field, v, 0.0, kMaxAttentionScale);
}

absl::StatusOr<int64_t> OriginalMax(const RopeScaling& s, absl::string_view type,
                                    std::optional<int64_t> fallback) {
  std::optional<int64_t> v = s.original_max_position ? s.original_max_position : fallback;
  if (!v.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("scaling.original_max_position is required for ", type, " scaling"));
  }
  if (*v < 1 || *v > kMaxAbsPosition) {
    return absl::InvalidArgumentError(
        absl::StrCat("scaling.original_max_position must be in [1, 2^31], got ", *v));
  }
  return *v;
}

// f_k = base^(-2k/dim) for k in [0, dim/2): HF's default inv_freq.
void DefaultInvFreq(double base, int64_t dim, double* out) {
  for (int64_t k = 0; k < dim / 2; ++k) {
    out[k] = 1.0 / std::pow(base, static_cast<double>(2 * k) / static_cast<double>(dim));
  }
}

// HF get_mscale: 0.1 * mscale * ln(scale) + 1 above scale 1.
double YarnMscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// HF find_correction_dim: the dimension whose wavelength fits num_rotations
// times into max_position.
double YarnCorrectionDim(double num_rotations, double dim, double base, double max_position) {
  return (dim * std::log(max_position / (num_rotations * 2.0 * M_PI))) / (2.0 * std::log(base));
}

absl::Status ApplyYarn(const RopeScaling& s, double base, int64_t R, FrequencySet& fs) {
  POSENC_ASSIGN_OR_RETURN(double factor, Required("scaling.factor", s.factor, "yarn"));
  POSENC_ASSIGN_OR_RETURN(int64_t orig, OriginalMax(s, "yarn", std::nullopt));
  const double beta_fast = s.beta_fast.value_or(32.0);
  const double beta_slow = s.beta_slow.value_or(1.0);
  POSENC_RETURN_IF_ERROR(CheckFiniteInRange("scaling.beta_fast", beta_fast, kMinYarnBeta,
                                            kMaxYarnBeta, /*lo_inclusive=*/true));
  POSENC_RETURN_IF_ERROR(CheckFiniteInRange("scaling.beta_slow", beta_slow, kMinYarnBeta,
                                            kMaxYarnBeta, /*lo_inclusive=*/true));
  for (auto [name, v] : {std::pair<const char*, std::optional<double>>{"scaling.mscale", s.mscale},
                         {"scaling.mscale_all_dim", s.mscale_all_dim}}) {
    if (v.has_value()) {
      POSENC_RETURN_IF_ERROR(CheckFiniteInRange(name, *v, 0.0, kMaxYarnMscale, true));
    }
  }

  if (s.attention_factor.has_value()) {
    POSENC_RETURN_IF_ERROR(AttentionScale("scaling.attention_factor", *s.attention_factor));
    fs.attention_scale = *s.attention_factor;
  } else if (s.mscale.value_or(0) != 0 && s.mscale_all_dim.value_or(0) != 0) {
    fs.attention_scale = YarnMscale(factor, *s.mscale) / YarnMscale(factor, *s.mscale_all_dim);
  } else {
    fs.attention_scale = YarnMscale(factor, 1.0);
  }

  double low = YarnCorrectionDim(beta_fast, R, base, orig);
  double high = YarnCorrectionDim(beta_slow, R, base, orig);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(R - 1));
  if (low == high) high += 0.001;  // HF: avoid a zero-width ramp

  for (int64_t k = 0; k < R / 2; ++k) {
    const double pos_freq = std::pow(base, static_cast<double>(2 * k) / R);
    const double extrapolation = 1.0 / pos_freq;
    const double interpolation = 1.0 / (factor * pos_freq);
    const double ramp = std::clamp((static_cast<double>(k) - low) / (high - low), 0.0, 1.0);
    const double extrapolation_weight = 1.0 - ramp;
    fs.inv_freq[k] =
        interpolation * (1.0 - extrapolation_weight) + extrapolation * extrapolation_weight;
  }
  return absl::OkStatus();
}

absl::Status ApplyLlama3(const RopeScaling& s, FrequencySet& fs) {
  const double factor = s.factor.value_or(8.0);
  const double low_ff = s.low_freq_factor.value_or(1.0);
  const double high_ff = s.high_freq_factor.value_or(4.0);
  POSENC_RETURN_IF_ERROR(Factor("scaling.factor", factor));
  POSENC_RETURN_IF_ERROR(Factor("scaling.low_freq_factor", low_ff));
  POSENC_RETURN_IF_ERROR(Factor("scaling.high_freq_factor", high_ff));
  if (!(high_ff > low_ff)) {
    return absl::InvalidArgumentError(
        absl::StrCat("scaling.high_freq_factor must exceed scaling.low_freq_factor, got ", high_ff,
                     " <= ", low_ff));
  }
  POSENC_ASSIGN_OR_RETURN(int64_t orig, OriginalMax(s, "llama3", 8192));
  const double low_freq_wavelen = orig / low_ff;
  const double high_freq_wavelen = orig / high_ff;
  for (double& f : fs.inv_freq) {
    const double wavelen = 2.0 * M_PI / f;
    if (wavelen > low_freq_wavelen) {
      f = f / factor;
    } else if (wavelen >= high_freq_wavelen) {
      // Medium band: blend the scaled and unscaled frequency.
      const double smooth = (orig / wavelen - low_ff) / (high_ff - low_ff);
      f = (1.0 - smooth) * f / factor + smooth * f;
    }
  }
  return absl::OkStatus();
}

absl::Status ApplyLongRope(const RopeScaling& s, double base, int64_t R, int64_t seq_len,
                           FrequencySet& fs) {
  const int64_t half = R / 2;
  for (auto [name, v] :
       {std::pair<const char*, const std::vector<double>*>{"scaling.short_factor", &s.short_factor},
        {"scaling.long_factor", &s.long_factor}}) {
    if (static_cast<int64_t>(v->size()) != half) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " must have rotary_dim/2 = ", half, " values, got ", v->size()));
    }
    for (size_t i = 0; i < v->size(); ++i) {
      POSENC_RETURN_IF_ERROR(Factor(absl::StrCat(name, "[", i, "]"), (*v)[i]));
    }
  }
  POSENC_ASSIGN_OR_RETURN(int64_t orig, OriginalMax(s, "longrope", std::nullopt));
  const double factor = s.factor.value_or(1.0);
  POSENC_RETURN_IF_ERROR(Factor("scaling.factor", factor));
  if (s.attention_factor.has_value()) {
    POSENC_RETURN_IF_ERROR(AttentionScale("scaling.attention_factor", *s.attention_factor));
    fs.attention_scale = *s.attention_factor;
  } else if (factor <= 1.0) {
    fs.attention_scale = 1.0;
  } else if (orig < 2) {
    // s = sqrt(1 + ln(factor) / ln(original)) divides by ln(1) = 0.
    return absl::InvalidArgumentError(absl::StrCat(
        "scaling.original_max_position must be >= 2 for LongRoPE with factor > 1 (its attention "
        "scale divides by ln(original_max_position)), got ",
        orig));
  } else {
    fs.attention_scale = std::sqrt(1.0 + std::log(factor) / std::log(static_cast<double>(orig)));
  }
  bool use_long = false;
  switch (s.longrope_mode) {
    case LongRopeMode::kBySequenceLength:
      use_long = seq_len > orig;
      break;
    case LongRopeMode::kShort:
      use_long = false;
      break;
    case LongRopeMode::kLong:
      use_long = true;
      break;
    default:  // a value outside the enum (a library caller's cast)
      return absl::InvalidArgumentError(
          absl::StrCat("scaling.longrope_mode must be BY_SEQUENCE_LENGTH, SHORT or LONG, got ",
                       static_cast<int>(s.longrope_mode)));
  }
  const std::vector<double>& ext = use_long ? s.long_factor : s.short_factor;
  for (int64_t k = 0; k < half; ++k) {
    fs.inv_freq[k] = 1.0 / (ext[k] * std::pow(base, static_cast<double>(2 * k) / R));
  }
  return absl::OkStatus();
}

absl::Status AssignAxes(const RopeOptions& o, int64_t R, FrequencySet& fs) {
  const int64_t half = R / 2;
  fs.slot_axis.assign(half, 0);
  switch (o.axis_mode) {
    case AxisMode::kSingle:
      return absl::OkStatus();
    case AxisMode::kAxial: {
      int64_t sum = 0;  // each term <= kMaxDim, at most kMaxAxes terms
      for (size_t a = 0; a < o.axis_dims.size(); ++a) {
        const int64_t d = o.axis_dims[a];
        if (d <= 0 || d % 2 != 0 || d > kMaxDim) {
          return absl::InvalidArgumentError(
              absl::StrCat("axis_dims[", a, "] must be even and in [2, ", kMaxDim, "], got ", d));
        }
        sum += d;
      }
      if (o.axis_dims.empty() || sum != R) {
        return absl::InvalidArgumentError(absl::StrCat("axis_dims must sum to rotary_dim = ", R,
                                                       ", got ", sum, " over ", o.axis_dims.size(),
                                                       " axes"));
      }
      int64_t k = 0;
      for (size_t a = 0; a < o.axis_dims.size(); ++a) {
        for (int64_t j = 0; j < o.axis_dims[a] / 2; ++j, ++k) fs.slot_axis[k] = a;
      }
      return absl::OkStatus();
    }
    case AxisMode::kMrope:
    case AxisMode::kMropeInterleaved: {
      int64_t sum = 0;  // each term <= kMaxDim, at most kMaxAxes terms
      for (size_t a = 0; a < o.sections.size(); ++a) {
        POSENC_RETURN_IF_ERROR(
            CheckDimension(absl::StrCat("sections[", a, "]"), o.sections[a], kMaxDim));
        sum += o.sections[a];
      }
      if (o.sections.empty() || sum != half) {
        return absl::InvalidArgumentError(absl::StrCat("sections must sum to rotary_dim/2 = ", half,
                                                       ", got ", sum, " over ", o.sections.size(),
                                                       " axes"));
      }
      const int64_t n = static_cast<int64_t>(o.sections.size());
      if (o.axis_mode == AxisMode::kMrope) {
        int64_t k = 0;
        for (int64_t a = 0; a < n; ++a) {
          for (int64_t j = 0; j < o.sections[a]; ++j, ++k) fs.slot_axis[k] = a;
        }
      } else {
        // Qwen3-VL: slot k belongs to axis k % n while that axis has slots
        // left (k < n * sections[a]); the rest stay on axis 0.
        for (int64_t k = 0; k < half; ++k) {
          const int64_t a = k % n;
          fs.slot_axis[k] = (a != 0 && k < n * o.sections[a]) ? a : 0;
        }
      }
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError("axis_mode is not a known value");
}

}  // namespace

absl::Status CheckAxisCount(const RopeOptions& o) {
  const size_t n = o.axis_mode == AxisMode::kAxial ? o.axis_dims.size() : o.sections.size();
  if (n > static_cast<size_t>(kMaxAxes)) {
    return absl::InvalidArgumentError(
        absl::StrCat(o.axis_mode == AxisMode::kAxial ? "axis_dims" : "sections",
                     " must have at most ", kMaxAxes, " axes, got ", n));
  }
  return absl::OkStatus();
}

int NumPositionAxes(const RopeOptions& o) {
  switch (o.axis_mode) {
    case AxisMode::kAxial:
      return std::max<int>(1, o.axis_dims.size());
    case AxisMode::kMrope:
    case AxisMode::kMropeInterleaved:
      return std::max<int>(1, o.sections.size());
    case AxisMode::kSingle:
      break;
  }
  return 1;
}

absl::StatusOr<FrequencySet> ResolveFrequencies(const RopeOptions& o, int64_t R, int64_t seq_len) {
  POSENC_RETURN_IF_ERROR(CheckDimension("rotary_dim", R, kMaxDim));
  POSENC_RETURN_IF_ERROR(CheckAxisCount(o));
  // base > 1: base 1 makes every frequency 1 and YaRN divide by ln(1) = 0.
  POSENC_RETURN_IF_ERROR(CheckFiniteInRange("base", o.base, 1.0, kMaxBase));
  const RopeScaling& s = o.scaling;
  FrequencySet fs;
  fs.inv_freq.assign(R / 2, 0.0);
  POSENC_RETURN_IF_ERROR(AssignAxes(o, R, fs));
  if (R == 0) return fs;

  if (o.axis_mode == AxisMode::kAxial) {
    if (s.type != ScalingType::kNone && s.type != ScalingType::kLinear &&
        s.type != ScalingType::kExplicit) {
      return absl::InvalidArgumentError(
          "AXIAL supports scaling NONE, LINEAR or EXPLICIT only; length-based scalings are "
          "defined over a single rotary dimension");
    }
    int64_t k = 0;
    for (int64_t d : o.axis_dims) {
      DefaultInvFreq(o.base, d, fs.inv_freq.data() + k);
      k += d / 2;
    }
  } else {
    DefaultInvFreq(o.base, R, fs.inv_freq.data());
  }

  switch (s.type) {
    case ScalingType::kNone:
      break;
    case ScalingType::kLinear: {  // HF _compute_linear_scaling_rope_parameters
      POSENC_ASSIGN_OR_RETURN(double factor, Required("scaling.factor", s.factor, "linear"));
      for (double& f : fs.inv_freq) f /= factor;
      break;
    }
    case ScalingType::kDynamicNtk: {  // HF _compute_dynamic_ntk_parameters
      POSENC_ASSIGN_OR_RETURN(double factor, Required("scaling.factor", s.factor, "dynamic"));
      POSENC_ASSIGN_OR_RETURN(int64_t orig, OriginalMax(s, "dynamic", std::nullopt));
      if (R <= 2) {
        return absl::InvalidArgumentError(
            absl::StrCat("dynamic NTK scaling needs rotary_dim > 2, got ", R));
      }
      const double L = static_cast<double>(std::max(seq_len, orig));
      const double base =
          o.base * std::pow(factor * L / orig - (factor - 1.0), static_cast<double>(R) / (R - 2));
      DefaultInvFreq(base, R, fs.inv_freq.data());
      break;
    }
    case ScalingType::kYarn:
      POSENC_RETURN_IF_ERROR(ApplyYarn(s, o.base, R, fs));
      break;
    case ScalingType::kLlama3:
      POSENC_RETURN_IF_ERROR(ApplyLlama3(s, fs));
      break;
    case ScalingType::kLongRope:
      POSENC_RETURN_IF_ERROR(ApplyLongRope(s, o.base, R, seq_len, fs));
      break;
    case ScalingType::kExplicit: {
      if (static_cast<int64_t>(s.inv_freq.size()) != R / 2) {
        return absl::InvalidArgumentError(absl::StrCat("scaling.inv_freq must have rotary_dim/2 = ",
                                                       R / 2, " values, got ", s.inv_freq.size()));
      }
      for (size_t k = 0; k < s.inv_freq.size(); ++k) {
        if (!std::isfinite(s.inv_freq[k]) || std::abs(s.inv_freq[k]) > kMaxInvFreq) {
          return absl::InvalidArgumentError(
              absl::StrCat("scaling.inv_freq[", k, "] must be finite with |f| <= ", kMaxInvFreq,
                           ", got ", s.inv_freq[k]));
        }
      }
      fs.inv_freq = s.inv_freq;
      if (s.attention_factor.has_value()) {
        POSENC_RETURN_IF_ERROR(AttentionScale("scaling.attention_factor", *s.attention_factor));
        fs.attention_scale = *s.attention_factor;
      }
      break;
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("scaling.type ", static_cast<int>(s.type), " is not a known value"));
  }
  // Each parameter is in range, but combinations (a tiny factor, a large
  // mscale) could still give a frequency or scale that makes outputs
  // overflow; refuse them rather than answer with inf or NaN.
  for (size_t k = 0; k < fs.inv_freq.size(); ++k) {
    if (!std::isfinite(fs.inv_freq[k]) || std::abs(fs.inv_freq[k]) > kMaxInvFreq) {
      return absl::InvalidArgumentError(absl::StrCat(
          "scaling parameters give inverse frequency ", fs.inv_freq[k], " for slot ", k,
          "; it must be finite with |f| <= ", kMaxInvFreq, " (check scaling.factor)"));
    }
  }
  POSENC_RETURN_IF_ERROR(
      AttentionScale("the attention scale derived from scaling (mscale, mscale_all_dim, factor)",
                     fs.attention_scale));
  return fs;
}

}  // namespace posenc
