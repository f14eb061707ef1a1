#include "device_runtime.h"

#include <dlfcn.h>

#include "cuda_kernels.h"

namespace posenc::cuda {
namespace {

// cuMemGetAddressRange_v2 from the driver the runtime itself loaded
// (dlopen, not a link: a binary linked to libcuda would not start on a
// machine without a GPU driver, and the server must).
using AddressRangeFn = int (*)(unsigned long long* base, size_t* size, unsigned long long p);
AddressRangeFn DriverAddressRange() {
  static const AddressRangeFn fn = [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (lib == nullptr) lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    return lib == nullptr ? nullptr
                          : reinterpret_cast<AddressRangeFn>(dlsym(lib, "cuMemGetAddressRange_v2"));
  }();
  return fn;
}

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
  cudaError_t IpcOpenMemHandle(void** p, const cudaIpcMemHandle_t& handle) override {
    return cudaIpcOpenMemHandle(p, handle, cudaIpcMemLazyEnablePeerAccess);
  }
  cudaError_t IpcCloseMemHandle(void* p) override { return cudaIpcCloseMemHandle(p); }
  cudaError_t MemGetAddressRange(const void* p, void** base, size_t* bytes) override {
    const AddressRangeFn fn = DriverAddressRange();
    if (fn == nullptr) return cudaErrorNotSupported;
    unsigned long long b = 0;
    // CUDA_SUCCESS is 0; any other driver result means `p` is no device
    // allocation this context knows.
    if (fn(&b, bytes, reinterpret_cast<unsigned long long>(p)) != 0) return cudaErrorInvalidValue;
    *base = reinterpret_cast<void*>(b);
    return cudaSuccess;
  }
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
