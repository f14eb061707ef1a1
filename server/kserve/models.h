// The models the KServe v2 front serves: named configurations of posenc's
// operations whose options arrive as request parameters
// (kserve/parameters.h). Built-in ones fix nothing; those of the model
// repository (kserve/model_file.h) fix some parameters. What a model takes
// and gives is described here once; metadata, configuration and input
// checking all read it.
#ifndef POSENC_SERVER_KSERVE_MODELS_H_
#define POSENC_SERVER_KSERVE_MODELS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kserve/grpc_service.pb.h"

namespace posenc::server::kserve {

enum class ModelKind { kRope, kSinusoidal, kLearned, kAttentionBias };

struct TensorSpec {
  const char* name;
  // The datatype metadata announces. Float tensors also take FP16 and BF16
  // (answered in the same type); integer ones INT32 as well as INT64.
  const char* datatype;
  std::vector<int64_t> dims;  // -1: any size
  bool optional;
};

// A request's parameters (kserve/parameters.h reads them).
using Parameters = google::protobuf::Map<std::string, inference::InferParameter>;

struct Model {
  std::string name;
  ModelKind kind;
  std::vector<TensorSpec> inputs;
  std::vector<TensorSpec> outputs;
  // Parameters the model fixes: a request may not give them again
  // (kserve/infer.cc). Empty for built-in models.
  Parameters fixed;
  // Parameters a request may not give although no value is fixed for them:
  // with an hf_config (kserve/model_file.h) the config determines the whole
  // scaling, including the parameters it leaves unset, as it does beside a
  // request's own hf_config.
  std::vector<std::string> determined_by_hf_config;
  // RoPE: the head size query and key must have (0: any). Announced in the
  // metadata and checked per request, so a tensor of another model cannot
  // be rotated with this one's frequencies.
  int64_t head_dim = 0;
  std::string file;  // the repository file it came from ("" for built-ins)
};

// The only version of every model.
inline constexpr char kModelVersion[] = "1";

// rope, sinusoidal, learned, attention_bias.
const std::vector<std::shared_ptr<const Model>>& BuiltInModels();
// The built-in model of `kind` (a repository model's tensors are its).
const Model& BuiltInModel(ModelKind kind);
const char* KindName(ModelKind kind);
const TensorSpec* FindInput(const Model& model, absl::string_view name);
const TensorSpec* FindOutput(const Model& model, absl::string_view name);

// The shortest of %.15g and %.17g that reads back as `d`.
std::string NumberText(double d);
// A parameter's value as text ("500000", "llama3", "true").
std::string ParameterText(const inference::InferParameter& p);

// The parameters a request to `model` is read with: its own plus those the
// model fixes. INVALID_ARGUMENT naming a fixed parameter the request gives
// again (it would be ambiguous which one wins), or one of
// determined_by_hf_config. *merged is only filled for
// models fixing something; the answer points at it or at the request's.
[[nodiscard]] absl::StatusOr<const Parameters*> ParametersFor(const Model& model,
                                                              const Parameters& request,
                                                              Parameters* merged);

inference::ModelMetadataResponse MetadataOf(const Model& model);
inference::ModelConfig ConfigOf(const Model& model);

}  // namespace posenc::server::kserve

#endif  // POSENC_SERVER_KSERVE_MODELS_H_
