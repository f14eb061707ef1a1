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
#include "engine.h"
#include "kserve/grpc_service.pb.h"
#include "kserve_models.h"

namespace posenc::server::kserve {

// On an admitted call (`admission` holds the request). `req` is left
// without its tensors. *backend gets the backend that ran it.
[[nodiscard]] absl::Status RunInfer(Engine& engine, const Model& model,
                                    inference::ModelInferRequest* req,
                                    inference::ModelInferResponse* resp, const RunContext& ctx,
                                    Engine::Admission& admission, std::string* backend);

}  // namespace posenc::server::kserve

#endif  // POSENC_SERVER_KSERVE_INFER_H_
