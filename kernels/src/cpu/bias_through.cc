#include "cpu/bias_through.h"

#include <algorithm>
#include <cstdint>

#include "cpu/block_buffer.h"
#include "cpu_kernels.h"
#include "posenc/dtype.h"
#include "posenc/host_copy.h"
#include "posenc/status_macros.h"

namespace posenc::internal {
namespace {

int64_t RowBytes(const BiasPlan& plan) {
  return plan.k_len * static_cast<int64_t>(SizeOf(plan.dtype));
}

}  // namespace

int64_t BiasThroughBlockRows(const BiasPlan& plan) {
  return std::max<int64_t>(1, kThroughBlockBytes / std::max<int64_t>(1, RowBytes(plan)));
}

int64_t BiasThroughPieceKeys(const BiasPlan& plan) {
  if (RowBytes(plan) <= kThroughBlockBytes) return plan.k_len;
  return kThroughBlockBytes / static_cast<int64_t>(SizeOf(plan.dtype));
}

absl::Status BiasThroughRowsCpu(const BiasPlan& plan, const BiasThrough& t, int64_t begin,
                                int64_t end) {
  const auto elem = static_cast<int64_t>(SizeOf(plan.dtype));
  const int64_t row = RowBytes(plan);
  const auto* logits = static_cast<const char*>(t.logits);
  auto* out = static_cast<char*>(t.out);
  // A block is one stretch: copied aside into this thread's own buffer
  // (at most kThroughBlockBytes, kept across calls), the bias added while
  // it is in cache, copied out, so memory sees the logits read and out
  // written, as in one copy.
  const auto through = [&](int64_t at, int64_t bytes, char* aside,
                           const auto& add_bias) -> absl::Status {
    CopyHostBytes(aside, logits + at, static_cast<size_t>(bytes));
    add_bias();
    if (t.before_write) POSENC_RETURN_IF_ERROR(t.before_write());
    CopyHostBytes(out + at, aside, static_cast<size_t>(bytes));
    return absl::OkStatus();
  };
  if (row <= kThroughBlockBytes) {
    const int64_t block = BiasThroughBlockRows(plan);
    char* const buffer = ThisThreadsBlockBuffer().Reserve(block * row);
    for (int64_t b = begin; b < end; b += block) {
      const int64_t e = std::min(end, b + block);
      POSENC_RETURN_IF_ERROR(through(b * row, (e - b) * row, buffer,
                                     [&] { AttentionBiasRowsCpu(plan, buffer, b, e, b); }));
    }
    return absl::OkStatus();
  }
  // A row larger than a block (k_len is at most 2^31) goes in pieces of
  // keys, each the row's values bit for bit (AttentionBiasKeysCpu), so the
  // buffer stays a block's size whatever the row's.
  const int64_t piece = BiasThroughPieceKeys(plan);
  char* const buffer = ThisThreadsBlockBuffer().Reserve(piece * elem);
  for (int64_t r = begin; r < end; ++r) {
    for (int64_t k = 0; k < plan.k_len; k += piece) {
      const int64_t k_end = std::min(plan.k_len, k + piece);
      POSENC_RETURN_IF_ERROR(through(r * row + k * elem, (k_end - k) * elem, buffer,
                                     [&] { AttentionBiasKeysCpu(plan, buffer, r, k, k_end); }));
    }
  }
  return absl::OkStatus();
}

}  // namespace posenc::internal
