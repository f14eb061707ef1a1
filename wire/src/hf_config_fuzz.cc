// libFuzzer harness for ResolveHfRope: any bytes give options or an
// INVALID_ARGUMENT, never a crash, a hang or an unbounded allocation. What
// it accepts must be safe to hand on: a rotary_dim the head holds, and, when
// the kernel library accepts the options too, the same attention scale the
// kernel derives (the two formulas must never drift apart).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "posenc/limits.h"
#include "posenc/rope.h"
#include "posenc/wire/hf_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<posenc::wire::HfRope> hf = posenc::wire::ResolveHfRope(bytes);
  if (!hf.ok()) {
    if (hf.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  const posenc::RopeOptions& o = hf->options;
  if (hf->head_dim < 2 || hf->head_dim > posenc::kMaxDim) std::abort();
  if (o.rotary_dim < 2 || o.rotary_dim % 2 != 0 || o.rotary_dim > hf->head_dim) std::abort();
  if (!(o.base > 1.0 && o.base <= posenc::kMaxBase)) std::abort();
  if (!std::isfinite(hf->attention_scale)) std::abort();

  posenc::RopeOptions merged;
  if (!posenc::wire::MergeHfRope(*hf, {}, hf->head_dim, &merged).ok()) std::abort();
  // Frequencies for a short and a long sequence (LongRoPE switches sets).
  for (int64_t seq_len : {int64_t{1}, int64_t{1} << 20}) {
    auto fs = posenc::ResolveFrequencies(merged, merged.rotary_dim, seq_len);
    if (!fs.ok()) continue;
    const double want = hf->attention_scale, got = fs->attention_scale;
    if (!(std::abs(got - want) <= 1e-12 * std::max(1.0, std::abs(want)))) std::abort();
  }
  return 0;
}
