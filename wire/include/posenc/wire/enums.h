// Every enum posenc.v1 carries, translated to and from the kernel library's
// enums, and parsed from the names people type (flags, the CLI). Each pair is
// listed once (enums.cc); conversions are checked both ways, so the two
// numberings are free to differ and an unknown value is an error naming the
// field, never a silent default.
#ifndef POSENC_WIRE_ENUMS_H_
#define POSENC_WIRE_ENUMS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "posenc/attention_bias.h"
#include "posenc/backend.h"
#include "posenc/codes.h"
#include "posenc/rope.h"
#include "posenc/v1/posenc.pb.h"

namespace posenc::wire {

// Wire -> kernel. UNSPECIFIED takes the documented default of the field
// (BSHD, NEOX, no scaling, ...), except for a tensor's dtype, which must be
// set. Values the proto does not define are INVALID_ARGUMENT naming `field`.
[[nodiscard]] absl::StatusOr<DType> FromProto(absl::string_view field, v1::DataType v);
[[nodiscard]] absl::StatusOr<RopeLayout> FromProto(absl::string_view field, v1::RopeLayout v);
[[nodiscard]] absl::StatusOr<RopeStyle> FromProto(absl::string_view field, v1::RopeStyle v);
[[nodiscard]] absl::StatusOr<ScalingType> FromProto(absl::string_view field, v1::ScalingType v);
[[nodiscard]] absl::StatusOr<LongRopeMode> FromProto(absl::string_view field, v1::LongRopeMode v);
[[nodiscard]] absl::StatusOr<AxisMode> FromProto(absl::string_view field, v1::AxisMode v);
[[nodiscard]] absl::StatusOr<SinusoidalLayout> FromProto(absl::string_view field,
                                                         v1::SinusoidalLayout v);
[[nodiscard]] absl::StatusOr<BiasForm> FromProto(absl::string_view field, v1::BiasForm v);
[[nodiscard]] absl::StatusOr<BackendChoice> FromProto(absl::string_view field, v1::Backend v);

// Kernel -> wire. A value outside the kernel enum (only a cast could make
// one) becomes UNSPECIFIED, which the server then treats as above.
v1::DataType ToProto(DType v);
v1::RopeLayout ToProto(RopeLayout v);
v1::RopeStyle ToProto(RopeStyle v);
v1::ScalingType ToProto(ScalingType v);
v1::LongRopeMode ToProto(LongRopeMode v);
v1::AxisMode ToProto(AxisMode v);
v1::SinusoidalLayout ToProto(SinusoidalLayout v);
v1::BiasForm ToProto(BiasForm v);
v1::Backend ToProto(BackendChoice v);

// Text -> kernel, case-insensitive: the proto value's name without its
// prefix ("gptj", "BHSD", "dynamic_ntk", "bfloat16") or a common alias
// ("bf16", "fp32", "dynamic"). Anything else is INVALID_ARGUMENT naming
// `field` (e.g. "--style"), listing the accepted names and quoting the text.
template <typename Enum>
[[nodiscard]] absl::StatusOr<Enum> Parse(absl::string_view field, absl::string_view text);

// The canonical name Parse accepts for a value ("gptj", "bfloat16").
template <typename Enum>
std::string NameOf(Enum v);

// Every canonical name of an enum, in wire order (for help texts).
template <typename Enum>
std::vector<std::string> NamesOf();

}  // namespace posenc::wire

#endif  // POSENC_WIRE_ENUMS_H_
