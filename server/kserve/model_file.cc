#include "kserve/model_file.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/repository_file.h"
#include "engine/utf8.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "kserve/parameters.h"
#include "posenc/status_macros.h"
#include "posenc/wire/enums.h"
#include "posenc/wire/hf_config.h"

namespace posenc::server::kserve {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

constexpr absl::string_view kTopKeys[] = {"operation",  "description", "head_dim",
                                          "parameters", "hf_config",   "inputs"};
// Parameters whose values are lists (sent by requests as "0.5,1,2").
constexpr absl::string_view kListParameters[] = {"short_factor", "long_factor", "slopes",
                                                 "axis_dims", "sections"};
constexpr size_t kMaxStringBytes = 1024;
constexpr int kMaxListItems = 4096;
constexpr int64_t kMaxHeadDim = 1 << 16;

absl::Status Invalid(absl::string_view key, absl::string_view want, absl::string_view got) {
  return absl::InvalidArgumentError(absl::StrCat("\"", key, "\" must be ", want, ", got ", got));
}

std::string Shorten(absl::string_view s) {
  return s.size() > 64 ? absl::StrCat(Utf8Prefix(s, 64), "...") : std::string(s);
}

std::string KindOf(const Value& v) {
  switch (v.kind_case()) {
    case Value::kNullValue:
      return "null";
    case Value::kNumberValue:
      return absl::StrFormat("the number %.17g", v.number_value());
    case Value::kStringValue:
      return absl::StrCat("the string \"", Shorten(v.string_value()), "\"");
    case Value::kBoolValue:
      return v.bool_value() ? "true" : "false";
    case Value::kStructValue:
      return "an object";
    case Value::kListValue:
      return "a list";
    case Value::KIND_NOT_SET:
      break;
  }
  return "nothing";
}

bool IsWhole(double d) { return std::abs(d) <= 9007199254740992.0 && d == std::floor(d); }

// A finite JSON number as the parameter a request would send: whole numbers
// as int64 (integer parameters take only those), others as double.
absl::StatusOr<inference::InferParameter> NumberParameter(absl::string_view key, double d) {
  inference::InferParameter p;
  if (!std::isfinite(d)) return Invalid(key, "a finite number", "a non-finite number");
  if (IsWhole(d)) {
    p.set_int64_param(static_cast<int64_t>(d));
  } else {
    p.set_double_param(d);
  }
  return p;
}

absl::StatusOr<inference::InferParameter> ToParameter(const std::string& key, const Value& v) {
  const std::string field = absl::StrCat("parameters.", key);
  const bool list_key = std::find(std::begin(kListParameters), std::end(kListParameters), key) !=
                        std::end(kListParameters);
  inference::InferParameter p;
  switch (v.kind_case()) {
    case Value::kNumberValue:
      return NumberParameter(field, v.number_value());
    case Value::kBoolValue:
      p.set_bool_param(v.bool_value());
      return p;
    case Value::kStringValue:
      if (v.string_value().size() > kMaxStringBytes || !IsPrintableUtf8(v.string_value())) {
        return Invalid(field, absl::StrCat("printable text of at most ", kMaxStringBytes, " bytes"),
                       absl::StrCat(v.string_value().size(), " bytes"));
      }
      p.set_string_param(v.string_value());
      return p;
    case Value::kListValue: {
      if (!list_key) {
        return Invalid(field,
                       "a single value (lists: short_factor, long_factor, slopes, "
                       "axis_dims, sections)",
                       "a list");
      }
      const auto& items = v.list_value().values();
      if (items.size() > kMaxListItems) {
        return Invalid(field, absl::StrCat("at most ", kMaxListItems, " numbers"),
                       absl::StrCat(items.size()));
      }
      // The text form requests use, reading back as the same doubles.
      std::string text;
      for (int i = 0; i < items.size(); ++i) {
        const Value& item = items[i];
        if (item.kind_case() != Value::kNumberValue || !std::isfinite(item.number_value())) {
          return Invalid(absl::StrCat(field, "[", i, "]"), "a finite number", KindOf(item));
        }
        absl::StrAppend(&text, i == 0 ? "" : ",", NumberText(item.number_value()));
      }
      if (items.empty()) return Invalid(field, "a non-empty list of numbers", "an empty list");
      p.set_string_param(text);
      return p;
    }
    default:
      return Invalid(field, "a number, string, boolean or list of numbers", KindOf(v));
  }
}

// The head size `query` and `key` must have, announced on the tensors.
void SetHeadDim(int64_t head_dim, Model* model) {
  model->head_dim = head_dim;
  for (auto* specs : {&model->inputs, &model->outputs}) {
    for (TensorSpec& t : *specs) {
      const absl::string_view n = t.name;
      if (n == "query" || n == "key" || n == "query_out" || n == "key_out") {
        t.dims.back() = head_dim;
      }
    }
  }
}

// Resolves the file's "hf_config" (an HF config.json, inline) once, at load,
// into fixed parameters: what a request to the built-in rope model with the
// same config as its hf_config parameter would rotate with. The file's own
// parameters stand beside the config by the request path's rule
// (ExplicitRopeFieldsOf, wire::MergeHfRope): base, rotary_dim, style,
// axis_mode and sections only with the config's values, no scaling
// parameter at all; layout, inverse, backend and a style the family does not
// imply stay the file's. Requests then find the resolved values fixed and
// the unset scaling parameters closed (determined_by_hf_config).
absl::Status ApplyHfConfig(const Value& v, Model* model) {
  if (model->kind != ModelKind::kRope) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"hf_config\" is for operation rope, not ", KindName(model->kind)));
  }
  if (v.kind_case() != Value::kStructValue) {
    return Invalid("hf_config", "an object (the model's config.json, or its RoPE fields)",
                   KindOf(v));
  }
  std::string json;
  if (const auto printed = google::protobuf::util::MessageToJsonString(v.struct_value(), &json);
      !printed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("\"hf_config\" cannot be read back as JSON: ",
                                                   std::string(printed.message())));
  }
  // Errors name the field as a path: hf_config.rope_scaling.factor.
  POSENC_ASSIGN_OR_RETURN(const wire::HfRope hf, wire::ResolveHfRope(json));
  if (model->head_dim > 0 && model->head_dim != hf.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat("\"head_dim\" is ", model->head_dim,
                                                   " but hf_config gives ", hf.head_dim,
                                                   "; give one or make them agree"));
  }
  ParameterReader reader(model->fixed);
  RopeOptions o;
  BackendChoice backend = BackendChoice::kDefault;
  POSENC_RETURN_IF_ERROR(ReadRopeOptions(reader, &o, &backend));
  POSENC_RETURN_IF_ERROR(wire::MergeHfRope(hf, ExplicitRopeFieldsOf(reader), 0, &o));
  SetHeadDim(hf.head_dim, model);

  Parameters& fixed = model->fixed;
  auto number = [&](const char* name, double d) -> absl::Status {
    POSENC_ASSIGN_OR_RETURN(fixed[name], NumberParameter(absl::StrCat("hf_config's ", name), d));
    return absl::OkStatus();
  };
  auto numbers = [&](const char* name, const std::vector<double>& values) {
    std::string text;
    for (double d : values) absl::StrAppend(&text, text.empty() ? "" : ",", NumberText(d));
    fixed[name].set_string_param(text);
  };
  POSENC_RETURN_IF_ERROR(number("base", o.base));
  fixed["rotary_dim"].set_int64_param(o.rotary_dim);
  if (hf.style_implied) fixed["style"].set_string_param(wire::NameOf(o.style));
  if (hf.axis_mode_implied) {
    fixed["axis_mode"].set_string_param(wire::NameOf(o.axis_mode));
    fixed["sections"].set_string_param(absl::StrJoin(o.sections, ","));
    fixed.erase("axis_dims");  // MergeHfRope drops them for M-RoPE too
  }
  const RopeScaling& s = o.scaling;
  const RopeScaling defaults;
  if (s.type == ScalingType::kExplicit || !s.inv_freq.empty()) {
    return absl::InternalError("hf_config resolved to explicit inverse frequencies");
  }
  fixed["scaling"].set_string_param(wire::NameOf(s.type));
  // Each scaling parameter is fixed to the config's value or, left unset by
  // the config (a reader leaves it at its default then), closed to requests.
  std::vector<std::string>& closed = model->determined_by_hf_config;
  closed.emplace_back("hf_config");  // a request's own would only conflict
  using Optional = std::pair<const char*, std::optional<double>>;
  for (const auto& [name, value] :
       std::initializer_list<Optional>{{"factor", s.factor},
                                       {"beta_fast", s.beta_fast},
                                       {"beta_slow", s.beta_slow},
                                       {"mscale", s.mscale},
                                       {"mscale_all_dim", s.mscale_all_dim},
                                       {"attention_factor", s.attention_factor},
                                       {"low_freq_factor", s.low_freq_factor},
                                       {"high_freq_factor", s.high_freq_factor}}) {
    if (value.has_value()) {
      POSENC_RETURN_IF_ERROR(number(name, *value));
    } else {
      closed.emplace_back(name);
    }
  }
  if (s.original_max_position.has_value()) {
    fixed["original_max_position"].set_int64_param(*s.original_max_position);
  } else {
    closed.emplace_back("original_max_position");
  }
  if (s.truncate != defaults.truncate) {
    fixed["truncate"].set_bool_param(s.truncate);
  } else {
    closed.emplace_back("truncate");
  }
  if (s.longrope_mode != defaults.longrope_mode) {
    fixed["longrope_mode"].set_string_param(wire::NameOf(s.longrope_mode));
  } else {
    closed.emplace_back("longrope_mode");
  }
  using List = std::pair<const char*, const std::vector<double>*>;
  for (const auto& [name, values] : std::initializer_list<List>{{"short_factor", &s.short_factor},
                                                                {"long_factor", &s.long_factor}}) {
    if (!values->empty()) {
      numbers(name, *values);
    } else {
      closed.emplace_back(name);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelKind> KindFrom(const Value& v) {
  const std::string want = "one of \"rope\", \"sinusoidal\", \"learned\", \"attention_bias\"";
  if (v.kind_case() != Value::kStringValue) return Invalid("operation", want, KindOf(v));
  for (ModelKind k :
       {ModelKind::kRope, ModelKind::kSinusoidal, ModelKind::kLearned, ModelKind::kAttentionBias}) {
    if (v.string_value() == KindName(k)) return k;
  }
  return Invalid("operation", want, KindOf(v));
}

// Reads the fixed parameters as a request's would be read, so a file fixes
// only what a request could give, with the same types and names.
absl::Status CheckParameters(const Model& model) {
  Parameters fixed = model.fixed;
  // A learned model's table may be left to each request; the readers
  // require one, so a placeholder stands in for the check.
  if (model.kind == ModelKind::kLearned && !fixed.contains("table")) {
    fixed["table"].set_string_param("(left to each request)");
  }
  ParameterReader reader(fixed);
  BackendChoice backend = BackendChoice::kDefault;
  switch (model.kind) {
    case ModelKind::kRope: {
      RopeOptions o;
      POSENC_RETURN_IF_ERROR(ReadRopeOptions(reader, &o, &backend));
      break;
    }
    case ModelKind::kSinusoidal:
    case ModelKind::kLearned: {
      AbsoluteOptions o;
      POSENC_RETURN_IF_ERROR(
          ReadAbsoluteOptions(reader, model.kind == ModelKind::kLearned, &o, &backend));
      break;
    }
    case ModelKind::kAttentionBias: {
      BiasOptions o;
      POSENC_RETURN_IF_ERROR(ReadBiasOptions(reader, &o, &backend));
      break;
    }
  }
  POSENC_RETURN_IF_ERROR(reader.Finish(model.name));
  // Finish lets Triton's scheduling parameters pass (clients send them);
  // a file fixing one would refuse every such request, so none may.
  for (const auto& [key, value] : fixed) {
    if (!reader.WasRead(key)) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameters.", Shorten(key), " is not an option of ", KindName(model.kind),
                       " (a scheduling parameter of the protocol, which a model file cannot fix)"));
    }
  }
  return absl::OkStatus();
}

// "inputs": which of the operation's inputs the model takes, each of them
// then required, for clients that send every input a model announces (as
// perf_analyzer must with --shared-memory=system, which refuses models with
// optional inputs). The operation's own required inputs must be among
// them. RoPE's key_out goes with key: required with it, gone without it.
absl::Status RestrictInputs(const Value& v, Model* model) {
  std::vector<std::string> names;
  for (const TensorSpec& t : model->inputs) names.push_back(t.name);
  const std::string want = absl::StrCat("a list of distinct inputs of ", KindName(model->kind),
                                        " (", absl::StrJoin(names, ", "), ")");
  if (v.kind_case() != Value::kListValue) return Invalid("inputs", want, KindOf(v));
  const auto& items = v.list_value().values();
  if (static_cast<size_t>(items.size()) > names.size()) {
    return Invalid("inputs", want, absl::StrCat("a list of ", items.size(), " items"));
  }
  std::vector<bool> listed(names.size(), false);
  for (int i = 0; i < items.size(); ++i) {
    const std::string field = absl::StrCat("inputs[", i, "]");
    const Value& item = items[i];
    const auto it = item.kind_case() == Value::kStringValue
                        ? std::find(names.begin(), names.end(), item.string_value())
                        : names.end();
    if (it == names.end()) {
      return Invalid(field, absl::StrCat("one of ", absl::StrJoin(names, ", ")), KindOf(item));
    }
    const auto at = static_cast<size_t>(it - names.begin());
    if (listed[at]) return Invalid(field, "an input not listed before", KindOf(item));
    listed[at] = true;
  }
  std::vector<TensorSpec> inputs;
  bool has_key = false;
  for (size_t i = 0; i < names.size(); ++i) {
    if (!listed[i]) {
      if (!model->inputs[i].optional) {
        return absl::InvalidArgumentError(absl::StrCat(
            "\"inputs\" must list \"", names[i], "\", which ", KindName(model->kind), " requires"));
      }
      continue;
    }
    has_key = has_key || names[i] == "key";
    inputs.push_back(model->inputs[i]);
    inputs.back().optional = false;
  }
  model->inputs = std::move(inputs);
  if (model->kind == ModelKind::kRope) {
    std::vector<TensorSpec> outputs;
    for (TensorSpec t : model->outputs) {
      if (absl::string_view(t.name) == "key_out") {
        if (!has_key) continue;
        t.optional = false;
      }
      outputs.push_back(t);
    }
    model->outputs = std::move(outputs);
  }
  return absl::OkStatus();
}

absl::Status ParseInto(const Struct& top, Model* model) {
  for (const auto& [key, value] : top.fields()) {
    if (std::find(std::begin(kTopKeys), std::end(kTopKeys), key) == std::end(kTopKeys)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown key \"", Shorten(key), "\"; a model file has ", absl::StrJoin(kTopKeys, ", ")));
    }
  }
  auto op = top.fields().find("operation");
  if (op == top.fields().end()) {
    return absl::InvalidArgumentError(
        "\"operation\" is missing: rope, sinusoidal, learned or attention_bias");
  }
  POSENC_ASSIGN_OR_RETURN(ModelKind kind, KindFrom(op->second));
  const Model& base = BuiltInModel(kind);
  model->kind = kind;
  model->inputs = base.inputs;
  model->outputs = base.outputs;
  if (auto d = top.fields().find("description"); d != top.fields().end()) {
    const Value& v = d->second;
    if (v.kind_case() != Value::kStringValue || v.string_value().size() > kMaxStringBytes ||
        !IsPrintableUtf8(v.string_value())) {
      return Invalid(
          "description", absl::StrCat("printable text of at most ", kMaxStringBytes, " bytes"),
          v.kind_case() == Value::kStringValue ? absl::StrCat(v.string_value().size(), " bytes")
                                               : KindOf(v));
    }
  }
  if (auto h = top.fields().find("head_dim"); h != top.fields().end()) {
    const Value& v = h->second;
    if (kind != ModelKind::kRope) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"head_dim\" is for operation rope, not ", KindName(kind)));
    }
    if (v.kind_case() != Value::kNumberValue || !IsWhole(v.number_value()) ||
        v.number_value() < 2 || v.number_value() > kMaxHeadDim ||
        static_cast<int64_t>(v.number_value()) % 2 != 0) {
      return Invalid("head_dim", absl::StrCat("an even integer in [2, ", kMaxHeadDim, "]"),
                     KindOf(v));
    }
    SetHeadDim(static_cast<int64_t>(v.number_value()), model);
  }
  if (auto p = top.fields().find("parameters"); p != top.fields().end()) {
    if (p->second.kind_case() != Value::kStructValue) {
      return Invalid("parameters", "an object", KindOf(p->second));
    }
    for (const auto& [key, value] : p->second.struct_value().fields()) {
      if (key.size() > kMaxModelNameBytes || !IsPrintableUtf8(key)) {
        return absl::InvalidArgumentError(absl::StrCat("parameter names are printable and at most ",
                                                       kMaxModelNameBytes, " bytes"));
      }
      if (key == "hf_config") {
        return absl::InvalidArgumentError(
            "parameters.hf_config: give the HF config as the file's top-level \"hf_config\" "
            "object (resolved once, at load)");
      }
      POSENC_ASSIGN_OR_RETURN(model->fixed[key], ToParameter(key, value));
    }
  }
  if (auto h = top.fields().find("hf_config"); h != top.fields().end()) {
    POSENC_RETURN_IF_ERROR(ApplyHfConfig(h->second, model));
  }
  POSENC_RETURN_IF_ERROR(CheckParameters(*model));
  if (auto in = top.fields().find("inputs"); in != top.fields().end()) {
    POSENC_RETURN_IF_ERROR(RestrictInputs(in->second, model));
  }
  // Several position axes (M-RoPE sections, axial dims): padded
  // position_ids are [batch, seq, axes]; the metadata says so.
  for (const char* list : {"sections", "axis_dims"}) {
    auto it = model->fixed.find(list);
    if (kind != ModelKind::kRope || it == model->fixed.end()) continue;
    const std::string& text = it->second.string_param();
    const int64_t axes = 1 + std::count(text.begin(), text.end(), ',');
    for (TensorSpec& t : model->inputs) {
      if (absl::string_view(t.name) == "position_ids") t.dims = {-1, -1, axes};
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckModelName(absl::string_view name) {
  const auto allowed = [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  };
  if (name.empty() || name.size() > kMaxModelNameBytes ||
      !absl::ascii_isalnum(static_cast<unsigned char>(name[0])) ||
      !std::all_of(name.begin(), name.end(), allowed)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the model name (the file name without .json) must be 1 to ",
                     kMaxModelNameBytes, " of A-Z a-z 0-9 . _ -, starting with a letter or digit"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Model> ParseModelFile(absl::string_view name, absl::string_view json) {
  POSENC_RETURN_IF_ERROR(CheckModelName(name));
  if (static_cast<int64_t>(json.size()) > kMaxModelFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the file is ", json.size(), " bytes, over the limit of ", kMaxModelFileBytes));
  }
  Struct top;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto parsed = google::protobuf::util::JsonStringToMessage(std::string(json), &top, options);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a JSON object: ", Shorten(std::string(parsed.message()))));
  }
  Model model;
  model.name = std::string(name);
  POSENC_RETURN_IF_ERROR(ParseInto(top, &model));
  return model;
}

}  // namespace posenc::server::kserve
