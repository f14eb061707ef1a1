// The memory a plan needs, announced before any of it is allocated, so that a
// server can refuse (RESOURCE_EXHAUSTED) work that would exceed its budget
// instead of running out of memory part way.
#ifndef POSENC_PLAN_COST_H_
#define POSENC_PLAN_COST_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"

namespace posenc {

struct PlanCost {
  // What the plan itself will hold: resolved positions, frequency sets,
  // slopes. An upper bound, computed from validated shapes.
  int64_t plan_bytes = 0;
  // A new buffer the caller must allocate for the result (a bias without
  // logits, an encoding table); 0 when the work is in place.
  int64_t output_bytes = 0;
  // What a GPU backend stages beside the tensors, whichever way it moves
  // them (pinned host memory, and as much on the device): copies of the
  // plan's arrays (positions, frequencies, slopes), each padded to 256
  // bytes, and RoPE's frequency set per token where there are several. An
  // upper bound; the CPU needs none. It can outgrow the tensors themselves
  // (eight position axes of a head_dim 2 query: 64 bytes a token against 4).
  int64_t device_side_bytes = 0;
};

// The padding of each side array a GPU stages (its allocation alignment).
inline constexpr int64_t kDeviceSidePadding = 256;

// Called by planning exactly once, after the request's shapes and options are
// validated and before the plan allocates anything in proportion to them. A
// non-OK status stops planning and is returned as is. Empty: no budget.
using ReserveFn = std::function<absl::Status(const PlanCost&)>;

}  // namespace posenc

#endif  // POSENC_PLAN_COST_H_
