#include "service.h"

#include <chrono>

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

template <typename Request, typename Response, typename Fn>
grpc::ServerUnaryReactor* Unary(const char* method, Engine* engine, Metrics* metrics,
                                grpc::CallbackServerContext* ctx, const Request* req,
                                Response* resp, Fn fn) {
  const auto start = std::chrono::steady_clock::now();
  engine->NoteArrival();
  const double bytes_in = metrics != nullptr ? static_cast<double>(req->ByteSizeLong()) : 0.0;
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::Status s = CheckCallAlive(ctx);
  if (s.ok()) s = fn(ContextOf(ctx));
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
  engine->NoteArrival();
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
    if (s.ok()) s = fn(ContextOf(ctx));
    finish(s);
  });
  return reactor;
}

// One RoPE request at a time, answered in order; a failed request answers
// with its status in the response and the stream continues.
class RopeStreamReactor final : public grpc::ServerBidiReactor<v1::RopeRequest, v1::RopeResponse> {
 public:
  RopeStreamReactor(Engine* engine, Metrics* metrics, grpc::CallbackServerContext* ctx)
      : engine_(engine), metrics_(metrics), ctx_(ctx), run_(ContextOf(ctx)) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client half-closed (or left)
      Finish(grpc::Status::OK);
      return;
    }
    response_.Clear();
    engine_->NoteArrival();
    const auto start = std::chrono::steady_clock::now();
    const double bytes_in =
        metrics_ != nullptr ? static_cast<double>(request_.ByteSizeLong()) : 0.0;
    absl::Status s = CheckCallAlive(ctx_);
    if (s.ok()) s = engine_->ApplyRope(&request_, &response_, run_);
    Record(metrics_, "StreamRope", s, start, bytes_in, response_, response_.backend());
    if (!s.ok()) {
      LogFailure("StreamRope", s);
      if (s.code() == absl::StatusCode::kCancelled ||
          s.code() == absl::StatusCode::kDeadlineExceeded) {
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

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "stream write failed: the caller left"));
      return;
    }
    StartRead(&request_);
  }

  void OnDone() override { delete this; }

 private:
  Engine* engine_;
  Metrics* metrics_;
  grpc::CallbackServerContext* ctx_;
  RunContext run_;
  v1::RopeRequest request_;
  v1::RopeResponse response_;
};

}  // namespace

grpc::ServerUnaryReactor* PositionalEncodingService::ApplyRope(grpc::CallbackServerContext* ctx,
                                                               const v1::RopeRequest* req,
                                                               v1::RopeResponse* resp) {
  return Offloaded("ApplyRope", engine_, metrics_, executor_, ctx, req, resp,
                   [this, req, resp](const RunContext& rc) {
                     return engine_->ApplyRopeAdmitted(Mutable(req), resp, rc);
                   });
}

grpc::ServerBidiReactor<v1::RopeRequest, v1::RopeResponse>* PositionalEncodingService::StreamRope(
    grpc::CallbackServerContext* ctx) {
  return new RopeStreamReactor(engine_, metrics_, ctx);
}

grpc::ServerUnaryReactor* PositionalEncodingService::AddAbsoluteEncoding(
    grpc::CallbackServerContext* ctx, const v1::AbsoluteEncodingRequest* req,
    v1::AbsoluteEncodingResponse* resp) {
  return Offloaded("AddAbsoluteEncoding", engine_, metrics_, executor_, ctx, req, resp,
                   [this, req, resp](const RunContext& rc) {
                     return engine_->AddAbsoluteEncodingAdmitted(Mutable(req), resp, rc);
                   });
}

grpc::ServerUnaryReactor* PositionalEncodingService::GetEncodingTable(
    grpc::CallbackServerContext* ctx, const v1::EncodingTableRequest* req,
    v1::EncodingTableResponse* resp) {
  return Offloaded("GetEncodingTable", engine_, metrics_, executor_, ctx, req, resp,
                   [this, req, resp](const RunContext& rc) {
                     return engine_->GetEncodingTableAdmitted(*req, resp, rc);
                   });
}

grpc::ServerUnaryReactor* PositionalEncodingService::AttentionBias(
    grpc::CallbackServerContext* ctx, const v1::AttentionBiasRequest* req,
    v1::AttentionBiasResponse* resp) {
  return Offloaded("AttentionBias", engine_, metrics_, executor_, ctx, req, resp,
                   [this, req, resp](const RunContext& rc) {
                     return engine_->AttentionBiasAdmitted(Mutable(req), resp, rc);
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
