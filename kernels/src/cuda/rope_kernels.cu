// RoPE on the GPU: a __global__ around rope_body.h's RopeBody, one
// instantiation per dtype, pairing and slice width.
#include "cuda_kernels.h"
#include "rope_body.h"

namespace posenc::cuda {
namespace {

// At least 4 blocks per SM (64 registers a thread): the 16-bit NEOX kernel
// with 8 pairs a slice otherwise takes 80 and fits 3, and on an H100 ran
// 0.73x of a device copy instead of 0.85x (bench/RESULTS.md).
template <typename T, RopeStyle kStyle, int kPairs, bool kVector>
__global__ void __launch_bounds__(kThreadsPerBlock, 4) RopeKernel(RopeParams p) {
  RopeBody<T, kStyle, kPairs, kVector>(p, Coord{blockIdx.x, blockIdx.y, blockIdx.z},
                                       Coord{threadIdx.x, threadIdx.y, threadIdx.z});
}

struct Launcher {
  const RopeParams& p;
  LaunchShape shape;
  cudaStream_t stream;
  template <typename T, RopeStyle kStyle, int kPairs, bool kVector>
  void Run() {
    RopeKernel<T, kStyle, kPairs, kVector>
        <<<dim3(shape.grid.x, shape.grid.y), dim3(shape.block.x), 0, stream>>>(p);
  }
};

}  // namespace

cudaError_t LaunchRope(RopeParams p, int sm_count, cudaStream_t stream) {
  const LaunchShape shape = PlanRopeLaunch(&p, sm_count);
  if (shape.empty()) return cudaSuccess;
  if (shape.grid.y > 65535 || shape.grid.x > 0x7fffffffu) return cudaErrorInvalidValue;
  Launcher launcher{p, shape, stream};
  if (!VisitRope(p, launcher)) return cudaErrorInvalidValue;
  return cudaPeekAtLastError();
}

}  // namespace posenc::cuda
