#include "rpc/reflection_v1.h"

#include "grpcpp/impl/rpc_method.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/channel_arguments.h"
#include "grpcpp/support/sync_stream.h"

namespace posenc::server {
namespace {

constexpr char kV1alphaMethod[] = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";

// A message as bytes, and back: the relay never interprets them.
bool ToBytes(const google::protobuf::Message& m, grpc::ByteBuffer* out) {
  std::string bytes;
  if (!m.SerializeToString(&bytes)) return false;
  grpc::Slice slice(bytes);
  *out = grpc::ByteBuffer(&slice, 1);
  return true;
}

bool FromBytes(const grpc::ByteBuffer& in, google::protobuf::Message* m) {
  grpc::Slice joined;
  if (!in.DumpToSingleSlice(&joined).ok()) return false;
  return m->ParseFromArray(joined.begin(), static_cast<int>(joined.size()));
}

}  // namespace

void ReflectionV1Service::Attach(grpc::Server* server) {
  channel_ = server->InProcessChannel(grpc::ChannelArguments());
  attached_.store(true);
}

grpc::Status ReflectionV1Service::ServerReflectionInfo(
    grpc::ServerContext* ctx,
    grpc::ServerReaderWriter<grpc::reflection::v1::ServerReflectionResponse,
                             grpc::reflection::v1::ServerReflectionRequest>* stream) {
  if (!attached_.load()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "reflection is not ready yet");
  }
  grpc::ClientContext inner_ctx;
  inner_ctx.set_deadline(ctx->deadline());
  // The generated stubs' own factory, for a method we only know by name
  // (the v1alpha messages are compiled into gRPC's library, not ours).
  const grpc::internal::RpcMethod method(kV1alphaMethod, grpc::internal::RpcMethod::BIDI_STREAMING,
                                         channel_);
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> inner(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          channel_.get(), method, &inner_ctx));
  grpc::reflection::v1::ServerReflectionRequest request;
  while (stream->Read(&request)) {
    grpc::ByteBuffer out, in;
    grpc::reflection::v1::ServerReflectionResponse response;
    if (!ToBytes(request, &out) || !inner->Write(out) || !inner->Read(&in) ||
        !FromBytes(in, &response)) {
      inner_ctx.TryCancel();
      inner->Finish().IgnoreError();
      return grpc::Status(grpc::StatusCode::INTERNAL, "the v1alpha reflection service failed");
    }
    if (!stream->Write(response)) break;
    if (ctx->IsCancelled()) break;
  }
  inner->WritesDone();
  const grpc::Status s = inner->Finish();
  return s.ok() ? grpc::Status::OK : s;
}

}  // namespace posenc::server
