// The stream reactor of the call lifecycle (call.h).
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/no_throw.h"
#include "rpc/call_context.h"
#include "rpc/call_log.h"
#include "rpc/call_reactors.h"
#include "rpc/status.h"

namespace posenc::server {
namespace {

using Admission = Engine::Admission;

// A stream: many requests on one call (StreamRope, ModelStreamInfer),
// answered in request order and pipelined: while messages compute on the
// executor the next one is read, up to CallRouterOptions::stream_window
// messages in flight.
//
// Admission: the stream holds one slot for its life. The first message in
// flight reserves its read (the largest message, as a unary call) and may
// wait for it; a message read ahead takes a slot of its own and its bytes
// only if they are free now and no call waits for memory, so reading ahead
// never overtakes other calls, and otherwise waits for the stream to catch
// up. Each message holds its bytes until its answer has been written.
//
// A failed request is answered with the method's error answer and the
// stream goes on (as StreamRope always did and Triton's ModelStreamInfer
// does); draining and deadlines end it after the answers ahead of
// the message that met them, cancellation at once (answers not yet written
// are dropped once their computations return).
//
// Threads: gRPC's reactions, executor tasks and admission callbacks all
// change state under mu_ (DecideLocked says what follows). Admission bytes
// are released outside mu_ (a release may run another stream's callback),
// and Finish is the last thing a thread does with the stream: it is chosen
// only when no task runs, no write is out and no reservation waits, so
// nothing else can touch the stream after it.
class StreamCall final : public grpc::ServerGenericBidiReactor {
 public:
  StreamCall(const Method& method, RouterState& state, grpc::GenericCallbackServerContext* ctx)
      : method_(method),
        state_(state),
        o_(state.options),
        ctx_(ctx),
        caller_{RequestIdOf(ctx), CallerTraceId(ctx)} {
    absl::StatusOr<Admission> ticket = o_.engine->admission().Enter();
    if (!ticket.ok()) {
      LogFailure(method_.name, ticket.status(), caller_);
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
    const absl::Status why = WhyCancelled(ctx_);
    Steps steps;
    bool reserving;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!end_) end_ = why;
      reserving = read_state_ == ReadState::kReserving;
      steps = DecideLocked();
    }
    // Ends a wait for read bytes at once (its callback finishes the stream),
    // or, when the thread that chose to reserve has not reserved yet, has
    // its Reserve end at once.
    if (reserving) read_bytes_->CancelWait(why);
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
    m->busy.emplace(&state_.busy);
    // The read's bytes become the message's: on its own slot if it was read
    // ahead, else under the stream's. Then it holds what it needs (the
    // request twice while it is parsed, see ReadReservation).
    std::optional<Admission> ahead;  // under mu_: DecideLocked may give it back
    {
      std::lock_guard<std::mutex> lock(mu_);
      ahead.swap(read_slot_);
    }
    m->ticket = ahead ? std::move(*ahead) : stream_slot_->BytesOnly();
    read_bytes_->GiveBytes(read_bytes_->bytes(), &m->ticket);
    const absl::Status held = HoldWhileParsing(method_, m->request, m->ticket);
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
    CallFacts facts;
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
  static void Perform(StreamCall* stream, Steps steps) {
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
    // A read ahead of messages that have all been answered waits for the
    // caller's next message, which the stream's own slot carries (as it does
    // a first one): its slot goes back, so that an idle stream holds one
    // slot of --max_inflight, not two.
    if (read_state_ == ReadState::kReading && read_slot_ && inflight_.empty()) {
      steps.spare_slot.swap(read_slot_);
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
        LogFailure(method_.name, s, caller_);
        end_ = s;
      }
      steps = DecideLocked();
    }
    Perform(this, std::move(steps));
  }

  // On the executor: run one message through its method, or make its error
  // answer.
  void Run(Message* m, absl::Status s) {
    m->facts.stages.started = std::chrono::steady_clock::now();  // its time began at its read
    if (s.ok()) s = CheckCallAlive(ctx_);
    if (s.ok()) {
      const RunContext rc = ContextOf(ctx_);
      MethodCall call{rc, &m->ticket, m->start, &m->facts, DeadlineOf(ctx_), ctx_->peer(), caller_};
      s = RunMethod(method_, &m->request, &m->answer, call);
    }
    FinishCall(o_.metrics, {&method_, s, m->start, caller_, &m->facts, m->bytes_in,
                            static_cast<int64_t>(m->answer.Length()), /*stream_message=*/true});
    bool ends = false;
    if (!s.ok()) {
      ends = StreamEnds(s, *o_.engine);
      if (!ends) {
        m->answer.Clear();
        const absl::Status e =
            NoThrow([&] { return method_.error_answer(s, m->facts, &m->answer); });
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
    int seen = state_.stream_depth_peak.load();
    while (depth > seen && !state_.stream_depth_peak.compare_exchange_weak(seen, depth)) {
    }
  }

  const Method& method_;
  RouterState& state_;
  const CallRouterOptions& o_;
  grpc::GenericCallbackServerContext* ctx_;
  const CallIds caller_;                  // cleaned x-request-id, trace id
  std::optional<Admission> stream_slot_;  // the stream's slot, for its life
  // Bytes reserved for the read in progress: kept apart from the messages'
  // tickets so a cancellation can end its wait whatever they do.
  std::optional<Admission> read_bytes_;
  std::optional<Admission> read_slot_;  // the read in progress was read ahead (until idle)
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

}  // namespace

grpc::ServerGenericBidiReactor* NewStreamCall(const Method& method, RouterState& state,
                                              grpc::GenericCallbackServerContext* ctx) {
  return new StreamCall(method, state, ctx);
}

}  // namespace posenc::server
