// CUDA shared memory without CUDA, for the registry's and the fronts' own
// logic (tests and fuzz harnesses): a "device" that is host memory this
// object owns, opened on device 0 for one handle, with copies as memcpy,
// opens, closes and copied bytes counted. A call that reaches a backend
// still finds no GPU there (FAILED_PRECONDITION), as on a machine without
// one; the CUDA backend's own part is fake_device_runtime.h's.
#ifndef POSENC_TESTS_SUPPORT_STAND_IN_DEVICE_H_
#define POSENC_TESTS_SUPPORT_STAND_IN_DEVICE_H_

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/shared_memory_registry.h"

namespace posenc::testing {

class StandInDevice {
 public:
  explicit StandInDevice(size_t bytes = 4096, std::string handle = "good-handle")
      : memory(bytes, 'd'), handle(std::move(handle)) {}
  StandInDevice(const StandInDevice&) = delete;
  StandInDevice& operator=(const StandInDevice&) = delete;

  // For SharedMemoryRegistry::SetDeviceOpener. REQUIRES: this outlives
  // every region it opened.
  server::SharedMemoryRegistry::DeviceOpener Opener() {
    return [this](int device_id, absl::string_view h,
                  int64_t bytes) -> absl::StatusOr<server::DeviceMemory> {
      if (device_id != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("device_id ", device_id, " is not served here"));
      }
      if (h != handle) return absl::InvalidArgumentError("the handle does not open");
      if (bytes > static_cast<int64_t>(memory.size())) {
        return absl::InvalidArgumentError("the allocation is too small");
      }
      ++open;
      server::DeviceMemory m;
      m.data = memory.data();
      m.device = device_id;
      m.close = [this](char*) { --open; };
      m.copy = [this](void* to, const void* from, size_t n) {
        copied += static_cast<int64_t>(n);
        std::memcpy(to, from, n);
        return absl::OkStatus();
      };
      return m;
    };
  }

  std::string memory;
  std::string handle;
  int open = 0;
  int64_t copied = 0;
};

}  // namespace posenc::testing

#endif  // POSENC_TESTS_SUPPORT_STAND_IN_DEVICE_H_
