#include "engine/shared_memory_registry.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "posenc/host_copy.h"
#include "posenc/status_macros.h"

namespace posenc::server {
namespace {

constexpr size_t kMaxNameBytes = 128;
constexpr size_t kMaxKeyBytes = 255;  // NAME_MAX: one directory entry

// A name or key cut short and stripped of control bytes for messages.
std::string Shown(absl::string_view s) {
  std::string out;
  for (char c : s.substr(0, 64)) out += absl::ascii_isprint(c) ? c : '?';
  if (s.size() > 64) out += "...";
  return out;
}

absl::Status CheckName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("shared memory region name must be 1 to ",
                                                   kMaxNameBytes, " bytes, got ", name.size()));
  }
  for (char c : name) {
    if (!absl::ascii_isprint(c)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shared memory region name must be printable ASCII, got \"", Shown(name), "\""));
    }
  }
  return absl::OkStatus();
}

// The key as a file name under the directory: "name" or "/name", one path
// component of [A-Za-z0-9._-], never "." or "..", so it cannot leave
// /dev/shm.
absl::StatusOr<std::string> FileOfKey(absl::string_view key) {
  absl::string_view file = key;
  absl::ConsumePrefix(&file, "/");
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shared memory key must name an object under /dev/shm (\"/name\", at most ", kMaxKeyBytes,
        " bytes of letters, digits, '.', '_' or '-'): ", why, ", got \"", Shown(key), "\""));
  };
  if (file.empty() || file.size() > kMaxKeyBytes) return bad("wrong length");
  for (char c : file) {
    if (!absl::ascii_isalnum(c) && c != '.' && c != '_' && c != '-') {
      return bad(c == '/' ? "it has a '/' after the leading one" : "it has another character");
    }
  }
  if (absl::StrContains(file, "..") || file == ".") return bad("it has \"..\" or is \".\"");
  return std::string(file);
}

std::string Errno(int e) { return std::strerror(e); }

}  // namespace

absl::Status SharedMemoryDisabledError() {
  return absl::FailedPreconditionError(
      "system shared memory is off on this server; start posenc-server with "
      "--enable_system_shared_memory (callers on the same node only; see docs/shared-memory.md)");
}

absl::Status CudaSharedMemoryDisabledError() {
  return absl::FailedPreconditionError(
      "CUDA shared memory is off on this server; start posenc-server with "
      "--enable_cuda_shared_memory (callers on the same node and GPU only; see "
      "docs/shared-memory.md)");
}

SharedMemoryRegion::SharedMemoryRegion(std::string name, std::string key, int64_t offset,
                                       int64_t byte_size, std::string client,
                                       std::unique_ptr<GuardedMapping> mapping,
                                       AdmissionControl::Ticket admitted,
                                       std::function<void(char*)> unpin, int pinned_fd,
                                       ObjectId object)
    : name_(std::move(name)),
      key_(std::move(key)),
      offset_(offset),
      byte_size_(byte_size),
      client_(std::move(client)),
      mapping_(std::move(mapping)),
      admitted_(std::move(admitted)),
      unpin_(std::move(unpin)),
      pinned_fd_(pinned_fd),
      object_(object) {}

SharedMemoryRegion::SharedMemoryRegion(std::string name, int64_t byte_size, std::string client,
                                       DeviceMemory device)
    : name_(std::move(name)),
      offset_(0),
      byte_size_(byte_size),
      client_(std::move(client)),
      device_(std::move(device)) {}

SharedMemoryRegion::~SharedMemoryRegion() {
  if (device_.data != nullptr) {
    if (device_.close) device_.close(device_.data);
    return;
  }
  if (unpin_) unpin_(mapping_->data());
  if (pinned_fd_ >= 0) ::close(pinned_fd_);
}

absl::Status SharedMemoryRegion::CheckSlice(absl::string_view field, int64_t offset,
                                            int64_t size) const {
  if (offset < 0 || size < 0 || offset > byte_size_ || size > byte_size_ - offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": shared_memory_offset ", offset, " and shared_memory_byte_size ", size,
        " must lie within region \"", Shown(name_), "\" of ", byte_size_, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status SharedMemoryRegion::CheckIntact(absl::string_view field) const {
  // A CUDA allocation cannot shrink under an open handle.
  if (mapping_ == nullptr) return absl::OkStatus();
  bool truncated = mapping_->broken();
  if (!truncated && pinned_fd_ >= 0) {
    struct stat st;
    truncated = ::fstat(pinned_fd_, &st) != 0 || st.st_size < offset_ + byte_size_;
  }
  if (!truncated) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      field, ": shared memory region \"", Shown(name_), "\" (key ", Shown(key_),
      ") was truncated while the server used it; unregister it and register the object again"));
}

bool SharedMemoryRegion::SharesBytes(int64_t offset, int64_t size, const SharedMemoryRegion& other,
                                     int64_t other_offset, int64_t other_size) const {
  if (size <= 0 || other_size <= 0) return false;
  if (on_device() || other.on_device()) {
    if (!on_device() || !other.on_device() || device_id() != other.device_id()) return false;
    // One GPU's memory is one address space, and a handle opened twice in
    // a process gives its one address (CUDA counts the opens): the same
    // bytes are at the same device address.
    const auto x = reinterpret_cast<uintptr_t>(At(offset));
    const auto y = reinterpret_cast<uintptr_t>(other.At(other_offset));
    return x < y + static_cast<uintptr_t>(other_size) && y < x + static_cast<uintptr_t>(size);
  }
  if (!(object_ == other.object_)) return false;
  // Within objects of at most 2^63 - 1 bytes: no sum overflows.
  const int64_t a = offset_ + offset, b = other.offset_ + other_offset;
  return a < b + other_size && b < a + size;
}

absl::Status SharedMemoryRegion::Read(absl::string_view field, int64_t offset, int64_t size,
                                      std::string* out) const {
  POSENC_RETURN_IF_ERROR(CheckSlice(field, offset, size));
  POSENC_RETURN_IF_ERROR(CheckIntact(field));
  if (on_device()) {
    out->resize(static_cast<size_t>(size));
    return size > 0 ? device_.copy(out->data(), At(offset), out->size()) : absl::OkStatus();
  }
  AssignHostBytes(out, At(offset), static_cast<size_t>(size));
  // A truncation during the copy left zeros in it.
  if (absl::Status s = CheckIntact(field); !s.ok()) {
    out->clear();
    return s;
  }
  return absl::OkStatus();
}

absl::Status SharedMemoryRegion::ReadInto(absl::string_view field, int64_t offset, int64_t size,
                                          char* to) const {
  POSENC_RETURN_IF_ERROR(CheckSlice(field, offset, size));
  POSENC_RETURN_IF_ERROR(CheckIntact(field));
  if (on_device()) {
    return size > 0 ? device_.copy(to, At(offset), static_cast<size_t>(size)) : absl::OkStatus();
  }
  CopyHostBytes(to, At(offset), static_cast<size_t>(size));
  // A truncation during the copy left zeros in it.
  return CheckIntact(field);
}

absl::Status SharedMemoryRegion::Write(absl::string_view field, int64_t offset,
                                       absl::string_view data) const {
  const int64_t size = static_cast<int64_t>(data.size());
  POSENC_RETURN_IF_ERROR(CheckSlice(field, offset, size));
  POSENC_RETURN_IF_ERROR(CheckIntact(field));
  if (on_device()) {
    return size > 0 ? device_.copy(At(offset), data.data(), data.size()) : absl::OkStatus();
  }
  CopyHostBytes(At(offset), data.data(), data.size());
  return CheckIntact(field);
}

SharedMemoryRegistry::SharedMemoryRegistry(SharedMemoryOptions options, AdmissionControl* admission,
                                           int64_t keep_free)
    : options_(std::move(options)), admission_(admission), keep_free_(keep_free) {}

absl::Status SharedMemoryRegistry::CheckEnabled(MemoryKind kind) const {
  if (kind == MemoryKind::kCuda) {
    return options_.cuda_enabled ? absl::OkStatus() : CudaSharedMemoryDisabledError();
  }
  return options_.enabled ? absl::OkStatus() : SharedMemoryDisabledError();
}

absl::Status SharedMemoryRegistry::TakenOrFull(absl::string_view name, absl::string_view client,
                                               int64_t host_bytes) const {
  if (regions_.count(name) > 0) {
    return absl::AlreadyExistsError(absl::StrCat("shared memory region \"", Shown(name),
                                                 "\" is already registered; unregister it first"));
  }
  if (static_cast<int>(regions_.size()) >= options_.max_regions) {
    return absl::ResourceExhaustedError(
        absl::StrCat("at most ", options_.max_regions,
                     " shared memory regions may be registered (--max_shared_memory_regions)"));
  }
  if (auto it = regions_of_client_.find(client);
      it != regions_of_client_.end() && it->second >= options_.max_regions_per_client) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "this client (", Shown(client), ") already holds ", it->second,
        " shared memory regions, the most one client may (--max_shared_memory_regions_per_client); "
        "unregister some first"));
  }
  if (options_.max_regions_per_client <= 0) {
    return absl::ResourceExhaustedError(
        "no client may register shared memory regions (--max_shared_memory_regions_per_client "
        "is 0)");
  }
  if (host_bytes > options_.max_total_bytes - total_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("shared memory region \"", Shown(name), "\" of ", host_bytes,
                     " bytes would bring the registered total over ", options_.max_total_bytes,
                     " bytes (--max_shared_memory_bytes; ", total_bytes_, " registered)"));
  }
  return absl::OkStatus();
}

void SharedMemoryRegistry::AddLocked(std::string name, std::shared_ptr<SharedMemoryRegion> region) {
  if (!region->on_device()) total_bytes_ += region->byte_size();
  ++regions_of_client_[region->client()];
  regions_.emplace(std::move(name), std::move(region));
}

absl::Status SharedMemoryRegistry::RegisterCuda(absl::string_view name,
                                                absl::string_view raw_handle, int64_t device_id,
                                                uint64_t byte_size, absl::string_view client) {
  POSENC_RETURN_IF_ERROR(CheckEnabled(MemoryKind::kCuda));
  POSENC_RETURN_IF_ERROR(CheckName(name));
  constexpr uint64_t kMax = std::numeric_limits<int64_t>::max();
  if (byte_size == 0 || byte_size > kMax) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA shared memory region \"", Shown(name),
                                                   "\": byte_size must be 1 to 2^63-1, got ",
                                                   byte_size));
  }
  if (!open_device_) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA shared memory region \"", Shown(name),
                     "\" cannot be registered: ", device_unavailable_,
                     "; system shared memory (SystemSharedMemoryRegister) and tensors in "
                     "the message work without one"));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    POSENC_RETURN_IF_ERROR(TakenOrFull(name, client, 0));
  }
  absl::StatusOr<DeviceMemory> opened =
      open_device_(static_cast<int>(std::clamp<int64_t>(device_id, -1, INT32_MAX)), raw_handle,
                   static_cast<int64_t>(byte_size));
  if (!opened.ok()) {
    return absl::Status(
        opened.status().code(),
        absl::StrCat("CUDA shared memory region \"", Shown(name), "\" (device ", device_id, ", ",
                     byte_size, " bytes): ", opened.status().message()));
  }
  auto region = std::make_shared<SharedMemoryRegion>(
      std::string(name), static_cast<int64_t>(byte_size), std::string(client), *std::move(opened));
  std::lock_guard<std::mutex> lock(mu_);
  POSENC_RETURN_IF_ERROR(TakenOrFull(name, client, 0));  // the region closes as it goes
  AddLocked(std::string(name), std::move(region));
  return absl::OkStatus();
}

absl::Status SharedMemoryRegistry::Register(absl::string_view name, absl::string_view key,
                                            uint64_t offset, uint64_t byte_size,
                                            absl::string_view client) {
  POSENC_RETURN_IF_ERROR(CheckEnabled());
  POSENC_RETURN_IF_ERROR(CheckName(name));
  POSENC_ASSIGN_OR_RETURN(const std::string file, FileOfKey(key));
  constexpr uint64_t kMax = std::numeric_limits<int64_t>::max();
  if (byte_size == 0 || byte_size > kMax || offset > kMax) {
    return absl::InvalidArgumentError(absl::StrCat("shared memory region \"", Shown(name),
                                                   "\": byte_size must be 1 to 2^63-1 and offset "
                                                   "below 2^63, got byte_size ",
                                                   byte_size, " and offset ", offset));
  }
  const auto taken_or_full = [&]() -> absl::Status {
    return TakenOrFull(name, client, static_cast<int64_t>(byte_size));
  };
  {
    // Cheap refusals before opening anything.
    std::lock_guard<std::mutex> lock(mu_);
    POSENC_RETURN_IF_ERROR(taken_or_full());
  }
  // O_NOFOLLOW: no symlink out of /dev/shm; O_NONBLOCK: a FIFO planted
  // there cannot hang the call (it is then refused as not a regular file).
  const std::string path = absl::StrCat(options_.directory, "/", file);
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    const int e = errno;
    const std::string what =
        absl::StrCat("shared memory key \"", Shown(key), "\" (", Shown(path), "): ", Errno(e));
    if (e == ENOENT) return absl::NotFoundError(what);
    if (e == EACCES || e == EPERM) return absl::PermissionDeniedError(what);
    if (e == EMFILE || e == ENFILE) return absl::ResourceExhaustedError(what);
    return absl::InvalidArgumentError(what);
  }
  // The mapping holds its own reference to the object; a pinned region
  // keeps the descriptor too, to see the object's size (CheckIntact).
  auto close_fd = absl::MakeCleanup([fd] { ::close(fd); });
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared memory key \"", Shown(key), "\" is not a shared-memory object"));
  }
  const uint64_t object = static_cast<uint64_t>(st.st_size);
  if (offset > object || byte_size > object - offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shared memory region \"", Shown(name), "\": offset ", offset, " + byte_size ", byte_size,
        " must lie within the object \"", Shown(key), "\" of ", object, " bytes"));
  }
  // Its bytes join the memory budget first: the server will touch them.
  POSENC_ASSIGN_OR_RETURN(AdmissionControl::Ticket admitted, admission_->Enter());
  if (absl::Status s = admitted.TryGrow(static_cast<int64_t>(byte_size), keep_free_); !s.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "shared memory region \"", Shown(name), "\" of ", byte_size,
        " bytes does not fit the server's memory budget now (--max_inflight_bytes, of which ",
        keep_free_, " bytes are kept for calls to be read): ", s.message()));
  }
  admitted.ReleaseSlot();  // it is memory held, not work in progress
  POSENC_ASSIGN_OR_RETURN(
      std::unique_ptr<GuardedMapping> mapping,
      GuardedMapping::Map(fd, static_cast<int64_t>(offset), static_cast<int64_t>(byte_size)));
  const bool pinned = pin_ && pin_(name, mapping->data(), mapping->size());
  if (pinned) std::move(close_fd).Cancel();
  auto region = std::make_shared<SharedMemoryRegion>(
      std::string(name), std::string(key), static_cast<int64_t>(offset),
      static_cast<int64_t>(byte_size), std::string(client), std::move(mapping), std::move(admitted),
      unpin_, pinned ? fd : -1,
      SharedMemoryRegion::ObjectId{static_cast<uint64_t>(st.st_dev),
                                   static_cast<uint64_t>(st.st_ino)});
  std::lock_guard<std::mutex> lock(mu_);
  POSENC_RETURN_IF_ERROR(taken_or_full());
  AddLocked(std::string(name), std::move(region));
  return absl::OkStatus();
}

absl::Status SharedMemoryRegistry::Unregister(absl::string_view name, absl::Time deadline,
                                              MemoryKind kind) {
  POSENC_RETURN_IF_ERROR(CheckEnabled(kind));
  std::vector<std::shared_ptr<SharedMemoryRegion>> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = regions_.begin(); it != regions_.end();) {
      if ((name.empty() || it->first == name) && it->second->kind() == kind) {
        if (!it->second->on_device()) total_bytes_ -= it->second->byte_size();
        if (auto c = regions_of_client_.find(it->second->client()); --c->second == 0) {
          regions_of_client_.erase(c);
        }
        gone.push_back(std::move(it->second));
        it = regions_.erase(it);
      } else {
        ++it;
      }
    }
  }
  // Outside the registry's lock: requests holding a region let go without it.
  for (const auto& region : gone) {
    std::unique_lock<std::mutex> lock(region->mu_);
    const bool unused = region->unused_.wait_until(lock, absl::ToChronoTime(deadline),
                                                   [&] { return region->users_ == 0; });
    if (!unused) {
      return absl::DeadlineExceededError(
          absl::StrCat("shared memory region \"", Shown(region->name()), "\" is unregistered but ",
                       region->users_, " requests still use it; it is unmapped when they finish"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::shared_ptr<const SharedMemoryRegion>>> SharedMemoryRegistry::Status(
    absl::string_view name, MemoryKind kind) const {
  POSENC_RETURN_IF_ERROR(CheckEnabled(kind));
  std::vector<std::shared_ptr<const SharedMemoryRegion>> out;
  std::lock_guard<std::mutex> lock(mu_);
  if (name.empty()) {
    for (const auto& [n, r] : regions_) {
      if (r->kind() == kind) out.push_back(r);
    }
    return out;
  }
  auto it = regions_.find(name);
  if (it == regions_.end() || it->second->kind() != kind) {
    return absl::NotFoundError(
        absl::StrCat("no shared memory region \"", Shown(name), "\" is registered"));
  }
  out.push_back(it->second);
  return out;
}

absl::StatusOr<std::shared_ptr<const SharedMemoryRegion>> SharedMemoryRegistry::Find(
    absl::string_view field, absl::string_view name) const {
  if (absl::Status s = CheckEnabled(); !s.ok() && !options_.cuda_enabled) {
    return absl::FailedPreconditionError(absl::StrCat(field, ": ", s.message()));
  }
  std::shared_ptr<SharedMemoryRegion> region;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regions_.find(name);
    if (it == regions_.end()) {
      return absl::NotFoundError(
          absl::StrCat(field, ": no shared memory region \"", Shown(name), "\" is registered"));
    }
    region = it->second;
    std::lock_guard<std::mutex> use(region->mu_);
    ++region->users_;
  }
  // The hold: the region (and its mapping) lives while the pointer does,
  // and releasing the last copy of it counts the request out.
  SharedMemoryRegion* raw = region.get();
  std::shared_ptr<const SharedMemoryRegion> hold(raw, [region](SharedMemoryRegion* r) {
    std::lock_guard<std::mutex> lock(r->mu_);
    if (--r->users_ == 0) r->unused_.notify_all();
  });
  POSENC_RETURN_IF_ERROR(hold->CheckIntact(field));
  return hold;
}

std::string SharedMemoryRegistry::domain() const {
  std::string boot = "unknown";
  if (const int fd = ::open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC); fd >= 0) {
    char buf[64];
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) boot = std::string(absl::StripAsciiWhitespace(absl::string_view(buf, n)));
    ::close(fd);
  }
  struct stat st;
  if (::stat(options_.directory.c_str(), &st) != 0) return "";
  return absl::StrCat(boot, "/", st.st_dev, ":", st.st_ino);
}

int SharedMemoryRegistry::count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(regions_.size());
}

}  // namespace posenc::server
