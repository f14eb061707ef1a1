// The CUDA backend: moves a plan's tensors to the GPU, runs the kernels and
// brings the results back. Compiled by the host compiler; kernels live in
// *.cu files behind cuda_kernels.h.
//
// Each call takes a Worker (two streams, a grow-only device buffer and a
// pinned host staging buffer) from a small pool, so buffers are reused
// across requests and concurrent calls overlap on separate streams.
//
// Large token-major RoPE and absolute-encoding calls, and large biases, are
// staged in chunks of tokens (bias rows) through two pinned slots, on the
// worker's two streams (RunChunked): while one chunk uploads and is
// computed, the host copies the next into the other slot; once every kernel
// has succeeded, the chunks come back the same way. So a chunked call's
// pinned staging is two chunks and its side tables however large the call,
// and is not allocated per call (only the side tables of very long calls
// may outgrow max_idle_staging_bytes). BHSD RoPE goes in chunks of one
// sequence's tokens, gathered head by head into a BHSD chunk of their own.
// Results reach the caller's memory only once every kernel has succeeded,
// so a failed call leaves the caller's bytes as they were (the server may
// then run it on the CPU); one that fails while they arrive is DATA_LOSS.
//
// The pinned buffer holds a call's small side tables first and, only where
// a call is staged whole (small calls), its tensors after them: calls on
// shared memory (pinned or on the device) need the side tables alone.
//
// Tensors inside host memory registered with PinHostMemory (shared-memory
// regions) skip staging altogether: their bytes go straight from the caller's
// memory to the device and, once the kernel has succeeded, straight back.
// A call from host tensors into other host memory (the through calls:
// ApplyRopeThrough, ApplyAbsoluteThrough, ApplyAttentionBiasThrough; KServe
// outputs in slices of their own) goes the same ways, taking its inputs
// from one place and putting its results in another: each input up
// (straight from pinned memory, or through the staging), computed in the
// device buffer, and only once every kernel has succeeded and the caller's
// check (before_write) has passed, each result down into its output. Every
// input is read before any output is written, so outputs may overlap
// inputs, and the caller needs no copy of its own aside.
//
// Tensors inside device memory another process shared (CUDA IPC handles,
// OpenSharedDeviceMemory) are not moved at all: the kernels run on them
// where they are, and only the small side tables (positions, frequencies)
// go up.
//
// Every runtime call goes through a DeviceRuntime (device_runtime.h): the
// CUDA runtime in production, a host-memory fake in tests, which run this
// file's logic without a GPU.
//
// Errors go through cuda_status.h: out of memory is RESOURCE_EXHAUSTED and
// leaves the backend usable, a shape the kernels do not cover is
// UNIMPLEMENTED (the CPU serves it), and a sticky error marks the backend
// failed, after which every call returns health() (FAILED_PRECONDITION).
#include "cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <new>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "cuda_status.h"
#include "device_runtime.h"
#include "params_from_plan.h"
#include "posenc/backend.h"
#include "posenc/host_copy.h"
#include "posenc/status_macros.h"

namespace posenc {
namespace {

using cuda::CudaCall;
using cuda::DeviceRuntime;

// Asked once before a call's results first reach the caller's memory (the
// through calls' before_write); may be empty.
using BeforeWrite = std::function<absl::Status()>;

absl::Status Ask(const BeforeWrite& before_write) {
  return before_write ? before_write() : absl::OkStatus();
}

// The bytes of a RoPE plan's query and key (0 without a key).
struct RopeBytes {
  explicit RopeBytes(const RopePlan& plan)
      : query(plan.num_tokens * plan.query_heads * plan.head_dim * SizeOf(plan.dtype)),
        key(plan.has_key ? plan.num_tokens * plan.key_heads * plan.head_dim * SizeOf(plan.dtype)
                         : 0) {}
  size_t query, key;
};

// Concurrent GPU calls; more wait for a worker.
constexpr int kWorkers = 4;
constexpr size_t kAlign = 256;

size_t AlignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Regions of one request inside a worker's buffers.
class Layout {
 public:
  size_t Add(size_t bytes) {
    const size_t at = size_;
    size_ += AlignUp(bytes);
    return at;
  }
  size_t size() const { return size_; }

 private:
  size_t size_ = 0;
};

struct Worker {
  cudaStream_t stream = nullptr;
  cudaStream_t stream2 = nullptr;  // the chunk pipeline's second stream
  char* device = nullptr;
  size_t device_bytes = 0;
  char* pinned = nullptr;  // staging for both directions
  size_t pinned_bytes = 0;
};

// Makes `*buffer` hold at least `bytes`. It grows to twice its capacity when
// that is more, so a workload of growing requests reallocates O(log n) times
// rather than at every new maximum; when the double does not fit it settles
// for `bytes`. The old buffer is freed first so the peak stays one buffer.
// On an error the buffer is empty and the next call starts over.
template <typename Alloc, typename Release>
cudaError_t Grow(DeviceRuntime& rt, char** buffer, size_t* capacity, size_t bytes, Alloc alloc,
                 Release release) {
  if (bytes <= *capacity) return cudaSuccess;
  const size_t want = std::max(bytes, *capacity * 2);
  if (*buffer != nullptr) {
    const cudaError_t e = release(*buffer);
    *buffer = nullptr;
    *capacity = 0;
    if (e != cudaSuccess) return e;
  }
  cudaError_t e = alloc(buffer, want);
  size_t got = want;
  if (e == cudaErrorMemoryAllocation && want > bytes) {
    // Handled here, so clear it: left behind, the launcher's
    // cudaPeekAtLastError would report it for this healthy request.
    rt.GetLastError();
    e = alloc(buffer, bytes);
    got = bytes;
  }
  if (e != cudaSuccess) {
    *buffer = nullptr;
    return e;
  }
  *capacity = got;
  return cudaSuccess;
}

// Checks a CUDA call inside CudaBackend: returns its status from the
// enclosing function, marking the backend failed on a sticky error.
#define POSENC_CUDA(call) POSENC_RETURN_IF_ERROR(Check((call), #call))

class CudaBackend final : public Backend {
 public:
  CudaBackend(DeviceRuntime& rt, int device, DeviceInfo info, int sm_count,
              cuda::CudaBackendOptions options)
      : rt_(rt),
        device_(device),
        info_(std::move(info)),
        sm_count_(sm_count),
        chunk_bytes_(std::max<size_t>(options.chunk_bytes, 1)),
        max_idle_staging_(options.max_idle_staging_bytes) {}

  ~CudaBackend() override {
    // Best effort: after a sticky error these fail too, and there is no one
    // left to tell.
    rt_.SetDevice(device_);
    for (auto& w : workers_) {
      if (w->device) rt_.Free(w->device);
      if (w->pinned) rt_.FreeHost(w->pinned);
      if (w->stream) rt_.StreamDestroy(w->stream);
      if (w->stream2) rt_.StreamDestroy(w->stream2);
    }
    for (auto& [ptr, entry] : tables_) rt_.Free(entry.device);
    for (auto& [start, bytes] : pinned_) rt_.HostUnregister(reinterpret_cast<void*>(start));
    for (auto& [start, entry] : shared_) {
      for (int i = 0; i < entry.opened; ++i) rt_.IpcCloseMemHandle(reinterpret_cast<void*>(start));
    }
    rt_.GetLastError();
  }

  absl::Status Init() {
    POSENC_CUDA(rt_.SetDevice(device_));
    for (int i = 0; i < kWorkers; ++i) {
      // Owned before its streams are made: the destructor frees those made
      // when a later one fails.
      Worker* w = workers_.emplace_back(std::make_unique<Worker>()).get();
      POSENC_CUDA(rt_.StreamCreate(&w->stream));
      POSENC_CUDA(rt_.StreamCreate(&w->stream2));
      idle_.push_back(w);
    }
    return absl::OkStatus();
  }

  BackendKind kind() const override { return BackendKind::kCuda; }
  int64_t ResidentHostBytes() const override {
    return static_cast<int64_t>(kWorkers * max_idle_staging_);
  }
  // Whole under two chunks (each of up to two tensors padded to kAlign);
  // else two slots of a chunk's rows (StagingOf).
  int64_t StagingBytes(int64_t tensor_bytes, int64_t row_bytes) const override {
    const auto bytes = static_cast<size_t>(std::max<int64_t>(tensor_bytes, 0));
    if (bytes < 2 * chunk_bytes_) return static_cast<int64_t>(bytes + 2 * kAlign);
    const auto row = static_cast<size_t>(std::max<int64_t>(row_bytes, 1));
    const int64_t per_chunk = std::max<int64_t>(1, chunk_bytes_ / row);
    return static_cast<int64_t>(std::min(bytes, 2 * SlotBytes(per_chunk, row)));
  }
  DeviceInfo device() const override { return info_; }

  absl::Status health() const override {
    if (!failed_.load(std::memory_order_acquire)) return absl::OkStatus();
    std::lock_guard<std::mutex> lock(health_mu_);
    return failure_;
  }

  absl::Status ApplyRope(const RopePlan& plan, void* query, void* key,
                         const RunContext& ctx) override {
    return Rope(plan, query, key, nullptr, nullptr, ctx);
  }

  absl::Status ApplyRopeInto(const RopePlan& plan, const void* query, const void* key,
                             void* query_out, void* key_out, const RunContext& ctx) override {
    const auto [q_bytes, k_bytes] = RopeBytes(plan);
    POSENC_ASSIGN_OR_RETURN(
        const bool resident,
        Resident({{query, q_bytes}, {key, k_bytes}, {query_out, q_bytes}, {key_out, k_bytes}}));
    if (!resident && !plan.empty()) {
      return absl::InvalidArgumentError(
          "ApplyRopeInto takes tensors and outputs in shared device memory (host memory goes "
          "through ApplyRopeThrough)");
    }
    return Rope(plan, const_cast<void*>(query), const_cast<void*>(key), query_out, key_out, ctx);
  }

  // Any host memory, pinned or not: see the file comment. The work
  // memories are not used.
  absl::Status ApplyRopeThrough(const RopePlan& plan, const RopeThrough& t,
                                const RunContext& ctx) override {
    const auto [q_bytes, k_bytes] = RopeBytes(plan);
    if (!plan.empty() && (t.query == nullptr || t.query_out == nullptr ||
                          (k_bytes > 0 && (t.key == nullptr || t.key_out == nullptr)))) {
      return absl::InvalidArgumentError("ApplyRopeThrough needs every tensor and its output");
    }
    POSENC_RETURN_IF_ERROR(InHostMemory(
        {{t.query, q_bytes}, {t.key, k_bytes}, {t.query_out, q_bytes}, {t.key_out, k_bytes}},
        "ApplyRopeThrough"));
    return Rope(plan, const_cast<void*>(t.query), k_bytes > 0 ? const_cast<void*>(t.key) : nullptr,
                t.query_out, k_bytes > 0 ? t.key_out : nullptr, ctx, t.before_write);
  }
  bool RopeThroughNeedsWork(const RopePlan& /*plan*/) const override { return false; }

  absl::Status ApplyAbsoluteThrough(const AbsolutePlan& plan, const AbsoluteThrough& t,
                                    const RunContext& ctx) override {
    if (!plan.has_input) {
      return absl::InvalidArgumentError("ApplyAbsoluteThrough needs a plan with an input x");
    }
    const size_t bytes = plan.num_tokens * plan.dim * SizeOf(plan.dtype);
    POSENC_RETURN_IF_ERROR(InHostMemory({{t.x, bytes}, {t.y, bytes}}, "ApplyAbsoluteThrough"));
    return Absolute(plan, t.x, t.y, ctx, t.before_write);
  }

  absl::Status ApplyAttentionBiasThrough(const BiasPlan& plan, const BiasThrough& t,
                                         const RunContext& ctx) override {
    if (!plan.add_to_logits) {
      return absl::InvalidArgumentError("ApplyAttentionBiasThrough needs a plan adding to logits");
    }
    const size_t bytes = plan.NumElements() * SizeOf(plan.dtype);
    POSENC_RETURN_IF_ERROR(
        InHostMemory({{t.logits, bytes}, {t.out, bytes}}, "ApplyAttentionBiasThrough"));
    return Bias(plan, t.logits, t.out, ctx, t.before_write);
  }

  bool HostPinned(const void* p, size_t bytes) const override { return InPinned(p, bytes); }

 private:
  // RoPE in place (`query_out` null), or from query / key into query_out /
  // key_out, all in shared device memory or all in host memory: copied
  // into the worker's device buffer, rotated there, and copied out, so the
  // outputs receive finished values only and the inputs stay as they were.
  // Host outputs may overlap host inputs (every input goes up before any
  // result comes down); `before_write` is asked before the first does.
  absl::Status Rope(const RopePlan& plan, void* query, void* key, void* query_out, void* key_out,
                    const RunContext& ctx, const BeforeWrite& before_write = {}) {
    POSENC_RETURN_IF_ERROR(health());
    if (plan.empty()) return absl::OkStatus();
    if (ctx.IsCancelled()) return absl::CancelledError("the call was cancelled");
    const auto [q_bytes, k_bytes] = RopeBytes(plan);
    POSENC_ASSIGN_OR_RETURN(const bool resident, Resident({{query, q_bytes}, {key, k_bytes}}));
    // REQUIRES: the outputs resident where the inputs are (ApplyRopeInto),
    // in host memory where they are not (ApplyRopeThrough).
    const bool into = query_out != nullptr;
    char* const q_dst = static_cast<char*>(into ? query_out : query);
    char* const k_dst = static_cast<char*>(into ? key_out : key);
    const std::vector<int32_t> token_set = cuda::TokenFreqSets(plan);
    const bool per_token_sets = !token_set.empty();
    Layout l;
    const size_t pos_at = l.Add(plan.positions.values.size() * 8);
    const size_t set_at = l.Add(token_set.size() * 4);
    const size_t freq_at = l.Add(plan.inv_freq.size() * 8);
    const size_t scale_at = l.Add(plan.attention_scale.size() * 8);
    const size_t axis_at = l.Add(plan.slot_axis.size() * 4);
    const size_t side_bytes = l.size();  // the side tables, first
    const bool in_buffer = !resident || into;
    const size_t q_at = l.Add(in_buffer ? q_bytes : 0), k_at = l.Add(in_buffer ? k_bytes : 0);
    const size_t q_token = q_bytes / plan.num_tokens, k_token = k_bytes / plan.num_tokens;
    const auto pinned = [&](const void* p, size_t n) { return n == 0 || InPinned(p, n); };
    const bool direct = !resident && pinned(query, q_bytes) && pinned(key, k_bytes) &&
                        pinned(q_dst, q_bytes) && pinned(k_dst, k_bytes);
    const Staging st =
        StagingOf(resident, direct, q_bytes + k_bytes, q_token + k_token, side_bytes, l.size());
    const bool chunked = st.chunked, staged = st.staged;
    const int64_t per_chunk = st.per_chunk;
    return WithWorker(l.size(), st.host_bytes, [&](Worker& w) -> absl::Status {
      char* h = w.pinned;
      if (staged) {
        CopyHostBytes(h + q_at, query, q_bytes);
        CopyHostBytes(h + k_at, key, k_bytes);
      }
      // CopyHostBytes, not memcpy, for the side tables too: one may be empty
      // (a learned table's omega, a call's k_starts), and memcpy from an empty
      // vector's data() (null) is undefined even for no bytes.
      CopyHostBytes(h + pos_at, plan.positions.values.data(), plan.positions.values.size() * 8);
      if (per_token_sets) CopyHostBytes(h + set_at, token_set.data(), token_set.size() * 4);
      CopyHostBytes(h + freq_at, plan.inv_freq.data(), plan.inv_freq.size() * 8);
      CopyHostBytes(h + scale_at, plan.attention_scale.data(), plan.attention_scale.size() * 8);
      CopyHostBytes(h + axis_at, plan.slot_axis.data(), plan.slot_axis.size() * 4);
      POSENC_CUDA(rt_.MemcpyAsync(w.device, h, staged ? l.size() : side_bytes,
                                  cudaMemcpyHostToDevice, w.stream));
      if (direct) {
        POSENC_CUDA(
            rt_.MemcpyAsync(w.device + q_at, query, q_bytes, cudaMemcpyHostToDevice, w.stream));
        if (k_bytes) {
          POSENC_CUDA(
              rt_.MemcpyAsync(w.device + k_at, key, k_bytes, cudaMemcpyHostToDevice, w.stream));
        }
      }
      const cuda::RopeParams p = cuda::MakeRopeParams(
          plan, {in_buffer ? w.device + q_at : static_cast<char*>(query),
                 k_bytes == 0 ? nullptr
                 : in_buffer  ? w.device + k_at
                              : static_cast<char*>(key),
                 reinterpret_cast<const int64_t*>(w.device + pos_at),
                 per_token_sets ? reinterpret_cast<const int32_t*>(w.device + set_at) : nullptr,
                 reinterpret_cast<const double*>(w.device + freq_at),
                 reinterpret_cast<const double*>(w.device + scale_at),
                 reinterpret_cast<const int32_t*>(w.device + axis_at)});
      if (chunked) {
        // The side tables must be on the device before the second stream's
        // first kernel: a short wait, once.
        POSENC_CUDA(rt_.StreamSynchronize(w.stream));
        const bool bhsd = plan.layout == RopeLayout::kBHSD;
        const ChunkedTensor tensors[] = {{static_cast<char*>(query), q_dst, w.device + q_at,
                                          q_token, bhsd ? plan.query_heads : 0, plan.seq_len},
                                         {static_cast<char*>(key), k_dst, w.device + k_at, k_token,
                                          bhsd ? plan.key_heads : 0, plan.seq_len}};
        return RunChunked(w, h + side_bytes,
                          ChunksOf(plan.num_tokens, per_chunk, bhsd ? plan.seq_len : 0), tensors,
                          /*upload=*/true, before_write,
                          [&](Chunk chunk, cudaStream_t s) -> absl::Status {
                            const int64_t t0 = chunk.first;
                            cuda::RopeParams c = p;
                            c.query = w.device + q_at + t0 * q_token;
                            c.key = k_bytes ? w.device + k_at + t0 * k_token : nullptr;
                            c.positions = p.positions + t0 * p.num_axes;
                            if (c.token_freq_set != nullptr)
                              c.token_freq_set = p.token_freq_set + t0;
                            c.num_tokens = chunk.rows;
                            // A head-major chunk is a BHSD tensor of one sequence of its own.
                            if (bhsd) c.seq_len = chunk.rows;
                            POSENC_RETURN_IF_ERROR(BeforeLaunch());
                            return Check(rt_.LaunchRope(c, sm_count_, s),
                                         "launching the RoPE kernel", CudaCall::kLaunch);
                          });
      }
      // Device to device on the worker's stream; nothing for an absent key.
      const auto d2d = [&](void* to, const void* from, size_t n) {
        return n == 0 ? absl::OkStatus()
                      : Check(rt_.MemcpyAsync(to, from, n, cudaMemcpyDeviceToDevice, w.stream),
                              "cudaMemcpyAsync, device to device");
      };
      if (into && resident) {
        POSENC_RETURN_IF_ERROR(d2d(w.device + q_at, query, q_bytes));
        POSENC_RETURN_IF_ERROR(d2d(w.device + k_at, key, k_bytes));
      }
      POSENC_RETURN_IF_ERROR(BeforeLaunch());
      POSENC_RETURN_IF_ERROR(Check(rt_.LaunchRope(p, sm_count_, w.stream),
                                   "launching the RoPE kernel", CudaCall::kLaunch));
      if (into && resident) {
        POSENC_RETURN_IF_ERROR(d2d(query_out, w.device + q_at, q_bytes));
        POSENC_RETURN_IF_ERROR(d2d(key_out, w.device + k_at, k_bytes));
      }
      if (resident) return Check(rt_.StreamSynchronize(w.stream), "waiting for the RoPE kernel");
      if (direct) {
        return DownloadDirect(
            w, before_write,
            {{q_dst, w.device + q_at, q_bytes}, {k_dst, w.device + k_at, k_bytes}});
      }
      POSENC_CUDA(
          rt_.MemcpyAsync(h + q_at, w.device + q_at, q_bytes, cudaMemcpyDeviceToHost, w.stream));
      if (k_bytes) {
        POSENC_CUDA(
            rt_.MemcpyAsync(h + k_at, w.device + k_at, k_bytes, cudaMemcpyDeviceToHost, w.stream));
      }
      POSENC_CUDA(rt_.StreamSynchronize(w.stream));
      POSENC_RETURN_IF_ERROR(Ask(before_write));
      CopyHostBytes(q_dst, h + q_at, q_bytes);
      CopyHostBytes(k_dst, h + k_at, k_bytes);
      return absl::OkStatus();
    });
  }

 public:
  absl::Status ApplyAbsolute(const AbsolutePlan& plan, void* x, const RunContext& ctx) override {
    return Absolute(plan, x, x, ctx);
  }

  absl::Status ApplyAttentionBias(const BiasPlan& plan, void* out, const RunContext& ctx) override {
    return Bias(plan, out, out, ctx);
  }

 private:
  // y = x * x_scale + PE, x read when plan.has_input. In place (y == x), or
  // from host memory into other host memory (ApplyAbsoluteThrough), as
  // Rope's.
  absl::Status Absolute(const AbsolutePlan& plan, const void* x, void* y, const RunContext& ctx,
                        const BeforeWrite& before_write = {}) {
    POSENC_RETURN_IF_ERROR(health());
    if (plan.empty()) return absl::OkStatus();
    if (ctx.IsCancelled()) return absl::CancelledError("the call was cancelled");
    const size_t x_bytes = plan.num_tokens * plan.dim * SizeOf(plan.dtype);
    const bool learned = plan.options.kind == AbsoluteOptions::Kind::kLearned;
    // Resident only in place (ApplyAbsoluteThrough takes host memory).
    POSENC_ASSIGN_OR_RETURN(const bool resident, Resident({{x, x_bytes}, {y, x_bytes}}));
    Layout l;
    const size_t pos_at = l.Add(plan.positions.values.size() * 8);
    const size_t omega_at = l.Add(plan.omega.size() * 8);
    const size_t step_at = l.Add(plan.phase_step.size() * 8);
    const size_t offsets_bytes = plan.offset_sin.size() * 4;
    const size_t offset_sin_at = l.Add(offsets_bytes);
    const size_t offset_cos_at = l.Add(offsets_bytes);
    const size_t side_bytes = l.size();  // the side tables, first
    const size_t x_at = l.Add(resident ? 0 : x_bytes);
    const size_t row = x_bytes / plan.num_tokens;
    const bool direct = !resident && InPinned(x, x_bytes) && InPinned(y, x_bytes);
    const Staging st = StagingOf(resident, direct, x_bytes, row, side_bytes, l.size());
    const bool chunked = st.chunked, staged = st.staged;
    const int64_t per_chunk = st.per_chunk;
    return WithWorker(l.size(), st.host_bytes, [&](Worker& w) -> absl::Status {
      const float* table = nullptr;
      if (learned) {
        POSENC_ASSIGN_OR_RETURN(table, DeviceTable(plan.options.table, w));
      }
      char* h = w.pinned;
      if (plan.has_input && staged) CopyHostBytes(h + x_at, x, x_bytes);
      CopyHostBytes(h + pos_at, plan.positions.values.data(), plan.positions.values.size() * 8);
      CopyHostBytes(h + omega_at, plan.omega.data(), plan.omega.size() * 8);
      CopyHostBytes(h + step_at, plan.phase_step.data(), plan.phase_step.size() * 8);
      CopyHostBytes(h + offset_sin_at, plan.offset_sin.data(), offsets_bytes);
      CopyHostBytes(h + offset_cos_at, plan.offset_cos.data(), offsets_bytes);
      // Without an input (a table) x is written whole: nothing to upload.
      POSENC_CUDA(rt_.MemcpyAsync(w.device, h, staged && plan.has_input ? l.size() : side_bytes,
                                  cudaMemcpyHostToDevice, w.stream));
      if (direct && plan.has_input) {
        POSENC_CUDA(rt_.MemcpyAsync(w.device + x_at, x, x_bytes, cudaMemcpyHostToDevice, w.stream));
      }
      const cuda::SinusoidalTables tables{reinterpret_cast<const double*>(w.device + omega_at),
                                          reinterpret_cast<const uint64_t*>(w.device + step_at),
                                          reinterpret_cast<const float*>(w.device + offset_sin_at),
                                          reinterpret_cast<const float*>(w.device + offset_cos_at),
                                          static_cast<int64_t>(plan.omega.size())};
      const cuda::AbsoluteParams p = cuda::MakeAbsoluteParams(
          plan, resident ? static_cast<char*>(y) : w.device + x_at,
          reinterpret_cast<const int64_t*>(w.device + pos_at), tables, table);
      if (chunked) {
        POSENC_CUDA(rt_.StreamSynchronize(w.stream));  // the side tables, before stream 2
        const ChunkedTensor tensors[] = {
            {static_cast<const char*>(x), static_cast<char*>(y), w.device + x_at, row}};
        return RunChunked(
            w, h + side_bytes, ChunksOf(plan.num_tokens, per_chunk), tensors, plan.has_input,
            before_write, [&](Chunk chunk, cudaStream_t s) -> absl::Status {
              cuda::AbsoluteParams c = p;
              c.x = w.device + x_at + chunk.first * row;
              c.positions = p.positions + chunk.first;
              c.num_tokens = chunk.rows;
              POSENC_RETURN_IF_ERROR(BeforeLaunch());
              return Check(rt_.LaunchAbsolute(c, s), "launching the absolute encoding kernel",
                           CudaCall::kLaunch);
            });
      }
      POSENC_RETURN_IF_ERROR(BeforeLaunch());
      POSENC_RETURN_IF_ERROR(Check(rt_.LaunchAbsolute(p, w.stream),
                                   "launching the absolute encoding kernel", CudaCall::kLaunch));
      if (resident) {
        return Check(rt_.StreamSynchronize(w.stream), "waiting for the absolute encoding kernel");
      }
      if (direct) return DownloadDirect(w, before_write, {{y, w.device + x_at, x_bytes}});
      POSENC_CUDA(
          rt_.MemcpyAsync(h + x_at, w.device + x_at, x_bytes, cudaMemcpyDeviceToHost, w.stream));
      POSENC_CUDA(rt_.StreamSynchronize(w.stream));
      POSENC_RETURN_IF_ERROR(Ask(before_write));
      CopyHostBytes(y, h + x_at, x_bytes);
      return absl::OkStatus();
    });
  }

  // The bias into `out`, added to the logits at `logits` when
  // plan.add_to_logits: in place (out == logits), or from host memory into
  // other host memory (ApplyAttentionBiasThrough), as Rope's.
  absl::Status Bias(const BiasPlan& plan, const void* logits, void* out, const RunContext& ctx,
                    const BeforeWrite& before_write = {}) {
    POSENC_RETURN_IF_ERROR(health());
    if (plan.empty()) return absl::OkStatus();
    if (ctx.IsCancelled()) return absl::CancelledError("the call was cancelled");
    const size_t out_bytes = plan.NumElements() * SizeOf(plan.dtype);
    // Resident only in place (ApplyAttentionBiasThrough takes host memory).
    POSENC_ASSIGN_OR_RETURN(const bool resident, Resident({{logits, out_bytes}, {out, out_bytes}}));
    Layout l;
    const size_t slopes_at = l.Add(plan.slopes.size() * 8);
    const size_t klens_at = l.Add(plan.k_lens.size() * 8);
    const size_t kstarts_at = l.Add(plan.k_starts.size() * 8);
    const size_t side_bytes = l.size();  // the side tables, first
    const size_t out_at = l.Add(resident ? 0 : out_bytes);
    const int64_t rows = plan.batch * plan.num_heads * plan.q_len;
    const size_t row = out_bytes / rows;
    const bool direct = !resident && InPinned(logits, out_bytes) && InPinned(out, out_bytes);
    const Staging st = StagingOf(resident, direct, out_bytes, row, side_bytes, l.size());
    const bool chunked = st.chunked, staged = st.staged;
    const int64_t per_chunk = st.per_chunk;
    return WithWorker(l.size(), st.host_bytes, [&](Worker& w) -> absl::Status {
      char* h = w.pinned;
      if (plan.add_to_logits && staged) CopyHostBytes(h + out_at, logits, out_bytes);
      CopyHostBytes(h + slopes_at, plan.slopes.data(), plan.slopes.size() * 8);
      CopyHostBytes(h + klens_at, plan.k_lens.data(), plan.k_lens.size() * 8);
      CopyHostBytes(h + kstarts_at, plan.k_starts.data(), plan.k_starts.size() * 8);
      // Built biases upload only their small side tables.
      POSENC_CUDA(rt_.MemcpyAsync(w.device, h, plan.add_to_logits && staged ? l.size() : side_bytes,
                                  cudaMemcpyHostToDevice, w.stream));
      if (direct && plan.add_to_logits) {
        POSENC_CUDA(rt_.MemcpyAsync(w.device + out_at, logits, out_bytes, cudaMemcpyHostToDevice,
                                    w.stream));
      }
      const cuda::BiasParams p =
          cuda::MakeBiasParams(plan, resident ? static_cast<char*>(out) : w.device + out_at,
                               reinterpret_cast<const double*>(w.device + slopes_at),
                               reinterpret_cast<const int64_t*>(w.device + klens_at),
                               reinterpret_cast<const int64_t*>(w.device + kstarts_at));
      if (chunked) {
        POSENC_CUDA(rt_.StreamSynchronize(w.stream));  // the side tables, before stream 2
        const ChunkedTensor tensors[] = {
            {static_cast<const char*>(logits), static_cast<char*>(out), w.device + out_at, row}};
        return RunChunked(w, h + side_bytes, ChunksOf(rows, per_chunk), tensors, plan.add_to_logits,
                          before_write, [&](Chunk chunk, cudaStream_t s) -> absl::Status {
                            cuda::BiasParams c = p;
                            c.out = w.device + out_at + chunk.first * row;
                            c.row_begin = chunk.first;
                            c.row_count = chunk.rows;
                            POSENC_RETURN_IF_ERROR(BeforeLaunch());
                            return Check(rt_.LaunchBias(c, s),
                                         "launching the attention bias kernel", CudaCall::kLaunch);
                          });
      }
      POSENC_RETURN_IF_ERROR(BeforeLaunch());
      POSENC_RETURN_IF_ERROR(Check(rt_.LaunchBias(p, w.stream),
                                   "launching the attention bias kernel", CudaCall::kLaunch));
      if (resident) {
        return Check(rt_.StreamSynchronize(w.stream), "waiting for the attention bias kernel");
      }
      if (direct) return DownloadDirect(w, before_write, {{out, w.device + out_at, out_bytes}});
      POSENC_CUDA(rt_.MemcpyAsync(h + out_at, w.device + out_at, out_bytes, cudaMemcpyDeviceToHost,
                                  w.stream));
      POSENC_CUDA(rt_.StreamSynchronize(w.stream));
      POSENC_RETURN_IF_ERROR(Ask(before_write));
      CopyHostBytes(out, h + out_at, out_bytes);
      return absl::OkStatus();
    });
  }

 public:
  absl::Status PinHostMemory(void* p, size_t bytes) override {
    POSENC_RETURN_IF_ERROR(health());
    // cudaHostRegister locks every page of the range, which takes a while
    // for a large region: the lock covers the map only, so calls asking
    // InPinned do not wait behind it. (One range is pinned and unpinned by
    // its one owner, never concurrently.)
    POSENC_CUDA(rt_.SetDevice(device_));
    POSENC_RETURN_IF_ERROR(
        Check(rt_.HostRegister(p, bytes), absl::StrCat("registering ", bytes,
                                                       " bytes of host memory with the device "
                                                       "(cudaHostRegister)")));
    std::lock_guard<std::mutex> lock(pinned_mu_);
    pinned_[reinterpret_cast<uintptr_t>(p)] = bytes;
    return absl::OkStatus();
  }

  absl::StatusOr<void*> OpenSharedDeviceMemory(absl::string_view raw_handle,
                                               size_t bytes) override {
    POSENC_RETURN_IF_ERROR(health());
    cudaIpcMemHandle_t handle;
    if (raw_handle.size() != sizeof(handle)) {
      return absl::InvalidArgumentError(
          absl::StrCat("a CUDA IPC handle (cudaIpcGetMemHandle's cudaIpcMemHandle_t) has ",
                       sizeof(handle), " bytes, got ", raw_handle.size()));
    }
    std::memcpy(&handle, raw_handle.data(), sizeof(handle));
    std::lock_guard<std::mutex> lock(shared_mu_);
    POSENC_CUDA(rt_.SetDevice(device_));
    void* p = nullptr;
    const absl::Status opened = Check(rt_.IpcOpenMemHandle(&p, handle), "cudaIpcOpenMemHandle");
    if (!opened.ok()) {
      // Lost contexts and lack of memory are the backend's; anything else
      // is a handle that does not open here.
      if (!health().ok() || absl::IsResourceExhausted(opened)) return opened;
      return absl::InvalidArgumentError(absl::StrCat(
          "the CUDA IPC handle does not open on device ", device_, " (", info_.name,
          "): it must come from cudaIpcGetMemHandle on that device, for an allocation still "
          "alive; ",
          opened.message()));
    }
    void* base = nullptr;
    size_t size = 0;
    absl::Status ranged = Check(rt_.MemGetAddressRange(p, &base, &size), "cuMemGetAddressRange");
    if (ranged.ok() && (base != p || size < bytes)) {
      ranged = absl::InvalidArgumentError(
          absl::StrCat("the allocation behind the CUDA IPC handle has ", size,
                       " bytes from where it opens, fewer than the ", bytes, " asked for"));
    }
    if (!ranged.ok()) {
      Check(rt_.IpcCloseMemHandle(p), "cudaIpcCloseMemHandle").IgnoreError();
      return ranged;
    }
    // The same allocation opened again maps at the same address.
    Shared& entry = shared_[reinterpret_cast<uintptr_t>(p)];
    entry.bytes = std::max(entry.bytes, bytes);
    ++entry.opened;
    return p;
  }

  absl::Status CopyMemory(void* to, const void* from, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    const bool to_device = InShared(to, bytes), from_device = InShared(from, bytes);
    // A range that begins in a mapping and runs past its end (or begins
    // before one) is neither host nor device memory: copied as host memory
    // it would read or write device addresses from the CPU.
    for (const auto& [p, on_device, name] :
         {std::tuple<const void*, bool, const char*>{to, to_device, "destination"},
          {from, from_device, "source"}}) {
      if (!on_device && TouchesShared(p, bytes)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the copy's ", name, " (", bytes,
            " bytes) lies partly in shared device memory: a copy's range must lie wholly in one "
            "mapping or wholly outside them"));
      }
    }
    if (!to_device && !from_device) {
      CopyHostBytes(to, from, bytes);
      return absl::OkStatus();
    }
    const cudaMemcpyKind kind = to_device && from_device ? cudaMemcpyDeviceToDevice
                                : to_device              ? cudaMemcpyHostToDevice
                                                         : cudaMemcpyDeviceToHost;
    return WithWorker(0, 0, [&](Worker& w) -> absl::Status {
      POSENC_CUDA(rt_.MemcpyAsync(to, from, bytes, kind, w.stream));
      POSENC_CUDA(rt_.StreamSynchronize(w.stream));
      return absl::OkStatus();
    });
  }

  void CloseSharedDeviceMemory(void* p) override {
    std::lock_guard<std::mutex> lock(shared_mu_);
    auto it = shared_.find(reinterpret_cast<uintptr_t>(p));
    if (it == shared_.end()) return;
    if (--it->second.opened == 0) shared_.erase(it);
    rt_.SetDevice(device_);
    Check(rt_.IpcCloseMemHandle(p), "cudaIpcCloseMemHandle").IgnoreError();
  }

  void UnpinHostMemory(void* p) override {
    std::lock_guard<std::mutex> lock(pinned_mu_);
    if (pinned_.erase(reinterpret_cast<uintptr_t>(p)) == 0) return;
    rt_.SetDevice(device_);
    Check(rt_.HostUnregister(p), "unregistering host memory (cudaHostUnregister)").IgnoreError();
  }

 private:
  // A tensor a chunked call moves, by rows (tokens, or bias rows): `row_bytes`
  // each, row r at device + r * row_bytes in the worker's device buffer. In
  // the caller's memory, read from `in` and written to `out` (the same
  // place for a call in place), row r lies at r * row_bytes, or, for a
  // head-major tensor (heads > 0: [batch, heads, seq_len, head], BHSD), in
  // `heads` pieces of row_bytes / heads, one per head, seq_len rows apart;
  // there a chunk lies within one sequence and its rows go to the device
  // head-major too ([heads, rows, head]), a BHSD tensor of its own. A tensor
  // of row_bytes 0 is absent.
  struct ChunkedTensor {
    const char* in;
    char* out;
    char* device;
    size_t row_bytes;
    int64_t heads = 0, seq_len = 0;
  };

  // The rows [first, first + rows) of a chunked call.
  struct Chunk {
    int64_t first, rows;
  };

  // `rows` rows in chunks of `per_chunk`; with seq_len > 0, none crossing a
  // multiple of seq_len (a sequence of a head-major tensor).
  static std::vector<Chunk> ChunksOf(int64_t rows, int64_t per_chunk, int64_t seq_len = 0) {
    std::vector<Chunk> chunks;
    const int64_t run = seq_len > 0 ? seq_len : rows;
    for (int64_t begin = 0; begin < rows; begin += run) {
      const int64_t end = std::min(rows, begin + run);
      for (int64_t r = begin; r < end; r += per_chunk) {
        chunks.push_back({r, std::min(per_chunk, end - r)});
      }
    }
    return chunks;
  }

  // The pinned bytes of one chunk slot: `rows` rows of `row_bytes`.
  static size_t SlotBytes(int64_t rows, size_t row_bytes) {
    return AlignUp(static_cast<size_t>(rows) * row_bytes);
  }

  // How a call on host tensors moves them: straight from pinned memory
  // (direct), in chunks through two slots (chunked: twice chunk_bytes_ or
  // more), or whole through the pinned buffer (staged). Calls on device
  // memory (resident) move none of them.
  struct Staging {
    bool chunked, staged;
    int64_t per_chunk;  // rows a chunk
    size_t host_bytes;  // of the worker's pinned buffer the call needs
  };
  Staging StagingOf(bool resident, bool direct, size_t tensor_bytes, size_t row_bytes,
                    size_t side_bytes, size_t layout_bytes) const {
    Staging st;
    st.chunked = !resident && !direct && tensor_bytes >= 2 * chunk_bytes_;
    st.staged = !resident && !direct && !st.chunked;
    st.per_chunk = std::max<int64_t>(1, chunk_bytes_ / row_bytes);
    st.host_bytes = st.staged    ? layout_bytes
                    : st.chunked ? side_bytes + 2 * SlotBytes(st.per_chunk, row_bytes)
                                 : side_bytes;
    return st;
  }

  // Copies chunk c of t between the caller's memory and `slot`, where it
  // lies as it will on the device (to_slot: from t.in into the slot; else
  // from the slot to t.out).
  static void CopyChunk(const ChunkedTensor& t, Chunk c, char* slot, bool to_slot) {
    // `bytes` at `offset` in the caller's tensor, at `at` in the slot.
    const auto copy = [&](size_t offset, char* at, size_t bytes) {
      if (to_slot) {
        CopyHostBytes(at, t.in + offset, bytes);
      } else {
        CopyHostBytes(t.out + offset, at, bytes);
      }
    };
    if (t.heads == 0) {
      copy(c.first * t.row_bytes, slot, c.rows * t.row_bytes);
      return;
    }
    const size_t piece = t.row_bytes / t.heads;
    const int64_t b = c.first / t.seq_len, s = c.first % t.seq_len;
    for (int64_t h = 0; h < t.heads; ++h) {
      copy(((b * t.heads + h) * t.seq_len + s) * piece, slot + h * c.rows * piece, c.rows * piece);
    }
  }

  // Runs a call too large to stage whole, chunk by chunk (every tensor's
  // rows of it), through two pinned slots at `slots` (SlotBytes of the
  // largest chunk each), chunk i on slot and stream i % 2, in two passes:
  //  - up: each chunk is copied into its slot once the slot's last upload
  //    is done, uploaded (if `upload`) and computed by launch(chunk,
  //    stream), so the host's copy of one chunk overlaps the other stream's
  //    upload and kernel;
  //  - down, once every kernel has succeeded and `before_write` has passed:
  //    each chunk is downloaded into its slot and copied to the caller
  //    while the next one downloads.
  // The caller's memory changes only in the second pass: a call that fails
  // before it leaves it as it was (the server may run it on the CPU). One
  // that fails during it, after part of it was written, is DATA_LOSS, which
  // the engine never retries elsewhere.
  template <typename Launch>
  absl::Status RunChunked(Worker& w, char* slots, const std::vector<Chunk>& chunks,
                          absl::Span<const ChunkedTensor> tensors, bool upload,
                          const BeforeWrite& before_write, Launch launch) {
    size_t row_bytes = 0;
    for (const ChunkedTensor& t : tensors) row_bytes += t.row_bytes;
    int64_t most = 0;
    for (const Chunk& c : chunks) most = std::max(most, c.rows);
    const size_t slot_bytes = SlotBytes(most, row_bytes);
    const int64_t n = static_cast<int64_t>(chunks.size());
    const auto stream_of = [&](int64_t i) { return i % 2 == 0 ? w.stream : w.stream2; };
    // Queues chunk i's copies between its slot and the device buffer (up:
    // from the caller's memory into the slot first).
    const auto move = [&](int64_t i, cudaMemcpyKind kind) -> absl::Status {
      const Chunk c = chunks[i];
      char* at = slots + (i % 2) * slot_bytes;
      for (const ChunkedTensor& t : tensors) {
        if (t.row_bytes == 0) continue;
        const size_t bytes = c.rows * t.row_bytes;
        char* device = t.device + c.first * t.row_bytes;
        if (kind == cudaMemcpyHostToDevice) {
          CopyChunk(t, c, at, /*to_slot=*/true);
          POSENC_CUDA(rt_.MemcpyAsync(device, at, bytes, kind, stream_of(i)));
        } else {
          POSENC_CUDA(rt_.MemcpyAsync(at, device, bytes, kind, stream_of(i)));
        }
        at += bytes;
      }
      return absl::OkStatus();
    };
    for (int64_t i = 0; i < n; ++i) {
      if (upload) {
        // The slot's last upload (chunk i - 2, on this stream) must be done.
        if (i >= 2) POSENC_CUDA(rt_.StreamSynchronize(stream_of(i)));
        POSENC_RETURN_IF_ERROR(move(i, cudaMemcpyHostToDevice));
      }
      POSENC_RETURN_IF_ERROR(launch(chunks[i], stream_of(i)));
    }
    POSENC_CUDA(rt_.StreamSynchronize(w.stream));
    POSENC_CUDA(rt_.StreamSynchronize(w.stream2));
    POSENC_RETURN_IF_ERROR(Ask(before_write));
    bool written = false;
    const auto down = [&]() -> absl::Status {
      for (int64_t i = 0; i < std::min<int64_t>(2, n); ++i) {
        POSENC_RETURN_IF_ERROR(move(i, cudaMemcpyDeviceToHost));
      }
      for (int64_t i = 0; i < n; ++i) {
        POSENC_CUDA(rt_.StreamSynchronize(stream_of(i)));
        char* at = slots + (i % 2) * slot_bytes;
        for (const ChunkedTensor& t : tensors) {
          if (t.row_bytes == 0) continue;
          CopyChunk(t, chunks[i], at, /*to_slot=*/false);
          at += chunks[i].rows * t.row_bytes;
        }
        written = true;
        if (i + 2 < n) POSENC_RETURN_IF_ERROR(move(i + 2, cudaMemcpyDeviceToHost));
      }
      return absl::OkStatus();
    };
    const absl::Status s = down();
    return s.ok() || !written ? s : PartlyWritten(s);
  }

  // One result to bring back straight into pinned caller memory.
  struct Direct {
    void* to;
    const char* from;  // device
    size_t bytes;
  };

  // Waits for the kernel and asks `before_write`, then copies each result
  // into the caller's memory and waits for that: the caller's bytes change
  // only after the kernel has succeeded. A failure once a copy is queued
  // is PartlyWritten.
  absl::Status DownloadDirect(Worker& w, const BeforeWrite& before_write,
                              std::initializer_list<Direct> results) {
    POSENC_CUDA(rt_.StreamSynchronize(w.stream));
    POSENC_RETURN_IF_ERROR(Ask(before_write));
    bool queued = false;
    const auto copy_back = [&]() -> absl::Status {
      for (const Direct& d : results) {
        if (d.bytes == 0) continue;
        POSENC_CUDA(rt_.MemcpyAsync(d.to, d.from, d.bytes, cudaMemcpyDeviceToHost, w.stream));
        queued = true;
      }
      POSENC_CUDA(rt_.StreamSynchronize(w.stream));
      return absl::OkStatus();
    };
    const absl::Status s = copy_back();
    return s.ok() || !queued ? s : PartlyWritten(s);
  }

  // A failure after results began reaching the caller's memory, which is
  // then partly written: DATA_LOSS, which the engine never retries on
  // another backend.
  static absl::Status PartlyWritten(const absl::Status& s) {
    return absl::DataLossError(
        absl::StrCat(s.message(),
                     " (while results were reaching the caller's memory: the tensors are "
                     "partly written, so the call is not retried on another backend)"));
  }

  // Whether a call's tensors (those of nonzero size) all lie in device
  // memory from OpenSharedDeviceMemory (true) or none does (false).
  absl::StatusOr<bool> Resident(std::initializer_list<std::pair<const void*, size_t>> tensors) {
    int resident = 0, given = 0;
    for (const auto& [p, bytes] : tensors) {
      if (p == nullptr || bytes == 0) continue;
      ++given;
      resident += InShared(p, bytes) ? 1 : 0;
    }
    if (resident != 0 && resident != given) {
      return absl::InvalidArgumentError(
          "a call's tensors must all be in shared device memory or all in host memory");
    }
    return resident != 0;
  }

  // INVALID_ARGUMENT, naming `call`, when any of `tensors` (those of
  // nonzero size) lies in shared device memory.
  absl::Status InHostMemory(std::initializer_list<std::pair<const void*, size_t>> tensors,
                            absl::string_view call) {
    for (const auto& [p, bytes] : tensors) {
      if (p != nullptr && bytes > 0 && InShared(p, bytes)) {
        return absl::InvalidArgumentError(
            absl::StrCat(call,
                         " takes tensors and outputs in host memory; one of them lies in "
                         "shared device memory"));
      }
    }
    return absl::OkStatus();
  }

  // Whether [p, p + bytes) lies in one OpenSharedDeviceMemory mapping.
  bool InShared(const void* p, size_t bytes) {
    std::lock_guard<std::mutex> lock(shared_mu_);
    return Holds(shared_, p, bytes, [](const Shared& s) { return s.bytes; });
  }

  // Whether [p, p + bytes) shares a byte with any shared device mapping.
  bool TouchesShared(const void* p, size_t bytes) {
    const auto begin = reinterpret_cast<uintptr_t>(p);
    const uintptr_t end = bytes > UINTPTR_MAX - begin ? UINTPTR_MAX : begin + bytes;
    std::lock_guard<std::mutex> lock(shared_mu_);
    for (const auto& [start, s] : shared_) {
      if (begin < start + s.bytes && start < end) return true;
    }
    return false;
  }

  // Whether [p, p + bytes) lies in one PinHostMemory registration.
  bool InPinned(const void* p, size_t bytes) const {
    std::lock_guard<std::mutex> lock(pinned_mu_);
    return Holds(pinned_, p, bytes, [](size_t n) { return n; });
  }

  // Whether [p, p + bytes) lies in one of `ranges` (start -> entry, whose
  // size `size_of` gives), overflow-safe.
  template <typename Entry, typename SizeOf>
  static bool Holds(const std::map<uintptr_t, Entry>& ranges, const void* p, size_t bytes,
                    SizeOf size_of) {
    if (p == nullptr || ranges.empty()) return false;
    const auto at = reinterpret_cast<uintptr_t>(p);
    auto it = ranges.upper_bound(at);
    if (it == ranges.begin()) return false;
    --it;
    const size_t size = size_of(it->second);
    return at - it->first <= size && bytes <= size - (at - it->first);
  }

  // The status of a CUDA call's result. A sticky error marks the backend
  // failed; any other is cleared from the thread's last-error slot, since it
  // is reported here and would otherwise resurface in a later launch's
  // cudaPeekAtLastError and fail a healthy request.
  absl::Status Check(cudaError_t e, absl::string_view what, CudaCall call = CudaCall::kRuntime) {
    if (e == cudaSuccess) return absl::OkStatus();
    absl::Status s = cuda::CudaErrorStatus(e, what, call);
    if (cuda::ClassifyCudaError(e, call).sticky) {
      MarkFailed(s);
    } else {
      rt_.GetLastError();
    }
    return s;
  }

  // Clears what earlier calls on this thread left in the last-error slot
  // (the launchers report cudaPeekAtLastError, which would return it as the
  // launch's own error), unless it is sticky: then the context is gone and
  // launching is pointless.
  absl::Status BeforeLaunch() {
    const cudaError_t stale = rt_.GetLastError();
    if (stale != cudaSuccess && cuda::ClassifyCudaError(stale, CudaCall::kRuntime).sticky) {
      return Check(stale, "an earlier CUDA call on this thread");
    }
    return absl::OkStatus();
  }

  void MarkFailed(const absl::Status& cause) {
    std::lock_guard<std::mutex> lock(health_mu_);
    if (failed_.load(std::memory_order_relaxed)) return;  // the first cause is the one to report
    failure_ = absl::FailedPreconditionError(
        absl::StrCat("the CUDA backend on device ", device_, " (", info_.name,
                     ") has failed and takes no more work until the process restarts; ",
                     "the first error: ", cause.message()));
    failed_.store(true, std::memory_order_release);
  }

  absl::Status Reserve(Worker& w, size_t device_bytes, size_t host_bytes) {
    const auto device_alloc = [this](char** p, size_t n) {
      return rt_.Malloc(reinterpret_cast<void**>(p), n);
    };
    const auto device_free = [this](char* p) { return rt_.Free(p); };
    const auto host_alloc = [this](char** p, size_t n) {
      return rt_.MallocHost(reinterpret_cast<void**>(p), n);
    };
    const auto host_free = [this](char* p) { return rt_.FreeHost(p); };
    // The messages are built only on failure: this runs on every call.
    if (const cudaError_t e =
            Grow(rt_, &w.device, &w.device_bytes, device_bytes, device_alloc, device_free);
        e != cudaSuccess) {
      return Check(e, absl::StrCat("growing a worker's device buffer to ", device_bytes,
                                   " bytes (cudaFree, cudaMalloc)"));
    }
    if (const cudaError_t e =
            Grow(rt_, &w.pinned, &w.pinned_bytes, host_bytes, host_alloc, host_free);
        e != cudaSuccess) {
      return Check(e, absl::StrCat("growing a worker's pinned staging buffer to ", host_bytes,
                                   " bytes (cudaFreeHost, cudaMallocHost)"));
    }
    return absl::OkStatus();
  }

  // Runs fn on an idle worker whose device buffer holds `device_bytes` and
  // whose pinned buffer holds `host_bytes`.
  template <typename Fn>
  absl::Status WithWorker(size_t device_bytes, size_t host_bytes, Fn fn) {
    Worker* w;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return !idle_.empty(); });
      w = idle_.back();
      idle_.pop_back();
    }
    // The backend may have failed while this call waited.
    absl::Status s = health();
    if (s.ok()) s = Check(rt_.SetDevice(device_), "cudaSetDevice");
    if (s.ok()) s = Reserve(*w, device_bytes, host_bytes);
    if (s.ok()) {
      // The worker goes back whatever fn does: a throw that escaped here
      // would lose it, and with every worker lost each later call would
      // wait for one forever.
      try {
        s = fn(*w);
      } catch (const std::bad_alloc&) {
        s = absl::ResourceExhaustedError("out of host memory for a GPU call's side tables");
      } catch (...) {
        s = absl::InternalError("a GPU call failed with an exception");
      }
    }
    if (w->pinned_bytes > max_idle_staging_) {
      // Only a large call needed this much; what stays is bounded.
      Check(rt_.StreamSynchronize(w->stream), "draining a worker's stream").IgnoreError();
      Check(rt_.StreamSynchronize(w->stream2), "draining a worker's stream").IgnoreError();
      Check(rt_.FreeHost(w->pinned), "freeing a large staging buffer").IgnoreError();
      w->pinned = nullptr;
      w->pinned_bytes = 0;
    }
    if (!s.ok()) {
      // Leave no work in flight on the buffers the next call reuses.
      Check(rt_.StreamSynchronize(w->stream), "draining a worker's stream after an error")
          .IgnoreError();
      Check(rt_.StreamSynchronize(w->stream2), "draining a worker's stream after an error")
          .IgnoreError();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      idle_.push_back(w);
    }
    cv_.notify_one();
    return s;
  }

  // A learned table's device copy, uploaded on first use and kept while the
  // repository holds the table. The upload runs on the worker's stream and
  // is waited for before the copy enters the cache: other workers' streams
  // are non-blocking and unordered with this one, so they may only see a
  // finished copy. (cudaMemcpy from pageable memory on the legacy stream
  // could return before the data landed, and the legacy stream does not
  // order non-blocking streams.) First use only, so the wait costs little.
  absl::StatusOr<const float*> DeviceTable(const std::shared_ptr<const LearnedTable>& t,
                                           Worker& w) {
    std::lock_guard<std::mutex> lock(tables_mu_);
    for (auto it = tables_.begin(); it != tables_.end();) {
      if (it->second.owner.expired()) {
        Check(rt_.Free(it->second.device), "freeing an unused learned table").IgnoreError();
        it = tables_.erase(it);
      } else {
        ++it;
      }
    }
    auto it = tables_.find(t.get());
    if (it != tables_.end()) return it->second.device;
    float* d = nullptr;
    const size_t bytes = t->values.size() * sizeof(float);
    POSENC_RETURN_IF_ERROR(
        Check(rt_.Malloc(reinterpret_cast<void**>(&d), std::max<size_t>(bytes, 1)),
              absl::StrCat("allocating ", bytes, " bytes for a learned table")));
    absl::Status s =
        Check(rt_.MemcpyAsync(d, t->values.data(), bytes, cudaMemcpyHostToDevice, w.stream),
              "uploading a learned table");
    if (s.ok()) s = Check(rt_.StreamSynchronize(w.stream), "waiting for a learned table's upload");
    if (!s.ok()) {
      rt_.Free(d);
      return s;
    }
    tables_[t.get()] = TableEntry{t, d};
    return d;
  }

  struct TableEntry {
    std::weak_ptr<const LearnedTable> owner;
    float* device = nullptr;
  };

  DeviceRuntime& rt_;
  const int device_;
  const DeviceInfo info_;
  const int sm_count_;
  const size_t chunk_bytes_;
  const size_t max_idle_staging_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Worker*> idle_;
  std::mutex tables_mu_;
  std::map<const LearnedTable*, TableEntry> tables_;
  mutable std::mutex pinned_mu_;
  std::map<uintptr_t, size_t> pinned_;  // PinHostMemory: start -> bytes
  struct Shared {
    size_t bytes = 0;  // the most any opening asked for
    int opened = 0;
  };
  std::mutex shared_mu_;
  std::map<uintptr_t, Shared> shared_;  // OpenSharedDeviceMemory: start -> entry
  // Set once, by the first sticky error; health() reads the flag without the
  // lock so healthy calls do not contend.
  std::atomic<bool> failed_{false};
  mutable std::mutex health_mu_;
  absl::Status failure_;
};

#undef POSENC_CUDA

}  // namespace

bool BuiltWithCuda() { return true; }

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear it so later calls on this thread do not see it
    return absl::FailedPreconditionError(
        absl::StrCat("no usable CUDA driver or device (", cudaGetErrorString(e), ")"));
  }
  if (device < 0 || device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA device ", device, " does not exist (", count, " visible)"));
  }
  cudaDeviceProp prop{};
  const cudaError_t pe = cudaGetDeviceProperties(&prop, device);
  if (pe != cudaSuccess) {
    cudaGetLastError();
    return cuda::CudaErrorStatus(pe,
                                 absl::StrCat("reading the properties of CUDA device ", device));
  }
  DeviceInfo info;
  info.name = prop.name;
  info.memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  info.compute_capability = prop.major * 10 + prop.minor;
  {
    const auto* u = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
    std::string uuid = "GPU-";
    for (int i = 0; i < 16; ++i) {
      if (i == 4 || i == 6 || i == 8 || i == 10) uuid += '-';
      absl::StrAppend(&uuid, absl::Hex(u[i], absl::kZeroPad2));
    }
    info.uuid = uuid;
  }
  return cuda::CreateCudaBackendOn(cuda::CudaRuntime(), device, std::move(info),
                                   prop.multiProcessorCount);
}

namespace cuda {

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackendOn(DeviceRuntime& runtime, int device,
                                                             DeviceInfo info, int sm_count,
                                                             CudaBackendOptions options) {
  auto backend = std::make_unique<CudaBackend>(runtime, device, std::move(info), sm_count, options);
  POSENC_RETURN_IF_ERROR(backend->Init());
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace cuda

}  // namespace posenc
