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

// `runtime` outlives the backend. `sm_count` sizes decode launches.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackendOn(DeviceRuntime& runtime, int device,
                                                            DeviceInfo info, int sm_count);

}  // namespace posenc::cuda

#endif  // POSENC_KERNELS_CUDA_CUDA_BACKEND_H_
