// Tensors of the KServe v2 protocol: datatype names ("FP32", "BF16",
// "INT64") to the kernel library's DType and back, and a request's inputs
// taken out of the message by name, each validated against its shape. Raw
// contents (raw_input_contents, the fast path tritonclient and
// perf_analyzer use) are moved, never copied; typed contents (fp32,
// int32, int64) are converted once into little-endian bytes.
#ifndef POSENC_SERVER_KSERVE_TENSORS_H_
#define POSENC_SERVER_KSERVE_TENSORS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kserve/grpc_service.pb.h"
#include "kserve/shared_memory.h"
#include "posenc/tensor.h"

namespace posenc::server::kserve {

// INVALID_ARGUMENT naming `field` unless `datatype` is one posenc computes
// in: FP32, FP16, BF16, INT32, INT64.
[[nodiscard]] absl::StatusOr<DType> DTypeOf(absl::string_view field, absl::string_view datatype);
const char* DatatypeOf(DType dtype);

// One input, owning its bytes.
struct Input {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::string data;

  TensorView view() const { return TensorView{dtype, shape, data.data(), data.size()}; }
  // A writable view over data (for tensors worked on in place).
  MutableTensor mutable_view() { return MutableTensor{dtype, shape, data.data(), data.size()}; }
};

// The tensor bytes a request carries (what admission and the request size
// limit count): raw contents plus typed contents at their element size.
int64_t TensorBytes(const inference::ModelInferRequest& req);

// Where each input's bytes are in shared memory (nullopt: in the message),
// one entry per input of the request, in order.
using ShmInputs = std::vector<std::optional<ShmRef>>;

// Resolves the inputs' shared-memory parameters (ShmRefOf); *bytes gets
// their total. Other input parameters are ignored, as before the extension.
[[nodiscard]] absl::StatusOr<ShmInputs> ShmInputsOf(const inference::ModelInferRequest& req,
                                                    const SharedMemoryRegistry* registry,
                                                    int64_t* bytes);

// Takes every input out of `req` (its raw contents are left empty): names
// unique and non-empty, datatype known, raw contents either for every
// input not in shared memory or for none (Triton's rule), bytes matching the
// shape (ValidateTensorBytes). Inputs in `shm` (null: none) are read from
// their regions; the caller has admitted their bytes.
[[nodiscard]] absl::StatusOr<std::vector<Input>> TakeInputs(inference::ModelInferRequest* req,
                                                            const ShmInputs* shm = nullptr);

}  // namespace posenc::server::kserve

#endif  // POSENC_SERVER_KSERVE_TENSORS_H_
