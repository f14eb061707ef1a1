#include "call_support.h"

#include <atomic>

#include "absl/time/clock.h"
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
  void Note(const std::string& method, const absl::Status& s) {
    const int64_t now = absl::GetCurrentTimeNanos();
    // On success the exchange leaves `last` holding the previous line's time.
    int64_t last = last_ns_.load(std::memory_order_relaxed);
    if (now - last < kIntervalNs || !last_ns_.compare_exchange_strong(last, now)) {
      suppressed_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    const int64_t more = suppressed_.exchange(0);
    if (more > 0) {
      spdlog::warn("{} refused: {} (and {} more refusals in the last {:.1f}s)", method,
                   std::string(s.message()), more, (now - last) / 1e9);
    } else {
      spdlog::warn("{} refused: {}", method, std::string(s.message()));
    }
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

void LogFailure(const std::string& method, const absl::Status& s) {
  if (s.ok()) return;
  switch (s.code()) {
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kDataLoss:
      spdlog::error("{} failed: {}", method, s.ToString());
      break;
    case absl::StatusCode::kResourceExhausted:
      Refusals().Note(method, s);
      break;
    default:
      spdlog::debug("{} rejected: {}", method, s.ToString());
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
