// When a load point's measurement is trusted, after perf_analyzer: the
// load runs in measurement windows, and the point is stable once the last
// three windows' throughput and median latency each lie within a
// percentage of their own mean. A window with no completed call is never
// part of a stable run.
#ifndef POSENC_LOADGEN_STABILITY_H_
#define POSENC_LOADGEN_STABILITY_H_

#include <vector>

namespace posenc::loadgen {

// One measurement window: calls that completed OK in it, per second, and
// their median latency.
struct Window {
  double requests_per_s = 0;
  double p50_us = 0;
};

inline constexpr int kStableWindows = 3;

// True when the last kStableWindows of `windows` agree within `percentage`
// (10: each within 10% of their mean), in throughput and in p50.
bool IsStable(const std::vector<Window>& windows, double percentage);

}  // namespace posenc::loadgen

#endif  // POSENC_LOADGEN_STABILITY_H_
