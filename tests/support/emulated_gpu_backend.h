// A Backend that runs the CUDA kernels' bodies (kernels/src/cuda/*_body.h) on the
// CPU, calling each body for every block and thread of the grid the CUDA
// launcher would use, on host memory, with the parameters the CUDA backend
// would pass (params_from_plan.h). Tests run the whole conformance suite
// against it, so the GPU kernels' index maps and arithmetic are proven on
// every commit, on machines without a GPU.
#ifndef POSENC_TESTS_EMULATED_GPU_BACKEND_H_
#define POSENC_TESTS_EMULATED_GPU_BACKEND_H_

#include <memory>

#include "posenc/backend.h"

namespace posenc::testing {

// `sm_count` as on the GPU being emulated (it shapes decode launches).
std::unique_ptr<Backend> CreateEmulatedGpuBackend(int sm_count = 132);

}  // namespace posenc::testing

#endif  // POSENC_TESTS_EMULATED_GPU_BACKEND_H_
