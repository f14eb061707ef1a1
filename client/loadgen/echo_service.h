// The transport baseline: posenc's own service and messages, answering with
// the request's bytes and no computation (a table, or a bias built without
// logits, with zeros of the asked size). Loading it and posenc with the same
// requests makes the service's overhead a ratio.
#ifndef POSENC_LOADGEN_ECHO_SERVICE_H_
#define POSENC_LOADGEN_ECHO_SERVICE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "grpcpp/server.h"
#include "posenc/v1/posenc.grpc.pb.h"

namespace posenc::loadgen {

class EchoService final : public v1::PositionalEncoding::CallbackService {
 public:
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
};

// An echo server on `address` (port 0: any); returns it with its port.
struct EchoServer {
  std::unique_ptr<EchoService> service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};
[[nodiscard]] absl::StatusOr<EchoServer> StartEchoServer(const std::string& address);

// Moves the tensors of a RoPE request into a response, as posenc does.
void EchoRope(v1::RopeRequest* req, v1::RopeResponse* resp);

}  // namespace posenc::loadgen

#endif  // POSENC_LOADGEN_ECHO_SERVICE_H_
