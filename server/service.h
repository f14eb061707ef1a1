// The gRPC callback service: translates calls into Engine calls and Engine
// errors into gRPC statuses (via ToGrpcStatus). No work lives here.
#ifndef POSENC_SERVER_SERVICE_H_
#define POSENC_SERVER_SERVICE_H_

#include "engine.h"
#include "metrics.h"
#include "posenc/v1/posenc.grpc.pb.h"
#include "request_executor.h"

namespace posenc::server {

class PositionalEncodingService final : public v1::PositionalEncoding::CallbackService {
 public:
  // `metrics` may be null (no metrics endpoint). Tensor work runs on
  // `executor`; everything else on gRPC's threads.
  PositionalEncodingService(Engine* engine, Metrics* metrics, RequestExecutor* executor)
      : engine_(engine), metrics_(metrics), executor_(executor) {}

  grpc::ServerUnaryReactor* ApplyRope(grpc::CallbackServerContext* ctx, const v1::RopeRequest* req,
                                      v1::RopeResponse* resp) override;
  grpc::ServerBidiReactor<v1::RopeRequest, v1::RopeResponse>* StreamRope(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* AddAbsoluteEncoding(grpc::CallbackServerContext* ctx,
                                                const v1::AbsoluteEncodingRequest* req,
                                                v1::AbsoluteEncodingResponse* resp) override;
  grpc::ServerUnaryReactor* GetEncodingTable(grpc::CallbackServerContext* ctx,
                                             const v1::EncodingTableRequest* req,
                                             v1::EncodingTableResponse* resp) override;
  grpc::ServerUnaryReactor* AttentionBias(grpc::CallbackServerContext* ctx,
                                          const v1::AttentionBiasRequest* req,
                                          v1::AttentionBiasResponse* resp) override;
  grpc::ServerUnaryReactor* ListTables(grpc::CallbackServerContext* ctx,
                                       const v1::ListTablesRequest* req,
                                       v1::ListTablesResponse* resp) override;
  grpc::ServerUnaryReactor* ReloadTables(grpc::CallbackServerContext* ctx,
                                         const v1::ReloadTablesRequest* req,
                                         v1::ListTablesResponse* resp) override;
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* ctx,
                                          const v1::GetServerInfoRequest* req,
                                          v1::ServerInfo* resp) override;

 private:
  Engine* engine_;
  Metrics* metrics_;
  RequestExecutor* executor_;
};

}  // namespace posenc::server

#endif  // POSENC_SERVER_SERVICE_H_
