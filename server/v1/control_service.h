// The typed half of the posenc.v1.PositionalEncoding service: the small
// control-plane RPCs (ListTables, ReloadTables, GetServerInfo) as callback
// handlers. The tensor RPCs are marked generic here and served by
// TensorCallService (tensor_calls.h), which admits a call before reading it.
// Registering this class also lists the whole service for reflection.
#ifndef POSENC_SERVER_V1_CONTROL_SERVICE_H_
#define POSENC_SERVER_V1_CONTROL_SERVICE_H_

#include "engine/engine.h"
#include "rpc/metrics.h"
#include "posenc/v1/posenc.grpc.pb.h"
#include "engine/request_executor.h"

namespace posenc::server {

using PositionalEncodingBase = v1::PositionalEncoding::WithGenericMethod_ApplyRope<
    v1::PositionalEncoding::WithGenericMethod_StreamRope<
        v1::PositionalEncoding::WithGenericMethod_AddAbsoluteEncoding<
            v1::PositionalEncoding::WithGenericMethod_GetEncodingTable<
                v1::PositionalEncoding::WithGenericMethod_AttentionBias<
                    v1::PositionalEncoding::WithCallbackMethod_ListTables<
                        v1::PositionalEncoding::WithCallbackMethod_ReloadTables<
                            v1::PositionalEncoding::WithCallbackMethod_GetServerInfo<
                                v1::PositionalEncoding::Service>>>>>>>>;

class PositionalEncodingService final : public PositionalEncodingBase {
 public:
  // `metrics` may be null (no metrics endpoint). ReloadTables reads files,
  // so it runs on `executor`, never on gRPC's threads.
  PositionalEncodingService(Engine* engine, Metrics* metrics, RequestExecutor* executor)
      : engine_(engine), metrics_(metrics), executor_(executor) {}

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

#endif  // POSENC_SERVER_V1_CONTROL_SERVICE_H_
