// What every RPC handler does around its work: refuse calls already dead,
// keep exceptions out of gRPC's and the executor's threads, log by who is at
// fault, and record metrics. Shared by the typed and the generic handlers.
#ifndef POSENC_SERVER_RPC_CALL_SUPPORT_H_
#define POSENC_SERVER_RPC_CALL_SUPPORT_H_

#include <chrono>
#include <exception>
#include <new>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "grpcpp/server_context.h"
#include "rpc/metrics.h"
#include "posenc/backend.h"

namespace posenc::server {

// Work for a call whose deadline already passed, or whose caller left, is
// not started.
absl::Status CheckCallAlive(grpc::CallbackServerContext* ctx);

// The kernels' view of a call: cancelled when the caller leaves or its
// deadline passes.
RunContext ContextOf(grpc::CallbackServerContext* ctx);

// The call's deadline as an absl::Time (InfiniteFuture when it has none).
absl::Time DeadlineOf(grpc::CallbackServerContext* ctx);

// The caller's x-request-id metadata, cleaned for logs (CleanRequestId);
// empty when it sent none.
std::string RequestIdOf(grpc::CallbackServerContext* ctx);

// Client errors are the caller's business (debug); overload is a warning,
// at most one line a second with a count of the refusals in between; server
// faults are errors. `request_id` (cleaned, may be empty) goes with the line.
void LogFailure(const std::string& method, const absl::Status& s,
                const std::string& request_id = "");

// Calls taking longer than this (from arrival to answer) are logged as
// slow, at most one line a second; zero or less: never.
void SetSlowCallThreshold(absl::Duration d);
void LogIfSlow(const std::string& method, const absl::Status& s,
               std::chrono::steady_clock::time_point start, const std::string& request_id);

// One finished call, when metrics are on.
void RecordCall(Metrics* metrics, const std::string& method, const absl::Status& s,
                std::chrono::steady_clock::time_point start, int64_t bytes_in, int64_t bytes_out,
                const std::string& backend);

// Calls fn, turning anything it throws into a status: no exception may
// escape into gRPC's threads or the executor's (std::terminate).
template <typename Fn>
absl::Status NoThrow(Fn&& fn) {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("the server could not allocate memory for this call");
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("unexpected error: ", e.what()));
  } catch (...) {
    return absl::InternalError("unexpected error");
  }
}

}  // namespace posenc::server

#endif  // POSENC_SERVER_RPC_CALL_SUPPORT_H_
