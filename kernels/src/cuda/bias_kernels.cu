// Attention biases on the GPU: a __global__ around bias_body.h.
#include "bias_body.h"
#include "cuda_kernels.h"

namespace posenc::cuda {
namespace {

template <typename T, int kWidth, bool kVector>
__global__ void __launch_bounds__(kThreadsPerBlock) BiasKernel(BiasParams p) {
  BiasBody<T, kWidth, kVector>(p, Coord{blockIdx.x, blockIdx.y, blockIdx.z},
                               Coord{threadIdx.x, threadIdx.y, threadIdx.z},
                               Coord{gridDim.x, gridDim.y, gridDim.z});
}

struct Launcher {
  const BiasParams& p;
  LaunchShape shape;
  cudaStream_t stream;
  template <typename T, int kWidth, bool kVector>
  void Run() {
    BiasKernel<T, kWidth, kVector><<<dim3(shape.grid.x), dim3(shape.block.x), 0, stream>>>(p);
  }
};

}  // namespace

cudaError_t LaunchBias(BiasParams p, cudaStream_t stream) {
  const LaunchShape shape = PlanBiasLaunch(&p);
  if (shape.empty()) return cudaSuccess;
  Launcher launcher{p, shape, stream};
  if (!VisitBias(p, launcher)) return cudaErrorInvalidValue;
  return cudaPeekAtLastError();
}

}  // namespace posenc::cuda
