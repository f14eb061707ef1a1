#include "engine/backend_cost.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/str_format.h"
#include "posenc/rope.h"
#include "posenc/status_macros.h"

namespace posenc::server {

std::string CostModel::ToString() const {
  return absl::StrFormat("%.1f us + %.1f us/MiB", fixed_us, us_per_mib);
}

CostModel FitCost(const std::vector<std::pair<int64_t, double>>& points) {
  CostModel m;
  if (points.empty()) return m;
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  const double n = static_cast<double>(points.size());
  for (const auto& [bytes, us] : points) {
    const double x = static_cast<double>(bytes) / (1 << 20);
    sx += x;
    sy += us;
    sxx += x * x;
    sxy += x * us;
  }
  const double den = n * sxx - sx * sx;
  m.us_per_mib = den > 0 ? std::max(0.0, (n * sxy - sx * sy) / den) : 0.0;
  m.fixed_us = std::max(0.0, (sy - m.us_per_mib * sx) / n);
  return m;
}

absl::StatusOr<CostModel> MeasureCost(Backend& backend, const std::vector<int64_t>& sizes,
                                      int reps) {
  constexpr int64_t kHeads = 32, kDim = 128, kTokenBytes = kHeads * kDim * 2;
  std::vector<std::pair<int64_t, double>> points;
  for (const int64_t size : sizes) {
    const int64_t tokens = std::max<int64_t>(1, size / kTokenBytes);
    std::vector<uint16_t> q(static_cast<size_t>(tokens * kHeads * kDim));
    uint32_t x = 12345;
    for (auto& v : q) {  // bfloat16 values in [1, 2): ordinary data, no slow pairs
      x = x * 1664525u + 1013904223u;
      v = static_cast<uint16_t>(0x3f80 | (x >> 25));
    }
    RopeTensors t;
    t.query = {DType::kBFloat16, {1, tokens, kHeads, kDim}, q.data(), q.size() * 2};
    std::vector<int64_t> offsets = {1000};
    t.positions.offsets = {DType::kInt64, {1}, offsets.data(), 8};
    POSENC_ASSIGN_OR_RETURN(const RopePlan plan, PlanRope(RopeOptions{}, t));
    std::vector<double> us;
    for (int r = 0; r <= reps; ++r) {
      const auto start = std::chrono::steady_clock::now();
      POSENC_RETURN_IF_ERROR(backend.ApplyRope(plan, q.data(), nullptr, RunContext{}));
      const double took =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
              .count();
      if (r > 0) us.push_back(took);  // the first warms buffers up
    }
    std::sort(us.begin(), us.end());
    points.emplace_back(static_cast<int64_t>(q.size() * 2), us[us.size() / 2]);
  }
  return FitCost(points);
}

}  // namespace posenc::server
