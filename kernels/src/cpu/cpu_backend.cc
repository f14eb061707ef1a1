// The CPU backend: splits each plan's work across a thread pool.
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cpu/absolute_through.h"
#include "cpu/anchor_cache.h"
#include "cpu/bias_through.h"
#include "cpu/rope_through.h"
#include "cpu/rotation_cache.h"
#include "cpu/thread_pool.h"
#include "cpu_kernels.h"
#include "posenc/backend.h"
#include "posenc/dtype.h"
#include "posenc/host_copy.h"

namespace posenc {
namespace {

// Chunks of at least this many elements amortise the per-chunk overhead
// (angle buffers, scheduling) without starving threads on small requests;
// chunks of at most this many (a few ms of work) let a cancelled call stop
// soon, since cancellation is checked between chunks. The minimum follows
// the kernels' speed: waking the second thread (an idle vCPU here) costs
// about as much as 100 us of work. At 2^18 a 128-token bf16 RoPE request
// (655K elements, ~125 us on one thread) was split and ran 0-40% slower on
// 2 threads than on 1, split 51 + 51 + 26 or 64 + 64 alike; 512 tokens (2
// chunks of 256 at 2^20) gain 5-30%.
constexpr int64_t kMinElementsPerChunk = 1 << 20;
constexpr int64_t kMaxElementsPerChunk = 1 << 22;

int64_t Grain(int64_t elements_per_item) {
  return std::max<int64_t>(1, kMinElementsPerChunk / std::max<int64_t>(1, elements_per_item));
}
int64_t MaxChunk(int64_t elements_per_item) {
  return std::max<int64_t>(1, kMaxElementsPerChunk / std::max<int64_t>(1, elements_per_item));
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int num_threads) : pool_(num_threads) {}

  BackendKind kind() const override { return BackendKind::kCpu; }
  DeviceInfo device() const override {
    DeviceInfo d;
    d.name = "cpu";
    d.threads = pool_.num_threads();
    return d;
  }

  absl::Status ApplyRope(const RopePlan& plan, void* query, void* key,
                         const RunContext& ctx) override {
    if (plan.empty()) return absl::OkStatus();
    const int64_t per_token = (plan.query_heads + plan.key_heads) * plan.head_dim;
    const std::shared_ptr<internal::RowTable> rotations = rotations_.For(plan);
    return Run(plan.num_tokens, Grain(per_token), MaxChunk(per_token), ctx,
               [&](int64_t b, int64_t e) {
                 internal::RopeTokensCpu(plan, rotations.get(), query, key, b, e);
               });
  }

  absl::Status ApplyRopeThrough(const RopePlan& plan, const RopeThrough& t,
                                const RunContext& ctx) override {
    const int64_t per_token =
        (plan.query_heads + (plan.has_key ? plan.key_heads : 0)) * plan.head_dim;
    if (plan.num_tokens == 0 || per_token == 0) return absl::OkStatus();
    // Blocks go out on several threads while later ones are read: an
    // output is its own input exactly (in place) or shares no byte with
    // any input or the other output, else a block would read what another
    // already wrote (the contract of RopeThrough).
    const size_t es = SizeOf(plan.dtype);
    const auto q_bytes =
        static_cast<size_t>(plan.num_tokens * plan.query_heads * plan.head_dim) * es;
    const size_t k_bytes =
        plan.has_key ? static_cast<size_t>(plan.num_tokens * plan.key_heads * plan.head_dim) * es
                     : 0;
    const auto meet = [](const void* a, size_t an, const void* b, size_t bn) {
      return an > 0 && bn > 0 && HostBytesOverlap(a, an, b, bn);
    };
    if ((t.query_out != t.query && meet(t.query_out, q_bytes, t.query, q_bytes)) ||
        (t.key_out != t.key && meet(t.key_out, k_bytes, t.key, k_bytes)) ||
        meet(t.query_out, q_bytes, t.key, k_bytes) || meet(t.key_out, k_bytes, t.query, q_bytes) ||
        meet(t.query_out, q_bytes, t.key_out, k_bytes)) {
      return absl::InvalidArgumentError(
          "ApplyRopeThrough: an output overlaps an input or the other output (an output may be "
          "its own input exactly, or lie apart from every other tensor)");
    }
    if ((t.query_work == t.query && t.query_out != t.query) ||
        (plan.has_key && t.key_work == t.key && t.key_out != t.key)) {
      return absl::InvalidArgumentError(
          "ApplyRopeThrough: a work memory that is its input needs its output there too");
    }
    if (internal::RopeThroughNeedsWork(plan) &&
        (t.query_work == nullptr ||
         (plan.has_key && plan.key_heads > 0 && t.key_work == nullptr))) {
      return absl::InvalidArgumentError(
          "ApplyRopeThrough: tokens larger than a block need work memory");
    }
    const std::shared_ptr<internal::RowTable> rotations =
        plan.empty() ? nullptr : rotations_.For(plan);
    RopeThrough checked = t;
    return RunThrough(plan.num_tokens, per_token, ctx, &checked.before_write,
                      [&](int64_t b, int64_t e) {
                        return internal::RopeThroughTokensCpu(plan, rotations.get(), checked, b, e);
                      });
  }

  absl::Status ApplyAbsoluteThrough(const AbsolutePlan& plan, const AbsoluteThrough& t,
                                    const RunContext& ctx) override {
    if (!plan.has_input) {
      return absl::InvalidArgumentError("ApplyAbsoluteThrough: the plan has no input");
    }
    if (plan.empty()) return absl::OkStatus();
    const auto bytes = static_cast<size_t>(plan.num_tokens * plan.dim) * SizeOf(plan.dtype);
    if (HostBytesOverlap(t.x, bytes, t.y, bytes)) {
      return absl::InvalidArgumentError("ApplyAbsoluteThrough: y overlaps x");
    }
    const std::shared_ptr<internal::RowTable> anchors = anchors_.For(plan);
    AbsoluteThrough checked = t;
    return RunThrough(
        plan.num_tokens, plan.dim, ctx, &checked.before_write, [&](int64_t b, int64_t e) {
          return internal::AbsoluteThroughTokensCpu(plan, anchors.get(), checked, b, e);
        });
  }

  absl::Status ApplyAttentionBiasThrough(const BiasPlan& plan, const BiasThrough& t,
                                         const RunContext& ctx) override {
    if (!plan.add_to_logits) {
      return absl::InvalidArgumentError("ApplyAttentionBiasThrough: the plan has no logits");
    }
    if (plan.empty()) return absl::OkStatus();
    const auto bytes = static_cast<size_t>(plan.NumElements()) * SizeOf(plan.dtype);
    if (HostBytesOverlap(t.logits, bytes, t.out, bytes)) {
      return absl::InvalidArgumentError("ApplyAttentionBiasThrough: out overlaps the logits");
    }
    BiasThrough checked = t;
    return RunThrough(
        plan.batch * plan.num_heads * plan.q_len, plan.k_len, ctx, &checked.before_write,
        [&](int64_t b, int64_t e) { return internal::BiasThroughRowsCpu(plan, checked, b, e); });
  }

  bool RopeThroughNeedsWork(const RopePlan& plan) const override {
    return internal::RopeThroughNeedsWork(plan);
  }

  absl::Status ApplyAbsolute(const AbsolutePlan& plan, void* x, const RunContext& ctx) override {
    if (plan.empty()) return absl::OkStatus();
    const std::shared_ptr<internal::RowTable> anchors = anchors_.For(plan);
    return Run(
        plan.num_tokens, Grain(plan.dim), MaxChunk(plan.dim), ctx,
        [&](int64_t b, int64_t e) { internal::AbsoluteTokensCpu(plan, anchors.get(), x, b, e); });
  }

  absl::Status ApplyAttentionBias(const BiasPlan& plan, void* out, const RunContext& ctx) override {
    if (plan.empty()) return absl::OkStatus();
    const int64_t rows = plan.batch * plan.num_heads * plan.q_len;
    return Run(rows, Grain(plan.k_len), MaxChunk(plan.k_len), ctx,
               [&](int64_t b, int64_t e) { internal::AttentionBiasRowsCpu(plan, out, b, e); });
  }

 private:
  // Runs fn(b, e) (a through operation's tokens [b, e), returning only
  // *before_write's errors) over `tokens` tokens of `per_token` elements on
  // the pool. The first before_write error is the call's, and stops every
  // thread at its next block: *before_write is wrapped so that it is kept,
  // and the stop set, where the error is seen, and the others stop asking
  // at once.
  template <typename Fn>
  absl::Status RunThrough(int64_t tokens, int64_t per_token, const RunContext& ctx,
                          std::function<absl::Status()>* before_write, Fn fn) {
    std::mutex mu;
    absl::Status failed;
    std::atomic<bool> stop{false};
    if (*before_write) {
      *before_write = [&, asked = *before_write]() -> absl::Status {
        if (stop.load(std::memory_order_relaxed)) return absl::AbortedError("stopped");
        absl::Status s = asked();
        if (!s.ok()) {
          std::lock_guard<std::mutex> lock(mu);
          if (failed.ok()) failed = s;
          stop = true;
        }
        return s;
      };
    }
    const absl::Status ran =
        Run(tokens, Grain(per_token), MaxChunk(per_token), ctx, [&](int64_t b, int64_t e) {
          if (stop.load(std::memory_order_relaxed)) return;
          // Its only error is before_write's, kept in `failed`.
          fn(b, e).IgnoreError();
        });
    return failed.ok() ? ran : failed;
  }

  // Runs fn over [0, n) in parallel; chunks that start after the caller left
  // are skipped, and the call reports CANCELLED.
  template <typename Fn>
  absl::Status Run(int64_t n, int64_t grain, int64_t max_chunk, const RunContext& ctx, Fn fn) {
    std::atomic<bool> cancelled{false};
    pool_.ParallelFor(
        n, grain,
        [&](int64_t b, int64_t e) {
          if (cancelled.load(std::memory_order_relaxed)) return;
          if (ctx.IsCancelled()) {
            cancelled = true;
            return;
          }
          fn(b, e);
        },
        max_chunk);
    if (cancelled) return absl::CancelledError("the call was cancelled while computing");
    return absl::OkStatus();
  }

  ThreadPool pool_;
  // Slot rotations by position, shared by the calls of one model's
  // frequencies (rotation_cache.h).
  internal::RotationCache rotations_;
  // The sinusoidal add's anchor rows, likewise (anchor_cache.h).
  internal::AnchorCache anchors_;
};

}  // namespace

int CpusWithinQuota(absl::string_view cpu_max, int cpus) {
  // cgroup v2: "max 100000" (no limit) or "<quota> <period>", in
  // microseconds; a quota of 1.5 periods takes 2 CPUs. Anything else,
  // numbers out of range included, leaves `cpus`.
  const std::vector<absl::string_view> words =
      absl::StrSplit(cpu_max, absl::ByAnyChar(" \t\n"), absl::SkipEmpty());
  int64_t quota = 0, period = 0;
  if (words.size() != 2 || !absl::SimpleAtoi(words[0], &quota) ||
      !absl::SimpleAtoi(words[1], &period) || quota <= 0 || period <= 0) {
    return cpus;
  }
  const int64_t needed = quota / period + (quota % period != 0 ? 1 : 0);
  return static_cast<int>(std::clamp<int64_t>(needed, 1, std::max(cpus, 1)));
}

int UsableCpus() {
  int cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) cpus = std::max(1, CPU_COUNT(&set));
  std::ifstream in("/sys/fs/cgroup/cpu.max");
  std::string line;
  if (std::getline(in, line)) cpus = CpusWithinQuota(line, cpus);
  return cpus;
}

std::unique_ptr<Backend> CreateCpuBackend(int num_threads) {
  if (num_threads <= 0) num_threads = UsableCpus();
  return std::make_unique<CpuBackend>(num_threads);
}

}  // namespace posenc
