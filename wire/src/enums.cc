#include "posenc/wire/enums.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace posenc::wire {
namespace {

// One row per value: the kernel value, the wire value, the canonical name
// and any aliases people type.
template <typename Kernel, typename Wire>
struct Row {
  Kernel kernel;
  Wire wire;
  const char* name;
  std::vector<const char*> aliases;
};

template <typename Kernel, typename Wire>
struct Table {
  std::vector<Row<Kernel, Wire>> rows;
  // The row UNSPECIFIED means for this field; -1: it must be set.
  int unspecified_default = -1;
};

template <typename Kernel, typename Wire>
std::string WireName(Wire v) {
  const google::protobuf::EnumValueDescriptor* d =
      google::protobuf::GetEnumDescriptor<Wire>()->FindValueByNumber(static_cast<int>(v));
  return d == nullptr ? std::to_string(static_cast<int>(v)) : d->name();
}

template <typename Kernel, typename Wire>
std::string Accepted(const Table<Kernel, Wire>& t) {
  std::vector<std::string> names;
  for (const auto& r : t.rows) names.push_back(WireName<Kernel, Wire>(r.wire));
  return absl::StrJoin(names, ", ");
}

template <typename Kernel, typename Wire>
absl::StatusOr<Kernel> Decode(const Table<Kernel, Wire>& t, absl::string_view field, Wire v) {
  for (const auto& r : t.rows) {
    if (r.wire == v) return r.kernel;
  }
  if (static_cast<int>(v) == 0 && t.unspecified_default >= 0) {
    return t.rows[t.unspecified_default].kernel;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, " must be one of ", Accepted(t), "; got ", WireName<Kernel, Wire>(v)));
}

template <typename Kernel, typename Wire>
Wire Encode(const Table<Kernel, Wire>& t, Kernel v) {
  for (const auto& r : t.rows) {
    if (r.kernel == v) return r.wire;
  }
  return static_cast<Wire>(0);
}

template <typename Kernel, typename Wire>
absl::StatusOr<Kernel> ParseText(const Table<Kernel, Wire>& t, absl::string_view field,
                                 absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  std::vector<std::string> names;
  for (const auto& r : t.rows) {
    if (lower == r.name) return r.kernel;
    for (const char* a : r.aliases) {
      if (lower == a) return r.kernel;
    }
    names.push_back(r.name);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, " must be one of ", absl::StrJoin(names, ", "), " (any case); got '", text, "'"));
}

template <typename Kernel, typename Wire>
std::string NameIn(const Table<Kernel, Wire>& t, Kernel v) {
  for (const auto& r : t.rows) {
    if (r.kernel == v) return r.name;
  }
  return absl::StrCat("unknown(", static_cast<int>(v), ")");
}

template <typename Kernel, typename Wire>
std::vector<std::string> AllNames(const Table<Kernel, Wire>& t) {
  std::vector<std::string> out;
  for (const auto& r : t.rows) out.push_back(r.name);
  return out;
}

// ------------------------------------------------------------- the tables --

const Table<DType, v1::DataType>& DTypes() {
  static const auto& t = *new Table<DType, v1::DataType>{{
      {DType::kFloat32, v1::DATA_TYPE_FLOAT32, "float32", {"f32", "fp32", "float"}},
      {DType::kFloat16, v1::DATA_TYPE_FLOAT16, "float16", {"f16", "fp16", "half"}},
      {DType::kBFloat16, v1::DATA_TYPE_BFLOAT16, "bfloat16", {"bf16"}},
      {DType::kInt32, v1::DATA_TYPE_INT32, "int32", {"i32"}},
      {DType::kInt64, v1::DATA_TYPE_INT64, "int64", {"i64"}},
  }};
  return t;
}

// Tables are leaked on purpose: they live for the process, so no
// destruction-order question arises at exit.
template <typename Kernel, typename Wire>
const Table<Kernel, Wire>& WithDefault(std::vector<Row<Kernel, Wire>> rows, int default_index) {
  return *new Table<Kernel, Wire>{std::move(rows), default_index};
}

const Table<RopeLayout, v1::RopeLayout>& Layouts() {
  static const auto& t = WithDefault<RopeLayout, v1::RopeLayout>(
      {{RopeLayout::kBSHD, v1::ROPE_LAYOUT_BSHD, "bshd"},
       {RopeLayout::kBHSD, v1::ROPE_LAYOUT_BHSD, "bhsd"},
       {RopeLayout::kTHD, v1::ROPE_LAYOUT_THD, "thd", {"packed", "varlen"}}},
      0);
  return t;
}

const Table<RopeStyle, v1::RopeStyle>& Styles() {
  static const auto& t = WithDefault<RopeStyle, v1::RopeStyle>(
      {{RopeStyle::kNeox, v1::ROPE_STYLE_NEOX, "neox", {"gpt-neox", "rotate_half", "llama"}},
       {RopeStyle::kGptj, v1::ROPE_STYLE_GPTJ, "gptj", {"gpt-j", "interleaved"}}},
      0);
  return t;
}

const Table<ScalingType, v1::ScalingType>& Scalings() {
  static const auto& t = WithDefault<ScalingType, v1::ScalingType>(
      {{ScalingType::kNone, v1::SCALING_TYPE_NONE, "none", {"default"}},
       {ScalingType::kLinear, v1::SCALING_TYPE_LINEAR, "linear"},
       {ScalingType::kDynamicNtk, v1::SCALING_TYPE_DYNAMIC_NTK, "dynamic_ntk", {"dynamic", "ntk"}},
       {ScalingType::kYarn, v1::SCALING_TYPE_YARN, "yarn"},
       {ScalingType::kLlama3, v1::SCALING_TYPE_LLAMA3, "llama3"},
       {ScalingType::kLongRope, v1::SCALING_TYPE_LONGROPE, "longrope", {"su"}},
       {ScalingType::kExplicit, v1::SCALING_TYPE_EXPLICIT, "explicit"}},
      0);
  return t;
}

const Table<LongRopeMode, v1::LongRopeMode>& LongRopeModes() {
  static const auto& t = WithDefault<LongRopeMode, v1::LongRopeMode>(
      {{LongRopeMode::kBySequenceLength, v1::LONGROPE_MODE_BY_SEQUENCE_LENGTH,
        "by_sequence_length"},
       {LongRopeMode::kShort, v1::LONGROPE_MODE_SHORT, "short"},
       {LongRopeMode::kLong, v1::LONGROPE_MODE_LONG, "long"}},
      0);
  return t;
}

const Table<AxisMode, v1::AxisMode>& AxisModes() {
  static const auto& t = WithDefault<AxisMode, v1::AxisMode>(
      {{AxisMode::kSingle, v1::AXIS_MODE_SINGLE, "single"},
       {AxisMode::kAxial, v1::AXIS_MODE_AXIAL, "axial"},
       {AxisMode::kMrope, v1::AXIS_MODE_MROPE, "mrope"},
       {AxisMode::kMropeInterleaved, v1::AXIS_MODE_MROPE_INTERLEAVED, "mrope_interleaved"}},
      0);
  return t;
}

const Table<SinusoidalLayout, v1::SinusoidalLayout>& SinusoidalLayouts() {
  static const auto& t = WithDefault<SinusoidalLayout, v1::SinusoidalLayout>(
      {{SinusoidalLayout::kInterleaved, v1::SINUSOIDAL_LAYOUT_INTERLEAVED, "interleaved"},
       {SinusoidalLayout::kConcatenated,
        v1::SINUSOIDAL_LAYOUT_CONCATENATED,
        "concatenated",
        {"fairseq", "tensor2tensor"}}},
      0);
  return t;
}

const Table<BiasForm, v1::BiasForm>& BiasForms() {
  // UNSPECIFIED is CAUSAL (ALiBi's own form), the second row.
  static const auto& t = WithDefault<BiasForm, v1::BiasForm>(
      {{BiasForm::kNone, v1::BIAS_FORM_NONE, "none"},
       {BiasForm::kCausal, v1::BIAS_FORM_CAUSAL, "causal"},
       {BiasForm::kSymmetric, v1::BIAS_FORM_SYMMETRIC, "symmetric"}},
      1);
  return t;
}

const Table<BackendChoice, v1::Backend>& Backends() {
  // kDefault is the wire's UNSPECIFIED itself: a caller may name it.
  static const auto& t = *new Table<BackendChoice, v1::Backend>{{
      {BackendChoice::kDefault, v1::BACKEND_UNSPECIFIED, "default", {"server", ""}},
      {BackendChoice::kAuto, v1::BACKEND_AUTO, "auto"},
      {BackendChoice::kCpu, v1::BACKEND_CPU, "cpu"},
      {BackendChoice::kCuda, v1::BACKEND_CUDA, "cuda", {"gpu"}},
  }};
  return t;
}

}  // namespace

#define POSENC_WIRE_ENUM(Kernel, Wire, table)                                             \
  absl::StatusOr<Kernel> FromProto(absl::string_view field, Wire v) {                     \
    return Decode(table(), field, v);                                                     \
  }                                                                                       \
  Wire ToProto(Kernel v) { return Encode(table(), v); }                                   \
  template <>                                                                             \
  absl::StatusOr<Kernel> Parse<Kernel>(absl::string_view field, absl::string_view text) { \
    return ParseText(table(), field, text);                                               \
  }                                                                                       \
  template <>                                                                             \
  std::string NameOf<Kernel>(Kernel v) {                                                  \
    return NameIn(table(), v);                                                            \
  }                                                                                       \
  template <>                                                                             \
  std::vector<std::string> NamesOf<Kernel>() {                                            \
    return AllNames(table());                                                             \
  }

POSENC_WIRE_ENUM(DType, v1::DataType, DTypes)
POSENC_WIRE_ENUM(RopeLayout, v1::RopeLayout, Layouts)
POSENC_WIRE_ENUM(RopeStyle, v1::RopeStyle, Styles)
POSENC_WIRE_ENUM(ScalingType, v1::ScalingType, Scalings)
POSENC_WIRE_ENUM(LongRopeMode, v1::LongRopeMode, LongRopeModes)
POSENC_WIRE_ENUM(AxisMode, v1::AxisMode, AxisModes)
POSENC_WIRE_ENUM(SinusoidalLayout, v1::SinusoidalLayout, SinusoidalLayouts)
POSENC_WIRE_ENUM(BiasForm, v1::BiasForm, BiasForms)
POSENC_WIRE_ENUM(BackendChoice, v1::Backend, Backends)

#undef POSENC_WIRE_ENUM

}  // namespace posenc::wire
