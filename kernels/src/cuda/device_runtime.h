// The CUDA runtime as the CUDA backend uses it, behind an interface: the
// handful of calls its host side makes (device, streams, memory, copies,
// the last-error slot) and the three kernel launchers. CudaRuntime() is the
// real one. Tests put a host-memory fake behind it (tests/support/
// fake_device_runtime.h) that runs the kernels' bodies over their grid on
// the CPU, so the backend's own logic (staging, worker streams, buffer
// growth, error classification, recovery) is tested on machines without a
// GPU, bit for bit against the CPU backend, with faults injected at will.
#ifndef POSENC_KERNELS_CUDA_DEVICE_RUNTIME_H_
#define POSENC_KERNELS_CUDA_DEVICE_RUNTIME_H_

#include <cuda_runtime.h>

#include <cstddef>

#include "kernel_params.h"

namespace posenc::cuda {

class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;

  virtual cudaError_t SetDevice(int device) = 0;
  virtual cudaError_t StreamCreate(cudaStream_t* stream) = 0;  // non-blocking
  virtual cudaError_t StreamDestroy(cudaStream_t stream) = 0;
  virtual cudaError_t StreamSynchronize(cudaStream_t stream) = 0;
  virtual cudaError_t Malloc(void** p, size_t bytes) = 0;
  virtual cudaError_t Free(void* p) = 0;
  virtual cudaError_t MallocHost(void** p, size_t bytes) = 0;  // pinned
  virtual cudaError_t FreeHost(void* p) = 0;
  virtual cudaError_t MemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                                  cudaStream_t stream) = 0;
  // Returns and clears the calling thread's last error (sticky ones stay).
  virtual cudaError_t GetLastError() = 0;
  // cudaHostRegister (cudaHostRegisterDefault) and cudaHostUnregister.
  virtual cudaError_t HostRegister(void* p, size_t bytes) = 0;
  virtual cudaError_t HostUnregister(void* p) = 0;

  // cudaIpcOpenMemHandle (cudaIpcMemLazyEnablePeerAccess) and
  // cudaIpcCloseMemHandle: another process's device allocation, mapped
  // into this one.
  virtual cudaError_t IpcOpenMemHandle(void** p, const cudaIpcMemHandle_t& handle) = 0;
  virtual cudaError_t IpcCloseMemHandle(void* p) = 0;
  // The allocation `p` lies in: its first byte and size (the driver's
  // cuMemGetAddressRange, which the runtime API lacks).
  virtual cudaError_t MemGetAddressRange(const void* p, void** base, size_t* bytes) = 0;

  // cuda_kernels.h's launchers: the launch's own error.
  virtual cudaError_t LaunchRope(const RopeParams& p, int sm_count, cudaStream_t stream) = 0;
  virtual cudaError_t LaunchAbsolute(const AbsoluteParams& p, cudaStream_t stream) = 0;
  virtual cudaError_t LaunchBias(const BiasParams& p, cudaStream_t stream) = 0;
};

// The CUDA runtime itself (process-wide, never destroyed).
DeviceRuntime& CudaRuntime();

}  // namespace posenc::cuda

#endif  // POSENC_KERNELS_CUDA_DEVICE_RUNTIME_H_
