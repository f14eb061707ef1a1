// What a handler reads off gRPC's view of a call: whether it is still
// wanted, its deadline, the caller's x-request-id and trace id.
#ifndef POSENC_SERVER_RPC_CALL_CONTEXT_H_
#define POSENC_SERVER_RPC_CALL_CONTEXT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/server_context.h"
#include "posenc/backend.h"

namespace posenc::server {

// Work for a call whose deadline already passed, or whose caller left, is
// not started.
absl::Status CheckCallAlive(grpc::CallbackServerContext* ctx);

// Why gRPC cancelled a call (its OnCancel): the deadline passed
// (DEADLINE_EXCEEDED; a cancellation within 50 ms of it counts, as the
// caller's own deadline timer sends it) or the caller left (CANCELLED), so
// that logs and metrics tell a caller out of time from one that went away.
absl::Status WhyCancelled(grpc::CallbackServerContext* ctx);

// The kernels' view of a call: cancelled when the caller leaves or its
// deadline passes.
RunContext ContextOf(grpc::CallbackServerContext* ctx);

// The call's deadline as an absl::Time (InfiniteFuture when it has none).
absl::Time DeadlineOf(grpc::CallbackServerContext* ctx);

// The caller's x-request-id metadata, cleaned for logs (CleanRequestId);
// empty when it sent none.
std::string RequestIdOf(grpc::CallbackServerContext* ctx);
// The caller's posenc-call-id metadata, as sent ("" when absent or given
// more than once).
std::string CallIdOf(grpc::CallbackServerContext* ctx);

// The trace id of the caller's traceparent metadata (TraceIdOf,
// rpc/trace_context.h); empty when it sent none, one it may not use, or
// more than one (the specification allows one).
std::string CallerTraceId(grpc::CallbackServerContext* ctx);

}  // namespace posenc::server

#endif  // POSENC_SERVER_RPC_CALL_CONTEXT_H_
