// The CUDA backend on a given DeviceRuntime (device_runtime.h). Production
// goes through posenc::CreateCudaBackend, which finds the device and uses
// the CUDA runtime; tests pass a fake runtime to run the backend's host
// logic without a GPU.
#ifndef POSENC_KERNELS_CUDA_CUDA_BACKEND_H_
#define POSENC_KERNELS_CUDA_CUDA_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "device_runtime.h"
#include "posenc/backend.h"

namespace posenc::cuda {

struct CudaBackendOptions {
  // Large token-major calls are staged in chunks of about this many bytes
  // of tensors (cuda_backend.cc); calls under twice it go whole.
  size_t chunk_bytes = size_t{4} << 20;
  // Pinned staging a worker keeps between calls: a buffer grown past this
  // for a large call is freed after it, so what stays is bounded
  // (ResidentHostBytes) while the large call's own staging is charged to
  // it by the server (StagingBytes). Staged calls need at most about 2 x
  // chunk_bytes plus their side tables (chunked calls go through two
  // chunk-sized slots).
  size_t max_idle_staging_bytes = size_t{16} << 20;
};

// `runtime` outlives the backend. `sm_count` sizes decode launches.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackendOn(DeviceRuntime& runtime, int device,
                                                             DeviceInfo info, int sm_count,
                                                             CudaBackendOptions options = {});

}  // namespace posenc::cuda

#endif  // POSENC_KERNELS_CUDA_CUDA_BACKEND_H_
