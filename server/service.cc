#include "service.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "grpc_status.h"
#include "spdlog/spdlog.h"

namespace posenc::server {
namespace {

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

template <typename Fn>
grpc::ServerUnaryReactor* Unary(const char* method, grpc::CallbackServerContext* ctx, Fn fn) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::Status s = CheckCallAlive(ctx);
  if (s.ok()) s = fn(ContextOf(ctx));
  LogFailure(method, s);
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

// One RoPE request at a time, answered in order; a failed request answers
// with its status in the response and the stream continues.
class RopeStreamReactor final : public grpc::ServerBidiReactor<v1::RopeRequest, v1::RopeResponse> {
 public:
  RopeStreamReactor(Engine* engine, grpc::CallbackServerContext* ctx)
      : engine_(engine), ctx_(ctx), run_(ContextOf(ctx)) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client half-closed (or left)
      Finish(grpc::Status::OK);
      return;
    }
    response_.Clear();
    absl::Status s = CheckCallAlive(ctx_);
    if (s.ok()) s = engine_->ApplyRope(request_, &response_, run_);
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
  grpc::CallbackServerContext* ctx_;
  RunContext run_;
  v1::RopeRequest request_;
  v1::RopeResponse response_;
};

}  // namespace

grpc::ServerUnaryReactor* PositionalEncodingService::ApplyRope(grpc::CallbackServerContext* ctx,
                                                               const v1::RopeRequest* req,
                                                               v1::RopeResponse* resp) {
  return Unary("ApplyRope", ctx, [&](const RunContext& rc) { return engine_->ApplyRope(*req, resp, rc); });
}

grpc::ServerBidiReactor<v1::RopeRequest, v1::RopeResponse>* PositionalEncodingService::StreamRope(
    grpc::CallbackServerContext* ctx) {
  return new RopeStreamReactor(engine_, ctx);
}

grpc::ServerUnaryReactor* PositionalEncodingService::AddAbsoluteEncoding(
    grpc::CallbackServerContext* ctx, const v1::AbsoluteEncodingRequest* req,
    v1::AbsoluteEncodingResponse* resp) {
  return Unary("AddAbsoluteEncoding", ctx,
               [&](const RunContext& rc) { return engine_->AddAbsoluteEncoding(*req, resp, rc); });
}

grpc::ServerUnaryReactor* PositionalEncodingService::GetEncodingTable(
    grpc::CallbackServerContext* ctx, const v1::EncodingTableRequest* req,
    v1::EncodingTableResponse* resp) {
  return Unary("GetEncodingTable", ctx,
               [&](const RunContext& rc) { return engine_->GetEncodingTable(*req, resp, rc); });
}

grpc::ServerUnaryReactor* PositionalEncodingService::AttentionBias(
    grpc::CallbackServerContext* ctx, const v1::AttentionBiasRequest* req,
    v1::AttentionBiasResponse* resp) {
  return Unary("AttentionBias", ctx,
               [&](const RunContext& rc) { return engine_->AttentionBias(*req, resp, rc); });
}

grpc::ServerUnaryReactor* PositionalEncodingService::ListTables(grpc::CallbackServerContext* ctx,
                                                                const v1::ListTablesRequest*,
                                                                v1::ListTablesResponse* resp) {
  return Unary("ListTables", ctx, [&](const RunContext&) {
    *resp = engine_->ListTables();
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* PositionalEncodingService::ReloadTables(grpc::CallbackServerContext* ctx,
                                                                  const v1::ReloadTablesRequest*,
                                                                  v1::ListTablesResponse* resp) {
  return Unary("ReloadTables", ctx, [&](const RunContext&) {
    *resp = engine_->ReloadTables();
    spdlog::info("tables reloaded: {} loaded, {} skipped", resp->tables_size(), resp->skipped_size());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* PositionalEncodingService::GetServerInfo(grpc::CallbackServerContext* ctx,
                                                                   const v1::GetServerInfoRequest*,
                                                                   v1::ServerInfo* resp) {
  return Unary("GetServerInfo", ctx, [&](const RunContext&) {
    *resp = engine_->GetServerInfo();
    return absl::OkStatus();
  });
}

}  // namespace posenc::server
