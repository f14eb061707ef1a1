#include "v1/shm_slices.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "engine/utf8.h"
#include "posenc/status_macros.h"
#include "posenc/wire/tensors.h"

namespace posenc::server {
namespace {

constexpr uint64_t kMaxInt64 = std::numeric_limits<int64_t>::max();

}  // namespace

int64_t SliceBytes(const v1::SharedMemorySlice& slice) {
  return slice.byte_size() > kMaxInt64 ? std::numeric_limits<int64_t>::max()
                                       : static_cast<int64_t>(slice.byte_size());
}

absl::StatusOr<char*> ShmSlices::Resolve(absl::string_view field,
                                         const v1::SharedMemorySlice& slice, bool device_ok) {
  const std::string where = absl::StrCat(field, "_shm");
  if (slice.offset() > kMaxInt64 || slice.byte_size() > kMaxInt64) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": offset and byte_size must be below 2^63, got ", slice.offset(),
                     " and ", slice.byte_size()));
  }
  POSENC_ASSIGN_OR_RETURN(std::shared_ptr<const SharedMemoryRegion> region,
                          engine_.shared_memory().Find(where, slice.region()));
  // Outputs the server builds (tables, biases) are written by the host.
  if (region->on_device() && !device_ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": region \"", Utf8Prefix(slice.region(), 64),
        "\" is CUDA shared memory, which takes the tensors computed in place (query, key, x, "
        "logits); a built ",
        field, " goes to system shared memory or the answer"));
  }
  if (region->on_device() && !on_device_) device_ = region->device_id();
  on_device_ = on_device_ || region->on_device();
  const auto offset = static_cast<int64_t>(slice.offset());
  POSENC_RETURN_IF_ERROR(
      region->CheckSlice(where, offset, static_cast<int64_t>(slice.byte_size())));
  char* at = region->At(offset);
  held_.push_back({where, std::move(region), offset, static_cast<int64_t>(slice.byte_size())});
  return at;
}

absl::StatusOr<MutableTensor> ShmSlices::Input(absl::string_view field,
                                               const v1::SharedMemorySlice& slice,
                                               const v1::TensorDesc& desc,
                                               const std::string& data) {
  if (!data.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, "_data must be empty when ", field,
                                                   "_shm names the tensor, got ", data.size(),
                                                   " bytes"));
  }
  POSENC_ASSIGN_OR_RETURN(char* at, Resolve(field, slice, /*device_ok=*/true));
  return wire::MutableOf(field, desc, at, static_cast<size_t>(slice.byte_size()));
}

absl::StatusOr<OutputTarget> ShmSlices::Output(absl::string_view field,
                                               const v1::SharedMemorySlice& slice) {
  POSENC_ASSIGN_OR_RETURN(char* at, Resolve(field, slice, /*device_ok=*/false));
  return OutputTarget(at, static_cast<int64_t>(slice.byte_size()));
}

absl::Status ShmSlices::CheckApart() const {
  for (size_t i = 0; i < held_.size(); ++i) {
    for (size_t j = i + 1; j < held_.size(); ++j) {
      const Held& a = held_[i];
      const Held& b = held_[j];
      if (a.region->SharesBytes(a.offset, a.size, *b.region, b.offset, b.size)) {
        return absl::InvalidArgumentError(absl::StrCat(
            a.field, " and ", b.field, " share bytes (regions \"", Utf8Prefix(a.region->name(), 64),
            "\" at offset ", a.offset, " and \"", Utf8Prefix(b.region->name(), 64), "\" at offset ",
            b.offset, ", ", a.size, " and ", b.size,
            " bytes): each tensor computed in place, and each output, needs bytes of its own"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ShmSlices::CheckIntact() const {
  for (const Held& h : held_) POSENC_RETURN_IF_ERROR(h.region->CheckIntact(h.field));
  return absl::OkStatus();
}

}  // namespace posenc::server
