// The KServe v2 / Triton gRPC front (inference.GRPCInferenceService), served
// on the same port as posenc.v1 so tritonclient, perf_analyzer and other
// KServe clients talk to posenc unchanged. A thin adapter: models and their
// tensors are in kserve_models.h, the work in kserve_infer.h on the same
// Engine as posenc.v1 (admission, validation, backends, limits), with the
// same metrics and error codes.
//
// ModelInfer is taken as raw bytes so the request is parsed once into a
// message the call owns (its tensors then move into the answer, which goes
// out without a copy of its raw outputs). Unlike posenc.v1's tensor methods
// (tensor_calls.h), gRPC has read the request before the handler runs, so
// admission here bounds the work and the memory answers add, not the
// request bodies waiting in the transport (--max_memory_bytes does that).
#ifndef POSENC_SERVER_KSERVE_SERVICE_H_
#define POSENC_SERVER_KSERVE_SERVICE_H_

#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "kserve/grpc_service.grpc.pb.h"
#include "kserve/infer.h"
#include "kserve/model_registry.h"
#include "kserve/statistics.h"
#include "rpc/metrics.h"
#include "engine/request_executor.h"
#include "engine/shared_memory_registry.h"

namespace posenc::server {

using KServeServiceBase = inference::GRPCInferenceService::WithRawCallbackMethod_ModelInfer<
    inference::GRPCInferenceService::CallbackService>;

class KServeService final : public KServeServiceBase {
 public:
  // `metrics` may be null (no metrics endpoint). Loads the model
  // repository (logging what it skipped) before returning. `shared_memory`
  // says whether (and within which caps) the system shared-memory extension
  // is served.
  KServeService(Engine* engine, Metrics* metrics, RequestExecutor* executor,
                kserve::ModelRepositoryOptions models = {},
                const SharedMemoryOptions& shared_memory = {});

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* ctx,
                                       const inference::ServerLiveRequest* req,
                                       inference::ServerLiveResponse* resp) override;
  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* ctx,
                                        const inference::ServerReadyRequest* req,
                                        inference::ServerReadyResponse* resp) override;
  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* ctx,
                                       const inference::ModelReadyRequest* req,
                                       inference::ModelReadyResponse* resp) override;
  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* ctx,
                                           const inference::ServerMetadataRequest* req,
                                           inference::ServerMetadataResponse* resp) override;
  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* ctx,
                                          const inference::ModelMetadataRequest* req,
                                          inference::ModelMetadataResponse* resp) override;
  grpc::ServerUnaryReactor* ModelConfig(grpc::CallbackServerContext* ctx,
                                        const inference::ModelConfigRequest* req,
                                        inference::ModelConfigResponse* resp) override;
  grpc::ServerUnaryReactor* ModelStatistics(grpc::CallbackServerContext* ctx,
                                            const inference::ModelStatisticsRequest* req,
                                            inference::ModelStatisticsResponse* resp) override;
  grpc::ServerUnaryReactor* RepositoryIndex(grpc::CallbackServerContext* ctx,
                                            const inference::RepositoryIndexRequest* req,
                                            inference::RepositoryIndexResponse* resp) override;
  // Rescans --model_dir on the executor (file I/O stays off gRPC's
  // threads); OK when the named model is ready afterwards.
  grpc::ServerUnaryReactor* RepositoryModelLoad(
      grpc::CallbackServerContext* ctx, const inference::RepositoryModelLoadRequest* req,
      inference::RepositoryModelLoadResponse* resp) override;
  grpc::ServerUnaryReactor* SystemSharedMemoryStatus(
      grpc::CallbackServerContext* ctx, const inference::SystemSharedMemoryStatusRequest* req,
      inference::SystemSharedMemoryStatusResponse* resp) override;
  grpc::ServerUnaryReactor* SystemSharedMemoryRegister(
      grpc::CallbackServerContext* ctx, const inference::SystemSharedMemoryRegisterRequest* req,
      inference::SystemSharedMemoryRegisterResponse* resp) override;
  grpc::ServerUnaryReactor* SystemSharedMemoryUnregister(
      grpc::CallbackServerContext* ctx, const inference::SystemSharedMemoryUnregisterRequest* req,
      inference::SystemSharedMemoryUnregisterResponse* resp) override;
  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerBidiReactor<inference::ModelInferRequest, inference::ModelStreamInferResponse>*
  ModelStreamInfer(grpc::CallbackServerContext* ctx) override;

  // One serialised ModelInferRequest run as ModelInfer runs it on an
  // admitted call: parse, compute, serialise into `answer` (raw outputs
  // without a copy). `admission` must hold the request's bytes twice. For
  // benchmarks and tests; ModelInfer uses it too. `arrived` (when the call
  // came) splits its time into queueing and computing in the statistics.
  // *shm_bytes (may be null) gets the tensor bytes moved through shared
  // memory, in and out.
  [[nodiscard]] absl::Status RunModelInfer(const grpc::ByteBuffer& request,
                                           grpc::ByteBuffer* answer, const RunContext& ctx,
                                           Engine::Admission& admission,
                                           std::chrono::steady_clock::time_point arrived,
                                           std::string* backend,
                                           kserve::ShmTraffic* shm_bytes = nullptr);

  SharedMemoryRegistry& shared_memory() { return shared_.shared_memory; }

  // Rescans --model_dir and logs the result (a drain abandons it).
  void ReloadModels();
  const kserve::ModelRegistry& models() const { return shared_.models; }

  // Requests admitted and not yet answered (a drain waits for them).
  int busy() const { return shared_.busy.load(); }

  // Shared with the calls (kserve_service.cc).
  struct Shared {
    Engine* engine;
    Metrics* metrics;
    RequestExecutor* executor;
    kserve::ModelStatisticsTable statistics;
    kserve::ModelRegistry models;
    std::atomic<int> busy{0};
    SharedMemoryRegistry shared_memory;
  };

 private:
  Shared shared_;
};

}  // namespace posenc::server

#endif  // POSENC_SERVER_KSERVE_SERVICE_H_
