#include "fake_device_runtime.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuda/cuda_status.h"
#include "emulated_gpu_backend.h"
#include "posenc/dtype.h"

namespace posenc::testing {
namespace {

constexpr size_t kDeviceAlign = 256;  // what cudaMalloc guarantees

size_t RoundUp(size_t n) {
  return (std::max<size_t>(n, 1) + kDeviceAlign - 1) / kDeviceAlign * kDeviceAlign;
}

cudaError_t OutcomeError(GridOutcome o) {
  switch (o) {
    case GridOutcome::kRan:
      return cudaSuccess;
    case GridOutcome::kNoVariant:
      return cudaErrorInvalidValue;
    case GridOutcome::kMisaligned:
      return cudaErrorMisalignedAddress;
  }
  return cudaErrorUnknown;
}

}  // namespace

FakeDeviceRuntime::FakeDeviceRuntime(int64_t device_memory_bytes)
    : device_memory_(device_memory_bytes) {}

FakeDeviceRuntime::~FakeDeviceRuntime() {
  for (const auto& [p, n] : device_) std::free(reinterpret_cast<void*>(p));
  for (const auto& [p, n] : pinned_) std::free(reinterpret_cast<void*>(p));
}

void FakeDeviceRuntime::FailNext(Op op, cudaError_t error, int skip) {
  std::lock_guard<std::mutex> lock(mu_);
  injected_.push_back({op, error, skip});
}

void FakeDeviceRuntime::set_device_memory(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  device_memory_ = bytes;
}

int64_t FakeDeviceRuntime::device_bytes_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (const auto& [p, b] : device_) n += static_cast<int64_t>(b);
  return n;
}

int64_t FakeDeviceRuntime::pinned_bytes_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (const auto& [p, b] : pinned_) n += static_cast<int64_t>(b);
  return n;
}

int64_t FakeDeviceRuntime::pinned_bytes_peak() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pinned_peak_;
}

void FakeDeviceRuntime::ResetPinnedPeak() {
  std::lock_guard<std::mutex> lock(mu_);
  pinned_peak_ = pinned_in_use_;
}

int FakeDeviceRuntime::pinned_allocations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pinned_allocations_;
}

int FakeDeviceRuntime::launches() const {
  std::lock_guard<std::mutex> lock(mu_);
  return launches_;
}

int64_t FakeDeviceRuntime::bytes_copied() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_copied_;
}

int64_t FakeDeviceRuntime::bytes_copied_direct() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_copied_direct_;
}

int64_t FakeDeviceRuntime::registered_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (const auto& [p, b] : registered_) n += static_cast<int64_t>(b);
  return n;
}

cudaError_t FakeDeviceRuntime::HostRegister(void* p, size_t bytes) {
  if (before_host_register_) before_host_register_();
  std::lock_guard<std::mutex> lock(mu_);
  if (cudaError_t e = Injection(Op::kHostRegister); e != cudaSuccess) return Result(e);
  if (p == nullptr || bytes == 0 || OnDevice(p, 1) || Within(registered_, p, 1) ||
      Within(pinned_, p, 1)) {
    return Result(cudaErrorInvalidValue);
  }
  registered_[reinterpret_cast<uintptr_t>(p)] = bytes;
  return cudaSuccess;
}

cudaError_t FakeDeviceRuntime::HostUnregister(void* p) {
  std::lock_guard<std::mutex> lock(mu_);
  return Result(registered_.erase(reinterpret_cast<uintptr_t>(p)) == 1
                    ? cudaSuccess
                    : cudaErrorHostMemoryNotRegistered);
}

namespace {
constexpr char kIpcMagic[] = "posenc-fake-ipc";  // 16 bytes with its NUL
}  // namespace

cudaIpcMemHandle_t FakeDeviceRuntime::IpcHandleOf(void* p) const {
  cudaIpcMemHandle_t h;
  std::memset(&h, 0, sizeof(h));
  static_assert(sizeof(kIpcMagic) + sizeof(uintptr_t) <= sizeof(h.reserved));
  std::memcpy(h.reserved, kIpcMagic, sizeof(kIpcMagic));
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  std::memcpy(h.reserved + sizeof(kIpcMagic), &at, sizeof(at));
  return h;
}

int FakeDeviceRuntime::ipc_open() const {
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  for (const auto& [p, count] : ipc_open_) n += count;
  return n;
}

cudaError_t FakeDeviceRuntime::IpcOpenMemHandle(void** p, const cudaIpcMemHandle_t& handle) {
  std::lock_guard<std::mutex> lock(mu_);
  if (cudaError_t e = Injection(Op::kIpcOpen); e != cudaSuccess) return Result(e);
  uintptr_t at = 0;
  std::memcpy(&at, handle.reserved + sizeof(kIpcMagic), sizeof(at));
  // A forged or stale handle: no such allocation (or not its start).
  if (std::memcmp(handle.reserved, kIpcMagic, sizeof(kIpcMagic)) != 0 || device_.count(at) == 0) {
    return Result(cudaErrorInvalidResourceHandle);
  }
  ++ipc_open_[at];
  *p = reinterpret_cast<void*>(at);
  return cudaSuccess;
}

cudaError_t FakeDeviceRuntime::IpcCloseMemHandle(void* p) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ipc_open_.find(reinterpret_cast<uintptr_t>(p));
  if (it == ipc_open_.end()) return Result(cudaErrorInvalidResourceHandle);
  if (--it->second == 0) ipc_open_.erase(it);
  return cudaSuccess;
}

cudaError_t FakeDeviceRuntime::MemGetAddressRange(const void* p, void** base, size_t* bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto at = reinterpret_cast<uintptr_t>(p);
  auto it = device_.upper_bound(at);
  if (it == device_.begin()) return Result(cudaErrorInvalidValue);
  --it;
  if (at - it->first >= it->second) return Result(cudaErrorInvalidValue);
  *base = reinterpret_cast<void*>(it->first);
  *bytes = it->second;
  return cudaSuccess;
}

cudaError_t FakeDeviceRuntime::Result(cudaError_t e) {
  if (e == cudaSuccess) return e;
  last_error_[std::this_thread::get_id()] = e;
  if (cuda::ClassifyCudaError(e, cuda::CudaCall::kRuntime).sticky && sticky_ == cudaSuccess) {
    sticky_ = e;
  }
  return e;
}

cudaError_t FakeDeviceRuntime::Injection(Op op) {
  if (sticky_ != cudaSuccess) return sticky_;  // the context is gone
  for (auto it = injected_.begin(); it != injected_.end(); ++it) {
    if (it->op != op) continue;
    if (it->skip > 0) {
      --it->skip;
      return cudaSuccess;
    }
    const cudaError_t e = it->error;
    injected_.erase(it);
    return e;
  }
  return cudaSuccess;
}

bool FakeDeviceRuntime::Within(const std::map<uintptr_t, size_t>& in, const void* p, size_t bytes) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  auto it = in.upper_bound(at);
  if (it == in.begin()) return false;
  --it;
  return at >= it->first && at - it->first <= it->second && bytes <= it->second - (at - it->first);
}

cudaError_t FakeDeviceRuntime::Enqueue(cudaStream_t stream, Work work) {
  auto it = streams_.find(stream);
  if (it == streams_.end()) return cudaErrorInvalidResourceHandle;
  it->second.push_back(std::move(work));
  return cudaSuccess;
}

cudaError_t FakeDeviceRuntime::SetDevice(int device) {
  std::lock_guard<std::mutex> lock(mu_);
  if (cudaError_t e = Injection(Op::kSetDevice); e != cudaSuccess) return Result(e);
  return Result(device == ordinal_ ? cudaSuccess : cudaErrorInvalidDevice);
}

cudaError_t FakeDeviceRuntime::StreamCreate(cudaStream_t* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  if (cudaError_t e = Injection(Op::kStreamCreate); e != cudaSuccess) return Result(e);
  *stream = reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(next_stream_++) * 64);
  streams_[*stream];
  return cudaSuccess;
}

cudaError_t FakeDeviceRuntime::StreamDestroy(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  return Result(streams_.erase(stream) == 1 ? cudaSuccess : cudaErrorInvalidResourceHandle);
}

cudaError_t FakeDeviceRuntime::StreamSynchronize(cudaStream_t stream) {
  std::deque<Work> work;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cudaError_t e = Injection(Op::kStreamSynchronize); e != cudaSuccess) {
      auto it = streams_.find(stream);
      if (it != streams_.end()) it->second.clear();
      return Result(e);
    }
    auto it = streams_.find(stream);
    if (it == streams_.end()) return Result(cudaErrorInvalidResourceHandle);
    work.swap(it->second);
  }
  // The stream's work, in order, outside the lock: other streams run
  // meanwhile, as on a GPU. The first failure ends it (what follows a
  // failed kernel does not run).
  for (Work& w : work) {
    const cudaError_t e = w();
    if (e != cudaSuccess) {
      std::lock_guard<std::mutex> lock(mu_);
      return Result(e);
    }
  }
  return cudaSuccess;
}

cudaError_t FakeDeviceRuntime::Malloc(void** p, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (cudaError_t e = Injection(Op::kMalloc); e != cudaSuccess) return Result(e);
  int64_t used = 0;
  for (const auto& [q, b] : device_) used += static_cast<int64_t>(b);
  if (static_cast<int64_t>(bytes) > device_memory_ - used) return Result(cudaErrorMemoryAllocation);
  void* q = std::aligned_alloc(kDeviceAlign, RoundUp(bytes));
  if (q == nullptr) return Result(cudaErrorMemoryAllocation);
  std::memset(q, 0xa5, RoundUp(bytes));  // device memory starts as garbage
  device_[reinterpret_cast<uintptr_t>(q)] = bytes;
  *p = q;
  return cudaSuccess;
}

cudaError_t FakeDeviceRuntime::Free(void* p) {
  std::lock_guard<std::mutex> lock(mu_);
  if (p == nullptr) return cudaSuccess;
  if (device_.erase(reinterpret_cast<uintptr_t>(p)) != 1) return Result(cudaErrorInvalidValue);
  std::free(p);
  return sticky_ != cudaSuccess ? sticky_ : cudaSuccess;
}

cudaError_t FakeDeviceRuntime::MallocHost(void** p, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (cudaError_t e = Injection(Op::kMallocHost); e != cudaSuccess) return Result(e);
  void* q = std::aligned_alloc(kDeviceAlign, RoundUp(bytes));
  if (q == nullptr) return Result(cudaErrorMemoryAllocation);
  std::memset(q, 0x5a, RoundUp(bytes));
  pinned_[reinterpret_cast<uintptr_t>(q)] = bytes;
  ++pinned_allocations_;
  pinned_in_use_ += static_cast<int64_t>(bytes);
  pinned_peak_ = std::max(pinned_peak_, pinned_in_use_);
  *p = q;
  return cudaSuccess;
}

cudaError_t FakeDeviceRuntime::FreeHost(void* p) {
  std::lock_guard<std::mutex> lock(mu_);
  if (p == nullptr) return cudaSuccess;
  const auto it = pinned_.find(reinterpret_cast<uintptr_t>(p));
  if (it == pinned_.end()) return Result(cudaErrorInvalidValue);
  pinned_in_use_ -= static_cast<int64_t>(it->second);
  pinned_.erase(it);
  std::free(p);
  return cudaSuccess;
}

cudaError_t FakeDeviceRuntime::MemcpyAsync(void* dst, const void* src, size_t bytes,
                                           cudaMemcpyKind kind, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  if (cudaError_t e = Injection(Op::kMemcpy); e != cudaSuccess) return Result(e);
  bool ok = false;
  switch (kind) {
    case cudaMemcpyHostToDevice:
      ok = OnDevice(dst, bytes) && !OnDevice(src, 1);
      break;
    case cudaMemcpyDeviceToHost:
      ok = OnDevice(src, bytes) && !OnDevice(dst, 1);
      break;
    case cudaMemcpyDeviceToDevice:
      ok = OnDevice(src, bytes) && OnDevice(dst, bytes);
      break;
    default:
      ok = false;
  }
  if (!ok) return Result(cudaErrorInvalidValue);
  bytes_copied_ += static_cast<int64_t>(bytes);
  if ((kind == cudaMemcpyHostToDevice && Within(registered_, src, bytes)) ||
      (kind == cudaMemcpyDeviceToHost && Within(registered_, dst, bytes))) {
    bytes_copied_direct_ += static_cast<int64_t>(bytes);
  }
  return Result(Enqueue(stream, [dst, src, bytes] {
    if (bytes > 0) std::memcpy(dst, src, bytes);
    return cudaSuccess;
  }));
}

cudaError_t FakeDeviceRuntime::PeekLastError() const {
  if (sticky_ != cudaSuccess) return sticky_;
  auto it = last_error_.find(std::this_thread::get_id());
  return it == last_error_.end() ? cudaSuccess : it->second;
}

cudaError_t FakeDeviceRuntime::GetLastError() {
  std::lock_guard<std::mutex> lock(mu_);
  if (sticky_ != cudaSuccess) return sticky_;
  auto it = last_error_.find(std::this_thread::get_id());
  if (it == last_error_.end()) return cudaSuccess;
  const cudaError_t e = it->second;
  last_error_.erase(it);
  return e;
}

cudaError_t FakeDeviceRuntime::LaunchRope(const cuda::RopeParams& p, int sm_count,
                                          cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  if (cudaError_t e = Injection(Op::kLaunch); e != cudaSuccess) return Result(e);
  const size_t es = SizeOf(p.dtype);
  const size_t q_bytes = static_cast<size_t>(p.num_tokens) * p.query_heads * p.head_dim * es;
  const size_t k_bytes = static_cast<size_t>(p.num_tokens) * p.key_heads * p.head_dim * es;
  const bool pointers_ok =
      OnDevice(p.query, q_bytes) && (p.key == nullptr || OnDevice(p.key, k_bytes)) &&
      OnDevice(p.positions, static_cast<size_t>(p.num_tokens) * p.num_axes * 8) &&
      (p.token_freq_set == nullptr || OnDevice(p.token_freq_set, p.num_tokens * 4)) &&
      OnDevice(p.inv_freq, 8) && OnDevice(p.attention_scale, 8) && OnDevice(p.slot_axis, 4);
  if (!pointers_ok) return Result(cudaErrorInvalidValue);
  if (cudaError_t e = OutcomeError(EmulateRopeLaunch(p, sm_count, /*dry_run=*/true));
      e != cudaSuccess) {
    return Result(e);
  }
  ++launches_;
  if (cudaError_t e =
          Enqueue(stream, [p, sm_count] { return OutcomeError(EmulateRopeLaunch(p, sm_count)); });
      e != cudaSuccess) {
    return Result(e);
  }
  return PeekLastError();
}

cudaError_t FakeDeviceRuntime::LaunchAbsolute(const cuda::AbsoluteParams& p, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  if (cudaError_t e = Injection(Op::kLaunch); e != cudaSuccess) return Result(e);
  const size_t x_bytes = static_cast<size_t>(p.num_tokens) * p.dim * SizeOf(p.dtype);
  const bool learned = p.table != nullptr;
  const bool pointers_ok =
      OnDevice(p.x, x_bytes) && OnDevice(p.positions, static_cast<size_t>(p.num_tokens) * 8) &&
      (learned ? OnDevice(p.table, 4)
               : OnDevice(p.sinusoidal.omega, 8) && OnDevice(p.sinusoidal.phase_step, 8) &&
                     OnDevice(p.sinusoidal.offset_sin, 4) && OnDevice(p.sinusoidal.offset_cos, 4));
  if (!pointers_ok) return Result(cudaErrorInvalidValue);
  if (cudaError_t e = OutcomeError(EmulateAbsoluteLaunch(p, /*dry_run=*/true)); e != cudaSuccess) {
    return Result(e);
  }
  ++launches_;
  if (cudaError_t e = Enqueue(stream, [p] { return OutcomeError(EmulateAbsoluteLaunch(p)); });
      e != cudaSuccess) {
    return Result(e);
  }
  return PeekLastError();
}

cudaError_t FakeDeviceRuntime::LaunchBias(const cuda::BiasParams& p, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  if (cudaError_t e = Injection(Op::kLaunch); e != cudaSuccess) return Result(e);
  const size_t out_bytes = static_cast<size_t>(p.row_count) * p.k_len * SizeOf(p.dtype);
  const bool pointers_ok = OnDevice(p.out, out_bytes) && OnDevice(p.slopes, 8) &&
                           OnDevice(p.k_lens, 8) && OnDevice(p.k_starts, 8);
  if (!pointers_ok) return Result(cudaErrorInvalidValue);
  if (cudaError_t e = OutcomeError(EmulateBiasLaunch(p, /*dry_run=*/true)); e != cudaSuccess) {
    return Result(e);
  }
  ++launches_;
  if (cudaError_t e = Enqueue(stream, [p] { return OutcomeError(EmulateBiasLaunch(p)); });
      e != cudaSuccess) {
    return Result(e);
  }
  return PeekLastError();
}

}  // namespace posenc::testing
