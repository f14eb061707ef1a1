// Tensors in shared memory start wherever their caller put them (a region's
// offset plus a slice's), but the kernels read and write whole elements, so
// they need each tensor at a multiple of its element size: a float32 at 4,
// a bfloat16 at 2. Triton's clients may place tensors at any byte, and the
// server used to copy them out of the region anyway, so a misaligned tensor
// is not an error: it is computed in an aligned private copy (admitted
// against the call's budget first) and copied back when the work is done.
// Aligned tensors, every message tensor and every tensor our clients place,
// pass through untouched.
#ifndef POSENC_SERVER_ENGINE_ALIGNED_WORK_H_
#define POSENC_SERVER_ENGINE_ALIGNED_WORK_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/admission.h"
#include "posenc/tensor.h"

namespace posenc::server {

// True when `at` is a fit start for elements of `dtype`.
bool AlignedFor(const void* at, DType dtype);

class AlignedWork {
 public:
  // Copies are admitted against `admission` (not owned; outlives this).
  explicit AlignedWork(AdmissionControl::Ticket& admission) : admission_(admission) {}
  AlignedWork(const AlignedWork&) = delete;
  AlignedWork& operator=(const AlignedWork&) = delete;

  // Points `t` at an aligned copy of its bytes when it is misaligned;
  // leaves it as it is otherwise.
  [[nodiscard]] absl::Status Align(MutableTensor& t);
  // Where `bytes` of `dtype` output meant for `at` are computed: `at`, or an
  // aligned buffer when `at` is misaligned (its contents are not read).
  [[nodiscard]] absl::StatusOr<char*> Output(char* at, int64_t bytes, DType dtype);
  // Copies every result computed aside to where it belongs. Only after the
  // work succeeded: a failed call leaves the caller's bytes as they were.
  void CopyBack();

 private:
  struct Aside {
    char* home;
    int64_t bytes;
    std::unique_ptr<uint64_t[]> buffer;  // 8-byte aligned: every dtype's fit
  };
  absl::StatusOr<char*> Set(char* home, int64_t bytes, bool copy_in);

  AdmissionControl::Ticket& admission_;
  std::vector<Aside> aside_;
};

}  // namespace posenc::server

#endif  // POSENC_SERVER_ENGINE_ALIGNED_WORK_H_
