// The tensor RPCs (ApplyRope, StreamRope, AddAbsoluteEncoding,
// GetEncodingTable, AttentionBias) served through gRPC's generic callback
// API, so that a call is admitted before its request is read.
//
// Why not the typed callback service: for unary methods gRPC reads and
// parses the whole request before the handler runs, so a burst of large
// requests sits in memory before admission can refuse any of it (16 callers
// of 48 MiB drove the server to 1.6 GiB against a 128 MiB budget). Here each
// call first takes a slot and reserves the largest message it may read
// (--max_message_bytes); only then does it read, and its reservation becomes
// exactly what it holds: the request, its parsed copy or the serialised
// answer (2 x the message), plus what the engine announces (plans, new
// outputs). Calls that cannot reserve wait with their bodies still behind
// HTTP/2 flow control. Wire behaviour is that of the proto's methods.
#ifndef POSENC_SERVER_V1_TENSOR_SERVICE_H_
#define POSENC_SERVER_V1_TENSOR_SERVICE_H_

#include <atomic>

#include "engine/engine.h"
#include "grpcpp/generic/async_generic_service.h"
#include "rpc/metrics.h"
#include "engine/request_executor.h"

namespace posenc::server {

struct TensorCallOptions {
  Engine* engine = nullptr;
  Metrics* metrics = nullptr;  // may be null
  RequestExecutor* executor = nullptr;
  // The transport's receive limit: what a call reserves before it reads.
  int64_t max_message_bytes = 0;
  // StreamRope messages in flight at once on one stream (read ahead while
  // earlier ones compute or are written).
  int stream_window = 4;
  std::atomic<int>* busy = nullptr;               // set by TensorCallService
  std::atomic<int>* stream_depth_peak = nullptr;  // set by TensorCallService
};

class TensorCallService final : public grpc::CallbackGenericService {
 public:
  explicit TensorCallService(const TensorCallOptions& options);
  // Unknown methods (of any service) are UNIMPLEMENTED, as gRPC answers them.
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override;
  // Calls whose request has been read and whose answer is not yet sent.
  int busy() const { return busy_.load(); }
  // The most StreamRope messages one stream has had in flight at once.
  int stream_depth_peak() const { return stream_depth_peak_.load(); }

 private:
  std::atomic<int> busy_{0};
  std::atomic<int> stream_depth_peak_{0};
  TensorCallOptions options_;
};

// Runs one unary tensor method ("ApplyRope", "AddAbsoluteEncoding",
// "GetEncodingTable", "AttentionBias") on a serialised request as an
// admitted call does: parse (emptying `request`), compute, serialise into
// `answer`. `admission` must hold the request's bytes twice (see
// ReadReservation). For fuzzing and tests; calls use it too.
[[nodiscard]] absl::Status RunTensorMethod(Engine* engine, absl::string_view method,
                                           grpc::ByteBuffer* request, grpc::ByteBuffer* answer,
                                           const RunContext& ctx, Engine::Admission& admission);

}  // namespace posenc::server

#endif  // POSENC_SERVER_V1_TENSOR_SERVICE_H_
