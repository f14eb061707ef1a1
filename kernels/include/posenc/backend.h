// The execution interface every backend (CPU, CUDA) implements. Backends take
// validated plans and host buffers; where the work runs is their business.
#ifndef POSENC_BACKEND_H_
#define POSENC_BACKEND_H_

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "posenc/absolute.h"
#include "posenc/attention_bias.h"
#include "posenc/rope.h"

namespace posenc {

enum class BackendKind : int { kCpu = 1, kCuda = 2 };

// Which backend a request asks for. The kernel library itself never reads
// it (a local caller creates the backend it wants); it is here, beside the
// backends it names, because the client, the wire translation and the
// server speak the library's vocabulary for requests, as they do its
// options. kDefault is a request that names none (the server's default);
// kAuto picks the GPU when present and worth it for the size.
enum class BackendChoice : int { kDefault, kAuto, kCpu, kCuda };

struct DeviceInfo {
  std::string name;            // "cpu" or the GPU's name
  int64_t memory_bytes = 0;    // GPU memory; 0 for the CPU
  int compute_capability = 0;  // major * 10 + minor; 0 for the CPU
  int threads = 0;             // CPU worker threads
  std::string uuid;            // the GPU's, "GPU-xxxxxxxx-..." as nvidia-smi prints it
};

// Per-call context: lets a backend stop work for a caller who left.
struct RunContext {
  std::function<bool()> cancelled;  // may be empty
  bool IsCancelled() const { return cancelled && cancelled(); }
};

// The tensors of Backend::ApplyRopeThrough, all in host memory. The inputs
// stay as they were; the outputs receive finished values only, since
// another caller may read them meanwhile. Block by block (about L2's size
// of tokens, on every thread), each input block is copied aside, rotated
// there while it is in cache, and copied to the output: the bytes cross
// memory about as often as in one copy, where a whole copy in, a rotation
// and a whole copy out cross it three times. Aside is the thread's own
// block buffer (BHSD's blocks, one stretch a head, gathered into it head
// after head), and the work memory (at the block's own offsets) for
// tokens larger than a block. An output may be its input (rotated in
// place, through the block the same way); a work memory may be its input
// only then. INVALID_ARGUMENT otherwise, before anything is written.
// That is the CPU backend's way; the CUDA backend's takes every input up
// into its own device buffer before any result comes down (straight from
// and to memory it pinned, else through its staging), so its outputs may
// overlap any input, it uses no work memory, and it asks before_write once.
struct RopeThrough {
  const void* query = nullptr;
  const void* key = nullptr;  // null when the plan has no key
  // Null where Backend::RopeThroughNeedsWork(plan) is false: the memory is
  // then not touched, so a caller need not set any aside (nor count it
  // against its memory budget).
  void* query_work = nullptr;
  void* key_work = nullptr;
  void* query_out = nullptr;
  void* key_out = nullptr;
  // Asked before each block goes out (the CUDA backend: once, before the
  // first): an error (the inputs' memory was revoked under the call, say)
  // stops the call with it. The blocks written before stay written; they
  // hold finished values. May be empty.
  std::function<absl::Status()> before_write;
};

// The tensors of Backend::ApplyAbsoluteThrough: x in host memory, left as
// it was, and y, other host memory of x's size that receives finished
// values only (another caller may read it meanwhile), as RopeThrough's
// outputs. Block by block, each block of x is copied into a buffer of the
// thread's own, encoded there and copied to y. On the CPU y may not
// overlap x (INVALID_ARGUMENT before anything is written); the CUDA
// backend's y may (as RopeThrough's).
struct AbsoluteThrough {
  const void* x = nullptr;
  void* y = nullptr;
  // As RopeThrough's.
  std::function<absl::Status()> before_write;
};

// The tensors of Backend::ApplyAttentionBiasThrough: logits in host
// memory, left as they were, and out, other host memory of their size that
// receives the logits with the bias added, finished values only (another
// caller may read it meanwhile), as RopeThrough's outputs. Block by block
// (rows of about L2's size, or pieces of a row larger than that), each
// block of logits is copied into a buffer of the thread's own, the bias
// added there and the block copied to out: no memory of the caller's is
// needed aside, whatever the shape. On the CPU out may not overlap the
// logits (INVALID_ARGUMENT before anything is written); the CUDA backend's
// out may (as RopeThrough's).
struct BiasThrough {
  const void* logits = nullptr;
  void* out = nullptr;
  // As RopeThrough's.
  std::function<absl::Status()> before_write;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendKind kind() const = 0;
  virtual DeviceInfo device() const = 0;
  // OK while the backend can take work. Once it cannot (the CUDA backend
  // after a sticky device error, which lasts until the process restarts) it
  // returns FAILED_PRECONDITION saying why, and so does every later Apply*
  // call, so a server can route requests elsewhere. Thread-safe and cheap.
  virtual absl::Status health() const { return absl::OkStatus(); }

  // REQUIRES: plan from PlanRope over buffers of these sizes, in host
  // memory or (all of a call's tensors) inside memory this backend opened
  // with OpenSharedDeviceMemory. The same holds for every Apply* call.
  // Rotates query (and key when plan.has_key) in place.
  [[nodiscard]] virtual absl::Status ApplyRope(const RopePlan& plan, void* query, void* key,
                                               const RunContext& ctx) = 0;
  // REQUIRES: plan from PlanAbsolute / PlanEncodingTable; `x` holds
  // num_tokens * dim elements, read (when plan.has_input) and overwritten.
  [[nodiscard]] virtual absl::Status ApplyAbsolute(const AbsolutePlan& plan, void* x,
                                                   const RunContext& ctx) = 0;
  // REQUIRES: plan from PlanAttentionBias; `out` holds plan.NumElements()
  // elements: the logits when plan.add_to_logits, else written whole.
  [[nodiscard]] virtual absl::Status ApplyAttentionBias(const BiasPlan& plan, void* out,
                                                        const RunContext& ctx) = 0;

  // Host memory that stays put across many calls (a registered
  // shared-memory region). A backend that stages host tensors through
  // pinned buffers (CUDA) registers it with the device, and calls whose
  // tensors lie inside it then move their bytes straight between it and
  // the device, with no staging copy. Best effort: an error (say, the
  // device's limit on pinned memory) leaves calls working as before.
  // Unpin before the memory goes away. Default: nothing to do.
  virtual absl::Status PinHostMemory(void* /*p*/, size_t /*bytes*/) { return absl::OkStatus(); }
  virtual void UnpinHostMemory(void* /*p*/) {}
  // Whether [p, p + bytes) lies inside host memory this backend pinned
  // (PinHostMemory succeeded for it). Default: false.
  virtual bool HostPinned(const void* /*p*/, size_t /*bytes*/) const { return false; }
  // Host memory the backend keeps between calls, at most (the CUDA
  // backend's pinned staging buffers), for a server to hold in its memory
  // budget. Default: none.
  virtual int64_t ResidentHostBytes() const { return 0; }
  // Host memory of the backend's own (staging) a call copies its host
  // tensors into while it runs, at most, for `tensor_bytes` of them moved
  // in rows of `row_bytes` (tokens, bias rows) from memory it did not pin:
  // for a server to hold in the call's budget. Default: none.
  virtual int64_t StagingBytes(int64_t /*tensor_bytes*/, int64_t /*row_bytes*/) const { return 0; }
  // Device memory another process shares with this one (Triton's CUDA
  // shared memory): `raw_handle` is a CUDA IPC handle (cudaIpcGetMemHandle's
  // 64 bytes) of an allocation of at least `bytes` on this backend's device.
  // Opened once and kept until CloseSharedDeviceMemory; the Apply* calls
  // compute tensors that lie inside it in place there, with no copy at all.
  // Returns where it is mapped in this process. INVALID_ARGUMENT when the
  // handle does not open here (forged, stale, of another device) or its
  // allocation is smaller than `bytes`: the caller's mistake, never a
  // failure of the backend. Close only once no call uses the memory.
  // Default: FAILED_PRECONDITION (a backend computing in host memory).
  [[nodiscard]] virtual absl::StatusOr<void*> OpenSharedDeviceMemory(
      absl::string_view /*raw_handle*/, size_t /*bytes*/) {
    return absl::FailedPreconditionError(
        "this backend computes in host memory; device memory needs the CUDA backend");
  }
  virtual void CloseSharedDeviceMemory(void* /*p*/) {}
  // RoPE from query (and key) into query_out (and key_out), every one of
  // them in memory from OpenSharedDeviceMemory: the outputs receive only
  // finished values and the inputs stay as they were (another caller may
  // be reading the outputs, or writing the same ones). An output may be
  // its own input (rotated in place). INVALID_ARGUMENT, before anything
  // runs, for tensors elsewhere (host memory goes through
  // ApplyRopeThrough). Default: UNIMPLEMENTED (a backend with no device
  // memory).
  [[nodiscard]] virtual absl::Status ApplyRopeInto(const RopePlan& /*plan*/, const void* /*query*/,
                                                   const void* /*key*/, void* /*query_out*/,
                                                   void* /*key_out*/, const RunContext& /*ctx*/) {
    return absl::UnimplementedError("this backend computes in host memory only");
  }
  // RoPE from host memory into other host memory that others may read
  // meanwhile (another slice of system shared memory), through memory
  // aside (the CPU's blocks, a GPU's device buffer): see RopeThrough.
  // Default: UNIMPLEMENTED (the caller then copies the inputs into memory
  // of its own, rotates it with ApplyRope, and copies it out).
  [[nodiscard]] virtual absl::Status ApplyRopeThrough(const RopePlan& /*plan*/,
                                                      const RopeThrough& /*t*/,
                                                      const RunContext& /*ctx*/) {
    return absl::UnimplementedError("this backend does not rotate through a block buffer");
  }
  // y = x * x_scale + PE from host memory into other host memory that
  // others may read meanwhile: see AbsoluteThrough. REQUIRES: the plan has
  // an input (plan.has_input). Default: UNIMPLEMENTED (the caller then
  // copies x aside, applies ApplyAbsolute there, and copies it out).
  [[nodiscard]] virtual absl::Status ApplyAbsoluteThrough(const AbsolutePlan& /*plan*/,
                                                          const AbsoluteThrough& /*t*/,
                                                          const RunContext& /*ctx*/) {
    return absl::UnimplementedError("this backend does not encode through a block buffer");
  }
  // The bias added to logits in host memory, into other host memory that
  // others may read meanwhile: see BiasThrough. REQUIRES:
  // plan.add_to_logits. Default: UNIMPLEMENTED (the caller then copies the
  // logits aside, applies ApplyAttentionBias there, and copies them out).
  [[nodiscard]] virtual absl::Status ApplyAttentionBiasThrough(const BiasPlan& /*plan*/,
                                                               const BiasThrough& /*t*/,
                                                               const RunContext& /*ctx*/) {
    return absl::UnimplementedError("this backend does not add a bias through a block buffer");
  }
  // Whether ApplyRopeThrough(plan, ...) uses the work memories. The CPU
  // backend's does only for tokens larger than its block; a
  // backend that does not override this needs them.
  virtual bool RopeThroughNeedsWork(const RopePlan& /*plan*/) const { return true; }
  // Copies `bytes` between host memory and memory from
  // OpenSharedDeviceMemory (either way, or within it) and returns once they
  // have landed. Default: host memory on both sides.
  [[nodiscard]] virtual absl::Status CopyMemory(void* to, const void* from, size_t bytes) {
    if (bytes > 0) std::memcpy(to, from, bytes);
    return absl::OkStatus();
  }
};

// CPUs this process may use: the affinity mask's count, lowered to the
// cgroup CPU quota (cpu.max) when one is set, as in a Kubernetes pod with a
// CPU limit. At least 1.
int UsableCpus();

// `cpus` lowered to the quota a cgroup v2 cpu.max line states ("<quota>
// <period>", rounded up to whole CPUs, at least 1); `cpus` itself for "max
// <period>" or a line that does not parse (overflow-safe).
int CpusWithinQuota(absl::string_view cpu_max, int cpus);

// A CPU backend on `num_threads` threads (0: UsableCpus()).
std::unique_ptr<Backend> CreateCpuBackend(int num_threads);

// The CUDA backend on `device`, or FAILED_PRECONDITION saying why there is
// none (built without CUDA, no driver, no device).
[[nodiscard]] absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device);

// True when this library was compiled with the CUDA backend.
bool BuiltWithCuda();
// GPUs this process can see (0 without CUDA, a driver or a device).
int CudaDeviceCount();

// "release build, with CUDA, compiler 12.2.0": how this library was built,
// which is what decides where kernels can run; binaries print it under their
// own name and version (--version). Inline, so the build type is the calling
// binary's own.
inline std::string BuildDescription() {
#ifdef NDEBUG
  std::string s = "release build";
#else
  std::string s = "debug build";
#endif
  s += BuiltWithCuda() ? ", with CUDA" : ", without CUDA";
  s += ", compiler ";
  s += __VERSION__;
  return s;
}

}  // namespace posenc

#endif  // POSENC_BACKEND_H_
