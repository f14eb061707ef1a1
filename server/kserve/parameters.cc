#include "kserve/parameters.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "engine/utf8.h"
#include "posenc/limits.h"
#include "posenc/status_macros.h"
#include "posenc/wire/enums.h"
#include "posenc/wire/hf_config.h"

namespace posenc::server::kserve {
namespace {

using inference::InferParameter;

// Parameters the KServe / Triton protocol reserves for its schedulers;
// clients send them by default and they change nothing for these models.
constexpr absl::string_view kIgnored[] = {"priority", "timeout", "binary_data_output",
                                          "triton_enable_empty_final_response"};

std::string KindOf(const InferParameter& p) {
  switch (p.parameter_choice_case()) {
    case InferParameter::kBoolParam:
      return absl::StrCat("bool ", p.bool_param() ? "true" : "false");
    case InferParameter::kInt64Param:
      return absl::StrCat("int64 ", p.int64_param());
    case InferParameter::kUint64Param:
      return absl::StrCat("uint64 ", p.uint64_param());
    case InferParameter::kDoubleParam:
      return absl::StrCat("double ", p.double_param());
    case InferParameter::kStringParam:
      return absl::StrCat("string \"", Utf8Prefix(p.string_param(), 64),
                          p.string_param().size() > 64 ? "...\"" : "\"");
    case InferParameter::PARAMETER_CHOICE_NOT_SET:
      break;
  }
  return "a parameter with no value";
}

absl::Status WrongKind(absl::string_view name, absl::string_view want, const InferParameter& p) {
  return absl::InvalidArgumentError(
      absl::StrCat("parameter \"", name, "\" must be ", want, ", got ", KindOf(p)));
}

}  // namespace

const InferParameter* ParameterReader::Find(absl::string_view name) {
  read_.emplace_back(name);
  auto it = parameters_.find(std::string(name));
  return it == parameters_.end() ? nullptr : &it->second;
}

absl::Status ParameterReader::Double(absl::string_view name, double* out) {
  const InferParameter* p = Find(name);
  if (p == nullptr) return absl::OkStatus();
  switch (p->parameter_choice_case()) {
    case InferParameter::kDoubleParam:
      *out = p->double_param();
      break;
    case InferParameter::kInt64Param:
      *out = static_cast<double>(p->int64_param());
      break;
    case InferParameter::kUint64Param:
      *out = static_cast<double>(p->uint64_param());
      break;
    case InferParameter::kStringParam:
      // tritonclient before 2.41 cannot send double parameters.
      if (!absl::SimpleAtod(p->string_param(), out)) return WrongKind(name, "a number", *p);
      break;
    default:
      return WrongKind(name, "a number", *p);
  }
  // Ranges are the kernels' to check; a NaN or infinity never is a value.
  if (!std::isfinite(*out)) return WrongKind(name, "a finite number", *p);
  return absl::OkStatus();
}

absl::Status ParameterReader::Double(absl::string_view name, std::optional<double>* out) {
  double v = 0;
  const bool present = parameters_.contains(std::string(name));
  POSENC_RETURN_IF_ERROR(Double(name, &v));
  if (present) *out = v;
  return absl::OkStatus();
}

absl::Status ParameterReader::Int(absl::string_view name, int64_t* out) {
  const InferParameter* p = Find(name);
  if (p == nullptr) return absl::OkStatus();
  switch (p->parameter_choice_case()) {
    case InferParameter::kInt64Param:
      *out = p->int64_param();
      return absl::OkStatus();
    case InferParameter::kUint64Param:
      if (p->uint64_param() > static_cast<uint64_t>(INT64_MAX)) break;
      *out = static_cast<int64_t>(p->uint64_param());
      return absl::OkStatus();
    case InferParameter::kDoubleParam: {
      const double d = p->double_param();
      // Whole numbers within +-2^53, where doubles are exact.
      if (!(std::abs(d) <= 9007199254740992.0) || d != std::floor(d)) break;
      *out = static_cast<int64_t>(d);
      return absl::OkStatus();
    }
    case InferParameter::kStringParam:
      if (!absl::SimpleAtoi(p->string_param(), out)) break;
      return absl::OkStatus();
    default:
      break;
  }
  return WrongKind(name, "an integer", *p);
}

absl::Status ParameterReader::Int(absl::string_view name, std::optional<int64_t>* out) {
  int64_t v = 0;
  const bool present = parameters_.contains(std::string(name));
  POSENC_RETURN_IF_ERROR(Int(name, &v));
  if (present) *out = v;
  return absl::OkStatus();
}

absl::Status ParameterReader::Bool(absl::string_view name, bool* out) {
  const InferParameter* p = Find(name);
  if (p == nullptr) return absl::OkStatus();
  if (p->parameter_choice_case() != InferParameter::kBoolParam)
    return WrongKind(name, "a bool", *p);
  *out = p->bool_param();
  return absl::OkStatus();
}

absl::Status CheckParameterCount(const Parameters& parameters) {
  if (parameters.size() <= static_cast<size_t>(kMaxParameters)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("a request has at most ", kMaxParameters,
                                                 " parameters, got ", parameters.size()));
}

absl::Status ParameterReader::Text(absl::string_view name, absl::string_view* out) {
  *out = absl::string_view();
  const InferParameter* p = Find(name);
  if (p == nullptr) return absl::OkStatus();
  if (p->parameter_choice_case() != InferParameter::kStringParam) {
    return WrongKind(name, "a string", *p);
  }
  if (p->string_param().size() > kMaxParameterBytes) {
    return absl::InvalidArgumentError(absl::StrCat("parameter \"", name, "\" must be at most ",
                                                   kMaxParameterBytes, " bytes, got ",
                                                   p->string_param().size()));
  }
  *out = p->string_param();
  return absl::OkStatus();
}

absl::Status ParameterReader::String(absl::string_view name, std::string* out) {
  absl::string_view text;
  POSENC_RETURN_IF_ERROR(Text(name, &text));
  if (parameters_.contains(std::string(name))) *out = std::string(text);
  return absl::OkStatus();
}

absl::Status ParameterReader::Items(absl::string_view name, size_t max_items,
                                    std::vector<absl::string_view>* items) {
  absl::string_view text;
  POSENC_RETURN_IF_ERROR(Text(name, &text));
  items->clear();
  if (text.empty()) return absl::OkStatus();
  // Counted before anything is split or parsed: the list's memory and time
  // stay within what the model can use.
  const size_t count = static_cast<size_t>(std::count(text.begin(), text.end(), ',')) + 1;
  if (count > max_items) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter \"", name, "\" holds at most ", max_items, " values, got ", count));
  }
  *items = absl::StrSplit(text, ',');
  return absl::OkStatus();
}

absl::Status ParameterReader::Doubles(absl::string_view name, size_t max_items,
                                      std::vector<double>* out) {
  std::vector<absl::string_view> items;
  POSENC_RETURN_IF_ERROR(Items(name, max_items, &items));
  if (items.empty()) return absl::OkStatus();
  out->clear();
  for (absl::string_view item : items) {
    double v = 0;
    if (!absl::SimpleAtod(absl::StripAsciiWhitespace(item), &v) || !std::isfinite(v)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter \"", name, "\" must be finite numbers separated by commas, got the item \"",
          Utf8Prefix(item, 64), "\""));
    }
    out->push_back(v);
  }
  return absl::OkStatus();
}

absl::Status ParameterReader::Ints(absl::string_view name, size_t max_items,
                                   std::vector<int64_t>* out) {
  std::vector<absl::string_view> items;
  POSENC_RETURN_IF_ERROR(Items(name, max_items, &items));
  if (items.empty()) return absl::OkStatus();
  out->clear();
  for (absl::string_view item : items) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(item), &v)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter \"", name, "\" must be integers separated by commas, got the item \"",
          Utf8Prefix(item, 64), "\""));
    }
    out->push_back(v);
  }
  return absl::OkStatus();
}

bool ParameterReader::WasRead(absl::string_view name) const {
  return std::find(read_.begin(), read_.end(), name) != read_.end();
}

template <typename E>
absl::Status ParameterReader::Enum(absl::string_view name, E* out) {
  absl::string_view text;
  POSENC_RETURN_IF_ERROR(Text(name, &text));
  if (!parameters_.contains(std::string(name))) return absl::OkStatus();
  POSENC_ASSIGN_OR_RETURN(*out, wire::Parse<E>(absl::StrCat("parameter \"", name, "\""), text));
  return absl::OkStatus();
}

absl::Status ParameterReader::Finish(absl::string_view model) const {
  for (const auto& [name, value] : parameters_) {
    if (std::find(read_.begin(), read_.end(), name) != read_.end()) continue;
    if (std::find(std::begin(kIgnored), std::end(kIgnored), name) != std::end(kIgnored)) continue;
    std::vector<std::string> known = read_;
    std::sort(known.begin(), known.end());
    known.erase(std::unique(known.begin(), known.end()), known.end());
    return absl::InvalidArgumentError(absl::StrCat("model ", model, " has no parameter \"",
                                                   Utf8Prefix(name, 64), "\"; it reads ",
                                                   absl::StrJoin(known, ", ")));
  }
  return absl::OkStatus();
}

wire::ExplicitRopeFields ExplicitRopeFieldsOf(const ParameterReader& p) {
  wire::ExplicitRopeFields given;
  given.style = p.Has("style");
  given.rotary_dim = p.Has("rotary_dim");
  given.base = p.Has("base");
  given.axis_mode = p.Has("axis_mode");
  given.sections = p.Has("sections");
  // Every scaling parameter counts: the config determines them all.
  for (absl::string_view name : kRopeScalingParameters) {
    given.scaling = given.scaling || p.Has(name);
  }
  return given;
}

absl::Status ReadRopeOptions(ParameterReader& p, RopeOptions* o, BackendChoice* backend,
                             int64_t query_head_dim) {
  POSENC_RETURN_IF_ERROR(p.Enum("backend", backend));
  POSENC_RETURN_IF_ERROR(p.Enum("layout", &o->layout));
  POSENC_RETURN_IF_ERROR(p.Enum("style", &o->style));
  POSENC_RETURN_IF_ERROR(p.Int("rotary_dim", &o->rotary_dim));
  POSENC_RETURN_IF_ERROR(p.Double("base", &o->base));
  POSENC_RETURN_IF_ERROR(p.Bool("inverse", &o->inverse));
  RopeScaling& s = o->scaling;
  POSENC_RETURN_IF_ERROR(p.Enum("scaling", &s.type));
  POSENC_RETURN_IF_ERROR(p.Double("factor", &s.factor));
  POSENC_RETURN_IF_ERROR(p.Int("original_max_position", &s.original_max_position));
  POSENC_RETURN_IF_ERROR(p.Double("beta_fast", &s.beta_fast));
  POSENC_RETURN_IF_ERROR(p.Double("beta_slow", &s.beta_slow));
  POSENC_RETURN_IF_ERROR(p.Double("mscale", &s.mscale));
  POSENC_RETURN_IF_ERROR(p.Double("mscale_all_dim", &s.mscale_all_dim));
  POSENC_RETURN_IF_ERROR(p.Double("attention_factor", &s.attention_factor));
  POSENC_RETURN_IF_ERROR(p.Bool("truncate", &s.truncate));
  POSENC_RETURN_IF_ERROR(p.Double("low_freq_factor", &s.low_freq_factor));
  POSENC_RETURN_IF_ERROR(p.Double("high_freq_factor", &s.high_freq_factor));
  // LongRoPE's factors: one per frequency, half the head at most.
  POSENC_RETURN_IF_ERROR(p.Doubles("short_factor", kMaxDim / 2, &s.short_factor));
  POSENC_RETURN_IF_ERROR(p.Doubles("long_factor", kMaxDim / 2, &s.long_factor));
  POSENC_RETURN_IF_ERROR(p.Enum("longrope_mode", &s.longrope_mode));
  // Several position axes (Qwen2-VL M-RoPE: position_ids [axes, batch, seq]).
  POSENC_RETURN_IF_ERROR(p.Enum("axis_mode", &o->axis_mode));
  POSENC_RETURN_IF_ERROR(p.Ints("axis_dims", kMaxAxes, &o->axis_dims));
  POSENC_RETURN_IF_ERROR(p.Ints("sections", kMaxAxes, &o->sections));
  std::string hf_config;
  POSENC_RETURN_IF_ERROR(p.String("hf_config", &hf_config));
  if (!hf_config.empty()) {
    POSENC_ASSIGN_OR_RETURN(const wire::HfRope hf, wire::ResolveHfRopeCached(hf_config));
    POSENC_RETURN_IF_ERROR(wire::MergeHfRope(hf, ExplicitRopeFieldsOf(p), query_head_dim, o));
  }
  return absl::OkStatus();
}

absl::Status ReadAbsoluteOptions(ParameterReader& p, bool learned, AbsoluteOptions* o,
                                 BackendChoice* backend) {
  POSENC_RETURN_IF_ERROR(p.Enum("backend", backend));
  POSENC_RETURN_IF_ERROR(p.Double("x_scale", &o->x_scale));
  if (learned) {
    o->kind = AbsoluteOptions::Kind::kLearned;
    POSENC_RETURN_IF_ERROR(p.String("table", &o->table_name));
    if (o->table_name.empty()) {
      return absl::InvalidArgumentError(
          "model learned needs the string parameter \"table\" naming a table of the server's "
          "repository (ListTables lists them)");
    }
    return absl::OkStatus();
  }
  o->kind = AbsoluteOptions::Kind::kSinusoidal;
  POSENC_RETURN_IF_ERROR(p.Enum("layout", &o->sinusoidal_layout));
  POSENC_RETURN_IF_ERROR(p.Double("base", &o->base));
  return absl::OkStatus();
}

absl::Status ReadBiasOptions(ParameterReader& p, BiasOptions* o, BackendChoice* backend) {
  POSENC_RETURN_IF_ERROR(p.Enum("backend", backend));
  POSENC_RETURN_IF_ERROR(p.Enum("form", &o->form));
  POSENC_RETURN_IF_ERROR(p.Doubles("slopes", kMaxHeads, &o->slopes));
  POSENC_RETURN_IF_ERROR(p.Int("batch", &o->batch));
  POSENC_RETURN_IF_ERROR(p.Int("num_heads", &o->num_heads));
  POSENC_RETURN_IF_ERROR(p.Int("q_len", &o->q_len));
  POSENC_RETURN_IF_ERROR(p.Int("k_len", &o->k_len));
  POSENC_RETURN_IF_ERROR(p.Int("q_offset", &o->q_offset));
  POSENC_RETURN_IF_ERROR(p.Bool("causal", &o->causal));
  POSENC_RETURN_IF_ERROR(p.Int("window", &o->window));
  POSENC_RETURN_IF_ERROR(p.Enum("dtype", &o->dtype));
  return absl::OkStatus();
}

}  // namespace posenc::server::kserve
