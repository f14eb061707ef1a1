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

namespace posenc::cuda {
struct RopeParams;
struct AbsoluteParams;
struct BiasParams;
}  // namespace posenc::cuda

namespace posenc::testing {

// `sm_count` as on the GPU being emulated (it shapes decode launches).
std::unique_ptr<Backend> CreateEmulatedGpuBackend(int sm_count = 132);

// One launch of a kernel over the grid its CUDA launcher would plan for `p`
// (planned here, on a copy), on whatever memory p points at. `dry_run`
// only asks whether a kernel variant covers p.
enum class GridOutcome {
  kRan,
  kNoVariant,   // the launcher's cudaErrorInvalidValue
  kMisaligned,  // a vector access at an address not aligned to its width
};
GridOutcome EmulateRopeLaunch(const cuda::RopeParams& p, int sm_count, bool dry_run = false);
GridOutcome EmulateAbsoluteLaunch(const cuda::AbsoluteParams& p, bool dry_run = false);
GridOutcome EmulateBiasLaunch(const cuda::BiasParams& p, bool dry_run = false);

}  // namespace posenc::testing

#endif  // POSENC_TESTS_EMULATED_GPU_BACKEND_H_
