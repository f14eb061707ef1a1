#include "device_runtime.h"

#include "cuda_kernels.h"

namespace posenc::cuda {
namespace {

class RealRuntime final : public DeviceRuntime {
 public:
  cudaError_t SetDevice(int device) override { return cudaSetDevice(device); }
  cudaError_t StreamCreate(cudaStream_t* stream) override {
    return cudaStreamCreateWithFlags(stream, cudaStreamNonBlocking);
  }
  cudaError_t StreamDestroy(cudaStream_t stream) override { return cudaStreamDestroy(stream); }
  cudaError_t StreamSynchronize(cudaStream_t stream) override {
    return cudaStreamSynchronize(stream);
  }
  cudaError_t Malloc(void** p, size_t bytes) override { return cudaMalloc(p, bytes); }
  cudaError_t Free(void* p) override { return cudaFree(p); }
  cudaError_t MallocHost(void** p, size_t bytes) override { return cudaMallocHost(p, bytes); }
  cudaError_t FreeHost(void* p) override { return cudaFreeHost(p); }
  cudaError_t MemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                          cudaStream_t stream) override {
    return cudaMemcpyAsync(dst, src, bytes, kind, stream);
  }
  cudaError_t GetLastError() override { return cudaGetLastError(); }
  cudaError_t HostRegister(void* p, size_t bytes) override {
    return cudaHostRegister(p, bytes, cudaHostRegisterDefault);
  }
  cudaError_t HostUnregister(void* p) override { return cudaHostUnregister(p); }
  cudaError_t LaunchRope(const RopeParams& p, int sm_count, cudaStream_t stream) override {
    return cuda::LaunchRope(p, sm_count, stream);
  }
  cudaError_t LaunchAbsolute(const AbsoluteParams& p, cudaStream_t stream) override {
    return cuda::LaunchAbsolute(p, stream);
  }
  cudaError_t LaunchBias(const BiasParams& p, cudaStream_t stream) override {
    return cuda::LaunchBias(p, stream);
  }
};

}  // namespace

DeviceRuntime& CudaRuntime() {
  static RealRuntime* runtime = new RealRuntime;
  return *runtime;
}

}  // namespace posenc::cuda
