#include "kserve_model_file.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "kserve_parameters.h"
#include "posenc/status_macros.h"
#include "repository_file.h"

namespace posenc::server::kserve {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

constexpr absl::string_view kTopKeys[] = {"operation", "description", "head_dim", "parameters",
                                          "hf_config"};
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
  return s.size() > 64 ? absl::StrCat(s.substr(0, 64), "...") : std::string(s);
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

absl::Status ParseInto(const Struct& top, Model* model) {
  for (const auto& [key, value] : top.fields()) {
    if (std::find(std::begin(kTopKeys), std::end(kTopKeys), key) == std::end(kTopKeys)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown key \"", Shorten(key), "\"; a model file has ", absl::StrJoin(kTopKeys, ", ")));
    }
  }
  // HF config.json resolution (ResolveHfRope in wire/) is to be connected
  // here: the config's rope fields become this model's fixed parameters.
  if (top.fields().contains("hf_config")) {
    return absl::UnimplementedError(
        "\"hf_config\" is not supported yet: give the rope options under \"parameters\"");
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
    model->head_dim = static_cast<int64_t>(v.number_value());
    for (auto* specs : {&model->inputs, &model->outputs}) {
      for (TensorSpec& t : *specs) {
        const absl::string_view n = t.name;
        if (n == "query" || n == "key" || n == "query_out" || n == "key_out") {
          t.dims.back() = model->head_dim;
        }
      }
    }
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
      POSENC_ASSIGN_OR_RETURN(model->fixed[key], ToParameter(key, value));
    }
  }
  POSENC_RETURN_IF_ERROR(CheckParameters(*model));
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
