#include "rpc/call_context.h"

#include <chrono>
#include <iterator>

#include "rpc/logging.h"
#include "rpc/trace_context.h"

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

std::string CallerTraceId(grpc::CallbackServerContext* ctx) {
  const auto& md = ctx->client_metadata();
  const auto [first, last] = md.equal_range("traceparent");
  if (first == last || std::next(first) != last) return "";
  return TraceIdOf(absl::string_view(first->second.data(), first->second.size()));
}

std::string RequestIdOf(grpc::CallbackServerContext* ctx) {
  const auto& md = ctx->client_metadata();
  const auto it = md.find("x-request-id");
  if (it == md.end()) return "";
  return CleanRequestId(absl::string_view(it->second.data(), it->second.size()));
}

}  // namespace posenc::server
