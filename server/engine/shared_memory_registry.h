// Shared-memory regions, one registry for both fronts: a caller on the same
// node puts tensors in a POSIX shared-memory object (/dev/shm/<key>),
// registers a slice of it under a name, and names slices of that in its
// requests (posenc.v1's *_shm fields, the KServe v2 / Triton parameters), so
// its tensors skip the socket and are computed on in place. Knows neither
// protobuf nor gRPC; errors are absl::Status with the SPEC §3 codes.
//
// A region is mapped once, at registration (guarded_mapping.h says why a
// caller truncating, rewriting or unmapping its object cannot hurt the
// server), and its bytes are admitted against the server's memory budget
// for as long as it is registered: the server touches its pages, so they
// count in its resident memory.
//
// CUDA shared memory (Triton's cudasharedmemory extension) lives here too:
// a caller on the same node and GPU registers a CUDA IPC handle of its
// device allocation, the backend that owns the device opens it once
// (SetDeviceOpener), and requests name slices of it exactly as they name
// slices of system regions, in the same namespace (as in Triton). Tensors
// there are computed in place on the device; copies in or out of such a
// region (Read, Write) are device copies.
//
// Lifetime: Find hands out a hold on the region that a request keeps until
// its outputs are written. Unregister removes the name at once (no new
// request can use it) and then waits until no request holds the region, so
// that when it returns the caller may reuse or free its memory.
#ifndef POSENC_SERVER_ENGINE_SHARED_MEMORY_REGISTRY_H_
#define POSENC_SERVER_ENGINE_SHARED_MEMORY_REGISTRY_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "engine/admission.h"
#include "engine/guarded_mapping.h"

namespace posenc::server {

enum class MemoryKind { kSystem, kCuda };

struct SharedMemoryOptions {
  bool enabled = false;  // --enable_system_shared_memory
  // --enable_cuda_shared_memory: off by default for the reason system
  // shared memory is: a handle names memory of another process, and the
  // server writes where it points.
  bool cuda_enabled = false;
  int max_regions = 64;  // --max_shared_memory_regions (each holds a mapping)
  // --max_shared_memory_regions_per_client: how many of those one client
  // may hold, so that one that leaks its registrations cannot lock the
  // others out. A client is what the front says registered (the gRPC peer).
  int max_regions_per_client = 32;
  // The sum of the registered byte sizes (--max_shared_memory_bytes), on top
  // of the memory budget every region is admitted against.
  int64_t max_total_bytes = int64_t{64} << 30;
  // Where keys live; /dev/shm is where shm_open() puts them (tests only
  // change it).
  std::string directory = "/dev/shm";
};

// Device memory a backend opened for a CUDA region.
struct DeviceMemory {
  char* data = nullptr;
  int device = 0;
  // Closes the handle (when the region goes, after its last request).
  std::function<void(char*)> close;
  // Copies bytes between it and host memory (either direction).
  std::function<absl::Status(void* to, const void* from, size_t bytes)> copy;
};

// Which object a system region maps (its file's device and inode).
struct SharedMemoryObjectId {
  uint64_t device = 0;
  uint64_t inode = 0;
  bool operator==(const SharedMemoryObjectId& o) const {
    return device == o.device && inode == o.inode;
  }
};

// One registered region: the slice [offset, offset + byte_size) of a
// shared-memory object, mapped into the server; or a CUDA allocation of
// another process, opened by the backend of its device.
class SharedMemoryRegion {
 public:
  using ObjectId = SharedMemoryObjectId;
  // `pinned_fd`: the object's descriptor (owned) when the mapping is pinned
  // for a device, else -1 (see CheckIntact).
  SharedMemoryRegion(std::string name, std::string key, int64_t offset, int64_t byte_size,
                     std::string client, std::unique_ptr<GuardedMapping> mapping,
                     AdmissionControl::Ticket admitted, std::function<void(char*)> unpin = nullptr,
                     int pinned_fd = -1, ObjectId object = {});
  // A CUDA region.
  SharedMemoryRegion(std::string name, int64_t byte_size, std::string client, DeviceMemory device);
  // Unpins (see SharedMemoryRegistry::SetPinning), then unmaps; or closes
  // the CUDA handle.
  ~SharedMemoryRegion();
  SharedMemoryRegion(const SharedMemoryRegion&) = delete;
  SharedMemoryRegion& operator=(const SharedMemoryRegion&) = delete;

  const std::string& name() const { return name_; }
  const std::string& key() const { return key_; }
  int64_t offset() const { return offset_; }
  int64_t byte_size() const { return byte_size_; }
  // Who registered it (see SharedMemoryOptions::max_regions_per_client).
  const std::string& client() const { return client_; }
  MemoryKind kind() const {
    return device_.data != nullptr ? MemoryKind::kCuda : MemoryKind::kSystem;
  }
  // Whether At() points to device memory (the host must not touch it).
  bool on_device() const { return kind() == MemoryKind::kCuda; }
  int device_id() const { return device_.device; }

  // Whether bytes [offset, offset + size) of this region and [other_offset,
  // other_offset + other_size) of `other` are partly the same bytes of one
  // object. Two registrations of one object map it at two addresses, where
  // such slices look apart. CUDA regions: by device address, on one GPU
  // (a handle registered twice is one allocation at one address).
  // REQUIRES: both slices pass CheckSlice.
  bool SharesBytes(int64_t offset, int64_t size, const SharedMemoryRegion& other,
                   int64_t other_offset, int64_t other_size) const;

  // INVALID_ARGUMENT naming `field` unless [offset, offset + size) lies in
  // the region (overflow-safe).
  [[nodiscard]] absl::Status CheckSlice(absl::string_view field, int64_t offset,
                                        int64_t size) const;
  // The slice's first byte, in place: the caller may rewrite the bytes at
  // any time, so only tensor values are used from here, never bytes that
  // steer memory accesses. REQUIRES: CheckSlice(..., offset, ...) is OK.
  char* At(int64_t offset) const {
    return (device_.data != nullptr ? device_.data : mapping_->data()) + offset;
  }
  // A private copy of a slice (for positions and lengths, which are
  // validated and then used to index).
  [[nodiscard]] absl::Status Read(absl::string_view field, int64_t offset, int64_t size,
                                  std::string* out) const;
  // The same into `size` bytes at `to` (a scratch buffer).
  [[nodiscard]] absl::Status ReadInto(absl::string_view field, int64_t offset, int64_t size,
                                      char* to) const;
  // `data` copied into the slice at `offset`.
  [[nodiscard]] absl::Status Write(absl::string_view field, int64_t offset,
                                   absl::string_view data) const;
  // FAILED_PRECONDITION naming `field` once the caller has truncated the
  // object under the mapping (whatever the server read or wrote there since
  // is void); OK before. Checked after every use. The server's own touch of
  // a truncated page shows it (GuardedMapping::broken); a pinned mapping
  // is also checked against the object's size, because a device reads and
  // writes the pages it pinned without faulting (a shrink is seen; a
  // shrink followed by a regrow before the check is not).
  [[nodiscard]] absl::Status CheckIntact(absl::string_view field) const;

 private:
  friend class SharedMemoryRegistry;
  const std::string name_;
  const std::string key_;
  const int64_t offset_;
  const int64_t byte_size_;
  const std::string client_;
  const std::unique_ptr<GuardedMapping> mapping_;
  const AdmissionControl::Ticket admitted_;  // its bytes in the budget
  const std::function<void(char*)> unpin_;   // or null
  const DeviceMemory device_;                // a CUDA region's (else data is null)
  const int pinned_fd_ = -1;                 // see the constructor
  const ObjectId object_;                    // a system region's
  // Requests holding the region (see Find); Unregister waits for none.
  mutable std::mutex mu_;
  mutable std::condition_variable unused_;
  mutable int users_ = 0;
};

class SharedMemoryRegistry {
 public:
  // Regions' bytes are admitted against `admission` (not owned; outlives
  // the registry), and never take the last `keep_free` bytes of it: what
  // one call of the largest message reserves to be read (2 x the message
  // limit), so that regions cannot starve the calls that use them.
  SharedMemoryRegistry(SharedMemoryOptions options, AdmissionControl* admission,
                       int64_t keep_free = 0);

  bool enabled() const { return options_.enabled; }
  // Each region's mapping is handed to `pin` (with its name) once mapped and to `unpin`
  // before it is unmapped: the CUDA backend registers it as pinned memory,
  // so calls on its tensors skip the staging copy. `pin` says whether it
  // pinned (best effort: an unpinned region is staged). Set once, before
  // the first registration. A caller that truncates its object under a
  // pinned mapping leaves the device the pages it pinned, which it reads
  // and writes without a fault: CheckIntact then compares the object's
  // size, and the call fails as "truncated", as without a GPU.
  using Pin = std::function<bool(absl::string_view name, char* p, int64_t bytes)>;
  void SetPinning(Pin pin, std::function<void(char*)> unpin) {
    pin_ = std::move(pin);
    unpin_ = std::move(unpin);
  }
  const SharedMemoryOptions& options() const { return options_; }
  // Where keys resolve: this boot of the kernel and the file system of the
  // key directory ("<boot id>/<device>:<inode>"). A client that computes the
  // same string for its own /dev/shm shares the server's objects (same node,
  // same memory volume), so it may move tensors through regions.
  std::string domain() const;

  // How CUDA regions are opened: `open` (the backend of the device), or,
  // when null, why they cannot be (no GPU). Set once, before the first
  // registration.
  using DeviceOpener = std::function<absl::StatusOr<DeviceMemory>(
      int device_id, absl::string_view raw_handle, int64_t byte_size)>;
  void SetDeviceOpener(DeviceOpener open, std::string unavailable) {
    open_device_ = std::move(open);
    device_unavailable_ = std::move(unavailable);
  }
  bool cuda_enabled() const { return options_.cuda_enabled; }

  // Opens /dev/shm/<key> (key "name" or "/name": one component, no "..")
  // and registers and maps the slice as `name`, on behalf of `client`.
  // INVALID_ARGUMENT for a bad name, key or slice (beyond the object's
  // size), NOT_FOUND when the object does not exist, ALREADY_EXISTS for a
  // name taken, RESOURCE_EXHAUSTED beyond the caps (all regions, the
  // client's, the bytes) or the memory budget. FAILED_PRECONDITION (saying
  // how to enable) when off, as all are.
  [[nodiscard]] absl::Status Register(absl::string_view name, absl::string_view key,
                                      uint64_t offset, uint64_t byte_size,
                                      absl::string_view client = "");
  // Registers `byte_size` bytes of the CUDA allocation `raw_handle` (a
  // cudaIpcMemHandle_t) on `device_id` as `name`, for `client`: opened once
  // here, kept until unregistered. As Register for names and caps (its
  // bytes are device memory, outside the host memory budget and the byte
  // cap); INVALID_ARGUMENT for a handle that does not open or an
  // allocation too small; FAILED_PRECONDITION when CUDA shared memory is
  // off or the server has no GPU, saying which.
  [[nodiscard]] absl::Status RegisterCuda(absl::string_view name, absl::string_view raw_handle,
                                          int64_t device_id, uint64_t byte_size,
                                          absl::string_view client = "");
  // Removes `name` ("" every region), then waits until no request holds it
  // or `deadline` passes (DEADLINE_EXCEEDED: the name is gone, the mapping
  // goes when its last request finishes). A name not registered is not an
  // error (as in Triton, so cleanup may repeat).
  // Only regions of `kind` are touched (a name of the other kind is left
  // alone, as in Triton).
  [[nodiscard]] absl::Status Unregister(absl::string_view name,
                                        absl::Time deadline = absl::InfiniteFuture(),
                                        MemoryKind kind = MemoryKind::kSystem);
  // Every region of `kind` ("") or the one named (NOT_FOUND when none of
  // that kind), by name.
  [[nodiscard]] absl::StatusOr<std::vector<std::shared_ptr<const SharedMemoryRegion>>> Status(
      absl::string_view name, MemoryKind kind = MemoryKind::kSystem) const;
  // The region a request names, held (see the file comment) for as long as
  // the returned pointer or a copy of it lives.
  [[nodiscard]] absl::StatusOr<std::shared_ptr<const SharedMemoryRegion>> Find(
      absl::string_view field, absl::string_view name) const;

  int count() const;

 private:
  absl::Status CheckEnabled(MemoryKind kind = MemoryKind::kSystem) const;
  // RESOURCE_EXHAUSTED or ALREADY_EXISTS when `name` cannot join: taken,
  // or a cap reached. REQUIRES: mu_ held.
  absl::Status TakenOrFull(absl::string_view name, absl::string_view client,
                           int64_t host_bytes) const;
  void AddLocked(std::string name, std::shared_ptr<SharedMemoryRegion> region);

  const SharedMemoryOptions options_;
  AdmissionControl* const admission_;
  Pin pin_;
  std::function<void(char*)> unpin_;
  DeviceOpener open_device_;
  std::string device_unavailable_ = "this server has no GPU";
  const int64_t keep_free_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<SharedMemoryRegion>, std::less<>> regions_;
  std::map<std::string, int, std::less<>> regions_of_client_;  // none at 0
  int64_t total_bytes_ = 0;
};

// The error every shared-memory use gets while the extension is off.
absl::Status SharedMemoryDisabledError();
absl::Status CudaSharedMemoryDisabledError();

}  // namespace posenc::server

#endif  // POSENC_SERVER_ENGINE_SHARED_MEMORY_REGISTRY_H_
