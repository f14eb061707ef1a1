// The load points of a sweep, as perf_analyzer's --concurrency-range and
// --request-rate-range spell them: "start:end:step" adds step (linear),
// "start:end:xF" multiplies by F (geometric), "start:end" steps by 1 and a
// single value is one point. A comma list ("1,4,16") names points directly.
// The end is included when a step lands on it; points never pass it.
#ifndef POSENC_LOADGEN_LOAD_RANGE_H_
#define POSENC_LOADGEN_LOAD_RANGE_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace posenc::loadgen {

// A sweep long enough for any real use; more points is a typo (a step of
// 0.001), refused rather than run for days.
inline constexpr int kMaxLoadPoints = 1000;

// Callers at most: each is a thread of this process.
inline constexpr int kMaxCallers = 4096;

// Points of `text` for the flag `flag` (named in errors). With `integers`
// (callers) every value must be a whole number in [1, kMaxCallers];
// otherwise (requests/s) any value in (0, 1e9]. Errors are INVALID_ARGUMENT quoting the text.
[[nodiscard]] absl::StatusOr<std::vector<double>> ExpandLoadRange(absl::string_view flag,
                                                                  absl::string_view text,
                                                                  bool integers);

}  // namespace posenc::loadgen

#endif  // POSENC_LOADGEN_LOAD_RANGE_H_
