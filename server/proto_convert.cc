#include "proto_convert.h"

#include "absl/strings/str_cat.h"
#include "posenc/status_macros.h"

namespace posenc::server {
namespace {

template <typename Enum>
absl::Status UnknownEnum(absl::string_view field, Enum v, const std::string& name) {
  return absl::InvalidArgumentError(absl::StrCat(field, " has unknown value ", static_cast<int>(v),
                                                 name.empty() ? "" : " (", name,
                                                 name.empty() ? "" : ")"));
}

}  // namespace

absl::StatusOr<DType> FromProto(absl::string_view field, v1::DataType dtype) {
  switch (dtype) {
    case v1::DATA_TYPE_FLOAT32:
      return DType::kFloat32;
    case v1::DATA_TYPE_FLOAT16:
      return DType::kFloat16;
    case v1::DATA_TYPE_BFLOAT16:
      return DType::kBFloat16;
    case v1::DATA_TYPE_INT32:
      return DType::kInt32;
    case v1::DATA_TYPE_INT64:
      return DType::kInt64;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          field, " must be set to a DataType (FLOAT32, FLOAT16, BFLOAT16, INT32, INT64), got ",
          v1::DataType_Name(dtype).empty() ? std::to_string(dtype) : v1::DataType_Name(dtype)));
  }
}

v1::DataType ToProto(DType dtype) { return static_cast<v1::DataType>(static_cast<int>(dtype)); }

absl::StatusOr<TensorView> ViewOf(absl::string_view field, bool has, const v1::Tensor& t) {
  TensorView v;
  if (!has) return v;
  POSENC_ASSIGN_OR_RETURN(v.dtype, FromProto(absl::StrCat(field, ".dtype"), t.dtype()));
  v.shape.assign(t.shape().begin(), t.shape().end());
  v.data = t.data().data();
  v.nbytes = t.data().size();
  POSENC_RETURN_IF_ERROR(ValidateTensorBytes(field, v.dtype, v.shape, v.nbytes));
  return v;
}

absl::StatusOr<MutableTensor> MutableOf(absl::string_view field, const v1::TensorDesc& desc,
                                        std::string* data) {
  MutableTensor t;
  POSENC_ASSIGN_OR_RETURN(t.dtype, FromProto(absl::StrCat(field, ".dtype"), desc.dtype()));
  t.shape.assign(desc.shape().begin(), desc.shape().end());
  t.data = data->data();
  t.nbytes = data->size();
  POSENC_RETURN_IF_ERROR(ValidateTensorBytes(field, t.dtype, t.shape, t.nbytes));
  return t;
}

absl::StatusOr<RopeOptions> RopeOptionsOf(const v1::RopeRequest& req) {
  RopeOptions o;
  switch (req.layout()) {
    case v1::ROPE_LAYOUT_UNSPECIFIED:
    case v1::ROPE_LAYOUT_BSHD:
      o.layout = RopeLayout::kBSHD;
      break;
    case v1::ROPE_LAYOUT_BHSD:
      o.layout = RopeLayout::kBHSD;
      break;
    case v1::ROPE_LAYOUT_THD:
      o.layout = RopeLayout::kTHD;
      break;
    default:
      return UnknownEnum("layout", req.layout(), "");
  }
  switch (req.style()) {
    case v1::ROPE_STYLE_UNSPECIFIED:
    case v1::ROPE_STYLE_NEOX:
      o.style = RopeStyle::kNeox;
      break;
    case v1::ROPE_STYLE_GPTJ:
      o.style = RopeStyle::kGptj;
      break;
    default:
      return UnknownEnum("style", req.style(), "");
  }
  o.rotary_dim = req.rotary_dim();
  o.base = req.has_base() ? req.base() : 10000.0;
  o.inverse = req.inverse();
  switch (req.axis_mode()) {
    case v1::AXIS_MODE_UNSPECIFIED:
    case v1::AXIS_MODE_SINGLE:
      o.axis_mode = AxisMode::kSingle;
      break;
    case v1::AXIS_MODE_AXIAL:
      o.axis_mode = AxisMode::kAxial;
      break;
    case v1::AXIS_MODE_MROPE:
      o.axis_mode = AxisMode::kMrope;
      break;
    case v1::AXIS_MODE_MROPE_INTERLEAVED:
      o.axis_mode = AxisMode::kMropeInterleaved;
      break;
    default:
      return UnknownEnum("axis_mode", req.axis_mode(), "");
  }
  o.axis_dims.assign(req.axis_dims().begin(), req.axis_dims().end());
  o.sections.assign(req.sections().begin(), req.sections().end());
  if (o.axis_mode == AxisMode::kSingle && (!o.axis_dims.empty() || !o.sections.empty())) {
    return absl::InvalidArgumentError(
        "axis_dims / sections need axis_mode AXIAL / MROPE; axis_mode is SINGLE");
  }

  const v1::RopeScaling& s = req.scaling();
  RopeScaling& r = o.scaling;
  switch (s.type()) {
    case v1::SCALING_TYPE_UNSPECIFIED:
    case v1::SCALING_TYPE_NONE:
      r.type = ScalingType::kNone;
      break;
    case v1::SCALING_TYPE_LINEAR:
      r.type = ScalingType::kLinear;
      break;
    case v1::SCALING_TYPE_DYNAMIC_NTK:
      r.type = ScalingType::kDynamicNtk;
      break;
    case v1::SCALING_TYPE_YARN:
      r.type = ScalingType::kYarn;
      break;
    case v1::SCALING_TYPE_LLAMA3:
      r.type = ScalingType::kLlama3;
      break;
    case v1::SCALING_TYPE_LONGROPE:
      r.type = ScalingType::kLongRope;
      break;
    case v1::SCALING_TYPE_EXPLICIT:
      r.type = ScalingType::kExplicit;
      break;
    default:
      return UnknownEnum("scaling.type", s.type(), "");
  }
  if (s.has_factor()) r.factor = s.factor();
  if (s.has_original_max_position()) r.original_max_position = s.original_max_position();
  if (s.has_beta_fast()) r.beta_fast = s.beta_fast();
  if (s.has_beta_slow()) r.beta_slow = s.beta_slow();
  if (s.has_mscale()) r.mscale = s.mscale();
  if (s.has_mscale_all_dim()) r.mscale_all_dim = s.mscale_all_dim();
  if (s.has_attention_factor()) r.attention_factor = s.attention_factor();
  r.truncate = s.has_truncate() ? s.truncate() : true;
  if (s.has_low_freq_factor()) r.low_freq_factor = s.low_freq_factor();
  if (s.has_high_freq_factor()) r.high_freq_factor = s.high_freq_factor();
  r.short_factor.assign(s.short_factor().begin(), s.short_factor().end());
  r.long_factor.assign(s.long_factor().begin(), s.long_factor().end());
  r.inv_freq.assign(s.inv_freq().begin(), s.inv_freq().end());
  switch (s.longrope_mode()) {
    case v1::LONGROPE_MODE_UNSPECIFIED:
    case v1::LONGROPE_MODE_BY_SEQUENCE_LENGTH:
      r.longrope_mode = LongRopeMode::kBySequenceLength;
      break;
    case v1::LONGROPE_MODE_SHORT:
      r.longrope_mode = LongRopeMode::kShort;
      break;
    case v1::LONGROPE_MODE_LONG:
      r.longrope_mode = LongRopeMode::kLong;
      break;
    default:
      return UnknownEnum("scaling.longrope_mode", s.longrope_mode(), "");
  }
  return o;
}

absl::StatusOr<SinusoidalLayout> SinusoidalLayoutOf(v1::SinusoidalLayout l) {
  switch (l) {
    case v1::SINUSOIDAL_LAYOUT_UNSPECIFIED:
    case v1::SINUSOIDAL_LAYOUT_INTERLEAVED:
      return SinusoidalLayout::kInterleaved;
    case v1::SINUSOIDAL_LAYOUT_CONCATENATED:
      return SinusoidalLayout::kConcatenated;
    default:
      return UnknownEnum("sinusoidal.layout", l, "");
  }
}

absl::StatusOr<BiasForm> BiasFormOf(v1::BiasForm f) {
  switch (f) {
    case v1::BIAS_FORM_UNSPECIFIED:
    case v1::BIAS_FORM_CAUSAL:
      return BiasForm::kCausal;
    case v1::BIAS_FORM_NONE:
      return BiasForm::kNone;
    case v1::BIAS_FORM_SYMMETRIC:
      return BiasForm::kSymmetric;
    default:
      return UnknownEnum("form", f, "");
  }
}

}  // namespace posenc::server
