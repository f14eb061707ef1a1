// A generated gRPC service registered with every method marked generic: the
// service is known to the server (reflection lists and describes it) while
// CallRouter serves each of its methods (call_router.h says why).
#ifndef POSENC_SERVER_RPC_GENERIC_SERVICE_H_
#define POSENC_SERVER_RPC_GENERIC_SERVICE_H_

#include <string>

#include "google/protobuf/descriptor.h"
#include "grpcpp/impl/codegen/server_callback_handlers.h"
#include "grpcpp/impl/rpc_service_method.h"
#include "grpcpp/support/byte_buffer.h"

namespace posenc::server {

// `Grpc` is the generated outer class (v1::PositionalEncoding,
// inference::GRPCInferenceService).
template <typename Grpc>
class GenericallyServed : public Grpc::Service {
 public:
  GenericallyServed() : anchor_(std::string("/") + Grpc::service_full_name() + "/-anchor") {
    const google::protobuf::ServiceDescriptor* d =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
            Grpc::service_full_name());
    // The generated constructor adds the methods in the proto's order.
    for (int i = 0; d != nullptr && i < d->method_count(); ++i) this->MarkMethodGeneric(i);
    // gRPC lists (for reflection) only the services it holds a handler of,
    // and with every method generic it holds none of these. So one more
    // method, whose name no proto method can have, answers UNIMPLEMENTED as
    // an unknown method does.
    auto* anchor = new grpc::internal::RpcServiceMethod(
        anchor_.c_str(), grpc::internal::RpcMethod::NORMAL_RPC,
        new grpc::internal::CallbackUnaryHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
            [](grpc::CallbackServerContext* ctx, const grpc::ByteBuffer*, grpc::ByteBuffer*) {
              grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
              reactor->Finish(
                  grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "this method is not served"));
              return reactor;
            }));
    anchor->SetServerApiType(grpc::internal::RpcServiceMethod::ApiType::RAW_CALL_BACK);
    this->AddMethod(anchor);
  }

 private:
  const std::string anchor_;  // its path; gRPC keeps a pointer to it
};

}  // namespace posenc::server

#endif  // POSENC_SERVER_RPC_GENERIC_SERVICE_H_
