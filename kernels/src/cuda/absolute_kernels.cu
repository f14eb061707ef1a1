// Absolute encodings on the GPU: a __global__ around absolute_body.h.
#include "absolute_body.h"
#include "cuda_kernels.h"

namespace posenc::cuda {
namespace {

template <typename T, int kWidth, bool kVector>
__global__ void __launch_bounds__(kThreadsPerBlock) AbsoluteKernel(AbsoluteParams p) {
  AbsoluteBody<T, kWidth, kVector>(p, Coord{blockIdx.x, blockIdx.y, blockIdx.z},
                                   Coord{threadIdx.x, threadIdx.y, threadIdx.z});
}

struct Launcher {
  const AbsoluteParams& p;
  LaunchShape shape;
  cudaStream_t stream;
  template <typename T, int kWidth, bool kVector>
  void Run() {
    AbsoluteKernel<T, kWidth, kVector><<<dim3(shape.grid.x), dim3(shape.block.x), 0, stream>>>(p);
  }
};

}  // namespace

cudaError_t LaunchAbsolute(AbsoluteParams p, cudaStream_t stream) {
  const LaunchShape shape = PlanAbsoluteLaunch(&p);
  if (shape.empty()) return cudaSuccess;
  if (shape.grid.x > 0x7fffffffu) return cudaErrorInvalidValue;
  Launcher launcher{p, shape, stream};
  if (!VisitAbsolute(p, launcher)) return cudaErrorInvalidValue;
  return cudaPeekAtLastError();
}

}  // namespace posenc::cuda
