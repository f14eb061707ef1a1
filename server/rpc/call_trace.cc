#include "rpc/call_trace.h"

#include <atomic>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "rpc/logging.h"

namespace posenc::server {
namespace {

// Read by every call: atomics, so that counting takes no lock. Writers
// (SetTraceConfig) hold `mu`, so a reader of the whole setting
// (CurrentTraceConfig) sees one writer's.
struct Tracing {
  absl::Mutex mu;
  std::atomic<bool> on{false};
  std::atomic<int64_t> rate{1000};
  std::atomic<int64_t> count{-1};
  std::atomic<uint64_t> calls{0};  // counted since the last change
};

Tracing& Global() {
  static Tracing* t = new Tracing;
  return *t;
}

}  // namespace

TraceConfig CurrentTraceConfig() {
  Tracing& t = Global();
  absl::MutexLock lock(&t.mu);
  return {t.on.load(), t.rate.load(), t.count.load()};
}

void SetTraceConfig(const TraceConfig& config) {
  Tracing& t = Global();
  absl::MutexLock lock(&t.mu);
  t.on.store(false);  // no call is sampled against half a setting
  t.rate.store(config.rate);
  t.count.store(config.count);
  t.calls.store(0);
  t.on.store(config.on);
}

bool SampleCall() {
  Tracing& t = Global();
  if (!t.on.load(std::memory_order_relaxed)) return false;
  const uint64_t rate = static_cast<uint64_t>(t.rate.load(std::memory_order_relaxed));
  if ((t.calls.fetch_add(1, std::memory_order_relaxed) + 1) % rate != 0) return false;
  int64_t left = t.count.load(std::memory_order_relaxed);
  while (left != 0) {
    if (left < 0) return true;  // no limit
    if (t.count.compare_exchange_weak(left, left - 1, std::memory_order_relaxed)) return true;
  }
  return false;
}

void LogTrace(const std::string& method, const absl::Status& s,
              std::chrono::steady_clock::time_point start,
              std::chrono::steady_clock::time_point end, const CallIds& ids,
              const CallStages& stages) {
  const StageTimes times = StageBreakdown(start, end, stages, /*decimals=*/6);
  LogWithFields(
      spdlog::level::info,
      absl::StrCat(method, " traced: ",
                   absl::StrFormat("%.6f", std::chrono::duration<double>(end - start).count()),
                   " s"),
      {{"method", method},
       {"code", absl::StatusCodeToString(s.code())},
       {"request_id", ids.request_id},
       {"trace_id", ids.trace_id},
       {"memory_s", times.memory},
       {"read_s", times.read},
       {"queue_s", times.queue},
       {"work_s", times.work}});
}

}  // namespace posenc::server
