#include "engine/guarded_mapping.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace posenc::server {
namespace {

// Live mappings, for the signal handler: it reads them with atomic loads
// only (no lock, no allocation). A slot's `begin` is set last when it is
// taken and cleared first when it is given back.
constexpr int kSlots = 4096;
struct Slot {
  std::atomic<uintptr_t> begin{0};
  std::atomic<uintptr_t> end{0};
  std::atomic<bool> broken{false};
};
Slot slots[kSlots];
bool slot_taken[kSlots];  // under slot_mu
std::mutex slot_mu;
std::atomic<int64_t> repair_count{0};
struct sigaction previous_action;

void OnSigbus(int sig, siginfo_t* info, void* context) {
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  for (Slot& s : slots) {
    const uintptr_t begin = s.begin.load(std::memory_order_acquire);
    if (begin == 0 || addr < begin || addr >= s.end.load(std::memory_order_relaxed)) continue;
    // Zero pages over the whole mapping: the faulting access, and every
    // other one the kernels make before the call notices, land in memory
    // of the server's own. The raw system call: no interceptor or wrapper
    // runs inside a signal handler.
    // Marked broken first: a thread that reads the zero pages (another
    // thread of the call, or another call) and then asks broken() is told
    // so, and never passes zeros on as the caller's values.
    s.broken.store(true, std::memory_order_seq_cst);
    const uintptr_t length = s.end.load(std::memory_order_relaxed) - begin;
    const long r = syscall(SYS_mmap, reinterpret_cast<void*>(begin), length, PROT_READ | PROT_WRITE,
                           MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r == -1) break;  // cannot repair: fall through to the previous action
    repair_count.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  // Not a mapping of ours: what would have happened without us.
  if ((previous_action.sa_flags & SA_SIGINFO) != 0 && previous_action.sa_sigaction != nullptr) {
    previous_action.sa_sigaction(sig, info, context);
    return;
  }
  if (previous_action.sa_handler != SIG_DFL && previous_action.sa_handler != SIG_IGN) {
    previous_action.sa_handler(sig);
    return;
  }
  // The default action, taken when the faulting access runs again.
  signal(SIGBUS, SIG_DFL);
}

void InstallHandler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action;
    std::memset(&action, 0, sizeof action);
    action.sa_sigaction = OnSigbus;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    sigaction(SIGBUS, &action, &previous_action);
  });
}

}  // namespace

absl::StatusOr<std::unique_ptr<GuardedMapping>> GuardedMapping::Map(int fd, int64_t offset,
                                                                    int64_t size) {
  InstallHandler();
  if (offset < 0 || size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot map ", size, " bytes at offset ", offset, ": nothing to map"));
  }
  const int64_t page = sysconf(_SC_PAGESIZE);
  const int64_t aligned = offset - offset % page;
  const int64_t delta = offset - aligned;
  // Whole pages from `aligned`, in overflow-safe arithmetic: a size near
  // 2^63 (an object that large, with limits that admit it) is refused.
  if (size > std::numeric_limits<int64_t>::max() - delta - page) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot map ", size, " bytes at offset ",
                                                     offset, " of a shared-memory object"));
  }
  const int64_t length = (delta + size + page - 1) / page * page;
  int slot = -1;
  {
    std::lock_guard<std::mutex> lock(slot_mu);
    for (int i = 0; i < kSlots && slot < 0; ++i) {
      if (!slot_taken[i]) slot = i;
    }
    if (slot < 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the server has ", kSlots, " shared-memory mappings already"));
    }
    slot_taken[slot] = true;
  }
  void* p = ::mmap(nullptr, static_cast<size_t>(length), PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                   static_cast<off_t>(aligned));
  if (p == MAP_FAILED) {
    const int e = errno;
    std::lock_guard<std::mutex> lock(slot_mu);
    slot_taken[slot] = false;
    const std::string why =
        absl::StrCat("could not map the shared-memory object: ", std::strerror(e));
    return e == ENOMEM ? absl::ResourceExhaustedError(why) : absl::InvalidArgumentError(why);
  }
  char* base = static_cast<char*>(p);
  Slot& s = slots[slot];
  s.broken.store(false, std::memory_order_relaxed);
  s.end.store(reinterpret_cast<uintptr_t>(base) + static_cast<uintptr_t>(length),
              std::memory_order_relaxed);
  s.begin.store(reinterpret_cast<uintptr_t>(base), std::memory_order_release);
  return std::unique_ptr<GuardedMapping>(
      new GuardedMapping(base, length, base + delta, size, slot));
}

GuardedMapping::~GuardedMapping() {
  slots[slot_].begin.store(0, std::memory_order_release);
  ::munmap(base_, static_cast<size_t>(length_));
  std::lock_guard<std::mutex> lock(slot_mu);
  slot_taken[slot_] = false;
}

bool GuardedMapping::broken() const { return slots[slot_].broken.load(std::memory_order_acquire); }

int64_t GuardedMapping::repairs() { return repair_count.load(std::memory_order_relaxed); }

}  // namespace posenc::server
