// What a failed CUDA runtime call means for the CUDA backend: the absl status
// code the caller gets, and whether the error poisoned the CUDA context so
// that the backend must stop taking work. Host-only and needs no device, so
// it is unit-tested on machines without a GPU.
#ifndef POSENC_KERNELS_CUDA_STATUS_H_
#define POSENC_KERNELS_CUDA_STATUS_H_

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace posenc::cuda {

// Where an error came from. A launcher (cuda_kernels.h) answers
// cudaErrorInvalidValue for a variant its kernels do not cover, which is a
// limit of the kernels, not a bad argument to the runtime.
enum class CudaCall { kRuntime, kLaunch };

struct CudaErrorClass {
  absl::StatusCode code;
  // The context is lost: this and every later CUDA call of the process fail,
  // and cudaGetLastError cannot clear it.
  bool sticky;
};

CudaErrorClass ClassifyCudaError(cudaError_t error, CudaCall call);

// OK for cudaSuccess; otherwise a status with ClassifyCudaError's code whose
// message names `what` (the call or step that failed) and the error, and says
// what follows from it (the CPU backend serves the request, or the context is
// gone until the process restarts).
absl::Status CudaErrorStatus(cudaError_t error, absl::string_view what,
                             CudaCall call = CudaCall::kRuntime);

}  // namespace posenc::cuda

#endif  // POSENC_KERNELS_CUDA_STATUS_H_
