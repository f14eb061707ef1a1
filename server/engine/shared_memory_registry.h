// System shared-memory regions (the KServe v2 / Triton shared-memory
// extension): a caller on the same node puts tensors in a POSIX
// shared-memory object (/dev/shm/<key>) and names a slice of it, so they
// skip the socket. Knows neither protobuf nor gRPC; errors are absl::Status
// with the SPEC §3 codes.
//
// Design: no mapping. Registration opens the object once and keeps the file
// descriptor; inputs are read with pread() into a buffer the call owns, and
// outputs written back with pwrite(). Why not mmap:
//  - the caller owns the object and may ftruncate() it at any time; touching
//    a mapped page past the new end raises SIGBUS in the server. pread and
//    pwrite see the file's current size instead: a short read is an
//    INVALID_ARGUMENT for that one call, never a signal. (Catching SIGBUS
//    around every copy would need a process-wide handler and could not
//    cover the CUDA driver reading host memory.)
//  - the kernels validate their inputs (positions, lengths) and then read
//    them; over shared pages the caller could change them in between and
//    steer reads out of bounds. A private copy makes validation hold.
// The copy costs what a mapping plus the private copy would cost; what the
// caller saves is the socket, protobuf and gRPC's own copies.
//
// Lifetime: a region is a shared_ptr; a request holds it from lookup until
// its outputs are written, so Unregister while in use only removes the
// name and the descriptor closes when the last request lets go.
#ifndef POSENC_SERVER_ENGINE_SHARED_MEMORY_REGISTRY_H_
#define POSENC_SERVER_ENGINE_SHARED_MEMORY_REGISTRY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace posenc::server {

struct SharedMemoryOptions {
  bool enabled = false;  // --enable_system_shared_memory
  int max_regions = 64;  // --max_shared_memory_regions (each holds a descriptor)
  // The sum of the registered byte sizes (--max_shared_memory_bytes). Regions
  // hold no server memory (nothing is mapped); this bounds what callers may
  // point the server at.
  int64_t max_total_bytes = int64_t{64} << 30;
  // Where keys live; /dev/shm is where shm_open() puts them (tests only
  // change it).
  std::string directory = "/dev/shm";
};

// One registered region: the slice [offset, offset + byte_size) of an open
// shared-memory object. Immutable; closes its descriptor when destroyed.
class SharedMemoryRegion {
 public:
  SharedMemoryRegion(std::string name, std::string key, int fd, int64_t offset, int64_t byte_size);
  ~SharedMemoryRegion();
  SharedMemoryRegion(const SharedMemoryRegion&) = delete;
  SharedMemoryRegion& operator=(const SharedMemoryRegion&) = delete;

  const std::string& name() const { return name_; }
  const std::string& key() const { return key_; }
  int64_t offset() const { return offset_; }
  int64_t byte_size() const { return byte_size_; }

  // INVALID_ARGUMENT naming `field` unless [offset, offset + size) lies in
  // the region (overflow-safe).
  [[nodiscard]] absl::Status CheckSlice(absl::string_view field, int64_t offset,
                                        int64_t size) const;
  // `size` bytes at `offset` of the region into *out (resized here);
  // INVALID_ARGUMENT when the object no longer holds them (truncated).
  [[nodiscard]] absl::Status Read(absl::string_view field, int64_t offset, int64_t size,
                                  std::string* out) const;
  // `data` at `offset` of the region; INVALID_ARGUMENT when the object was
  // truncated below it (the server does not grow what the caller shrank).
  [[nodiscard]] absl::Status Write(absl::string_view field, int64_t offset,
                                   absl::string_view data) const;

 private:
  const std::string name_;
  const std::string key_;
  const int fd_;
  const int64_t offset_;
  const int64_t byte_size_;
};

class SharedMemoryRegistry {
 public:
  explicit SharedMemoryRegistry(SharedMemoryOptions options);

  bool enabled() const { return options_.enabled; }

  // Opens /dev/shm/<key> (key "name" or "/name": one component, no "..")
  // and registers the slice as `name`. INVALID_ARGUMENT for a bad name, key
  // or slice (beyond the object's size), NOT_FOUND when the object does not
  // exist, ALREADY_EXISTS for a name taken, RESOURCE_EXHAUSTED beyond the
  // caps. FAILED_PRECONDITION (saying how to enable) when off, as all are.
  [[nodiscard]] absl::Status Register(absl::string_view name, absl::string_view key,
                                      uint64_t offset, uint64_t byte_size);
  // Removes `name` ("" every region); a name not registered is not an error
  // (as in Triton, so cleanup may repeat).
  [[nodiscard]] absl::Status Unregister(absl::string_view name);
  // Every region ("") or the one named (NOT_FOUND when none), by name.
  [[nodiscard]] absl::StatusOr<std::vector<std::shared_ptr<const SharedMemoryRegion>>> Status(
      absl::string_view name) const;
  // The region a request names, held for the request's life.
  [[nodiscard]] absl::StatusOr<std::shared_ptr<const SharedMemoryRegion>> Find(
      absl::string_view field, absl::string_view name) const;

  int count() const;

 private:
  absl::Status CheckEnabled() const;

  const SharedMemoryOptions options_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<const SharedMemoryRegion>, std::less<>> regions_;
  int64_t total_bytes_ = 0;
};

// The error every shared-memory use gets while the extension is off.
absl::Status SharedMemoryDisabledError();

}  // namespace posenc::server

#endif  // POSENC_SERVER_ENGINE_SHARED_MEMORY_REGISTRY_H_
