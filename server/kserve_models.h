// The models the KServe v2 front serves: named, built-in configurations of
// posenc's operations whose options arrive as request parameters
// (kserve_parameters.h). What a model takes and gives is described here
// once; metadata, configuration and input checking all read it.
#ifndef POSENC_SERVER_KSERVE_MODELS_H_
#define POSENC_SERVER_KSERVE_MODELS_H_

#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
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

struct Model {
  const char* name;
  ModelKind kind;
  std::vector<TensorSpec> inputs;
  std::vector<TensorSpec> outputs;
};

// The only version of every model.
inline constexpr char kModelVersion[] = "1";

absl::Span<const Model> BuiltInModels();
// Null when there is no such model.
const Model* FindModel(absl::string_view name);
const TensorSpec* FindInput(const Model& model, absl::string_view name);
const TensorSpec* FindOutput(const Model& model, absl::string_view name);

inference::ModelMetadataResponse MetadataOf(const Model& model);
inference::ModelConfig ConfigOf(const Model& model);

}  // namespace posenc::server::kserve

#endif  // POSENC_SERVER_KSERVE_MODELS_H_
