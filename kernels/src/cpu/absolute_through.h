// An absolute encoding from one stretch of host memory into another, block
// by block (Backend::ApplyAbsoluteThrough, posenc/backend.h): the CPU
// backend's way for outputs others may read while the call runs.
#ifndef POSENC_KERNELS_CPU_ABSOLUTE_THROUGH_H_
#define POSENC_KERNELS_CPU_ABSOLUTE_THROUGH_H_

#include <cstdint>

#include "absl/status/status.h"
#include "posenc/absolute.h"
#include "posenc/backend.h"

namespace posenc::internal {

class RowTable;

// Tokens per block for `plan`: about kThroughBlockBytes (block_buffer.h)
// of x. At least 1 (a token is at most kMaxDim elements, 256 KiB).
int64_t AbsoluteThroughBlockTokens(const AbsolutePlan& plan);

// Tokens [begin, end) of `t`, block by block: each block of t.x copied into
// this thread's block buffer, encoded there with `anchors` (as
// AbsoluteTokensCpu), t.before_write asked, then copied to t.y. Returns
// before_write's first error, with the blocks before it written.
// REQUIRES: !plan.empty(), plan.has_input; anchors as AbsoluteTokensCpu's.
absl::Status AbsoluteThroughTokensCpu(const AbsolutePlan& plan, RowTable* anchors,
                                      const AbsoluteThrough& t, int64_t begin, int64_t end);

}  // namespace posenc::internal

#endif  // POSENC_KERNELS_CPU_ABSOLUTE_THROUGH_H_
