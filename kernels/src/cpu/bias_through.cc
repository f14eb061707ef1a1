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

bool BiasThroughNeedsWork(const BiasPlan& plan) { return RowBytes(plan) > kThroughBlockBytes; }

absl::Status BiasThroughRowsCpu(const BiasPlan& plan, const BiasThrough& t, int64_t begin,
                                int64_t end) {
  const int64_t row = RowBytes(plan);
  const int64_t block = BiasThroughBlockRows(plan);
  const bool in_work = BiasThroughNeedsWork(plan);
  // Rows are one stretch, a block of them too: copied aside, the bias added
  // while they are in cache, copied out, so memory sees the logits read
  // and out written, as in one copy. Aside is this thread's own buffer (at
  // most kThroughBlockBytes, kept across calls), or the work memory for a
  // row larger than that (then read from memory again: three passes, as a
  // caller's scratch buffer would make).
  char* const buffer = in_work ? nullptr : ThisThreadsBlockBuffer().Reserve(block * row);
  const auto* logits = static_cast<const char*>(t.logits);
  auto* work = static_cast<char*>(t.work);
  auto* out = static_cast<char*>(t.out);
  for (int64_t b = begin; b < end; b += block) {
    const int64_t e = std::min(end, b + block);
    const auto bytes = static_cast<size_t>((e - b) * row);
    char* const aside = in_work ? work + b * row : buffer;
    CopyHostBytes(aside, logits + b * row, bytes);
    AttentionBiasRowsCpu(plan, aside, b, e, b);
    if (t.before_write) POSENC_RETURN_IF_ERROR(t.before_write());
    CopyHostBytes(out + b * row, aside, bytes);
  }
  return absl::OkStatus();
}

}  // namespace posenc::internal
