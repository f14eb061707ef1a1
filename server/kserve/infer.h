// One KServe v2 ModelInferRequest run on the Engine: parameters read into
// kernel options, inputs taken by name and checked against the model,
// computed in place where the operation allows (RoPE, absolute encodings,
// bias added to logits), and answered with raw output contents moved into
// the response. The same validation and limits as posenc.v1 (the Engine
// applies them); errors are absl::Status with the SPEC §3 codes.
#ifndef POSENC_SERVER_KSERVE_INFER_H_
#define POSENC_SERVER_KSERVE_INFER_H_

#include <string>

#include "absl/status/status.h"
#include "engine/engine.h"
#include "engine/shared_memory_registry.h"
#include "kserve/grpc_service.pb.h"
#include "kserve/models.h"

namespace posenc::server::kserve {

// Tensor bytes a request moved through shared memory.
struct ShmTraffic {
  int64_t in = 0;
  int64_t out = 0;
};

// On an admitted call (`admission` holds the request; it grows by inputs
// read from shared memory before they are read). `req` is left without
// its tensors. *backend gets the backend that ran it. `shm` (null: the
// extension is off) resolves shared-memory tensors; *traffic (may be null)
// gets their bytes.
[[nodiscard]] absl::Status RunInfer(Engine& engine, const Model& model,
                                    inference::ModelInferRequest* req,
                                    inference::ModelInferResponse* resp, const RunContext& ctx,
                                    Engine::Admission& admission, std::string* backend,
                                    const SharedMemoryRegistry* shm = nullptr,
                                    ShmTraffic* traffic = nullptr);

}  // namespace posenc::server::kserve

#endif  // POSENC_SERVER_KSERVE_INFER_H_
