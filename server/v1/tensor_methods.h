// The posenc.v1 tensor methods (ApplyRope, StreamRope, AddAbsoluteEncoding,
// GetEncodingTable, AttentionBias) as Methods of the call lifecycle
// (rpc/call.h): each message parsed with its tensor bytes copied once and
// answered without a copy (rpc/large_fields.h), the work done by
// operations.h on the engine.
#ifndef POSENC_SERVER_V1_TENSOR_METHODS_H_
#define POSENC_SERVER_V1_TENSOR_METHODS_H_

#include <vector>

#include "engine/engine.h"
#include "rpc/call.h"

namespace posenc::server {

inline constexpr char kPositionalEncodingService[] = "posenc.v1.PositionalEncoding";

std::vector<Method> TensorMethods(Engine* engine);

}  // namespace posenc::server

#endif  // POSENC_SERVER_V1_TENSOR_METHODS_H_
