#include "engine/scratch_pool.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "posenc/status_macros.h"

namespace posenc::server {
namespace {

constexpr int64_t kAlign = 64;

}  // namespace

ScratchPool::Buffer& ScratchPool::Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    Reset();
    pool_ = o.pool_;
    call_ = o.call_;
    block_ = std::move(o.block_);
    o.pool_ = nullptr;
  }
  return *this;
}

void ScratchPool::Buffer::Reset() {
  if (pool_ != nullptr && block_.memory != nullptr) pool_->Return(std::move(block_), call_);
  pool_ = nullptr;
  call_ = nullptr;
  block_ = Block();
}

ScratchPool::ScratchPool(AdmissionControl* admission, int64_t max_idle_bytes)
    : admission_(admission),
      max_idle_bytes_(std::max<int64_t>(max_idle_bytes, 0)),
      held_(admission->Holder()) {
  // Idle buffers are the first memory to give up (see SetReclaimer).
  admission_->SetReclaimer([this](AdmissionControl::Ticket* freed) {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t idle = IdleBytesLocked();
    idle_.clear();
    held_.GiveBytes(idle, freed);
  });
}

ScratchPool::~ScratchPool() { admission_->SetReclaimer(nullptr); }

absl::StatusOr<ScratchPool::Buffer> ScratchPool::Lend(int64_t bytes,
                                                      AdmissionControl::Ticket& call) {
  if (bytes <= 0) return absl::InvalidArgumentError("a scratch buffer of no bytes");
  // Rounded up so that any tail a vector loop reads past the tensor's last
  // whole vector stays inside the allocation.
  if (bytes > INT64_MAX - kAlign) {
    return absl::ResourceExhaustedError(absl::StrCat("a scratch buffer of ", bytes, " bytes"));
  }
  const int64_t size = (bytes + kAlign - 1) / kAlign * kAlign;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto best = idle_.end();
    for (auto it = idle_.begin(); it != idle_.end(); ++it) {
      if (it->size >= size && it->size / 2 <= size &&
          (best == idle_.end() || it->size < best->size))
        best = it;
    }
    if (best != idle_.end()) {
      // Its bytes move from the pool's ticket to the call's, never released
      // to the budget in between.
      Block block = std::move(*best);
      idle_.erase(best);
      held_.GiveBytes(block.size, &call);
      return Buffer(this, &call, std::move(block));
    }
  }
  // Short of budget, TryGrow has the idle buffers given back first (the
  // reclaimer above) and tries again.
  POSENC_RETURN_IF_ERROR(call.TryGrow(size));
  Memory memory(static_cast<char*>(std::aligned_alloc(kAlign, static_cast<size_t>(size))));
  if (memory == nullptr) {
    call.Shrink(size);
    return absl::ResourceExhaustedError(
        absl::StrCat("could not allocate a scratch buffer of ", size, " bytes"));
  }
  return Buffer(this, &call, Block{std::move(memory), size});
}

void ScratchPool::Return(Block block, AdmissionControl::Ticket* call) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t idle = IdleBytesLocked();
  // Over the bound (or the call no longer holds its bytes to hand over):
  // freed here, its bytes released with the call's ticket.
  if (block.size > max_idle_bytes_ - idle || call->bytes() < block.size) return;
  call->GiveBytes(block.size, &held_);
  idle_.push_back(std::move(block));
}

int64_t ScratchPool::IdleBytesLocked() const {
  int64_t idle = 0;
  for (const Block& b : idle_) idle += b.size;
  return idle;
}

int64_t ScratchPool::idle_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return IdleBytesLocked();
}

int ScratchPool::idle_buffers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(idle_.size());
}

}  // namespace posenc::server
