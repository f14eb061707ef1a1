#include "call_support.h"

#include <atomic>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "logging.h"
#include "spdlog/spdlog.h"

namespace posenc::server {

absl::Status CheckCallAlive(grpc::CallbackServerContext* ctx) {
  if (ctx->IsCancelled()) return absl::CancelledError("the caller cancelled the call");
  if (ctx->deadline() < std::chrono::system_clock::now()) {
    return absl::DeadlineExceededError("the call's deadline passed before work started");
  }
  return absl::OkStatus();
}

RunContext ContextOf(grpc::CallbackServerContext* ctx) {
  RunContext rc;
  rc.cancelled = [ctx] { return ctx->IsCancelled(); };
  return rc;
}

std::string RequestIdOf(grpc::CallbackServerContext* ctx) {
  const auto& md = ctx->client_metadata();
  const auto it = md.find("x-request-id");
  if (it == md.end()) return "";
  return CleanRequestId(absl::string_view(it->second.data(), it->second.size()));
}

absl::Time DeadlineOf(grpc::CallbackServerContext* ctx) {
  const auto d = ctx->deadline();
  if (d == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(d);
}

namespace {

// Refusals under overload come by the thousand a second; the log gets the
// first, then one line a second counting the rest.
class RefusalLog {
 public:
  void Note(const std::string& method, const absl::Status& s, const std::string& request_id) {
    const int64_t now = absl::GetCurrentTimeNanos();
    // On success the exchange leaves `last` holding the previous line's time.
    int64_t last = last_ns_.load(std::memory_order_relaxed);
    if (now - last < kIntervalNs || !last_ns_.compare_exchange_strong(last, now)) {
      suppressed_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    // The line names this call (its id); the count is of other calls.
    const int64_t more = suppressed_.exchange(0);
    std::string line = absl::StrCat(method, " refused: ", s.message());
    if (more > 0) {
      absl::StrAppend(&line, " (and ", more, " more refusals in the last ",
                      absl::StrFormat("%.1f", (now - last) / 1e9), "s)");
    }
    const std::string refused_more = more > 0 ? absl::StrCat(more) : "";
    LogWithFields(spdlog::level::warn, line,
                  {{"method", method},
                   {"code", absl::StatusCodeToString(s.code())},
                   {"request_id", request_id},
                   {"refusals_suppressed", refused_more}});
  }

 private:
  static constexpr int64_t kIntervalNs = 1000000000;
  std::atomic<int64_t> last_ns_{0};
  std::atomic<int64_t> suppressed_{0};
};

RefusalLog& Refusals() {
  static RefusalLog* log = new RefusalLog;
  return *log;
}

}  // namespace

void LogFailure(const std::string& method, const absl::Status& s, const std::string& request_id) {
  if (s.ok()) return;
  const std::string code = absl::StatusCodeToString(s.code());
  switch (s.code()) {
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kDataLoss:
      LogWithFields(spdlog::level::err, absl::StrCat(method, " failed: ", s.ToString()),
                    {{"method", method}, {"code", code}, {"request_id", request_id}});
      break;
    case absl::StatusCode::kResourceExhausted:
      Refusals().Note(method, s, request_id);
      break;
    default:
      LogWithFields(spdlog::level::debug, absl::StrCat(method, " rejected: ", s.ToString()),
                    {{"method", method}, {"code", code}, {"request_id", request_id}});
  }
}

void RecordCall(Metrics* metrics, const std::string& method, const absl::Status& s,
                std::chrono::steady_clock::time_point start, int64_t bytes_in, int64_t bytes_out,
                const std::string& backend) {
  if (metrics == nullptr) return;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  metrics->RecordCall(method, absl::StatusCodeToString(s.code()), seconds,
                      static_cast<double>(bytes_in), s.ok() ? static_cast<double>(bytes_out) : 0.0,
                      s.ok() ? backend : "");
}

}  // namespace posenc::server
