#include "engine/aligned_work.h"

#include <cstring>
#include <new>

#include "posenc/host_copy.h"
#include "posenc/status_macros.h"

namespace posenc::server {

bool AlignedFor(const void* at, DType dtype) {
  const size_t size = SizeOf(dtype);
  return size <= 1 || reinterpret_cast<uintptr_t>(at) % size == 0;
}

absl::StatusOr<char*> AlignedWork::Set(char* home, int64_t bytes, bool copy_in) {
  POSENC_RETURN_IF_ERROR(admission_.TryGrow(bytes));
  const size_t words = (static_cast<size_t>(bytes) + 7) / 8;
  std::unique_ptr<uint64_t[]> buffer(new (std::nothrow) uint64_t[words == 0 ? 1 : words]);
  if (buffer == nullptr) {
    admission_.Shrink(bytes);
    return absl::ResourceExhaustedError("out of memory for an aligned copy of a tensor");
  }
  char* at = reinterpret_cast<char*>(buffer.get());
  if (copy_in) CopyHostBytes(at, home, static_cast<size_t>(bytes));
  aside_.push_back(Aside{home, bytes, std::move(buffer)});
  return at;
}

absl::Status AlignedWork::Align(MutableTensor& t) {
  if (t.data == nullptr || AlignedFor(t.data, t.dtype)) return absl::OkStatus();
  POSENC_ASSIGN_OR_RETURN(
      char* at, Set(static_cast<char*>(t.data), static_cast<int64_t>(t.nbytes), /*copy_in=*/true));
  t.data = at;
  return absl::OkStatus();
}

absl::StatusOr<char*> AlignedWork::Output(char* at, int64_t bytes, DType dtype) {
  if (AlignedFor(at, dtype)) return at;
  return Set(at, bytes, /*copy_in=*/false);
}

void AlignedWork::CopyBack() {
  for (const Aside& a : aside_) {
    CopyHostBytes(a.home, a.buffer.get(), static_cast<size_t>(a.bytes));
  }
  aside_.clear();
}

}  // namespace posenc::server
