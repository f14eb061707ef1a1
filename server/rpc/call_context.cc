#include "rpc/call_context.h"

#include <chrono>
#include <iterator>

#include "rpc/logging.h"
#include "rpc/trace_context.h"

namespace posenc::server {

namespace {

// A caller's own deadline timer cancels its call (RST_STREAM) a little
// before the server's copy of that deadline passes: the server's is its
// receipt of the headers (late on a loaded machine) plus the timeout,
// rounded up. A cancellation this close to the deadline is taken for it.
constexpr std::chrono::milliseconds kDeadlineGrace{50};

bool DeadlineReached(grpc::CallbackServerContext* ctx) {
  return ctx->deadline() <= std::chrono::system_clock::now() + kDeadlineGrace;
}

}  // namespace

absl::Status CheckCallAlive(grpc::CallbackServerContext* ctx) {
  if (ctx->deadline() <= std::chrono::system_clock::now() ||
      (ctx->IsCancelled() && DeadlineReached(ctx))) {
    return absl::DeadlineExceededError("the call's deadline passed before work started");
  }
  if (ctx->IsCancelled()) return absl::CancelledError("the caller cancelled the call");
  return absl::OkStatus();
}

absl::Status WhyCancelled(grpc::CallbackServerContext* ctx) {
  if (DeadlineReached(ctx)) return absl::DeadlineExceededError("the call's deadline passed");
  return absl::CancelledError("the caller cancelled the call");
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

std::string CallIdOf(grpc::CallbackServerContext* ctx) {
  const auto& md = ctx->client_metadata();
  const auto [first, last] = md.equal_range("posenc-call-id");
  if (first == last || std::next(first) != last) return "";
  return std::string(first->second.data(), first->second.size());
}

std::string RequestIdOf(grpc::CallbackServerContext* ctx) {
  const auto& md = ctx->client_metadata();
  const auto it = md.find("x-request-id");
  if (it == md.end()) return "";
  return CleanRequestId(absl::string_view(it->second.data(), it->second.size()));
}

}  // namespace posenc::server
