#include "service.h"

#include <chrono>
#include <exception>
#include <new>
#include <optional>

#include "absl/strings/str_cat.h"
#include "grpc_status.h"
#include "spdlog/spdlog.h"

namespace posenc::server {
namespace {

// The callback API owns the request until the handler finishes; the engine
// may move its tensor buffers into the response instead of copying them.
template <typename T>
T* Mutable(const T* request) {
  return const_cast<T*>(request);
}

RunContext ContextOf(grpc::CallbackServerContext* ctx) {
  RunContext rc;
  rc.cancelled = [ctx] { return ctx->IsCancelled(); };
  return rc;
}

// Work for a call whose deadline already passed, or whose caller left, is
// not started.
absl::Status CheckCallAlive(grpc::CallbackServerContext* ctx) {
  if (ctx->IsCancelled()) return absl::CancelledError("the caller cancelled the call");
  if (ctx->deadline() < std::chrono::system_clock::now()) {
    return absl::DeadlineExceededError("the call's deadline passed before work started");
  }
  return absl::OkStatus();
}

// Client errors are the caller's business (debug); server faults are ours.
void LogFailure(const char* method, const absl::Status& s) {
  if (s.ok()) return;
  switch (s.code()) {
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kDataLoss:
      spdlog::error("{} failed: {}", method, s.ToString());
      break;
    case absl::StatusCode::kResourceExhausted:
      spdlog::warn("{} refused: {}", method, std::string(s.message()));
      break;
    default:
      spdlog::debug("{} rejected: {}", method, s.ToString());
  }
}

// The backend a response reports, for the per-backend counter.
std::string BackendOf(const v1::RopeResponse& r) { return r.backend(); }
std::string BackendOf(const v1::AbsoluteEncodingResponse& r) { return r.backend(); }
std::string BackendOf(const v1::EncodingTableResponse& r) { return r.backend(); }
std::string BackendOf(const v1::AttentionBiasResponse& r) { return r.backend(); }
std::string BackendOf(const google::protobuf::Message&) { return ""; }

// `bytes_in` is taken on arrival: the engine moves tensors out of requests.
void Record(Metrics* metrics, const char* method, const absl::Status& s,
            std::chrono::steady_clock::time_point start, double bytes_in,
            const google::protobuf::Message& resp, const std::string& backend) {
  if (metrics == nullptr) return;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  metrics->RecordCall(method, absl::StatusCodeToString(s.code()), seconds, bytes_in,
                      s.ok() ? static_cast<double>(resp.ByteSizeLong()) : 0.0,
                      s.ok() ? backend : "");
}

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

template <typename Request, typename Response, typename Fn>
grpc::ServerUnaryReactor* Unary(const char* method, Engine* engine, Metrics* metrics,
                                grpc::CallbackServerContext* ctx, const Request* req,
                                Response* resp, Fn fn) {
  const auto start = std::chrono::steady_clock::now();
  const double bytes_in = metrics != nullptr ? static_cast<double>(req->ByteSizeLong()) : 0.0;
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::Status s = CheckCallAlive(ctx);
  if (s.ok()) s = NoThrow([&] { return fn(ContextOf(ctx)); });
  LogFailure(method, s);
  Record(metrics, method, s, start, bytes_in, *resp, BackendOf(*resp));
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

// A unary call that holds its admission until gRPC is done with it: the slot
// covers the request, the work and the response until it has been sent, so
// answers queued for slow clients count against the limits too.
class AdmittedReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit AdmittedReactor(absl::StatusOr<Engine::Admission> admission)
      : admission_(std::move(admission)) {}
  void OnDone() override { delete this; }  // releases the admission
  // REQUIRES: the call was admitted.
  Engine::Admission& admission() { return *admission_; }

 private:
  absl::StatusOr<Engine::Admission> admission_;
};

// A tensor operation: admitted on arrival (refusals answer at once), then
// computed on the executor; `fn` runs the admitted operation.
template <typename Request, typename Response, typename Fn>
grpc::ServerUnaryReactor* Offloaded(const char* method, Engine* engine, Metrics* metrics,
                                    RequestExecutor* executor, grpc::CallbackServerContext* ctx,
                                    const Request* req, Response* resp, Fn fn) {
  const auto start = std::chrono::steady_clock::now();
  const double bytes_in = metrics != nullptr ? static_cast<double>(req->ByteSizeLong()) : 0.0;
  absl::Status alive = CheckCallAlive(ctx);
  absl::StatusOr<Engine::Admission> admission =
      alive.ok() ? engine->Admit(Engine::RequestBytes(*req)) : alive;
  const absl::Status admitted = admission.status();
  auto* reactor = new AdmittedReactor(std::move(admission));
  auto finish = [=](const absl::Status& s) {
    LogFailure(method, s);
    Record(metrics, method, s, start, bytes_in, *resp, BackendOf(*resp));
    reactor->Finish(ToGrpcStatus(s));
  };
  if (!admitted.ok()) {
    finish(admitted);
    return reactor;
  }
  executor->Submit([=] {
    absl::Status s = CheckCallAlive(ctx);  // it may have waited in the queue
    if (s.ok()) s = NoThrow([&] { return fn(ContextOf(ctx), reactor->admission()); });
    finish(s);
  });
  return reactor;
}

// One RoPE request at a time, answered in order. Each message is admitted
// on arrival like a unary call (its slot held until its answer is written)
// and computed on the executor. A failed request answers with its status in
// the response and the stream continues; draining, cancellation and
// deadlines end the stream.
class RopeStreamReactor final : public grpc::ServerBidiReactor<v1::RopeRequest, v1::RopeResponse> {
 public:
  RopeStreamReactor(Engine* engine, Metrics* metrics, RequestExecutor* executor,
                    grpc::CallbackServerContext* ctx)
      : engine_(engine), metrics_(metrics), executor_(executor), ctx_(ctx), run_(ContextOf(ctx)) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client half-closed (or left)
      Finish(grpc::Status::OK);
      return;
    }
    response_.Clear();
    start_ = std::chrono::steady_clock::now();
    bytes_in_ = metrics_ != nullptr ? static_cast<double>(request_.ByteSizeLong()) : 0.0;
    absl::Status s = CheckCallAlive(ctx_);
    if (s.ok()) {
      absl::StatusOr<Engine::Admission> admission = engine_->Admit(Engine::RequestBytes(request_));
      s = admission.status();
      if (s.ok()) admission_.emplace(std::move(*admission));
    }
    if (!s.ok()) {
      Complete(s);
      return;
    }
    s = NoThrow([this] {
      executor_->Submit([this] {
        absl::Status r = CheckCallAlive(ctx_);
        if (r.ok()) {
          r = NoThrow([this] {
            return engine_->ApplyRopeAdmitted(&request_, &response_, run_, *admission_);
          });
        }
        Complete(r);
      });
      return absl::OkStatus();
    });
    if (!s.ok()) Complete(s);
  }

  void OnWriteDone(bool ok) override {
    admission_.reset();  // the answer is sent (or dropped): its slot is free
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "stream write failed: the caller left"));
      return;
    }
    StartRead(&request_);
  }

  void OnDone() override { delete this; }

 private:
  // Answers the current request, or ends the stream where continuing makes
  // no sense: the server is draining (the caller should move to another
  // replica) or the call is cancelled or past its deadline.
  void Complete(const absl::Status& s) {
    Record(metrics_, "StreamRope", s, start_, bytes_in_, response_, response_.backend());
    if (!s.ok()) {
      LogFailure("StreamRope", s);
      if (s.code() == absl::StatusCode::kCancelled ||
          s.code() == absl::StatusCode::kDeadlineExceeded ||
          (s.code() == absl::StatusCode::kUnavailable && engine_->draining())) {
        admission_.reset();
        Finish(ToGrpcStatus(s));
        return;
      }
      response_.Clear();
      response_.set_request_id(request_.request_id());
      response_.set_error_code(static_cast<int>(s.code()));
      response_.set_error_message(std::string(s.message()));
    }
    StartWrite(&response_);
  }

  Engine* engine_;
  Metrics* metrics_;
  RequestExecutor* executor_;
  grpc::CallbackServerContext* ctx_;
  RunContext run_;
  v1::RopeRequest request_;
  v1::RopeResponse response_;
  std::optional<Engine::Admission> admission_;
  std::chrono::steady_clock::time_point start_;
  double bytes_in_ = 0;
};

}  // namespace

grpc::ServerUnaryReactor* PositionalEncodingService::ApplyRope(grpc::CallbackServerContext* ctx,
                                                               const v1::RopeRequest* req,
                                                               v1::RopeResponse* resp) {
  return Offloaded("ApplyRope", engine_, metrics_, executor_, ctx, req, resp,
                   [this, req, resp](const RunContext& rc, Engine::Admission& a) {
                     return engine_->ApplyRopeAdmitted(Mutable(req), resp, rc, a);
                   });
}

grpc::ServerBidiReactor<v1::RopeRequest, v1::RopeResponse>* PositionalEncodingService::StreamRope(
    grpc::CallbackServerContext* ctx) {
  return new RopeStreamReactor(engine_, metrics_, executor_, ctx);
}

grpc::ServerUnaryReactor* PositionalEncodingService::AddAbsoluteEncoding(
    grpc::CallbackServerContext* ctx, const v1::AbsoluteEncodingRequest* req,
    v1::AbsoluteEncodingResponse* resp) {
  return Offloaded("AddAbsoluteEncoding", engine_, metrics_, executor_, ctx, req, resp,
                   [this, req, resp](const RunContext& rc, Engine::Admission& a) {
                     return engine_->AddAbsoluteEncodingAdmitted(Mutable(req), resp, rc, a);
                   });
}

grpc::ServerUnaryReactor* PositionalEncodingService::GetEncodingTable(
    grpc::CallbackServerContext* ctx, const v1::EncodingTableRequest* req,
    v1::EncodingTableResponse* resp) {
  return Offloaded("GetEncodingTable", engine_, metrics_, executor_, ctx, req, resp,
                   [this, req, resp](const RunContext& rc, Engine::Admission& a) {
                     return engine_->GetEncodingTableAdmitted(*req, resp, rc, a);
                   });
}

grpc::ServerUnaryReactor* PositionalEncodingService::AttentionBias(
    grpc::CallbackServerContext* ctx, const v1::AttentionBiasRequest* req,
    v1::AttentionBiasResponse* resp) {
  return Offloaded("AttentionBias", engine_, metrics_, executor_, ctx, req, resp,
                   [this, req, resp](const RunContext& rc, Engine::Admission& a) {
                     return engine_->AttentionBiasAdmitted(Mutable(req), resp, rc, a);
                   });
}

grpc::ServerUnaryReactor* PositionalEncodingService::ListTables(grpc::CallbackServerContext* ctx,
                                                                const v1::ListTablesRequest* req,
                                                                v1::ListTablesResponse* resp) {
  return Unary("ListTables", engine_, metrics_, ctx, req, resp, [&](const RunContext&) {
    *resp = engine_->ListTables();
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* PositionalEncodingService::ReloadTables(
    grpc::CallbackServerContext* ctx, const v1::ReloadTablesRequest* req,
    v1::ListTablesResponse* resp) {
  return Unary("ReloadTables", engine_, metrics_, ctx, req, resp, [&](const RunContext&) {
    *resp = engine_->ReloadTables();
    spdlog::info("tables reloaded: {} loaded, {} skipped", resp->tables_size(),
                 resp->skipped_size());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* PositionalEncodingService::GetServerInfo(
    grpc::CallbackServerContext* ctx, const v1::GetServerInfoRequest* req, v1::ServerInfo* resp) {
  return Unary("GetServerInfo", engine_, metrics_, ctx, req, resp, [&](const RunContext&) {
    *resp = engine_->GetServerInfo();
    return absl::OkStatus();
  });
}

}  // namespace posenc::server
