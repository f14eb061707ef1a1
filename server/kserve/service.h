// The KServe v2 / Triton gRPC front (inference.GRPCInferenceService), served
// on the same port as posenc.v1 so tritonclient, perf_analyzer and other
// KServe clients talk to posenc unchanged. A thin adapter: models and their
// tensors are in models.h, the work in infer.h on the same Engine as
// posenc.v1 (admission, validation, backends, limits), and every call goes
// through the same lifecycle (rpc/call.h): registered with every method
// generic, each served by CallRouter from Methods().
#ifndef POSENC_SERVER_KSERVE_SERVICE_H_
#define POSENC_SERVER_KSERVE_SERVICE_H_

#include <vector>

#include "engine/engine.h"
#include "engine/shared_memory_registry.h"
#include "kserve/grpc_service.grpc.pb.h"
#include "kserve/infer.h"
#include "kserve/model_registry.h"
#include "kserve/statistics.h"
#include "rpc/call.h"
#include "rpc/generic_service.h"

namespace posenc::server {

inline constexpr char kKServeService[] = "inference.GRPCInferenceService";

class KServeService final : public GenericallyServed<inference::GRPCInferenceService> {
 public:
  // Loads the model repository (logging what it skipped) before returning.
  // Shared-memory regions are the engine's (both fronts share them).
  explicit KServeService(Engine* engine, kserve::ModelRepositoryOptions models = {});

  // ModelInfer and ModelStreamInfer (infer_methods.cc), the control methods.
  std::vector<Method> Methods();

  SharedMemoryRegistry& shared_memory() { return engine_->shared_memory(); }
  const kserve::ModelRegistry& models() const { return models_; }
  // Rescans --model_dir (loading `load` again if it was unloaded) and logs
  // the result: ModelRegistry::Reload's status (a drain abandons it:
  // CANCELLED; RESOURCE_EXHAUSTED while two reloads are under way).
  [[nodiscard]] absl::Status ReloadModels(absl::string_view load = {});

 private:
  std::vector<Method> InferMethods();
  std::vector<Method> ControlMethods();

  Engine* engine_;
  kserve::ModelStatisticsTable statistics_;
  kserve::ModelRegistry models_;
};

}  // namespace posenc::server

#endif  // POSENC_SERVER_KSERVE_SERVICE_H_
