// Kernel launchers of the CUDA backend. Each plans the launch for the given
// parameters (the *_body.h Plan*Launch functions, the same the host
// emulation of the grid uses),
// launches on `stream` and returns that launch's own error:
// cudaErrorInvalidValue for a variant the kernels do not cover, otherwise
// what cudaPeekAtLastError reports right after the launch. Every pointer in
// the params is device memory.
#ifndef POSENC_KERNELS_CUDA_KERNELS_H_
#define POSENC_KERNELS_CUDA_KERNELS_H_

#include <cuda_runtime.h>

#include "kernel_params.h"

namespace posenc::cuda {

// `sm_count` sizes the head split of decode-sized launches.
cudaError_t LaunchRope(RopeParams p, int sm_count, cudaStream_t stream);
cudaError_t LaunchAbsolute(AbsoluteParams p, cudaStream_t stream);
cudaError_t LaunchBias(BiasParams p, cudaStream_t stream);

}  // namespace posenc::cuda

#endif  // POSENC_KERNELS_CUDA_KERNELS_H_
