// The one place where posenc's absl::Status becomes a grpc::Status.
#ifndef POSENC_SERVER_RPC_STATUS_H_
#define POSENC_SERVER_RPC_STATUS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace posenc::server {

// Canonical codes map 1:1 (absl and gRPC share the numbering); the message
// is kept verbatim.
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace posenc::server

#endif  // POSENC_SERVER_RPC_STATUS_H_
