// grpc.reflection.v1.ServerReflection for a server whose gRPC library (1.51,
// Debian 12) serves only v1alpha. The two versions' messages are identical
// on the wire, so each v1 request is relayed as bytes to the v1alpha service
// of the same server over an in-process channel, and its answer relayed
// back: one source of truth for what the server describes.
#ifndef POSENC_SERVER_RPC_REFLECTION_V1_H_
#define POSENC_SERVER_RPC_REFLECTION_V1_H_

#include <atomic>
#include <memory>

#include "grpc/reflection/v1/reflection.grpc.pb.h"
#include "grpcpp/channel.h"
#include "grpcpp/server.h"

namespace posenc::server {

class ReflectionV1Service final : public grpc::reflection::v1::ServerReflection::Service {
 public:
  // Until then calls are UNAVAILABLE. REQUIRES: `server` has the v1alpha
  // reflection service and outlives this object.
  void Attach(grpc::Server* server);

  grpc::Status ServerReflectionInfo(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<grpc::reflection::v1::ServerReflectionResponse,
                               grpc::reflection::v1::ServerReflectionRequest>* stream) override;

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::atomic<bool> attached_{false};
};

}  // namespace posenc::server

#endif  // POSENC_SERVER_RPC_REFLECTION_V1_H_
