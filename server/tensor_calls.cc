#include "tensor_calls.h"

#include <chrono>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "call_support.h"
#include "grpc_status.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/proto_buffer_writer.h"
#include "operations.h"
#include "posenc/status_macros.h"
#include "posenc/v1/posenc.pb.h"
#include "tensor_wire.h"

namespace posenc::server {
namespace {

using Admission = Engine::Admission;

constexpr char kServicePrefix[] = "/posenc.v1.PositionalEncoding/";

// The large bytes fields of each message (tensor_wire.h), by number.
std::vector<LargeField> LargeFieldsOf(v1::RopeRequest* m) {
  return {{2, m->mutable_query_data()}, {4, m->mutable_key_data()}};
}
std::vector<LargeField> LargeFieldsOf(v1::AbsoluteEncodingRequest* m) {
  return {{2, m->mutable_x_data()}};
}
std::vector<LargeField> LargeFieldsOf(v1::EncodingTableRequest*) { return {}; }
std::vector<LargeField> LargeFieldsOf(v1::AttentionBiasRequest* m) {
  return {{13, m->mutable_logits_data()}};
}
std::vector<LargeField> LargeFieldsOf(v1::RopeResponse* m) {
  return {{2, m->mutable_query_data()}, {4, m->mutable_key_data()}};
}
std::vector<LargeField> LargeFieldsOf(v1::AbsoluteEncodingResponse* m) {
  return {{2, m->mutable_y_data()}};
}
std::vector<LargeField> LargeFieldsOf(v1::EncodingTableResponse* m) {
  return {{2, m->mutable_table_data()}};
}
std::vector<LargeField> LargeFieldsOf(v1::AttentionBiasResponse* m) {
  return {{2, m->mutable_bias_data()}};
}

// Parses a request from the bytes read (emptying `in`), copying its large
// fields once into exactly-sized strings.
template <typename Request>
absl::Status ParseRequest(grpc::ByteBuffer* in, Request* req) {
  std::vector<grpc::Slice> slices;
  const grpc::Status dumped = in->Dump(&slices);
  in->Clear();
  if (!dumped.ok()) return absl::InternalError("could not read the request's bytes");
  std::vector<LargeField> fields = LargeFieldsOf(req);
  std::vector<std::string> contents(fields.size());
  std::vector<LargeField> split;
  for (size_t i = 0; i < fields.size(); ++i) split.push_back({fields[i].number, &contents[i]});
  std::string rest;
  absl::Status s = SplitLargeFields(&slices, split, &rest);
  if (s.ok() && !req->ParseFromString(rest)) {
    s = absl::InvalidArgumentError("the request's fields do not parse");
  }
  if (!s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("the request is not a valid ",
                                                   Request::descriptor()->full_name(), " message (",
                                                   s.message(), ")"));
  }
  for (size_t i = 0; i < fields.size(); ++i) *fields[i].data = std::move(contents[i]);
  return absl::OkStatus();
}

// Serialises an answer, handing its large fields to gRPC without a copy (the
// answer is left without them).
template <typename Response>
absl::Status SerializeAnswer(Response& resp, grpc::ByteBuffer* out) {
  std::vector<LargeField> fields = LargeFieldsOf(&resp);
  std::vector<std::string> contents(fields.size());
  std::vector<LargeField> moved;
  for (size_t i = 0; i < fields.size(); ++i) {
    contents[i] = std::move(*fields[i].data);
    fields[i].data->clear();
    moved.push_back({fields[i].number, &contents[i]});
  }
  std::string head;
  if (!resp.SerializeToString(&head)) return absl::InternalError("could not serialise the answer");
  *out = BufferWithLargeFields(head, moved);
  return absl::OkStatus();
}

// What a call reserves before it reads: the largest message it may receive,
// twice. A request of R bytes is held twice while it is parsed (its large
// fields copied out as the received slices are released, the rest parsed
// by protobuf), then once: answers reuse its buffers or are new outputs the
// engine reserves, and go out without a copy. Reserving the worst case up
// front means a call never grows (and waits) while holding memory, which
// could deadlock two calls.
int64_t ReadReservation(const TensorCallOptions& o) { return 2 * o.max_message_bytes; }

// Counts a call as busy while it lives: its request is read and its answer
// not yet sent. A drain waits for busy calls, not for idle streams.
class BusyMark {
 public:
  explicit BusyMark(std::atomic<int>* busy) : busy_(busy) { busy_->fetch_add(1); }
  ~BusyMark() { busy_->fetch_sub(1); }
  BusyMark(const BusyMark&) = delete;
  BusyMark& operator=(const BusyMark&) = delete;

 private:
  std::atomic<int>* busy_;
};

// One unary tensor method: parse, run on the engine, serialise. The typed
// messages live only inside Run, so the request's and the answer's memory
// is back in a ByteBuffer (or gone) before the answer is written.
struct UnaryMethod {
  const char* name;
  absl::Status (*run)(Engine*, grpc::ByteBuffer* in, grpc::ByteBuffer* out, const RunContext&,
                      Admission&, std::string* backend);
};

template <typename Request, typename Response,
          absl::Status (*Op)(Engine&, Request*, Response*, const RunContext&, Admission&)>
absl::Status RunUnary(Engine* engine, grpc::ByteBuffer* in, grpc::ByteBuffer* out,
                      const RunContext& ctx, Admission& admission, std::string* backend) {
  Request req;
  const int64_t bytes = static_cast<int64_t>(in->Length());
  POSENC_RETURN_IF_ERROR(ParseRequest(in, &req));
  admission.Shrink(admission.bytes() - bytes);  // parsed: held once
  Response resp;
  POSENC_RETURN_IF_ERROR(Op(*engine, &req, &resp, ctx, admission));
  *backend = resp.backend();
  return SerializeAnswer(resp, out);
}

const UnaryMethod kUnaryMethods[] = {
    {"ApplyRope", RunUnary<v1::RopeRequest, v1::RopeResponse, &ApplyRope>},
    {"AddAbsoluteEncoding",
     RunUnary<v1::AbsoluteEncodingRequest, v1::AbsoluteEncodingResponse, &AddAbsoluteEncoding>},
    {"GetEncodingTable",
     RunUnary<v1::EncodingTableRequest, v1::EncodingTableResponse, &GetEncodingTable>},
    {"AttentionBias",
     RunUnary<v1::AttentionBiasRequest, v1::AttentionBiasResponse, &AttentionBias>},
};

// A unary tensor call: slot, read reservation, read, run on the executor,
// answer. Every path ends in exactly one Finish.
class UnaryCall final : public grpc::ServerGenericBidiReactor {
 public:
  UnaryCall(const UnaryMethod& method, const TensorCallOptions& o,
            grpc::GenericCallbackServerContext* ctx)
      : method_(method), o_(o), ctx_(ctx), start_(std::chrono::steady_clock::now()) {
    absl::StatusOr<Admission> ticket = o_.engine->admission().Enter();
    if (!ticket.ok()) {
      Complete(ticket.status());
      return;
    }
    ticket_.emplace(std::move(*ticket));
    ticket_->Reserve(ReadReservation(o_), DeadlineOf(ctx_), [this](absl::Status s) {
      if (s.ok()) {
        StartRead(&request_);
      } else {
        Complete(s);
      }
    });
  }

  void OnCancel() override {
    if (ticket_) ticket_->CancelWait(absl::CancelledError("the caller cancelled the call"));
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Complete(absl::CancelledError("the call ended before its request arrived"));
      return;
    }
    busy_.emplace(o_.busy);
    bytes_in_ = static_cast<int64_t>(request_.Length());
    // What the call holds from now on (a shrink: it reserved for the
    // largest message): the request while it is parsed into its typed copy,
    // later the answer and its serialised copy.
    absl::Status s = ticket_->Resize(2 * bytes_in_);
    if (!s.ok()) {
      request_.Clear();
      Complete(s);
      return;
    }
    s = NoThrow([this] {
      o_.executor->Submit([this] {
        absl::Status r = CheckCallAlive(ctx_);
        if (r.ok()) {
          r = NoThrow([this] {
            return method_.run(o_.engine, &request_, &answer_, ContextOf(ctx_), *ticket_,
                               &backend_);
          });
        }
        Complete(r);
      });
      return absl::OkStatus();
    });
    if (!s.ok()) Complete(s);
  }

  void OnDone() override { delete this; }  // releases the slot and bytes

 private:
  void Complete(const absl::Status& s) {
    const std::string name = method_.name;
    LogFailure(name, s);
    RecordCall(o_.metrics, name, s, start_, bytes_in_, static_cast<int64_t>(answer_.Length()),
               backend_);
    if (s.ok()) {
      StartWriteAndFinish(&answer_, grpc::WriteOptions(), grpc::Status::OK);
    } else {
      Finish(ToGrpcStatus(s));
    }
  }

  const UnaryMethod& method_;
  const TensorCallOptions& o_;
  std::optional<BusyMark> busy_;  // from the request read until the answer is sent
  grpc::GenericCallbackServerContext* ctx_;
  const std::chrono::steady_clock::time_point start_;
  std::optional<Admission> ticket_;
  grpc::ByteBuffer request_, answer_;
  int64_t bytes_in_ = 0;
  std::string backend_;
};

// StreamRope: many RoPE requests on one call, answered in order. The stream
// holds one slot for its life and reserves a message's worth of bytes before
// each read. A failed request is answered with its status in the response
// and the stream goes on; draining, cancellation and deadlines end it.
class RopeStreamCall final : public grpc::ServerGenericBidiReactor {
 public:
  RopeStreamCall(const TensorCallOptions& o, grpc::GenericCallbackServerContext* ctx)
      : o_(o), ctx_(ctx) {
    absl::StatusOr<Admission> ticket = o_.engine->admission().Enter();
    if (!ticket.ok()) {
      LogFailure("StreamRope", ticket.status());
      Finish(ToGrpcStatus(ticket.status()));
      return;
    }
    ticket_.emplace(std::move(*ticket));
    NextRead();
  }

  void OnCancel() override {
    if (ticket_) ticket_->CancelWait(absl::CancelledError("the caller cancelled the call"));
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the caller half-closed (or left)
      ticket_->Shrink(ticket_->bytes());
      Finish(grpc::Status::OK);
      return;
    }
    busy_.emplace(o_.busy);
    start_ = std::chrono::steady_clock::now();
    bytes_in_ = static_cast<int64_t>(request_.Length());
    backend_.clear();
    absl::Status s = ticket_->Resize(2 * bytes_in_);
    if (!s.ok()) {
      request_.Clear();
      Answer(s, v1::RopeRequest());
      return;
    }
    s = NoThrow([this] {
      o_.executor->Submit([this] { Run(); });
      return absl::OkStatus();
    });
    if (!s.ok()) Answer(s, v1::RopeRequest());
  }

  void OnWriteDone(bool ok) override {
    answer_.Clear();
    busy_.reset();
    ticket_->Shrink(ticket_->bytes());  // the answer is sent (or dropped)
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "stream write failed: the caller left"));
      return;
    }
    NextRead();
  }

  void OnDone() override { delete this; }

 private:
  void NextRead() {
    ticket_->Reserve(ReadReservation(o_), DeadlineOf(ctx_), [this](absl::Status s) {
      if (s.ok()) {
        StartRead(&request_);
      } else {
        LogFailure("StreamRope", s);
        Finish(ToGrpcStatus(s));
      }
    });
  }

  void Run() {
    v1::RopeRequest req;
    absl::Status s = CheckCallAlive(ctx_);
    if (s.ok()) s = NoThrow([&] { return ParseRequest(&request_, &req); });
    if (s.ok()) ticket_->Shrink(ticket_->bytes() - bytes_in_);  // parsed: held once
    v1::RopeResponse resp;
    if (s.ok()) {
      s = NoThrow([&] { return ApplyRope(*o_.engine, &req, &resp, ContextOf(ctx_), *ticket_); });
    }
    if (s.ok()) {
      backend_ = resp.backend();
      s = NoThrow([&] { return SerializeAnswer(resp, &answer_); });
    }
    Answer(s, req);
  }

  // Writes the answer for the current request, or ends the stream where
  // going on makes no sense: the caller left or ran out of time, or the
  // server is draining (the caller should move to another replica).
  void Answer(const absl::Status& s, const v1::RopeRequest& req) {
    LogFailure("StreamRope", s);
    RecordCall(o_.metrics, "StreamRope", s, start_, bytes_in_,
               static_cast<int64_t>(answer_.Length()), backend_);
    if (!s.ok()) {
      if (s.code() == absl::StatusCode::kCancelled ||
          s.code() == absl::StatusCode::kDeadlineExceeded ||
          (s.code() == absl::StatusCode::kUnavailable && o_.engine->draining())) {
        Finish(ToGrpcStatus(s));
        return;
      }
      v1::RopeResponse error;
      error.set_request_id(req.request_id().substr(0, 256));
      error.set_error_code(static_cast<int>(s.code()));
      error.set_error_message(std::string(s.message()));
      answer_.Clear();
      if (!SerializeAnswer(error, &answer_).ok()) {
        Finish(grpc::Status(grpc::StatusCode::INTERNAL, "could not serialise an error answer"));
        return;
      }
    }
    StartWrite(&answer_);
  }

  const TensorCallOptions& o_;
  grpc::GenericCallbackServerContext* ctx_;
  std::optional<BusyMark> busy_;  // from a request read until its answer is sent
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::optional<Admission> ticket_;
  grpc::ByteBuffer request_, answer_;
  int64_t bytes_in_ = 0;
  std::string backend_;
};

class Unimplemented final : public grpc::ServerGenericBidiReactor {
 public:
  explicit Unimplemented(const std::string& method) {
    Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                        absl::StrCat("method ", method, " is not served here")));
  }
  void OnDone() override { delete this; }
};

}  // namespace

absl::Status RunTensorMethod(Engine* engine, absl::string_view method, grpc::ByteBuffer* request,
                             grpc::ByteBuffer* answer, const RunContext& ctx,
                             Engine::Admission& admission) {
  for (const UnaryMethod& m : kUnaryMethods) {
    if (method == m.name) {
      std::string backend;
      return NoThrow([&] { return m.run(engine, request, answer, ctx, admission, &backend); });
    }
  }
  return absl::UnimplementedError(absl::StrCat("no tensor method ", method));
}

TensorCallService::TensorCallService(const TensorCallOptions& options) : options_(options) {
  options_.busy = &busy_;
}

grpc::ServerGenericBidiReactor* TensorCallService::CreateReactor(
    grpc::GenericCallbackServerContext* ctx) {
  const std::string& method = ctx->method();
  if (absl::StartsWith(method, kServicePrefix)) {
    const absl::string_view name = absl::string_view(method).substr(sizeof(kServicePrefix) - 1);
    if (name == "StreamRope") return new RopeStreamCall(options_, ctx);
    for (const UnaryMethod& m : kUnaryMethods) {
      if (name == m.name) return new UnaryCall(m, options_, ctx);
    }
  }
  return new Unimplemented(method);
}

}  // namespace posenc::server
