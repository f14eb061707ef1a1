// The one lifecycle of every call either front serves (posenc.v1 and KServe
// v2, unary and streaming, tensor and control methods). A front describes
// each of its methods as a Method: what it does with one request message.
// Everything around that is done here and in the reactors of
// call_router.h, the same for every method:
//
//   admission     tensor calls take a slot and reserve the largest message
//                 before their request is read (so a burst of large
//                 requests waits behind HTTP/2 flow control, not in
//                 memory); control calls are small and are not admitted
//   request id    the caller's x-request-id metadata, else the message's own
//   deadline      work for a call already cancelled or past its deadline is
//                 not started; kernels see cancellation through RunContext
//   parse         our code parses every message (one error for a message
//                 that does not parse: INVALID_ARGUMENT naming its type)
//   the work      Method::run, off gRPC's threads unless it is a quick
//                 control method, inside one catch-all (NoThrow)
//   outcome       failure and slow-call log lines and metrics (FinishCall)
//   the answer    one Finish per call; a stream answers a failed message with
//                 the method's error answer and goes on
#ifndef POSENC_SERVER_RPC_CALL_H_
#define POSENC_SERVER_RPC_CALL_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/engine.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/support/byte_buffer.h"
#include "posenc/backend.h"
#include "rpc/call_log.h"
#include "rpc/metrics.h"

namespace posenc::server {

// What a call learns while it runs, for its answer, log lines and metrics.
struct CallFacts {
  // The id the message carries, as it came (a valid UTF-8 prefix of at most
  // kMaxEchoedBytes): stream error answers echo it, logs clean it.
  std::string message_id;
  // The model the message names (KServe), for stream error answers.
  std::string model_name;
  std::string backend;  // the backend that ran it ("" when none did)
  // Tensor bytes moved outside the message (shared memory), counted in the
  // metrics as the socket's would be.
  int64_t shared_memory_in = 0;
  int64_t shared_memory_out = 0;
  // When it reached each stage, for the slow-call log (call_log.h).
  CallStages stages;
};

// The longest id or name an answer repeats from its request.
inline constexpr size_t kMaxEchoedBytes = 256;

// One request message in the hands of its method.
struct MethodCall {
  const RunContext& ctx;
  // Tensor methods: the call's claim, holding the request's bytes twice
  // (the message read and its parsed copy); ParseAdmitted gives one back.
  // Control methods: null.
  Engine::Admission* admission = nullptr;
  std::chrono::steady_clock::time_point arrived;  // when the call (message) came
  CallFacts* facts = nullptr;
  absl::Time deadline = absl::InfiniteFuture();  // the call's
  // Who called, as gRPC names the peer ("ipv4:10.0.0.7:53412"; one TCP
  // connection is one client): what per-client caps count by.
  std::string peer;
  // The caller's x-request-id and trace id, for lines a method writes
  // itself (a setting changed, a model unloaded).
  CallIds caller;
  // The posenc-call-id the caller gave this call ("" when none): the same on
  // every attempt gRPC makes of it, so an in-place call refuses a retry
  // (engine/attempt_ledger.h). Unary calls only.
  std::string call_id;
};

// The largest request a control method (not admitted: server info,
// health, settings, shared-memory registration, model and table control)
// takes: every one of them is a few names and numbers. Larger ones are
// refused before they are parsed (RESOURCE_EXHAUSTED), since these calls
// hold no admission bytes and may queue on the executor.
inline constexpr int64_t kMaxControlRequestBytes = int64_t{1} << 20;

struct Method {
  enum class Kind {
    kControl,       // small and quick: not admitted, run on gRPC's thread
    kControlIo,     // not admitted, run on the executor (it reads files)
    kTensor,        // admitted before its request is read, run on the executor
    kTensorStream,  // tensor requests on one call, pipelined, answered in order
  };
  std::string service;  // "posenc.v1.PositionalEncoding"
  std::string name;     // "ApplyRope": in log lines and metrics
  Kind kind = Kind::kControl;
  // Parses `request` (leaving it empty), does the work and serialises the
  // answer into `answer`.
  std::function<absl::Status(MethodCall& call, grpc::ByteBuffer* request, grpc::ByteBuffer* answer)>
      run;
  // Streams only: the answer a message that failed gets (the stream goes
  // on, unless the failure ends it: see StreamEnds).
  std::function<absl::Status(const absl::Status& failure, const CallFacts& facts,
                             grpc::ByteBuffer* answer)>
      error_answer;

  // Unary tensor methods only: whether a request's work is small enough to
  // run on the gRPC thread that read it instead of hopping to the executor
  // (a thread switch each way: most of a tiny call's cost). Null: never.
  // Only for work bounded by the request's own small size: a message that
  // names tensors in shared memory, or builds an output, is no such thing.
  std::function<bool(const grpc::ByteBuffer& request)> light;
  // Tensor methods: the request's type, so that a call is charged for what
  // its message holds once parsed (HoldWhileParsing). Null: twice its bytes.
  const google::protobuf::Descriptor* request_type = nullptr;

  std::string path() const { return "/" + service + "/" + name; }
  bool admitted() const { return kind == Kind::kTensor || kind == Kind::kTensorStream; }
};

// Sets what an admitted call holds once its request is read: the bytes read
// and the message they parse into, at least as much again
// (BytesWhileParsing, DecodedBytesBound). A shrink of the reservation made
// for the largest message, unless the message would parse into more: then
// it grows without waiting, or RESOURCE_EXHAUSTED saying why.
[[nodiscard]] absl::Status HoldWhileParsing(const Method& method, const grpc::ByteBuffer& request,
                                            Engine::Admission& ticket);

// Runs `method` on one request as a call does once it is read and admitted
// (the reactors use it too): inside the catch-all, nothing escapes.
[[nodiscard]] absl::Status RunMethod(const Method& method, grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* answer, MethodCall& call);

// A call's (or a stream message's) end: its failure and slow-call log lines,
// named by CallRequestId, and its metrics (`metrics` may be null).
struct CallOutcome {
  const Method* method;
  absl::Status status;
  std::chrono::steady_clock::time_point start;
  CallIds caller;  // the caller's metadata: cleaned x-request-id, trace id
  const CallFacts* facts;
  int64_t bytes_in = 0;  // of the message
  int64_t bytes_out = 0;
  bool stream_message = false;  // one message of a stream (see CallRequestId)
};
void FinishCall(Metrics* metrics, const CallOutcome& outcome);

// What a call's log lines name it by (cleaned): the caller's x-request-id,
// else the id inside its message. A stream carries many requests under one
// x-request-id, so each of its messages is named by its own id first.
std::string CallRequestId(const std::string& metadata_id, const CallFacts& facts,
                          bool stream_message);

// Whether a stream message's failure ends its stream instead of being
// answered: the caller left or ran out of time, or the server is draining
// (the caller should move to another replica).
bool StreamEnds(const absl::Status& s, const Engine& engine);

}  // namespace posenc::server

#endif  // POSENC_SERVER_RPC_CALL_H_
