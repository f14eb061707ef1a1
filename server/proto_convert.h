// Translation between posenc.v1 messages and the kernel library's types.
// Errors name the request field (e.g. "query.dtype").
#ifndef POSENC_SERVER_PROTO_CONVERT_H_
#define POSENC_SERVER_PROTO_CONVERT_H_

#include <string>

#include "absl/status/statusor.h"
#include "posenc/absolute.h"
#include "posenc/attention_bias.h"
#include "posenc/rope.h"
#include "posenc/v1/posenc.pb.h"

namespace posenc::server {

[[nodiscard]] absl::StatusOr<DType> FromProto(absl::string_view field, v1::DataType dtype);
v1::DataType ToProto(DType dtype);

// A view of a small inline tensor; absent when the message is unset.
[[nodiscard]] absl::StatusOr<TensorView> ViewOf(absl::string_view field, bool has,
                                                const v1::Tensor& t);

// A writable view over `data` described by `desc`.
[[nodiscard]] absl::StatusOr<MutableTensor> MutableOf(absl::string_view field,
                                                      const v1::TensorDesc& desc,
                                                      std::string* data);

[[nodiscard]] absl::StatusOr<RopeOptions> RopeOptionsOf(const v1::RopeRequest& req);
[[nodiscard]] absl::StatusOr<SinusoidalLayout> SinusoidalLayoutOf(v1::SinusoidalLayout l);
[[nodiscard]] absl::StatusOr<BiasForm> BiasFormOf(v1::BiasForm f);

}  // namespace posenc::server

#endif  // POSENC_SERVER_PROTO_CONVERT_H_
