// An attention bias added to logits in one stretch of host memory, into
// another, block by block (Backend::ApplyAttentionBiasThrough,
// posenc/backend.h): the CPU backend's way for outputs others may read
// while the call runs.
#ifndef POSENC_KERNELS_CPU_BIAS_THROUGH_H_
#define POSENC_KERNELS_CPU_BIAS_THROUGH_H_

#include <cstdint>

#include "absl/status/status.h"
#include "posenc/attention_bias.h"
#include "posenc/backend.h"

namespace posenc::internal {

// Rows per block for `plan`: about kThroughBlockBytes (block_buffer.h) of
// logits, or 1 where a row is larger than that (it then goes in pieces).
int64_t BiasThroughBlockRows(const BiasPlan& plan);

// Keys per piece of a row larger than a block: about kThroughBlockBytes
// of them; k_len where a row fits a block.
int64_t BiasThroughPieceKeys(const BiasPlan& plan);

// Rows [begin, end) of `t`, block by block: each block of t.logits (a
// whole number of rows, or a piece of one row larger than a block) copied
// into this thread's block buffer, the bias added there (as
// AttentionBiasRowsCpu), t.before_write asked, then copied to t.out.
// Returns before_write's first error, with the blocks before it written.
// REQUIRES: !plan.empty(), plan.add_to_logits.
absl::Status BiasThroughRowsCpu(const BiasPlan& plan, const BiasThrough& t, int64_t begin,
                                int64_t end);

}  // namespace posenc::internal

#endif  // POSENC_KERNELS_CPU_BIAS_THROUGH_H_
