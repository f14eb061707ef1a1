// Per-model inference statistics for the KServe v2 ModelStatistics call
// (what perf_analyzer reads to split a request's time): counts and summed
// durations of successful and failed requests, the time waiting for
// admission and the time computing.
#ifndef POSENC_SERVER_KSERVE_STATISTICS_H_
#define POSENC_SERVER_KSERVE_STATISTICS_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "kserve/grpc_service.pb.h"

namespace posenc::server::kserve {

class ModelStatisticsTable {
 public:
  // One finished request of `model`: whether it succeeded, its whole time
  // in the server, the part spent waiting (admission, executor queue) and
  // the part computing.
  void Record(const std::string& model, bool ok, int64_t total_ns, int64_t queue_ns,
              int64_t compute_ns);
  // The statistics of `model`, or of every model in `all` when it is "".
  void Fill(const std::string& model, const std::vector<std::string>& all,
            inference::ModelStatisticsResponse* resp) const;

 private:
  struct Counts {
    uint64_t success = 0, success_ns = 0, fail = 0, fail_ns = 0;
    uint64_t queue_ns = 0, compute_ns = 0;
    uint64_t last_inference_ms = 0;
  };
  mutable std::mutex mu_;
  std::map<std::string, Counts> models_;
};

}  // namespace posenc::server::kserve

#endif  // POSENC_SERVER_KSERVE_STATISTICS_H_
