#include "call_support.h"

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

void LogFailure(const std::string& method, const absl::Status& s) {
  if (s.ok()) return;
  switch (s.code()) {
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kDataLoss:
      spdlog::error("{} failed: {}", method, s.ToString());
      break;
    case absl::StatusCode::kResourceExhausted:
      spdlog::warn("{} refused: {}", method, std::string(s.message()));
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
