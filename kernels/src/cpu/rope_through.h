// RoPE from one stretch of host memory into another through work memory,
// block by block (Backend::ApplyRopeThrough, posenc/backend.h): the CPU
// backend's way for outputs others may read while the call runs.
#ifndef POSENC_KERNELS_CPU_ROPE_THROUGH_H_
#define POSENC_KERNELS_CPU_ROPE_THROUGH_H_

#include <cstdint>

#include "absl/status/status.h"
#include "posenc/backend.h"
#include "posenc/rope.h"

namespace posenc::internal {

class RowTable;

// Tokens per block for `plan`: about kThroughBlockBytes (block_buffer.h) of query and
// key together, so that a block copied in stays in L2 while it is rotated
// and copied out. At least 1.
int64_t RopeThroughBlockTokens(const RopePlan& plan);

// Whether RopeThroughTokensCpu(plan, ...) uses t.query_work and t.key_work:
// for tokens larger than a block only. Otherwise it goes through the
// thread's own block buffer, in every layout.
bool RopeThroughNeedsWork(const RopePlan& plan);

// Tokens [begin, end) of `t` (RopeThrough), block by block: each block of
// each tensor copied aside (into this thread's block buffer, BHSD's one
// stretch a head gathered head after head; tokens larger than a block:
// into the work memory, unless that is the input), rotated there with
// `rotations` (as RopeTokensCpu), t.before_write asked, then copied to the
// output (unless that is the work memory). Returns before_write's first
// error, with the blocks before it written.
// REQUIRES: plan.num_tokens > 0; rotations as RopeTokensCpu's (null when
// plan.empty()).
absl::Status RopeThroughTokensCpu(const RopePlan& plan, RowTable* rotations, const RopeThrough& t,
                                  int64_t begin, int64_t end);

}  // namespace posenc::internal

#endif  // POSENC_KERNELS_CPU_ROPE_THROUGH_H_
