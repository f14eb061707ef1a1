// The posenc.v1.PositionalEncoding service: registered with gRPC with every
// method generic, so reflection describes it, while CallRouter
// (rpc/call_router.h) serves each method from Methods(): the tensor methods
// (tensor_methods.h) and the control methods ListTables, ReloadTables and
// GetServerInfo.
#ifndef POSENC_SERVER_V1_SERVICE_H_
#define POSENC_SERVER_V1_SERVICE_H_

#include <vector>

#include "engine/engine.h"
#include "posenc/v1/posenc.grpc.pb.h"
#include "rpc/call.h"
#include "rpc/generic_service.h"

namespace posenc::server {

class PositionalEncodingService final : public GenericallyServed<v1::PositionalEncoding> {
 public:
  // `transport_bytes`: the transport's memory cap, for GetServerInfo
  // (ServerOptions::transport_memory_limit; 0: none).
  explicit PositionalEncodingService(Engine* engine, int64_t transport_bytes = 0)
      : engine_(engine), transport_bytes_(transport_bytes) {}

  std::vector<Method> Methods() const;

 private:
  Engine* engine_;
  int64_t transport_bytes_;
};

}  // namespace posenc::server

#endif  // POSENC_SERVER_V1_SERVICE_H_
