#include "v1/tensor_service.h"

#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "rpc/call_support.h"
#include "rpc/status.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/proto_buffer_writer.h"
#include "rpc/logging.h"
#include "v1/operations.h"
#include "posenc/status_macros.h"
#include "posenc/v1/posenc.pb.h"
#include "rpc/large_fields.h"

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

// The request_id a message carries (for logs), where its type has one.
absl::string_view MessageRequestId(const v1::RopeRequest& m) { return m.request_id(); }
absl::string_view MessageRequestId(const v1::AbsoluteEncodingRequest& m) { return m.request_id(); }
absl::string_view MessageRequestId(const v1::EncodingTableRequest&) { return ""; }
absl::string_view MessageRequestId(const v1::AttentionBiasRequest&) { return ""; }

// What a call's log lines name it by: the caller's x-request-id, else the
// id inside its message.
std::string CallRequestId(const std::string& from_metadata, absl::string_view in_message) {
  return from_metadata.empty() ? CleanRequestId(in_message) : from_metadata;
}

// One unary tensor method: parse, run on the engine, serialise. The typed
// messages live only inside Run, so the request's and the answer's memory
// is back in a ByteBuffer (or gone) before the answer is written.
struct UnaryMethod {
  const char* name;
  absl::Status (*run)(Engine*, grpc::ByteBuffer* in, grpc::ByteBuffer* out, const RunContext&,
                      Admission&, std::string* backend, std::string* request_id);
};

template <typename Request, typename Response,
          absl::Status (*Op)(Engine&, Request*, Response*, const RunContext&, Admission&)>
absl::Status RunUnary(Engine* engine, grpc::ByteBuffer* in, grpc::ByteBuffer* out,
                      const RunContext& ctx, Admission& admission, std::string* backend,
                      std::string* request_id) {
  Request req;
  const int64_t bytes = static_cast<int64_t>(in->Length());
  POSENC_RETURN_IF_ERROR(ParseRequest(in, &req));
  // Only what a log line can show: the id may be as large as the message.
  *request_id = std::string(MessageRequestId(req).substr(0, kMaxRequestIdBytes));
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
      : method_(method),
        o_(o),
        ctx_(ctx),
        start_(std::chrono::steady_clock::now()),
        metadata_id_(RequestIdOf(ctx)) {
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
            return method_.run(o_.engine, &request_, &answer_, ContextOf(ctx_), *ticket_, &backend_,
                               &message_id_);
          });
        }
        Complete(r);
      });
      return absl::OkStatus();
    });
    if (!s.ok()) Complete(s);
  }

  void OnDone() override { delete this; }  // releases the bytes (the slot went at Complete)

 private:
  void Complete(const absl::Status& s) {
    const std::string name = method_.name;
    const std::string id = CallRequestId(metadata_id_, message_id_);
    LogFailure(name, s, id);
    LogIfSlow(name, s, start_, id);
    RecordCall(o_.metrics, name, s, start_, bytes_in_, static_cast<int64_t>(answer_.Length()),
               backend_);
    if (ticket_) ticket_->ReleaseSlot();  // the answer is final; its bytes stay
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
  const std::string metadata_id_;  // cleaned x-request-id
  std::string message_id_;         // the request's own id, once parsed
};

// StreamRope: many RoPE requests on one call, answered in request order and
// pipelined: while messages compute on the executor the next one is read,
// up to TensorCallOptions::stream_window messages in flight.
//
// Admission: the stream holds one slot for its life. The first message in
// flight reserves its read (the largest message, as a unary call) and may
// wait for it; a message read ahead takes a slot of its own and its bytes
// only if they are free now and no call waits for memory, so reading ahead
// never overtakes other calls, and otherwise waits for the stream to catch
// up. Each message holds its bytes until its answer has been written.
//
// A failed request is answered with its status in the response and the
// stream goes on; draining and deadlines end it after the answers ahead of
// the message that met them, cancellation at once (answers not yet written
// are dropped once their computations return).
//
// Threads: gRPC's reactions, executor tasks and admission callbacks all
// change state under mu_ (DecideLocked says what follows). Admission bytes
// are released outside mu_ (a release may run another stream's callback),
// and Finish is the last thing a thread does with the stream: it is chosen
// only when no task runs, no write is out and no reservation waits, so
// nothing else can touch the stream after it.
class RopeStreamCall final : public grpc::ServerGenericBidiReactor {
 public:
  RopeStreamCall(const TensorCallOptions& o, grpc::GenericCallbackServerContext* ctx)
      : o_(o), ctx_(ctx), metadata_id_(RequestIdOf(ctx)) {
    absl::StatusOr<Admission> ticket = o_.engine->admission().Enter();
    if (!ticket.ok()) {
      LogFailure("StreamRope", ticket.status(), metadata_id_);
      finishing_ = true;
      Finish(ToGrpcStatus(ticket.status()));
      return;
    }
    stream_slot_.emplace(std::move(*ticket));
    read_bytes_.emplace(stream_slot_->BytesOnly());
    Steps steps;
    {
      std::lock_guard<std::mutex> lock(mu_);
      steps = DecideLocked();
    }
    Perform(this, std::move(steps));
  }

  void OnCancel() override {
    Steps steps;
    bool reserving;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!end_) end_ = absl::CancelledError("the caller cancelled the call");
      reserving = read_state_ == ReadState::kReserving;
      steps = DecideLocked();
    }
    // Ends a wait for read bytes at once (its callback finishes the stream).
    if (reserving) read_bytes_->CancelWait(absl::CancelledError("the caller cancelled the call"));
    Perform(this, std::move(steps));
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the caller half-closed (or left)
      read_bytes_->Shrink(read_bytes_->bytes());
      std::optional<Admission> slot;
      Steps steps;
      {
        std::lock_guard<std::mutex> lock(mu_);
        read_state_ = ReadState::kIdle;
        read_closed_ = true;
        slot.swap(read_slot_);
        steps = DecideLocked();
      }
      slot.reset();  // a reaction: the stream outlives this function
      Perform(this, std::move(steps));
      return;
    }
    auto m = std::make_unique<Message>();
    m->start = std::chrono::steady_clock::now();
    m->bytes_in = static_cast<int64_t>(read_buf_.Length());
    m->request.Swap(&read_buf_);
    m->busy.emplace(o_.busy);
    // The read's bytes become the message's: on its own slot if it was read
    // ahead, else under the stream's. Then it holds what it needs (the
    // request twice while it is parsed, see ReadReservation).
    m->ticket = read_slot_ ? std::move(*read_slot_) : stream_slot_->BytesOnly();
    read_slot_.reset();
    read_bytes_->GiveBytes(read_bytes_->bytes(), &m->ticket);
    const absl::Status held = m->ticket.Resize(2 * m->bytes_in);
    Message* message = m.get();
    Steps steps;
    {
      std::lock_guard<std::mutex> lock(mu_);
      read_state_ = ReadState::kIdle;
      if (end_) {
        steps.drop.push_back(std::move(m));
      } else {
        inflight_.push_back(std::move(m));
        NoteDepthLocked();
        ++computing_;
        const absl::Status submitted = NoThrow([&] {
          o_.executor->Submit([this, message, held] { Run(message, held); });
          return absl::OkStatus();
        });
        if (!submitted.ok()) {
          --computing_;
          message->status = submitted;
          message->ends_stream = true;
          message->computed = true;
        }
      }
      steps = DecideLocked();
    }
    Perform(this, std::move(steps));
  }

  void OnWriteDone(bool ok) override {
    std::unique_ptr<Message> written;
    {
      std::lock_guard<std::mutex> lock(mu_);
      written = std::move(inflight_.front());
      inflight_.pop_front();
    }
    written.reset();  // its bytes and slot go back before the next read ahead
    Steps steps;
    {
      std::lock_guard<std::mutex> lock(mu_);
      writing_ = false;
      if (!ok && !end_) end_ = absl::CancelledError("stream write failed: the caller left");
      steps = DecideLocked();
    }
    Perform(this, std::move(steps));
  }

  void OnDone() override { delete this; }

 private:
  // One request of the stream, from its read until its answer is written.
  struct Message {
    Admission ticket;
    grpc::ByteBuffer request, answer;
    std::optional<BusyMark> busy;  // a drain waits for it
    std::chrono::steady_clock::time_point start;
    int64_t bytes_in = 0;
    absl::Status status;
    bool ends_stream = false;  // status ends the stream instead of answering
    bool computed = false;     // status and answer are final
  };

  enum class ReadState {
    kIdle,
    kReserving,  // read_bytes_ waits for admission; its callback is due
    kReading,    // a StartRead is out; OnReadDone is due
  };

  // What a thread does after deciding, outside mu_.
  struct Steps {
    std::vector<std::unique_ptr<Message>> drop;  // released to admission
    std::optional<Admission> spare_slot;         // a read-ahead slot not used
    bool reserve = false;                        // reserve the next read
    std::optional<grpc::Status> finish;
  };

  // Static, and `stream` used only for a finish or a reservation (which no
  // other thread can also have chosen): once a thread has released mu_ with
  // neither, another may finish the stream and gRPC delete it at once.
  static void Perform(RopeStreamCall* stream, Steps steps) {
    steps.drop.clear();
    steps.spare_slot.reset();
    if (steps.finish) {
      if (stream->stream_slot_) stream->stream_slot_->ReleaseSlot();
      stream->Finish(*steps.finish);  // the stream may be gone from here on
      return;
    }
    if (steps.reserve) {
      stream->read_bytes_->Reserve(ReadReservation(stream->o_), DeadlineOf(stream->ctx_),
                                   [stream](absl::Status s) { stream->OnReserved(s); });
    }
  }

  // Writes answers in order, reads ahead while the window has room, and
  // finishes once nothing is out. Starts gRPC operations (their reactions
  // run on other threads and wait for mu_).
  Steps DecideLocked() {
    Steps steps;
    if (finishing_) return steps;
    if (end_) {
      // Answers not yet written are dropped; tasks still running finish first.
      for (auto it = inflight_.begin(); it != inflight_.end();) {
        const bool being_written = writing_ && it == inflight_.begin();
        if ((*it)->computed && !being_written) {
          steps.drop.push_back(std::move(*it));
          it = inflight_.erase(it);
        } else {
          ++it;
        }
      }
      // A read still out is fine: gRPC ends it when the call finishes.
      if (!writing_ && computing_ == 0 && read_state_ != ReadState::kReserving) {
        finishing_ = true;
        steps.finish = ToGrpcStatus(*end_);
      }
      return steps;
    }
    if (!writing_ && !inflight_.empty() && inflight_.front()->computed) {
      Message& next = *inflight_.front();
      if (next.ends_stream) {
        end_ = next.status;
        return DecideLocked();
      }
      writing_ = true;
      StartWrite(&next.answer);
    }
    if (read_state_ != ReadState::kIdle) return steps;
    if (read_closed_) {
      if (inflight_.empty()) {
        finishing_ = true;
        steps.finish = grpc::Status::OK;
      }
      return steps;
    }
    if (inflight_.empty()) {
      read_state_ = ReadState::kReserving;
      steps.reserve = true;
    } else if (static_cast<int>(inflight_.size()) < o_.stream_window) {
      absl::StatusOr<Admission> slot = o_.engine->admission().Enter();
      if (slot.ok() && read_bytes_->TryReserve(ReadReservation(o_))) {
        read_slot_.emplace(std::move(*slot));
        read_state_ = ReadState::kReading;
        StartRead(&read_buf_);
      } else if (slot.ok()) {
        steps.spare_slot.emplace(std::move(*slot));
      }
    }
    return steps;
  }

  void OnReserved(const absl::Status& s) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (s.ok() && !end_) {
        read_state_ = ReadState::kReading;
        StartRead(&read_buf_);
        return;
      }
    }
    // Still kReserving, so the stream cannot finish under this thread.
    read_bytes_->Shrink(read_bytes_->bytes());
    Steps steps;
    {
      std::lock_guard<std::mutex> lock(mu_);
      read_state_ = ReadState::kIdle;
      if (!s.ok() && !end_) {
        LogFailure("StreamRope", s, metadata_id_);
        end_ = s;
      }
      steps = DecideLocked();
    }
    Perform(this, std::move(steps));
  }

  // On the executor: parse, compute and serialise one message, or make its
  // error answer.
  void Run(Message* m, absl::Status s) {
    v1::RopeRequest req;
    if (s.ok()) s = CheckCallAlive(ctx_);
    if (s.ok()) s = NoThrow([&] { return ParseRequest(&m->request, &req); });
    if (s.ok()) m->ticket.Shrink(m->ticket.bytes() - m->bytes_in);  // parsed: held once
    v1::RopeResponse resp;
    std::string backend;
    if (s.ok()) {
      s = NoThrow([&] { return ApplyRope(*o_.engine, &req, &resp, ContextOf(ctx_), m->ticket); });
    }
    if (s.ok()) {
      backend = resp.backend();
      s = NoThrow([&] { return SerializeAnswer(resp, &m->answer); });
    }
    const std::string id =
        req.request_id().empty() ? metadata_id_ : CleanRequestId(req.request_id());
    LogFailure("StreamRope", s, id);
    LogIfSlow("StreamRope", s, m->start, id);
    RecordCall(o_.metrics, "StreamRope", s, m->start, m->bytes_in,
               static_cast<int64_t>(m->answer.Length()), backend);
    bool ends = false;
    if (!s.ok()) {
      // The caller left or ran out of time, or the server is draining (the
      // caller should move to another replica): going on makes no sense.
      ends = s.code() == absl::StatusCode::kCancelled ||
             s.code() == absl::StatusCode::kDeadlineExceeded ||
             (s.code() == absl::StatusCode::kUnavailable && o_.engine->draining());
      if (!ends) {
        m->answer.Clear();
        const absl::Status e = NoThrow([&] {
          v1::RopeResponse error;
          error.set_request_id(req.request_id().substr(0, 256));
          error.set_error_code(static_cast<int>(s.code()));
          error.set_error_message(std::string(s.message()));
          return SerializeAnswer(error, &m->answer);
        });
        if (!e.ok()) {
          s = absl::InternalError("could not serialise an error answer");
          ends = true;
        }
      }
    }
    Steps steps;
    {
      std::lock_guard<std::mutex> lock(mu_);
      m->status = s;
      m->ends_stream = ends;
      m->computed = true;
      --computing_;
      steps = DecideLocked();
    }
    Perform(this, std::move(steps));
  }

  void NoteDepthLocked() {
    const int depth = static_cast<int>(inflight_.size());
    int seen = o_.stream_depth_peak->load();
    while (depth > seen && !o_.stream_depth_peak->compare_exchange_weak(seen, depth)) {
    }
  }

  const TensorCallOptions& o_;
  grpc::GenericCallbackServerContext* ctx_;
  const std::string metadata_id_;         // cleaned x-request-id
  std::optional<Admission> stream_slot_;  // the stream's slot, for its life
  // Bytes reserved for the read in progress: kept apart from the messages'
  // tickets so a cancellation can end its wait whatever they do.
  std::optional<Admission> read_bytes_;
  std::optional<Admission> read_slot_;  // the read in progress was read ahead
  grpc::ByteBuffer read_buf_;

  std::mutex mu_;
  std::deque<std::unique_ptr<Message>> inflight_;  // request order
  ReadState read_state_ = ReadState::kIdle;
  bool read_closed_ = false;         // the caller half-closed
  bool writing_ = false;             // inflight_.front() is being written
  int computing_ = 0;                // executor tasks not yet done
  std::optional<absl::Status> end_;  // the stream ends with this
  bool finishing_ = false;           // Finish chosen
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
      std::string backend, request_id;
      return NoThrow(
          [&] { return m.run(engine, request, answer, ctx, admission, &backend, &request_id); });
    }
  }
  return absl::UnimplementedError(absl::StrCat("no tensor method ", method));
}

TensorCallService::TensorCallService(const TensorCallOptions& options) : options_(options) {
  options_.busy = &busy_;
  options_.stream_depth_peak = &stream_depth_peak_;
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
