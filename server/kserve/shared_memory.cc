#include "kserve/shared_memory.h"

#include "absl/strings/str_cat.h"
#include "engine/utf8.h"
#include "posenc/status_macros.h"

namespace posenc::server::kserve {

absl::StatusOr<std::optional<ShmRef>> ShmRefOf(absl::string_view field,
                                               const Parameters& parameters,
                                               const SharedMemoryRegistry* registry,
                                               bool only_shm) {
  const auto in_field = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat(field, ": ", s.message()));
  };
  if (only_shm) {
    for (const auto& [name, value] : parameters) {
      if (name != kShmRegion && name != kShmByteSize && name != kShmOffset) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, " has the parameter \"", Utf8Prefix(name, 64),
            "\"; posenc's outputs take only shared_memory_region, shared_memory_byte_size and "
            "shared_memory_offset"));
      }
    }
  }
  const bool named = parameters.contains(kShmRegion);
  if (!named) {
    if (parameters.contains(kShmByteSize) || parameters.contains(kShmOffset)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field,
                       " has shared_memory_byte_size or shared_memory_offset but no "
                       "shared_memory_region"));
    }
    return std::nullopt;
  }
  if (registry == nullptr || (!registry->enabled() && !registry->cuda_enabled())) {
    return in_field(SharedMemoryDisabledError());
  }
  ParameterReader reader(parameters);
  std::string region;
  std::optional<int64_t> byte_size;
  int64_t offset = 0;
  if (absl::Status s = reader.String(kShmRegion, &region); !s.ok()) return in_field(s);
  if (absl::Status s = reader.Int(kShmByteSize, &byte_size); !s.ok()) return in_field(s);
  if (absl::Status s = reader.Int(kShmOffset, &offset); !s.ok()) return in_field(s);
  if (!byte_size.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(field, " names shared_memory_region \"",
                                                   Utf8Prefix(region, 64),
                                                   "\" without shared_memory_byte_size"));
  }
  ShmRef ref;
  POSENC_ASSIGN_OR_RETURN(ref.region, registry->Find(field, region));
  POSENC_RETURN_IF_ERROR(ref.region->CheckSlice(field, offset, *byte_size));
  ref.offset = offset;
  ref.byte_size = *byte_size;
  return ref;
}

}  // namespace posenc::server::kserve
