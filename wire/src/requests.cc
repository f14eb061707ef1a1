#include "posenc/wire/requests.h"

#include "absl/strings/str_cat.h"
#include "posenc/status_macros.h"
#include "posenc/wire/enums.h"
#include "posenc/wire/hf_config.h"
#include "posenc/wire/tensors.h"

namespace posenc::wire {
namespace {

constexpr double kDefaultBase = 10000.0;

template <typename Encoding>
absl::Status ReadEncoding(const Encoding& req, AbsoluteOptions* o) {
  if (req.has_sinusoidal()) {
    o->kind = AbsoluteOptions::Kind::kSinusoidal;
    POSENC_ASSIGN_OR_RETURN(o->sinusoidal_layout,
                            FromProto("sinusoidal.layout", req.sinusoidal().layout()));
    o->base = req.sinusoidal().has_base() ? req.sinusoidal().base() : kDefaultBase;
    return absl::OkStatus();
  }
  if (req.has_learned()) {
    o->kind = AbsoluteOptions::Kind::kLearned;
    o->table_name = req.learned().table_name();
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError("encoding must be set: sinusoidal or learned");
}

template <typename Encoding>
void WriteEncoding(const AbsoluteOptions& o, Encoding* req) {
  if (o.kind == AbsoluteOptions::Kind::kLearned) {
    req->mutable_learned()->set_table_name(
        o.table != nullptr && o.table_name.empty() ? o.table->name : o.table_name);
    return;
  }
  v1::SinusoidalEncoding* s = req->mutable_sinusoidal();
  s->set_layout(ToProto(o.sinusoidal_layout));
  s->set_base(o.base);
}

}  // namespace

absl::StatusOr<RopeOptions> RopeOptionsOf(const v1::RopeRequest& req) {
  RopeOptions o;
  POSENC_ASSIGN_OR_RETURN(o.layout, FromProto("layout", req.layout()));
  POSENC_ASSIGN_OR_RETURN(o.style, FromProto("style", req.style()));
  o.rotary_dim = req.rotary_dim();
  o.base = req.has_base() ? req.base() : kDefaultBase;
  o.inverse = req.inverse();
  POSENC_ASSIGN_OR_RETURN(o.axis_mode, FromProto("axis_mode", req.axis_mode()));
  o.axis_dims.assign(req.axis_dims().begin(), req.axis_dims().end());
  o.sections.assign(req.sections().begin(), req.sections().end());
  if (o.axis_mode == AxisMode::kSingle && (!o.axis_dims.empty() || !o.sections.empty())) {
    return absl::InvalidArgumentError(
        "axis_dims / sections need axis_mode AXIAL / MROPE; axis_mode is SINGLE");
  }

  const v1::RopeScaling& s = req.scaling();
  RopeScaling& r = o.scaling;
  POSENC_ASSIGN_OR_RETURN(r.type, FromProto("scaling.type", s.type()));
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
  POSENC_ASSIGN_OR_RETURN(r.longrope_mode, FromProto("scaling.longrope_mode", s.longrope_mode()));
  if (!req.hf_config().empty()) {
    POSENC_ASSIGN_OR_RETURN(const HfRope hf, ResolveHfRopeCached(req.hf_config()));
    ExplicitRopeFields given;
    given.style = req.style() != v1::ROPE_STYLE_UNSPECIFIED;
    given.rotary_dim = req.rotary_dim() != 0;
    given.base = req.has_base();
    given.scaling = req.has_scaling();
    given.axis_mode = req.axis_mode() != v1::AXIS_MODE_UNSPECIFIED;
    given.sections = !req.sections().empty();
    const auto& dims = req.query().shape();
    POSENC_RETURN_IF_ERROR(MergeHfRope(hf, given, dims.empty() ? 0 : dims[dims.size() - 1], &o));
  }
  return o;
}

void SetRopeOptions(const RopeOptions& o, v1::RopeRequest* req) {
  req->set_layout(ToProto(o.layout));
  req->set_style(ToProto(o.style));
  req->set_rotary_dim(o.rotary_dim);
  req->set_base(o.base);
  req->set_inverse(o.inverse);
  req->set_axis_mode(ToProto(o.axis_mode));
  req->clear_axis_dims();
  for (int64_t d : o.axis_dims) req->add_axis_dims(d);
  req->clear_sections();
  for (int64_t d : o.sections) req->add_sections(d);

  const RopeScaling& r = o.scaling;
  v1::RopeScaling* s = req->mutable_scaling();
  s->Clear();
  s->set_type(ToProto(r.type));
  if (r.factor) s->set_factor(*r.factor);
  if (r.original_max_position) s->set_original_max_position(*r.original_max_position);
  if (r.beta_fast) s->set_beta_fast(*r.beta_fast);
  if (r.beta_slow) s->set_beta_slow(*r.beta_slow);
  if (r.mscale) s->set_mscale(*r.mscale);
  if (r.mscale_all_dim) s->set_mscale_all_dim(*r.mscale_all_dim);
  if (r.attention_factor) s->set_attention_factor(*r.attention_factor);
  s->set_truncate(r.truncate);
  if (r.low_freq_factor) s->set_low_freq_factor(*r.low_freq_factor);
  if (r.high_freq_factor) s->set_high_freq_factor(*r.high_freq_factor);
  for (double f : r.short_factor) s->add_short_factor(f);
  for (double f : r.long_factor) s->add_long_factor(f);
  for (double f : r.inv_freq) s->add_inv_freq(f);
  s->set_longrope_mode(ToProto(r.longrope_mode));
}

absl::StatusOr<AbsoluteOptions> AbsoluteOptionsOf(const v1::AbsoluteEncodingRequest& req) {
  AbsoluteOptions o;
  POSENC_RETURN_IF_ERROR(ReadEncoding(req, &o));
  o.x_scale = req.has_x_scale() ? req.x_scale() : 1.0;
  return o;
}

absl::StatusOr<AbsoluteOptions> AbsoluteOptionsOf(const v1::EncodingTableRequest& req) {
  AbsoluteOptions o;
  POSENC_RETURN_IF_ERROR(ReadEncoding(req, &o));
  return o;
}

void SetAbsoluteOptions(const AbsoluteOptions& o, v1::AbsoluteEncodingRequest* req) {
  WriteEncoding(o, req);
  req->set_x_scale(o.x_scale);
}

void SetAbsoluteOptions(const AbsoluteOptions& o, v1::EncodingTableRequest* req) {
  WriteEncoding(o, req);
}

absl::StatusOr<BiasOptions> BiasOptionsOf(const v1::AttentionBiasRequest& req) {
  BiasOptions o;
  POSENC_ASSIGN_OR_RETURN(o.form, FromProto("form", req.form()));
  o.slopes.assign(req.slopes().begin(), req.slopes().end());
  o.batch = req.batch();
  o.num_heads = req.num_heads();
  o.q_len = req.q_len();
  o.k_len = req.k_len();
  if (req.has_q_offset()) o.q_offset = req.q_offset();
  o.causal = req.causal();
  o.window = req.window();
  POSENC_ASSIGN_OR_RETURN(o.k_lens, ViewOf("k_lens", req.has_k_lens(), req.k_lens()));
  POSENC_ASSIGN_OR_RETURN(o.k_starts, ViewOf("k_starts", req.has_k_starts(), req.k_starts()));
  if (req.dtype() != v1::DATA_TYPE_UNSPECIFIED) {
    POSENC_ASSIGN_OR_RETURN(o.dtype, FromProto("dtype", req.dtype()));
  }
  return o;
}

void SetBiasOptions(const BiasOptions& o, v1::AttentionBiasRequest* req) {
  req->set_form(ToProto(o.form));
  req->clear_slopes();
  for (double s : o.slopes) req->add_slopes(s);
  req->set_batch(o.batch);
  req->set_num_heads(o.num_heads);
  req->set_q_len(o.q_len);
  req->set_k_len(o.k_len);
  if (o.q_offset) {
    req->set_q_offset(*o.q_offset);
  } else {
    req->clear_q_offset();
  }
  req->set_causal(o.causal);
  req->set_window(o.window);
  if (o.k_lens.present()) {
    SetTensor(o.k_lens, req->mutable_k_lens());
  } else {
    req->clear_k_lens();
  }
  if (o.k_starts.present()) {
    SetTensor(o.k_starts, req->mutable_k_starts());
  } else {
    req->clear_k_starts();
  }
  req->set_dtype(ToProto(o.dtype));
}

}  // namespace posenc::wire
