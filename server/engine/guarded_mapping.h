// Memory a caller controls, mapped into the server: a shared-memory object
// the caller created, may write at any time and may truncate at any time.
//
// Why a caller cannot hurt the server through it:
//  - Truncation. Touching a mapped page past the object's new end raises
//    SIGBUS. One process-wide handler (installed with the first mapping)
//    looks the faulting address up among the live mappings; when it falls in
//    one, the handler maps anonymous zero pages over that whole mapping
//    (MAP_FIXED) and marks it broken, and the faulting instruction runs
//    again on the zero page. The call that touched it, and every later call
//    naming it, fail with FAILED_PRECONDITION; nothing else changes. This is
//    how Wayland compositors survive clients that shrink their shm pools.
//    A SIGBUS anywhere else goes to the handler that was there before (by
//    default: the process dies, as it would have).
//  - Rewriting. The caller may change the bytes while a kernel reads them,
//    so bytes that steer memory accesses (positions, lengths, offsets) are
//    never read from a mapping: the fronts copy them into the call's own
//    memory before they are validated. Tensor values read and written in
//    place can only be wrong for the caller who rewrote them.
//  - Unmapping or closing on the caller's side does not touch the server's
//    mapping, which holds its own reference to the object.
// Mappings are only ever unmapped once no call uses them (the registry's
// regions are reference-counted), so the handler never races an unmap.
#ifndef POSENC_SERVER_ENGINE_GUARDED_MAPPING_H_
#define POSENC_SERVER_ENGINE_GUARDED_MAPPING_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"

namespace posenc::server {

class GuardedMapping {
 public:
  // Maps [offset, offset + size) of `fd` (read and write, shared).
  // REQUIRES: the object holds those bytes now. RESOURCE_EXHAUSTED when
  // every guard slot is taken, or the slice cannot be mapped as whole
  // pages in 2^63 bytes; INVALID_ARGUMENT for size <= 0 or offset < 0.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<GuardedMapping>> Map(int fd, int64_t offset,
                                                                           int64_t size);
  ~GuardedMapping();
  GuardedMapping(const GuardedMapping&) = delete;
  GuardedMapping& operator=(const GuardedMapping&) = delete;

  char* data() const { return data_; }
  int64_t size() const { return size_; }
  // Whether a SIGBUS replaced the mapping with zero pages (the object was
  // truncated under it); from then on it holds nothing of the caller's.
  bool broken() const;

  // How many mappings of the process the handler has repaired (tests).
  static int64_t repairs();

 private:
  GuardedMapping(char* base, int64_t length, char* data, int64_t size, int slot)
      : base_(base), length_(length), data_(data), size_(size), slot_(slot) {}

  char* const base_;      // page-aligned start of the mapping
  const int64_t length_;  // of the mapping, whole pages
  char* const data_;      // the caller's offset within it
  const int64_t size_;
  const int slot_;  // in the handler's table
};

}  // namespace posenc::server

#endif  // POSENC_SERVER_ENGINE_GUARDED_MAPPING_H_
