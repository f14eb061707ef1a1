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
};

// Called by planning exactly once, after the request's shapes and options are
// validated and before the plan allocates anything in proportion to them. A
// non-OK status stops planning and is returned as is. Empty: no budget.
using ReserveFn = std::function<absl::Status(const PlanCost&)>;

}  // namespace posenc

#endif  // POSENC_PLAN_COST_H_
