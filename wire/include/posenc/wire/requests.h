// The options of each posenc.v1 request, translated both ways: the server
// reads requests into kernel options (errors name the field); clients, the
// CLI, posenc-loadgen and tests write kernel options into requests. Tensors
// are in tensors.h; enums in enums.h.
#ifndef POSENC_WIRE_REQUESTS_H_
#define POSENC_WIRE_REQUESTS_H_

#include "absl/status/statusor.h"
#include "posenc/absolute.h"
#include "posenc/attention_bias.h"
#include "posenc/rope.h"
#include "posenc/v1/posenc.pb.h"

namespace posenc::wire {

// RoPE options (layout, style, rotary_dim, base, inverse, axes, scaling).
[[nodiscard]] absl::StatusOr<RopeOptions> RopeOptionsOf(const v1::RopeRequest& req);
void SetRopeOptions(const RopeOptions& o, v1::RopeRequest* req);

// The encoding of an absolute-encoding or table request: sinusoidal (layout,
// base) or learned (table_name; `table` is left for the server to resolve),
// and x_scale. An unset encoding is INVALID_ARGUMENT.
[[nodiscard]] absl::StatusOr<AbsoluteOptions> AbsoluteOptionsOf(
    const v1::AbsoluteEncodingRequest& req);
[[nodiscard]] absl::StatusOr<AbsoluteOptions> AbsoluteOptionsOf(
    const v1::EncodingTableRequest& req);
void SetAbsoluteOptions(const AbsoluteOptions& o, v1::AbsoluteEncodingRequest* req);
void SetAbsoluteOptions(const AbsoluteOptions& o, v1::EncodingTableRequest* req);

// Attention-bias options; k_lens and k_starts are views into `req`, which
// must outlive the result. UNSPECIFIED dtype is FLOAT32.
[[nodiscard]] absl::StatusOr<BiasOptions> BiasOptionsOf(const v1::AttentionBiasRequest& req);
void SetBiasOptions(const BiasOptions& o, v1::AttentionBiasRequest* req);

}  // namespace posenc::wire

#endif  // POSENC_WIRE_REQUESTS_H_
