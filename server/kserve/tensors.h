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
#include "engine/scratch_pool.h"
#include "kserve/grpc_service.pb.h"
#include "kserve/shared_memory.h"
#include "posenc/tensor.h"

namespace posenc::server::kserve {

// INVALID_ARGUMENT naming `field` unless `datatype` is one posenc computes
// in: FP32, FP16, BF16, INT32, INT64.
[[nodiscard]] absl::StatusOr<DType> DTypeOf(absl::string_view field, absl::string_view datatype);
const char* DatatypeOf(DType dtype);

// One input: its bytes taken out of the message, or left in the
// shared-memory slice the request names (computed on in place there).
struct Input {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::string data;           // the bytes, unless they are in shared memory
  std::optional<ShmRef> shm;  // where they are instead (data is then empty)
  // A private copy of a shared-memory input worked on aside (MakeScratch);
  // its first `size()` bytes are the tensor's.
  ScratchPool::Buffer scratch;
  // Where the engine writes this tensor's result instead of in place
  // (RoPE, absolute encodings): another slice of shared memory
  // (kserve/infer.cc's Place).
  char* out = nullptr;

  char* bytes() {
    if (scratch) return scratch.data();
    return shm ? shm->region->At(shm->offset) : data.data();
  }
  int64_t size() const { return shm ? shm->byte_size : static_cast<int64_t>(data.size()); }
  TensorView view() { return TensorView{dtype, shape, bytes(), static_cast<size_t>(size())}; }
  // A writable view (for tensors worked on in place).
  MutableTensor mutable_view() {
    return MutableTensor{dtype, shape, bytes(), static_cast<size_t>(size())};
  }
  // Copies the bytes out of shared memory into `data`, which the caller has
  // admitted: for positions and lengths (validated, then used to index, so
  // the caller must not be able to change them in between) and for tensors
  // whose results go into the answer. No-op for bytes already private.
  [[nodiscard]] absl::Status MakePrivate(absl::string_view field);
  // Copies the bytes out of shared memory into a scratch buffer lent by
  // `pool` and charged to `call`, leaving `shm` naming where they came
  // from: for a tensor whose result goes to another slice.
  [[nodiscard]] absl::Status MakeScratch(absl::string_view field, ScratchPool& pool,
                                         AdmissionControl::Ticket& call);
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
// shape (ValidateTensorBytes). Inputs in `shm` (null: none) stay in their
// slices (Input::shm); nothing of them is read here.
[[nodiscard]] absl::StatusOr<std::vector<Input>> TakeInputs(inference::ModelInferRequest* req,
                                                            const ShmInputs* shm = nullptr);

}  // namespace posenc::server::kserve

#endif  // POSENC_SERVER_KSERVE_TENSORS_H_
