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
// logits. At least 1.
int64_t BiasThroughBlockRows(const BiasPlan& plan);

// Whether BiasThroughRowsCpu(plan, ...) uses t.work: for rows larger than
// a block (k_len up to 2^31 keys), which the thread's own buffer would
// otherwise have to hold for the thread's life.
bool BiasThroughNeedsWork(const BiasPlan& plan);

// Rows [begin, end) of `t`, block by block: each block of t.logits copied
// into this thread's block buffer (or t.work at the block's own offset,
// where BiasThroughNeedsWork), the bias added there (as
// AttentionBiasRowsCpu), t.before_write asked, then copied to t.out.
// Returns before_write's first error, with the blocks before it written.
// REQUIRES: !plan.empty(), plan.add_to_logits.
absl::Status BiasThroughRowsCpu(const BiasPlan& plan, const BiasThrough& t, int64_t begin,
                                int64_t end);

}  // namespace posenc::internal

#endif  // POSENC_KERNELS_CPU_BIAS_THROUGH_H_
