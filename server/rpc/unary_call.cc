// The unary reactor of the call lifecycle (call.h): admission (tensor
// methods), read, the work (inline for quick control methods, else on the
// executor), outcome, answer. Every path ends in exactly one Finish.
#include <chrono>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/no_throw.h"
#include "rpc/call_context.h"
#include "rpc/call_reactors.h"
#include "rpc/status.h"

namespace posenc::server {
namespace {

class UnaryCall final : public grpc::ServerGenericBidiReactor {
 public:
  UnaryCall(const Method& method, RouterState& state, grpc::GenericCallbackServerContext* ctx)
      : method_(method),
        state_(state),
        ctx_(ctx),
        start_(std::chrono::steady_clock::now()),
        caller_{RequestIdOf(ctx), CallerTraceId(ctx)} {
    if (!method_.admitted()) {
      StartRead(&request_);
      return;
    }
    absl::StatusOr<Engine::Admission> ticket = state_.options.engine->admission().Enter();
    if (!ticket.ok()) {
      Complete(ticket.status());
      return;
    }
    ticket_.emplace(std::move(*ticket));
    ticket_->Reserve(ReadReservation(state_.options), DeadlineOf(ctx_), [this](absl::Status s) {
      if (s.ok()) {
        facts_.stages.admitted = std::chrono::steady_clock::now();
        StartRead(&request_);
      } else {
        Complete(s);
      }
    });
  }

  void OnCancel() override {
    if (ticket_) ticket_->CancelWait(WhyCancelled(ctx_));
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Complete(absl::CancelledError("the call ended before its request arrived"));
      return;
    }
    facts_.stages.read = std::chrono::steady_clock::now();
    busy_.emplace(&state_.busy);
    bytes_in_ = static_cast<int64_t>(request_.Length());
    if (!method_.admitted() && bytes_in_ > kMaxControlRequestBytes) {
      request_.Clear();
      Complete(absl::ResourceExhaustedError(absl::StrCat("a ", method_.name, " request is at most ",
                                                         kMaxControlRequestBytes, " bytes, got ",
                                                         bytes_in_)));
      return;
    }
    if (ticket_) {
      // What the call holds from now on (usually a shrink: it reserved for
      // the largest message): the request while it is parsed into its
      // typed copy, later the answer and its serialised copy.
      const absl::Status held = HoldWhileParsing(method_, request_, *ticket_);
      if (!held.ok()) {
        request_.Clear();
        Complete(held);
        return;
      }
    }
    if (method_.kind == Method::Kind::kControl || (method_.light && method_.light(request_))) {
      Execute();
      return;
    }
    const absl::Status submitted = NoThrow([this] {
      state_.options.executor->Submit([this] { Execute(); });
      return absl::OkStatus();
    });
    if (!submitted.ok()) Complete(submitted);
  }

  void OnDone() override { delete this; }  // releases the bytes (the slot went at Complete)

 private:
  void Execute() {
    facts_.stages.started = std::chrono::steady_clock::now();
    absl::Status s = CheckCallAlive(ctx_);
    if (s.ok()) {
      const RunContext rc = ContextOf(ctx_);
      MethodCall call{rc,
                      ticket_ ? &*ticket_ : nullptr,
                      start_,
                      &facts_,
                      DeadlineOf(ctx_),
                      ctx_->peer(),
                      caller_,
                      CallIdOf(ctx_)};
      s = RunMethod(method_, &request_, &answer_, call);
    }
    Complete(s);
  }

  void Complete(const absl::Status& s) {
    FinishCall(state_.options.metrics, {&method_, s, start_, caller_, &facts_, bytes_in_,
                                        static_cast<int64_t>(answer_.Length())});
    if (ticket_) ticket_->ReleaseSlot();  // the answer is final; its bytes stay
    if (s.ok()) {
      StartWriteAndFinish(&answer_, grpc::WriteOptions(), grpc::Status::OK);
    } else {
      Finish(ToGrpcStatus(s));
    }
  }

  const Method& method_;
  RouterState& state_;
  grpc::GenericCallbackServerContext* ctx_;
  const std::chrono::steady_clock::time_point start_;
  const CallIds caller_;  // cleaned x-request-id, trace id
  std::optional<Engine::Admission> ticket_;
  std::optional<BusyMark> busy_;  // from the request read until the answer is sent
  grpc::ByteBuffer request_, answer_;
  int64_t bytes_in_ = 0;
  CallFacts facts_;
};

}  // namespace

grpc::ServerGenericBidiReactor* NewUnaryCall(const Method& method, RouterState& state,
                                             grpc::GenericCallbackServerContext* ctx) {
  return new UnaryCall(method, state, ctx);
}

}  // namespace posenc::server
