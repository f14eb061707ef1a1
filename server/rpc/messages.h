// The one parse path and the one answer path of every method either front
// serves: requests come as bytes (gRPC's generic API) and are parsed here,
// so a message that does not parse gets the same INVALID_ARGUMENT on every
// method, unary or streaming, tensor or control.
#ifndef POSENC_SERVER_RPC_MESSAGES_H_
#define POSENC_SERVER_RPC_MESSAGES_H_

#include <functional>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "google/protobuf/message.h"
#include "grpcpp/support/byte_buffer.h"
#include "posenc/status_macros.h"
#include "rpc/call.h"
#include "rpc/large_fields.h"

namespace posenc::server {

// Parses `message` from the bytes read, emptying `in`. The fields numbered
// in `large` (singular bytes fields) are copied once, straight from the
// received slices (large_fields.h). INVALID_ARGUMENT naming the message's
// type when the bytes are not one.
[[nodiscard]] absl::Status ParseMessage(grpc::ByteBuffer* in, google::protobuf::Message* message,
                                        absl::Span<const LargeField> large = {});

// ParseMessage on an admitted call: once parsed, the bytes read are gone,
// so the call holds the request once instead of twice.
[[nodiscard]] absl::Status ParseAdmitted(MethodCall& call, grpc::ByteBuffer* in,
                                         google::protobuf::Message* message,
                                         absl::Span<const LargeField> large = {});

// Serialises `message` into `out`. The fields numbered in `large` are moved
// out of it and handed to gRPC without a copy (the message is left without
// them).
[[nodiscard]] absl::Status SerializeMessage(google::protobuf::Message& message,
                                            grpc::ByteBuffer* out,
                                            absl::Span<const LargeField> large = {});

// A control method (small plain messages, not admitted): its request
// parsed, `work` done, its answer serialised. `kind` is kControl, or
// kControlIo when the work reads files.
template <typename Request, typename Response>
Method ControlMethod(const char* service, const char* name,
                     std::function<absl::Status(MethodCall&, const Request&, Response*)> work,
                     Method::Kind kind = Method::Kind::kControl) {
  Method m;
  m.service = service;
  m.name = name;
  m.kind = kind;
  m.run = [work = std::move(work)](MethodCall& call, grpc::ByteBuffer* in,
                                   grpc::ByteBuffer* out) -> absl::Status {
    Request request;
    POSENC_RETURN_IF_ERROR(ParseMessage(in, &request));
    Response response;
    POSENC_RETURN_IF_ERROR(work(call, request, &response));
    return SerializeMessage(response, out);
  };
  return m;
}

}  // namespace posenc::server

#endif  // POSENC_SERVER_RPC_MESSAGES_H_
