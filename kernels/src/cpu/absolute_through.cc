#include "cpu/absolute_through.h"

#include <algorithm>
#include <cstdint>

#include "cpu/block_buffer.h"
#include "cpu_kernels.h"
#include "posenc/dtype.h"
#include "posenc/host_copy.h"
#include "posenc/status_macros.h"

namespace posenc::internal {

int64_t AbsoluteThroughBlockTokens(const AbsolutePlan& plan) {
  const int64_t row = plan.dim * static_cast<int64_t>(SizeOf(plan.dtype));
  return std::max<int64_t>(1, kThroughBlockBytes / std::max<int64_t>(1, row));
}

absl::Status AbsoluteThroughTokensCpu(const AbsolutePlan& plan, RowTable* anchors,
                                      const AbsoluteThrough& t, int64_t begin, int64_t end) {
  const int64_t block = AbsoluteThroughBlockTokens(plan);
  const int64_t row = plan.dim * static_cast<int64_t>(SizeOf(plan.dtype));
  // Every layout of x is token-major (a token's row is one stretch), so a
  // block is one stretch, encoded in this thread's own buffer while in
  // cache: memory sees x read and y written, as in one copy. At most
  // kThroughBlockBytes, or one token (256 KiB), a thread.
  char* buffer = ThisThreadsBlockBuffer().Reserve(block * row);
  const auto* x = static_cast<const char*>(t.x);
  auto* y = static_cast<char*>(t.y);
  for (int64_t b = begin; b < end; b += block) {
    const int64_t e = std::min(end, b + block);
    const auto bytes = static_cast<size_t>((e - b) * row);
    CopyHostBytes(buffer, x + b * row, bytes);
    AbsoluteTokensCpu(plan, anchors, buffer, b, e, b);
    if (t.before_write) POSENC_RETURN_IF_ERROR(t.before_write());
    CopyHostBytes(y + b * row, buffer, bytes);
  }
  return absl::OkStatus();
}

}  // namespace posenc::internal
