// Tensors in system shared memory, as the KServe v2 / Triton extension
// names them: the parameters shared_memory_region (string),
// shared_memory_byte_size and shared_memory_offset (integers, offset
// default 0) on an input or a requested output. Resolved against the
// registry (engine/shared_memory_registry.h) into a reference that keeps the region alive
// for the request.
#ifndef POSENC_SERVER_KSERVE_SHARED_MEMORY_H_
#define POSENC_SERVER_KSERVE_SHARED_MEMORY_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "engine/shared_memory_registry.h"
#include "kserve/parameters.h"

namespace posenc::server::kserve {

// A slice of a registered region, checked to lie within it.
struct ShmRef {
  std::shared_ptr<const SharedMemoryRegion> region;
  int64_t offset = 0;
  int64_t byte_size = 0;
};

// The region a tensor's parameters name, or nullopt when they name none.
// INVALID_ARGUMENT naming `field` for an offset or size without a region, a
// missing or negative size, or a slice beyond the region; NOT_FOUND for a
// region not registered; FAILED_PRECONDITION when `registry` is null or
// off. With `only_shm`, any other parameter is refused too (outputs take
// no others).
[[nodiscard]] absl::StatusOr<std::optional<ShmRef>> ShmRefOf(absl::string_view field,
                                                             const Parameters& parameters,
                                                             const SharedMemoryRegistry* registry,
                                                             bool only_shm);

// Names of the parameters (for the answer's outputs).
inline constexpr char kShmRegion[] = "shared_memory_region";
inline constexpr char kShmByteSize[] = "shared_memory_byte_size";
inline constexpr char kShmOffset[] = "shared_memory_offset";

}  // namespace posenc::server::kserve

#endif  // POSENC_SERVER_KSERVE_SHARED_MEMORY_H_
