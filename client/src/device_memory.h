// Device memory the caller registered with the server (CUDA shared memory;
// internal to the client library). A call whose tensors all lie inside
// registered allocations names them there (*_shm slices) instead of sending
// their bytes, and the server computes them in place on its GPU. The
// client never reads or writes that memory itself: it does not link CUDA,
// and the host touching device memory would fault.
#ifndef POSENC_CLIENT_SRC_DEVICE_MEMORY_H_
#define POSENC_CLIENT_SRC_DEVICE_MEMORY_H_

#include <cstdint>
#include <initializer_list>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "posenc/client.h"
#include "posenc/v1/posenc.grpc.pb.h"

namespace posenc::client_internal {

class DeviceRegions {
 public:
  // Unregisters through `stub` (not owned; outlives this) what is left.
  explicit DeviceRegions(v1::PositionalEncoding::Stub* stub) : stub_(stub) {}
  ~DeviceRegions();

  absl::Status Register(const DeviceAllocation& a, grpc::ClientContext* ctx);
  absl::Status Unregister(const void* base, grpc::ClientContext* ctx);

  // Where the call's tensors (those present) lie: all inside registered
  // allocations (their slices, in order), none (nullopt), or some
  // (INVALID_ARGUMENT naming the first one in host memory).
  absl::StatusOr<std::optional<std::vector<v1::SharedMemorySlice>>> Find(
      std::initializer_list<std::pair<const char*, const MutableTensor*>> tensors) const;

 private:
  struct Allocation {
    size_t bytes;
    std::string name;
    // Its registration is on the wire: held so that a concurrent Register
    // of the same or overlapping memory is refused, but not used by calls
    // (nor unregistered by base) until the server has it.
    bool pending = false;
  };
  v1::PositionalEncoding::Stub* const stub_;
  mutable std::mutex mu_;
  std::map<uintptr_t, Allocation> allocations_;  // base -> allocation
  int next_ = 0;
};

}  // namespace posenc::client_internal

#endif  // POSENC_CLIENT_SRC_DEVICE_MEMORY_H_
