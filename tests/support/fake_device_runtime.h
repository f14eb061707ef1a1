// A DeviceRuntime (kernels/src/cuda/device_runtime.h) in host memory, so the
// CUDA backend's own logic runs on machines without a GPU:
//  - "device" and "pinned" memory are host allocations it keeps track of;
//    a copy or a launch that names memory of the wrong kind (a host pointer
//    where a device one belongs, bytes past an allocation's end) fails with
//    cudaErrorInvalidValue, as it would be a fault on a GPU;
//  - work queued on a stream runs only when the stream is synchronized, in
//    order, so a caller that reads results before waiting reads stale bytes
//    and its test fails;
//  - launches run the kernels' bodies over their grid on the CPU
//    (emulated_gpu_backend.h), so results are the GPU kernels' own;
//  - faults are injected on demand (FailNext); a sticky error (a lost
//    context: cudaErrorIllegalAddress, cudaErrorMisalignedAddress, ...)
//    then fails every later call, and the last-error slot is per thread and
//    keeps it, as the CUDA runtime does; a launch reports whatever that slot
//    holds (the launchers return cudaPeekAtLastError), so an error a caller
//    left uncleared fails its next launch here as it would there.
#ifndef POSENC_TESTS_SUPPORT_FAKE_DEVICE_RUNTIME_H_
#define POSENC_TESTS_SUPPORT_FAKE_DEVICE_RUNTIME_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "cuda/device_runtime.h"

namespace posenc::testing {

class FakeDeviceRuntime final : public cuda::DeviceRuntime {
 public:
  enum class Op {
    kSetDevice,
    kStreamCreate,
    kStreamSynchronize,
    kMalloc,
    kMallocHost,
    kMemcpy,
    kLaunch,
    kHostRegister,
    kIpcOpen
  };

  explicit FakeDeviceRuntime(int64_t device_memory_bytes = int64_t{1} << 30);
  ~FakeDeviceRuntime() override;

  // The call of `op` after `skip` more of them fails with `error`.
  void FailNext(Op op, cudaError_t error, int skip = 0);
  // Device memory the fake pretends to have (cudaErrorMemoryAllocation past it).
  void set_device_memory(int64_t bytes);
  // The one device ordinal SetDevice accepts (0 unless told): a test with
  // several GPUs gives each fake its own.
  void set_ordinal(int ordinal) { ordinal_ = ordinal; }

  int64_t device_bytes_in_use() const;
  int64_t pinned_bytes_in_use() const;
  // The most pinned bytes held at once since the last ResetPinnedPeak.
  int64_t pinned_bytes_peak() const;
  void ResetPinnedPeak();
  // Successful MallocHost calls so far (a backend that allocates staging
  // per call shows here).
  int pinned_allocations() const;
  int launches() const;
  int64_t bytes_copied() const;
  // Bytes copied straight from or to host memory registered with
  // HostRegister (no staging buffer in between).
  int64_t bytes_copied_direct() const;
  int64_t registered_bytes() const;
  // What another process would send for the device allocation starting at
  // `p` (cudaIpcGetMemHandle): opening it maps that allocation.
  cudaIpcMemHandle_t IpcHandleOf(void* p) const;
  // Handles opened and not yet closed.
  int ipc_open() const;
  // Runs at the start of every HostRegister, outside the fake's lock (a
  // test holds a registration there, as a large one takes time on a GPU).
  // Set before the calls that may run it.
  void set_before_host_register(std::function<void()> f) { before_host_register_ = std::move(f); }

  cudaError_t SetDevice(int device) override;
  cudaError_t StreamCreate(cudaStream_t* stream) override;
  cudaError_t StreamDestroy(cudaStream_t stream) override;
  cudaError_t StreamSynchronize(cudaStream_t stream) override;
  cudaError_t Malloc(void** p, size_t bytes) override;
  cudaError_t Free(void* p) override;
  cudaError_t MallocHost(void** p, size_t bytes) override;
  cudaError_t FreeHost(void* p) override;
  cudaError_t MemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                          cudaStream_t stream) override;
  cudaError_t GetLastError() override;
  cudaError_t HostRegister(void* p, size_t bytes) override;
  cudaError_t HostUnregister(void* p) override;
  cudaError_t IpcOpenMemHandle(void** p, const cudaIpcMemHandle_t& handle) override;
  cudaError_t IpcCloseMemHandle(void* p) override;
  cudaError_t MemGetAddressRange(const void* p, void** base, size_t* bytes) override;
  cudaError_t LaunchRope(const cuda::RopeParams& p, int sm_count, cudaStream_t stream) override;
  cudaError_t LaunchAbsolute(const cuda::AbsoluteParams& p, cudaStream_t stream) override;
  cudaError_t LaunchBias(const cuda::BiasParams& p, cudaStream_t stream) override;

 private:
  using Work = std::function<cudaError_t()>;
  struct Injected {
    Op op;
    cudaError_t error;
    int skip;
  };
  // The result of a call: records a failure in the thread's last-error slot
  // and a sticky one for every later call. REQUIRES: mu_ held.
  cudaError_t Result(cudaError_t e);
  // A failure injected for this call of `op`, or cudaSuccess; also the
  // lost context once there is one. REQUIRES: mu_ held.
  cudaError_t Injection(Op op);
  // Whether [p, p + bytes) lies in one allocation of `in`. REQUIRES: mu_ held.
  static bool Within(const std::map<uintptr_t, size_t>& in, const void* p, size_t bytes);
  bool OnDevice(const void* p, size_t bytes) const { return Within(device_, p, bytes); }
  cudaError_t Enqueue(cudaStream_t stream, Work work);  // REQUIRES: mu_ held
  // What the launchers report after a launch, as cudaPeekAtLastError does:
  // the thread's last error, an earlier call's included, without clearing
  // it. REQUIRES: mu_ held.
  cudaError_t PeekLastError() const;

  mutable std::mutex mu_;
  int64_t device_memory_;
  std::map<uintptr_t, size_t> device_, pinned_, registered_;  // start -> bytes
  int pinned_allocations_ = 0;
  int64_t pinned_in_use_ = 0, pinned_peak_ = 0;
  std::map<cudaStream_t, std::deque<Work>> streams_;
  std::map<uintptr_t, int> ipc_open_;  // allocation -> times opened
  std::deque<Injected> injected_;
  std::map<std::thread::id, cudaError_t> last_error_;
  cudaError_t sticky_ = cudaSuccess;
  int launches_ = 0;
  int64_t bytes_copied_ = 0;
  int64_t bytes_copied_direct_ = 0;
  int next_stream_ = 1;
  int ordinal_ = 0;
  std::function<void()> before_host_register_;
};

}  // namespace posenc::testing

#endif  // POSENC_TESTS_SUPPORT_FAKE_DEVICE_RUNTIME_H_
