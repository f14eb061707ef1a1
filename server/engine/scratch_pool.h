// Buffers a call works in when it may not work where its tensor lies: a
// KServe input in one shared-memory slice whose result goes to another is
// computed in a private copy where the output overlaps the input, so the
// output slice only ever receives finished values (kserve/infer.cc says
// why); a GPU computes in its own buffer, and the CPU otherwise block by
// block (Engine::RopeIntoHost). Allocating such a copy per
// call would cost fresh pages on every call (an 80 MiB prefill: ~20k page
// faults, each zero-filled by the kernel), so finished calls give their
// buffers back here and the next call of a like size reuses one.
//
// Every byte stays inside the memory budget: a lent buffer is charged to
// the call that holds it, an idle one to the pool's own ticket, and the
// bytes move between the two without being released in between. Idle
// buffers are kept up to `max_idle_bytes`, and are given back to the
// budget when a call cannot otherwise get the bytes it asks for.
#ifndef POSENC_SERVER_ENGINE_SCRATCH_POOL_H_
#define POSENC_SERVER_ENGINE_SCRATCH_POOL_H_

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/admission.h"

namespace posenc::server {

class ScratchPool {
 private:
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  using Memory = std::unique_ptr<char, Free>;
  struct Block {
    Memory memory;
    int64_t size = 0;
  };

 public:
  // A lent buffer: 64-byte aligned (every dtype's and every vector load's
  // fit), its contents whatever the last user left. Goes back to the pool
  // when destroyed. REQUIRES: the pool outlives it.
  class Buffer {
   public:
    Buffer() = default;
    Buffer(Buffer&& o) noexcept : pool_(o.pool_), call_(o.call_), block_(std::move(o.block_)) {
      o.pool_ = nullptr;
    }
    Buffer& operator=(Buffer&& o) noexcept;
    ~Buffer() { Reset(); }
    char* data() const { return block_.memory.get(); }
    int64_t size() const { return block_.size; }
    explicit operator bool() const { return block_.memory != nullptr; }
    void Reset();

   private:
    friend class ScratchPool;
    Buffer(ScratchPool* pool, AdmissionControl::Ticket* call, Block block)
        : pool_(pool), call_(call), block_(std::move(block)) {}
    ScratchPool* pool_ = nullptr;
    AdmissionControl::Ticket* call_ = nullptr;  // charged for the block
    Block block_;
  };

  // Idle bytes are held against `admission`'s budget (not owned; outlives
  // the pool). Registers itself as `admission`'s reclaimer (idle buffers
  // give way to calls that would otherwise wait or be refused), until it
  // goes.
  ScratchPool(AdmissionControl* admission, int64_t max_idle_bytes);
  ~ScratchPool();
  ScratchPool(const ScratchPool&) = delete;
  ScratchPool& operator=(const ScratchPool&) = delete;

  // A buffer of at least `bytes` (> 0), charged in full to `call`: the
  // smallest idle one that holds them and is at most twice their size (a
  // small call must not take the buffer a large one will want), else a new
  // one. RESOURCE_EXHAUSTED when `call` cannot grow by that much even after
  // the idle buffers went back to the budget, or the allocation fails.
  [[nodiscard]] absl::StatusOr<Buffer> Lend(int64_t bytes, AdmissionControl::Ticket& call);

  int64_t idle_bytes() const;
  int idle_buffers() const;

 private:
  void Return(Block block, AdmissionControl::Ticket* call);
  int64_t IdleBytesLocked() const;

  AdmissionControl* const admission_;
  const int64_t max_idle_bytes_;
  mutable std::mutex mu_;
  AdmissionControl::Ticket held_;  // the idle buffers' bytes
  std::vector<Block> idle_;
};

}  // namespace posenc::server

#endif  // POSENC_SERVER_ENGINE_SCRATCH_POOL_H_
