#include "rpc/call_log.h"

#include <atomic>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "rpc/logging.h"
#include "spdlog/spdlog.h"

namespace posenc::server {

namespace {

// Refusals (and slow calls) under overload come by the thousand a second;
// the log gets the first, then one line a second counting the rest.
class OncePerSecond {
 public:
  // Whether to write a line now; if so, `more` lines were skipped over the
  // last `seconds`.
  bool Admit(int64_t* more, double* seconds) {
    const int64_t now = absl::GetCurrentTimeNanos();
    // On success the exchange leaves `last` holding the previous line's time.
    int64_t last = last_ns_.load(std::memory_order_relaxed);
    if (now - last < kIntervalNs || !last_ns_.compare_exchange_strong(last, now)) {
      suppressed_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    *more = suppressed_.exchange(0);
    *seconds = (now - last) / 1e9;
    return true;
  }

 private:
  static constexpr int64_t kIntervalNs = 1000000000;
  std::atomic<int64_t> last_ns_{0};
  std::atomic<int64_t> suppressed_{0};
};

// One line about one call (named by its id), with a count of the calls
// whose lines were skipped.
void LogSummarised(OncePerSecond& limit, const std::string& line, const char* what,
                   const std::string& method, absl::StatusCode code, const CallIds& ids,
                   const StageTimes& stages = {}) {
  int64_t more = 0;
  double seconds = 0;
  if (!limit.Admit(&more, &seconds)) return;
  std::string text = line;
  if (more > 0) {
    absl::StrAppend(&text, " (and ", more, " more ", what, " in the last ",
                    absl::StrFormat("%.1f", seconds), "s)");
  }
  const std::string skipped = more > 0 ? absl::StrCat(more) : "";
  LogWithFields(spdlog::level::warn, text,
                {{"method", method},
                 {"code", absl::StatusCodeToString(code)},
                 {"request_id", ids.request_id},
                 {"trace_id", ids.trace_id},
                 {"skipped", skipped},
                 {"memory_s", stages.memory},
                 {"read_s", stages.read},
                 {"queue_s", stages.queue},
                 {"work_s", stages.work}});
}

OncePerSecond& Refusals() {
  static OncePerSecond* limit = new OncePerSecond;
  return *limit;
}
OncePerSecond& SlowCalls() {
  static OncePerSecond* limit = new OncePerSecond;
  return *limit;
}

std::atomic<int64_t> slow_call_ns{0};

}  // namespace

void LogFailure(const std::string& method, const absl::Status& s, const CallIds& ids) {
  if (s.ok()) return;
  const std::string code = absl::StatusCodeToString(s.code());
  switch (s.code()) {
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kDataLoss:
      LogWithFields(spdlog::level::err, absl::StrCat(method, " failed: ", s.ToString()),
                    {{"method", method},
                     {"code", code},
                     {"request_id", ids.request_id},
                     {"trace_id", ids.trace_id}});
      break;
    case absl::StatusCode::kResourceExhausted:
      LogSummarised(Refusals(), absl::StrCat(method, " refused: ", s.message()), "refusals", method,
                    s.code(), ids);
      break;
    default:
      LogWithFields(spdlog::level::debug, absl::StrCat(method, " rejected: ", s.ToString()),
                    {{"method", method},
                     {"code", code},
                     {"request_id", ids.request_id},
                     {"trace_id", ids.trace_id}});
  }
}

void SetSlowCallThreshold(absl::Duration d) {
  slow_call_ns.store(d <= absl::ZeroDuration() ? 0 : absl::ToInt64Nanoseconds(d));
}

StageTimes StageBreakdown(std::chrono::steady_clock::time_point start,
                          std::chrono::steady_clock::time_point end, const CallStages& stages,
                          int decimals) {
  StageTimes out;
  // Each stage ends where the next begins; the time after the last one a
  // call reached is the next stage's, under way when it ended.
  struct Stage {
    CallStages::Time ends;
    std::string* seconds;
  };
  const Stage order[] = {{stages.admitted, &out.memory},
                         {stages.read, &out.read},
                         {stages.started, &out.queue},
                         {end, &out.work}};
  const CallStages::Time unset{};
  CallStages::Time from = start;
  int last = -1;  // the last stage reached
  for (int i = 0; i < 3; ++i) {
    if (order[i].ends != unset) last = i;
  }
  if (last < 0) return out;
  for (int i = 0; i <= last + 1; ++i) {
    const Stage& stage = order[i];
    if (i <= last && stage.ends == unset) continue;
    const CallStages::Time to = i == last + 1 ? end : stage.ends;
    *stage.seconds =
        absl::StrFormat("%.*f", decimals, std::chrono::duration<double>(to - from).count());
    from = to;
  }
  return out;
}

void LogIfSlow(const std::string& method, const absl::Status& s,
               std::chrono::steady_clock::time_point start,
               std::chrono::steady_clock::time_point end, const CallIds& ids,
               const CallStages& stages) {
  const int64_t limit = slow_call_ns.load(std::memory_order_relaxed);
  if (limit == 0) return;
  const auto took = end - start;
  if (std::chrono::duration_cast<std::chrono::nanoseconds>(took).count() < limit) return;
  const StageTimes times = StageBreakdown(start, end, stages);
  LogSummarised(SlowCalls(),
                absl::StrCat(method, " was slow: ",
                             absl::StrFormat("%.3f", std::chrono::duration<double>(took).count()),
                             " s (over --slow_call_ms=", limit / 1000000, ")"),
                "slow calls", method, s.code(), ids, times);
}

}  // namespace posenc::server
