#include "kserve/models.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace posenc::server::kserve {
namespace {

// Positions shared by RoPE and the absolute encodings (SPEC: padded
// position_ids [batch, seq] or [1, seq], per-sequence offsets, cu_seqlens
// for packed [tokens, ...] tensors).
std::vector<TensorSpec> WithPositions(std::vector<TensorSpec> inputs) {
  inputs.push_back({"position_ids", "INT64", {-1, -1}, true});
  inputs.push_back({"offsets", "INT64", {-1}, true});
  inputs.push_back({"cu_seqlens", "INT64", {-1}, true});
  return inputs;
}

std::vector<Model> Models() {
  return std::vector<Model>{
      {"rope",
       ModelKind::kRope,
       WithPositions(
           {{"query", "FP32", {-1, -1, -1, -1}, false}, {"key", "FP32", {-1, -1, -1, -1}, true}}),
       {{"query_out", "FP32", {-1, -1, -1, -1}, false},
        {"key_out", "FP32", {-1, -1, -1, -1}, true}}},
      // RoPE with exactly two inputs, both required, positions 0..seq-1 per
      // sequence: for clients that cannot leave optional inputs out, as
      // perf_analyzer cannot with --shared-memory=system.
      {"rope_qk",
       ModelKind::kRope,
       {{"query", "FP32", {-1, -1, -1, -1}, false}, {"key", "FP32", {-1, -1, -1, -1}, false}},
       {{"query_out", "FP32", {-1, -1, -1, -1}, false},
        {"key_out", "FP32", {-1, -1, -1, -1}, false}}},
      {"sinusoidal",
       ModelKind::kSinusoidal,
       WithPositions({{"x", "FP32", {-1, -1, -1}, false}}),
       {{"y", "FP32", {-1, -1, -1}, false}}},
      {"learned",
       ModelKind::kLearned,
       WithPositions({{"x", "FP32", {-1, -1, -1}, false}}),
       {{"y", "FP32", {-1, -1, -1}, false}}},
      {"attention_bias",
       ModelKind::kAttentionBias,
       {{"logits", "FP32", {-1, -1, -1, -1}, true},
        {"k_lens", "INT64", {-1}, true},
        {"k_starts", "INT64", {-1}, true}},
       {{"bias", "FP32", {-1, -1, -1, -1}, false}, {"slopes", "FP64", {-1}, false}}},
  };
}

inference::DataType ConfigType(const char* datatype) {
  const absl::string_view d = datatype;
  if (d == "FP32") return inference::TYPE_FP32;
  if (d == "FP64") return inference::TYPE_FP64;
  if (d == "INT64") return inference::TYPE_INT64;
  return inference::TYPE_INVALID;
}

}  // namespace

std::string NumberText(double d) {
  std::string text = absl::StrFormat("%.15g", d);
  double back = 0;
  if (absl::SimpleAtod(text, &back) && back == d) return text;
  return absl::StrFormat("%.17g", d);  // always reads back exactly
}

std::string ParameterText(const inference::InferParameter& p) {
  switch (p.parameter_choice_case()) {
    case inference::InferParameter::kBoolParam:
      return p.bool_param() ? "true" : "false";
    case inference::InferParameter::kInt64Param:
      return absl::StrCat(p.int64_param());
    case inference::InferParameter::kUint64Param:
      return absl::StrCat(p.uint64_param());
    case inference::InferParameter::kDoubleParam:
      return NumberText(p.double_param());
    case inference::InferParameter::kStringParam:
      return p.string_param();
    case inference::InferParameter::PARAMETER_CHOICE_NOT_SET:
      break;
  }
  return "";
}

const std::vector<std::shared_ptr<const Model>>& BuiltInModels() {
  static const auto* models = [] {
    auto* v = new std::vector<std::shared_ptr<const Model>>;
    for (Model& m : Models()) v->push_back(std::make_shared<const Model>(std::move(m)));
    return v;
  }();
  return *models;
}

const Model& BuiltInModel(ModelKind kind) {
  for (const auto& m : BuiltInModels()) {
    if (m->kind == kind) return *m;
  }
  return *BuiltInModels().front();  // unreachable: every kind has one
}

const char* KindName(ModelKind kind) {
  switch (kind) {
    case ModelKind::kRope:
      return "rope";
    case ModelKind::kSinusoidal:
      return "sinusoidal";
    case ModelKind::kLearned:
      return "learned";
    case ModelKind::kAttentionBias:
      return "attention_bias";
  }
  return "unknown";
}

const TensorSpec* FindInput(const Model& model, absl::string_view name) {
  for (const TensorSpec& t : model.inputs) {
    if (name == t.name) return &t;
  }
  return nullptr;
}

const TensorSpec* FindOutput(const Model& model, absl::string_view name) {
  for (const TensorSpec& t : model.outputs) {
    if (name == t.name) return &t;
  }
  return nullptr;
}

absl::StatusOr<const Parameters*> ParametersFor(const Model& model, const Parameters& request,
                                                Parameters* merged) {
  if (model.fixed.empty() && model.determined_by_hf_config.empty()) return &request;
  *merged = model.fixed;
  for (const auto& [name, value] : request) {
    const auto& determined = model.determined_by_hf_config;
    if (std::find(determined.begin(), determined.end(), name) != determined.end()) {
      const auto scaling = model.fixed.find("scaling");
      return absl::InvalidArgumentError(
          absl::StrCat("parameter \"", name, "\" is determined by model ", model.name,
                       "'s hf_config (its scaling: ",
                       scaling == model.fixed.end() ? "none" : ParameterText(scaling->second),
                       "); a request may give only the parameters its model file leaves open"));
    }
    if (auto it = model.fixed.find(name); it != model.fixed.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter \"", name, "\" is fixed by model ", model.name, " (",
                       ParameterText(it->second),
                       "); a request may give only the parameters its model file leaves open"));
    }
    (*merged)[name] = value;
  }
  return merged;
}

inference::ModelMetadataResponse MetadataOf(const Model& model) {
  inference::ModelMetadataResponse r;
  r.set_name(model.name);
  r.add_versions(kModelVersion);
  r.set_platform("posenc");
  auto add = [](const TensorSpec& t, inference::ModelMetadataResponse::TensorMetadata* m) {
    m->set_name(t.name);
    m->set_datatype(t.datatype);
    for (int64_t d : t.dims) m->add_shape(d);
  };
  for (const TensorSpec& t : model.inputs) add(t, r.add_inputs());
  for (const TensorSpec& t : model.outputs) add(t, r.add_outputs());
  return r;
}

inference::ModelConfig ConfigOf(const Model& model) {
  inference::ModelConfig c;
  c.set_name(model.name);
  c.set_platform("posenc");
  c.set_backend("posenc");
  c.set_max_batch_size(0);  // shapes are taken as given, batch included
  for (const TensorSpec& t : model.inputs) {
    inference::ModelInput* in = c.add_input();
    in->set_name(t.name);
    in->set_data_type(ConfigType(t.datatype));
    for (int64_t d : t.dims) in->add_dims(d);
    in->set_optional(t.optional);
  }
  for (const TensorSpec& t : model.outputs) {
    inference::ModelOutput* out = c.add_output();
    out->set_name(t.name);
    out->set_data_type(ConfigType(t.datatype));
    for (int64_t d : t.dims) out->add_dims(d);
  }
  // What a repository model fixes, as Triton shows a model's parameters.
  for (const auto& [name, value] : model.fixed) {
    (*c.mutable_parameters())[name].set_string_value(ParameterText(value));
  }
  return c;
}

}  // namespace posenc::server::kserve
