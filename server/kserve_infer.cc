#include "kserve_infer.h"

#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kserve_parameters.h"
#include "kserve_tensors.h"
#include "posenc/status_macros.h"

namespace posenc::server::kserve {
namespace {

// What an answer carries besides tensor data: names, datatypes, shapes,
// ids and field tags (generously).
int64_t Overhead(const inference::ModelInferRequest& req) {
  return 1024 + static_cast<int64_t>(req.id().size() + req.model_name().size());
}

// The request's inputs by name, checked against the model's.
class InputSet {
 public:
  static absl::StatusOr<InputSet> Of(const Model& model, std::vector<Input> inputs) {
    for (const Input& in : inputs) {
      if (FindInput(model, in.name) == nullptr) {
        std::vector<std::string> names;
        for (const TensorSpec& t : model.inputs) names.push_back(t.name);
        return absl::InvalidArgumentError(absl::StrCat(
            "model ", model.name, " has no input \"", absl::string_view(in.name).substr(0, 64),
            "\"; its inputs are ", absl::StrJoin(names, ", ")));
      }
    }
    for (const TensorSpec& t : model.inputs) {
      bool given = false;
      for (const Input& in : inputs) given = given || in.name == t.name;
      if (!t.optional && !given) {
        return absl::InvalidArgumentError(
            absl::StrCat("model ", model.name, " needs the input \"", t.name, "\""));
      }
    }
    return InputSet(std::move(inputs));
  }

  Input* Find(absl::string_view name) {
    for (Input& in : inputs_) {
      if (in.name == name) return &in;
    }
    return nullptr;
  }
  TensorView View(absl::string_view name) {
    Input* in = Find(name);
    return in == nullptr ? TensorView() : in->view();
  }
  MutableTensor Mutable(absl::string_view name) {
    Input* in = Find(name);
    return in == nullptr ? MutableTensor() : in->mutable_view();
  }

 private:
  explicit InputSet(std::vector<Input> inputs) : inputs_(std::move(inputs)) {}
  std::vector<Input> inputs_;
};

// The outputs the caller asked for (all the model gives when none).
class OutputSet {
 public:
  static absl::StatusOr<OutputSet> Of(const Model& model, const inference::ModelInferRequest& req) {
    OutputSet s;
    for (const auto& out : req.outputs()) {
      const std::string field =
          absl::StrCat("requested output \"", absl::string_view(out.name()).substr(0, 64), "\"");
      if (FindOutput(model, out.name()) == nullptr) {
        std::vector<std::string> names;
        for (const TensorSpec& t : model.outputs) names.push_back(t.name);
        return absl::InvalidArgumentError(absl::StrCat(
            field, ": model ", model.name, " has outputs ", absl::StrJoin(names, ", ")));
      }
      if (!out.parameters().empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, " has parameters (e.g. classification); posenc's outputs take none"));
      }
      s.names_.push_back(out.name());
    }
    return s;
  }
  bool Wants(absl::string_view name) const {
    if (names_.empty()) return true;
    for (const std::string& n : names_) {
      if (n == name) return true;
    }
    return false;
  }

 private:
  std::vector<std::string> names_;
};

void AddOutput(absl::string_view name, const char* datatype, const std::vector<int64_t>& shape,
               std::string* data, inference::ModelInferResponse* resp) {
  inference::ModelInferResponse::InferOutputTensor* out = resp->add_outputs();
  out->set_name(std::string(name));
  out->set_datatype(datatype);
  for (int64_t d : shape) out->add_shape(d);
  resp->add_raw_output_contents()->swap(*data);
}

absl::Status RunRope(Engine& engine, ParameterReader& params, InputSet& in, const OutputSet& want,
                     const CallEnv& env_in, inference::ModelInferResponse* resp,
                     std::string* backend_out) {
  RopeOptions options;
  CallEnv env = env_in;
  const Input* query = in.Find("query");
  POSENC_RETURN_IF_ERROR(ReadRopeOptions(params, &options, &env.backend,
                                         query != nullptr && !query->shape.empty()
                                             ? query->shape.back()
                                             : 0));
  POSENC_RETURN_IF_ERROR(params.Finish("rope"));
  RopeTensors t;
  t.query = in.Mutable("query");
  t.key = in.Mutable("key");
  t.positions.position_ids = in.View("position_ids");
  t.positions.offsets = in.View("offsets");
  t.cu_seqlens = in.View("cu_seqlens");
  POSENC_ASSIGN_OR_RETURN(*backend_out, engine.ApplyRope(options, t, env));
  if (want.Wants("query_out")) {
    Input* q = in.Find("query");
    AddOutput("query_out", DatatypeOf(q->dtype), q->shape, &q->data, resp);
  }
  if (Input* k = in.Find("key"); k != nullptr && want.Wants("key_out")) {
    AddOutput("key_out", DatatypeOf(k->dtype), k->shape, &k->data, resp);
  }
  return absl::OkStatus();
}

absl::Status RunAbsolute(Engine& engine, const Model& model, ParameterReader& params, InputSet& in,
                         const CallEnv& env_in, inference::ModelInferResponse* resp,
                         std::string* backend_out) {
  AbsoluteOptions options;
  CallEnv env = env_in;
  POSENC_RETURN_IF_ERROR(
      ReadAbsoluteOptions(params, model.kind == ModelKind::kLearned, &options, &env.backend));
  POSENC_RETURN_IF_ERROR(params.Finish(model.name));
  AbsoluteTensors t;
  t.x = in.Mutable("x");
  t.positions.position_ids = in.View("position_ids");
  t.positions.offsets = in.View("offsets");
  t.cu_seqlens = in.View("cu_seqlens");
  POSENC_ASSIGN_OR_RETURN(*backend_out, engine.AddAbsolute(std::move(options), t, env));
  Input* x = in.Find("x");
  AddOutput("y", DatatypeOf(x->dtype), x->shape, &x->data, resp);
  return absl::OkStatus();
}

absl::Status RunBias(Engine& engine, ParameterReader& params, InputSet& in, const OutputSet& want,
                     const CallEnv& env_in, inference::ModelInferResponse* resp,
                     std::string* backend_out) {
  BiasOptions options;
  CallEnv env = env_in;
  POSENC_RETURN_IF_ERROR(ReadBiasOptions(params, &options, &env.backend));
  POSENC_RETURN_IF_ERROR(params.Finish("attention_bias"));
  options.k_lens = in.View("k_lens");
  options.k_starts = in.View("k_starts");
  MutableTensor logits = in.Mutable("logits");
  std::string built;
  POSENC_ASSIGN_OR_RETURN(Produced bias, engine.AttentionBias(options, logits, &built, env));
  *backend_out = bias.backend;
  if (want.Wants("bias")) {
    Input* l = in.Find("logits");
    AddOutput("bias", DatatypeOf(bias.dtype), bias.shape, l != nullptr ? &l->data : &built, resp);
  }
  if (want.Wants("slopes")) {
    std::string slopes(bias.slopes.size() * sizeof(double), '\0');
    if (!slopes.empty()) std::memcpy(slopes.data(), bias.slopes.data(), slopes.size());
    AddOutput("slopes", "FP64", {static_cast<int64_t>(bias.slopes.size())}, &slopes, resp);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<const Model*> ModelOf(absl::string_view name, absl::string_view version) {
  const Model* model = FindModel(name);
  if (model == nullptr) {
    std::vector<std::string> names;
    for (const Model& m : BuiltInModels()) names.push_back(m.name);
    return absl::NotFoundError(absl::StrCat("no model \"", name.substr(0, 64),
                                            "\"; the models are ", absl::StrJoin(names, ", ")));
  }
  if (!version.empty() && version != kModelVersion) {
    return absl::InvalidArgumentError(absl::StrCat("model ", name, " has only version ",
                                                   kModelVersion, ", got version \"",
                                                   version.substr(0, 32), "\""));
  }
  return model;
}

absl::Status RunInfer(Engine& engine, const Model& model, inference::ModelInferRequest* req,
                      inference::ModelInferResponse* resp, const RunContext& ctx,
                      Engine::Admission& admission, std::string* backend) {
  POSENC_RETURN_IF_ERROR(engine.CheckRequestSize(TensorBytes(*req)));
  POSENC_ASSIGN_OR_RETURN(OutputSet want, OutputSet::Of(model, *req));
  POSENC_ASSIGN_OR_RETURN(std::vector<Input> inputs, TakeInputs(req));
  POSENC_ASSIGN_OR_RETURN(InputSet in, InputSet::Of(model, std::move(inputs)));
  ParameterReader params(req->parameters());
  const CallEnv env{ctx, admission, BackendChoice::kDefault, Overhead(*req)};
  resp->set_model_name(model.name);
  resp->set_model_version(kModelVersion);
  resp->set_id(req->id());
  switch (model.kind) {
    case ModelKind::kRope:
      return RunRope(engine, params, in, want, env, resp, backend);
    case ModelKind::kSinusoidal:
    case ModelKind::kLearned:
      return RunAbsolute(engine, model, params, in, env, resp, backend);
    case ModelKind::kAttentionBias:
      return RunBias(engine, params, in, want, env, resp, backend);
  }
  return absl::InternalError("unknown model kind");
}

}  // namespace posenc::server::kserve
