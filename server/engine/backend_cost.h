// What a backend's served path costs, measured: time per call as a fixed
// part plus a part per byte, fitted to timed RoPE calls of a few sizes on
// the backend itself (for the GPU that includes the staging and transfers
// every served call pays). AUTO routes each request to the backend whose
// model predicts the shorter time, so a GPU is used where it pays and not
// by a fixed threshold.
#ifndef POSENC_SERVER_ENGINE_BACKEND_COST_H_
#define POSENC_SERVER_ENGINE_BACKEND_COST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "posenc/backend.h"

namespace posenc::server {

struct CostModel {
  double fixed_us = 0;    // per call
  double us_per_mib = 0;  // per MiB of tensor bytes
  double PredictUs(int64_t bytes) const {
    return fixed_us + us_per_mib * static_cast<double>(bytes) / (1 << 20);
  }
  std::string ToString() const;
};

// Times `backend` on bfloat16 RoPE calls of `sizes` bytes (query only,
// heads of 128; median of `reps` each after one warm-up) and fits the model
// by least squares. Fails with the backend's error if a call fails.
absl::StatusOr<CostModel> MeasureCost(Backend& backend,
                                      const std::vector<int64_t>& sizes = {int64_t{256} << 10,
                                                                           int64_t{2} << 20,
                                                                           int64_t{16} << 20},
                                      int reps = 5);

// Least squares of (bytes, microseconds) points; the per-byte part is never
// negative (a noisy fit that says bigger is cheaper is read as flat).
CostModel FitCost(const std::vector<std::pair<int64_t, double>>& points);

}  // namespace posenc::server

#endif  // POSENC_SERVER_ENGINE_BACKEND_COST_H_
