#include "reference.h"

#include <cmath>
#include <limits>

namespace posenc::reference {
namespace {

std::vector<double> Default(double base, int64_t dim) {
  std::vector<double> f;
  for (int64_t i = 0; i < dim; i += 2) f.push_back(1.0 / std::pow(base, double(i) / double(dim)));
  return f;
}

double GetMscale(double scale, double mscale) {
  if (scale <= 1) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

}  // namespace

Frequencies RopeFrequencies(const RopeOptions& o, int64_t R, int64_t L) {
  const RopeScaling& s = o.scaling;
  Frequencies out;
  const int64_t half = R / 2;
  out.axis.assign(half, 0);
  if (o.axis_mode == AxisMode::kAxial) {
    int a = 0;
    for (int64_t d : o.axis_dims) {
      for (double f : Default(o.base, d)) {
        out.inv_freq.push_back(f);
        out.axis[out.inv_freq.size() - 1] = a;
      }
      ++a;
    }
  } else {
    out.inv_freq = Default(o.base, R);
    if (o.axis_mode == AxisMode::kMrope) {
      // HF Qwen2-VL: split cos/sin by mrope_section, chunk i uses axis i % 3.
      int64_t k = 0;
      for (size_t a = 0; a < o.sections.size(); ++a)
        for (int64_t j = 0; j < o.sections[a]; ++j) out.axis[k++] = static_cast<int>(a);
    } else if (o.axis_mode == AxisMode::kMropeInterleaved) {
      // HF Qwen3-VL apply_interleaved_mrope: start from axis 0, overwrite
      // slice(offset, sections[dim] * 3, 3) with axis `dim`.
      const int64_t n = o.sections.size();
      for (int64_t dim = 1; dim < n; ++dim)
        for (int64_t k = dim; k < o.sections[dim] * n && k < half; k += n) out.axis[k] = dim;
    }
  }
  const double factor = s.factor.value_or(0);
  switch (s.type) {
    case ScalingType::kNone:
      break;
    case ScalingType::kLinear:
      for (double& f : out.inv_freq) f /= factor;
      break;
    case ScalingType::kDynamicNtk: {
      const double orig = double(*s.original_max_position);
      const double seq = std::max(double(L), orig);
      const double base =
          o.base * std::pow((factor * seq / orig) - (factor - 1), double(R) / (R - 2));
      out.inv_freq = Default(base, R);
      break;
    }
    case ScalingType::kYarn: {
      const double orig = double(*s.original_max_position);
      if (s.attention_factor) {
        out.scale = *s.attention_factor;
      } else if (s.mscale.value_or(0) && s.mscale_all_dim.value_or(0)) {
        out.scale = GetMscale(factor, *s.mscale) / GetMscale(factor, *s.mscale_all_dim);
      } else {
        out.scale = GetMscale(factor, 1);
      }
      auto correction_dim = [&](double rot) {
        return (R * std::log(orig / (rot * 2 * M_PI))) / (2 * std::log(o.base));
      };
      double low = correction_dim(s.beta_fast.value_or(32));
      double high = correction_dim(s.beta_slow.value_or(1));
      if (s.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, double(R - 1));
      if (low == high) high += 0.001;
      for (int64_t k = 0; k < half; ++k) {
        const double pos_freq = std::pow(o.base, double(2 * k) / R);
        const double ramp = std::min(1.0, std::max(0.0, (k - low) / (high - low)));
        const double extra = 1 - ramp;
        out.inv_freq[k] = (1 / (factor * pos_freq)) * (1 - extra) + (1 / pos_freq) * extra;
      }
      break;
    }
    case ScalingType::kLlama3: {
      const double f8 = s.factor.value_or(8), lo = s.low_freq_factor.value_or(1),
                   hi = s.high_freq_factor.value_or(4);
      const double old = double(s.original_max_position.value_or(8192));
      for (double& f : out.inv_freq) {
        const double wavelen = 2 * M_PI / f;
        const double scaled = wavelen > old / lo ? f / f8 : f;
        const double smooth = (old / wavelen - lo) / (hi - lo);
        const bool medium = !(wavelen < old / hi) && !(wavelen > old / lo);
        f = medium ? (1 - smooth) * scaled / f8 + smooth * scaled : scaled;
      }
      break;
    }
    case ScalingType::kLongRope: {
      const double orig = double(*s.original_max_position);
      const double fac = s.factor.value_or(1);
      out.scale = s.attention_factor ? *s.attention_factor
                  : fac <= 1         ? 1.0
                                     : std::sqrt(1 + std::log(fac) / std::log(orig));
      bool use_long = s.longrope_mode == LongRopeMode::kLong ||
                      (s.longrope_mode == LongRopeMode::kBySequenceLength && L > orig);
      const auto& ext = use_long ? s.long_factor : s.short_factor;
      for (int64_t k = 0; k < half; ++k)
        out.inv_freq[k] = 1.0 / (ext[k] * std::pow(o.base, double(2 * k) / R));
      break;
    }
    case ScalingType::kExplicit:
      out.inv_freq = s.inv_freq;
      if (s.attention_factor) out.scale = *s.attention_factor;
      break;
  }
  return out;
}

void RotateHead(const RopeOptions& o, const Frequencies& f, int64_t R,
                const std::vector<int64_t>& pos, double* x) {
  const int64_t half = R / 2;
  std::vector<double> in(x, x + R);
  for (int64_t k = 0; k < half; ++k) {
    double angle = double(pos[f.axis[k]]) * f.inv_freq[k];
    if (o.inverse) angle = -angle;
    const double c = f.scale * std::cos(angle), n = f.scale * std::sin(angle);
    const int64_t i = o.style == RopeStyle::kNeox ? k : 2 * k;
    const int64_t j = o.style == RopeStyle::kNeox ? k + half : 2 * k + 1;
    x[i] = in[i] * c - in[j] * n;
    x[j] = in[j] * c + in[i] * n;
  }
}

std::vector<double> SinusoidalRow(SinusoidalLayout layout, double base, int64_t d, int64_t pos) {
  std::vector<double> row(d, 0.0);
  if (layout == SinusoidalLayout::kInterleaved) {
    // DistilBERT's create_sinusoidal_embeddings (seed 003's loop for even
    // d): channel j uses pos / base^(2 (j / 2) / d), sin for even j, cos for
    // odd j, so an odd d ends in a sin channel (SPEC 2.2).
    for (int64_t j = 0; j < d; ++j) {
      const double angle = pos / std::pow(base, 2.0 * static_cast<double>(j / 2) / d);
      row[j] = j % 2 == 0 ? std::sin(angle) : std::cos(angle);
    }
  } else {  // fairseq get_embedding
    const int64_t half_dim = d / 2;
    const double emb = std::log(base) / (half_dim - 1);
    for (int64_t i = 0; i < half_dim; ++i) {
      const double a = pos * std::exp(i * -emb);
      row[i] = std::sin(a);
      row[half_dim + i] = std::cos(a);
    }
  }
  return row;
}

std::vector<double> PaperAlibiSlopes(int64_t n) {
  auto pow2 = [](int64_t m) {
    const double start = std::pow(2.0, -std::pow(2.0, -(std::log2(double(m)) - 3)));
    std::vector<double> s;
    for (int64_t i = 0; i < m; ++i) s.push_back(start * std::pow(start, double(i)));
    return s;
  };
  const double l = std::log2(double(n));
  if (l == std::floor(l)) return pow2(n);
  const int64_t closest = int64_t(1) << int64_t(std::floor(l));
  std::vector<double> s = pow2(closest);
  std::vector<double> extra = PaperAlibiSlopes(2 * closest);
  for (int64_t i = 0; int64_t(s.size()) < n; i += 2) s.push_back(extra[i]);
  return s;
}

double Bias(const BiasPlan& p, int64_t b, int64_t h, int64_t i, int64_t j) {
  const double inf = std::numeric_limits<double>::infinity();
  const int64_t qpos = p.q_offset + i;
  if (p.causal && j > qpos) return -inf;
  if (p.window > 0 && (j > qpos || j <= qpos - p.window)) return -inf;
  if (j < p.k_starts[b] || j >= p.k_lens[b]) return -inf;  // left or right padding
  const double m = p.slopes[h];
  if (p.form == BiasForm::kCausal) return -m * double(qpos - j);
  if (p.form == BiasForm::kSymmetric) return -m * std::abs(double(qpos - j));
  return 0.0;
}

}  // namespace posenc::reference
