#include "v1/control_service.h"

#include <chrono>

#include "rpc/call_support.h"
#include "rpc/status.h"
#include "v1/operations.h"
#include "spdlog/spdlog.h"

namespace posenc::server {
namespace {

// A small control-plane call, answered on the calling thread.
template <typename Response, typename Fn>
grpc::ServerUnaryReactor* Answer(const char* method, Metrics* metrics,
                                 grpc::CallbackServerContext* ctx, Response* resp, Fn fn) {
  const auto start = std::chrono::steady_clock::now();
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::Status s = CheckCallAlive(ctx);
  if (s.ok()) s = NoThrow(fn);
  LogFailure(method, s, RequestIdOf(ctx));
  RecordCall(metrics, method, s, start, 0, static_cast<int64_t>(resp->ByteSizeLong()), "");
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* PositionalEncodingService::ListTables(grpc::CallbackServerContext* ctx,
                                                                const v1::ListTablesRequest*,
                                                                v1::ListTablesResponse* resp) {
  return Answer("ListTables", metrics_, ctx, resp, [&] {
    *resp = server::ListTables(*engine_);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* PositionalEncodingService::ReloadTables(grpc::CallbackServerContext* ctx,
                                                                  const v1::ReloadTablesRequest*,
                                                                  v1::ListTablesResponse* resp) {
  const auto start = std::chrono::steady_clock::now();
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::Status alive = CheckCallAlive(ctx);
  if (!alive.ok()) {
    reactor->Finish(ToGrpcStatus(alive));
    return reactor;
  }
  Metrics* metrics = metrics_;
  Engine* engine = engine_;
  executor_->Submit([=] {
    absl::Status s = NoThrow([&] {
      engine->ReloadTables();
      *resp = server::ListTables(*engine);
      spdlog::info("tables reloaded: {} loaded, {} skipped", resp->tables_size(),
                   resp->skipped_size());
      return absl::OkStatus();
    });
    LogFailure("ReloadTables", s, RequestIdOf(ctx));
    RecordCall(metrics, "ReloadTables", s, start, 0, static_cast<int64_t>(resp->ByteSizeLong()),
               "");
    reactor->Finish(ToGrpcStatus(s));
  });
  return reactor;
}

grpc::ServerUnaryReactor* PositionalEncodingService::GetServerInfo(grpc::CallbackServerContext* ctx,
                                                                   const v1::GetServerInfoRequest*,
                                                                   v1::ServerInfo* resp) {
  return Answer("GetServerInfo", metrics_, ctx, resp, [&] {
    *resp = server::GetServerInfo(*engine_);
    return absl::OkStatus();
  });
}

}  // namespace posenc::server
