#include "shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "call_outcome.h"

namespace posenc::client_internal {
namespace {

constexpr int64_t kMinRegionBytes = int64_t{1} << 20;
// Larger regions are not asked for (the call uses the socket).
constexpr int64_t kMaxRegionBytes = int64_t{1} << 46;
constexpr size_t kMaxIdleRegions = 4;
constexpr std::chrono::milliseconds kFirstBackoff{100}, kMaxBackoff{5000};

// Refusals that leave shared memory worth asking for again later (Defer):
// no room now, or a moment's trouble.
bool Transient(absl::StatusCode code) {
  return code == absl::StatusCode::kResourceExhausted || code == absl::StatusCode::kUnavailable ||
         code == absl::StatusCode::kDeadlineExceeded || code == absl::StatusCode::kCancelled ||
         code == absl::StatusCode::kAborted;
}

int64_t RoundUpToPages(int64_t bytes) {
  const int64_t page = sysconf(_SC_PAGESIZE);
  return (bytes + page - 1) / page * page;
}

}  // namespace

std::string LocalSharedMemoryDomain() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string boot;
  std::getline(in, boot);
  boot = std::string(absl::StripAsciiWhitespace(boot));
  if (boot.empty()) boot = "unknown";
  struct stat st;
  if (::stat("/dev/shm", &st) != 0) return "";
  return absl::StrCat(boot, "/", st.st_dev, ":", st.st_ino);
}

ClientRegion::~ClientRegion() { ::munmap(data_, static_cast<size_t>(size_)); }

void Lease::Release() {
  if (region_ == nullptr) return;
  if (discard_) {
    pool_->Unregister(region_->name());
    region_.reset();
  } else {
    pool_->Return(std::move(region_));
  }
}

SharedMemoryPool::~SharedMemoryPool() {
  for (const auto& r : idle_) UnregisterNow(r->name());
}

bool SharedMemoryPool::disabled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return usable_.has_value() && !*usable_;
}

absl::Status SharedMemoryPool::WhyNot() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (why_not_.code() == absl::StatusCode::kResourceExhausted ||
      why_not_.code() == absl::StatusCode::kUnavailable) {
    return why_not_;
  }
  if (Transient(why_not_.code())) {  // deferred: worth asking again
    return absl::UnavailableError(
        absl::StrCat("a shared-memory region was not registered now: ", why_not_.message()));
  }
  return absl::FailedPreconditionError(
      why_not_.ok() ? "this server cannot share memory with this process (not on this node, "
                      "another /dev/shm, or turned off)"
                    : absl::StrCat("shared memory with this server failed: ", why_not_.message()));
}

void SharedMemoryPool::Defer(const absl::Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  why_not_ = why;
  retry_at_ = std::chrono::steady_clock::now() + backoff_;
  backoff_ = std::min(2 * backoff_, kMaxBackoff);
}

void SharedMemoryPool::Disable(const absl::Status& why) {
  std::vector<std::unique_ptr<ClientRegion>> idle;
  {
    std::lock_guard<std::mutex> lock(mu_);
    usable_ = false;
    why_not_ = why;
    idle.swap(idle_);
  }
  for (const auto& r : idle) Unregister(r->name());
}

bool SharedMemoryPool::Usable() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (usable_.has_value()) return *usable_;
    // The last ask got no answer: not again before its backoff.
    if (std::chrono::steady_clock::now() < ask_at_) return false;
  }
  // Once, outside the lock: concurrent first calls may both ask.
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ServerInfo info;
  const grpc::Status s = stub_->GetServerInfo(&ctx, v1::GetServerInfoRequest(), &info);
  if (!s.ok() && s.error_code() != grpc::StatusCode::UNIMPLEMENTED) {
    // Not an answer (the server starting, unreachable): this call uses the
    // socket, and a call after a backoff (100 ms doubling to 5 s) asks again.
    std::lock_guard<std::mutex> lock(mu_);
    why_not_ = absl::UnavailableError(
        absl::StrCat("could not ask the server whether it shares memory: ", s.error_message()));
    ask_at_ = std::chrono::steady_clock::now() + ask_backoff_;
    ask_backoff_ = std::min(2 * ask_backoff_, kMaxBackoff);
    return false;
  }
  const bool same_node =
      s.ok() && info.shared_memory_enabled() &&
      (unix_target_ || (!info.shared_memory_domain().empty() &&
                        info.shared_memory_domain() == LocalSharedMemoryDomain()));
  std::lock_guard<std::mutex> lock(mu_);
  if (!usable_.has_value()) {
    usable_ = same_node;
    why_not_ = absl::OkStatus();  // the answer, not an earlier failure to ask
  }
  return *usable_;
}

std::optional<Lease> SharedMemoryPool::Take(int64_t bytes) {
  if (!enabled_ || bytes <= 0 || bytes > kMaxRegionBytes || !Usable()) return std::nullopt;
  int64_t size = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!usable_.value_or(false)) return std::nullopt;
    // The smallest idle region that holds the call.
    auto best = idle_.end();
    for (auto it = idle_.begin(); it != idle_.end(); ++it) {
      if ((*it)->size() >= bytes && (best == idle_.end() || (*it)->size() < (*best)->size())) {
        best = it;
      }
    }
    if (best != idle_.end()) {
      std::unique_ptr<ClientRegion> r = std::move(*best);
      idle_.erase(best);
      return Lease(this, std::move(r));
    }
    if (std::chrono::steady_clock::now() < retry_at_) return std::nullopt;  // deferred
    // Geometric growth: a caller whose tensors grow reuses regions after a
    // few calls instead of registering one per size. At most twice this
    // call's bytes: calls in flight together need a region each, and
    // growth from the largest alone doubled with every one of them.
    size = RoundUpToPages(std::max({bytes, std::min(2 * largest_, 2 * bytes), kMinRegionBytes}));
  }
  std::unique_ptr<ClientRegion> region = Create(size);
  if (region == nullptr) return std::nullopt;
  // Idle regions too small for this call are outgrown (a caller whose
  // tensors grow keeps one region, not one per size); those that would
  // have held it stay, for callers of other sizes.
  std::vector<std::unique_ptr<ClientRegion>> outgrown;
  {
    std::lock_guard<std::mutex> lock(mu_);
    largest_ = std::max(largest_, size);
    for (auto it = idle_.begin(); it != idle_.end();) {
      if ((*it)->size() < bytes) {
        outgrown.push_back(std::move(*it));
        it = idle_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const auto& r : outgrown) Unregister(r->name());
  return Lease(this, std::move(region));
}

std::unique_ptr<ClientRegion> SharedMemoryPool::Create(int64_t bytes) {
  // Numbered across the process: every Client of it has a pool, and their
  // regions' keys and names must differ.
  static std::atomic<uint64_t> created{0};
  const uint64_t n = created.fetch_add(1);
  static const uint64_t nonce = std::random_device{}() * uint64_t{0x9e3779b97f4a7c15};
  const std::string key = absl::StrFormat("/posenc-client-%d-%016x-%d", ::getpid(), nonce, n);
  const int fd = ::shm_open(key.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    Disable(absl::InternalError(absl::StrCat("shm_open: ", std::strerror(errno))));
    return nullptr;
  }
  // posix_fallocate, not ftruncate alone: it takes the object's pages from
  // /dev/shm now, so a full tmpfs (a pod's sizeLimit) is ENOSPC here instead
  // of SIGBUS when a tensor is first written into a page it never got.
  void* p = MAP_FAILED;
  int e;
  do {
    e = ::posix_fallocate(fd, 0, bytes);  // glibc does not retry a signal's EINTR
  } while (e == EINTR);
  if (e == 0) {
    p = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) e = errno;
  }
  ::close(fd);
  if (p == MAP_FAILED) {
    ::shm_unlink(key.c_str());
    Defer(absl::ResourceExhaustedError(absl::StrCat(
        "could not size or map a shared-memory region of ", bytes, " bytes: ", std::strerror(e))));
    return nullptr;
  }
  auto region = std::unique_ptr<ClientRegion>(new ClientRegion(key, static_cast<char*>(p), bytes));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::RegisterSharedMemoryRequest req;
  req.set_name(key);
  req.set_key(key);
  req.set_byte_size(static_cast<uint64_t>(bytes));
  v1::SharedMemoryStatus resp;
  grpc::Status s = stub_->RegisterSharedMemory(&ctx, req, &resp);
  // Registered, the server maps the object; no file is needed after that.
  ::shm_unlink(key.c_str());
  // The name is ours alone (the nonce): taken means an attempt of this very
  // registration got through and its answer was lost before gRPC retried it.
  if (s.error_code() == grpc::StatusCode::ALREADY_EXISTS) s = grpc::Status::OK;
  if (!s.ok()) {
    const absl::Status why(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
    if (OutcomeUnknown(why.code())) Unregister(key);  // the server may have it
    if (Transient(why.code())) {
      Defer(why);
    } else {
      Disable(why);  // the server cannot map our regions
    }
    return nullptr;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    backoff_ = kFirstBackoff;
    why_not_ = absl::OkStatus();
  }
  return region;
}

void SharedMemoryPool::Return(std::unique_ptr<ClientRegion> region) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Kept while shared memory is in use; a full pool gives back its
    // smallest region (this one, or an idle one smaller), so callers of
    // mixed sizes each keep a region.
    if (usable_.value_or(false)) {
      if (idle_.size() < kMaxIdleRegions) {
        idle_.push_back(std::move(region));
        return;
      }
      auto smallest =
          std::min_element(idle_.begin(), idle_.end(),
                           [](const auto& a, const auto& b) { return a->size() < b->size(); });
      if ((*smallest)->size() < region->size()) std::swap(*smallest, region);
    }
  }
  Unregister(region->name());
}

void SharedMemoryPool::Unregister(const std::string& name) {
  // The token first: released after the context, once gRPC is done.
  struct Call {
    explicit Call(std::shared_ptr<PendingCalls> p) : token(std::move(p)) {}
    PendingCalls::Token token;
    grpc::ClientContext ctx;
    v1::UnregisterSharedMemoryRequest req;
    v1::SharedMemoryStatus resp;
  };
  auto call = std::make_shared<Call>(pending_);
  // The server removes the name at once, and answers once no request holds
  // the region (a call past its deadline may still be computing there);
  // ~Client waits for the answer, so not long.
  call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  call->req.set_name(name);
  stub_->async()->UnregisterSharedMemory(&call->ctx, &call->req, &call->resp,
                                         [call](grpc::Status) {});
}

void SharedMemoryPool::UnregisterNow(const std::string& name) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  v1::UnregisterSharedMemoryRequest req;
  req.set_name(name);
  v1::SharedMemoryStatus resp;
  (void)stub_->UnregisterSharedMemory(&ctx, req, &resp);
}

}  // namespace posenc::client_internal
