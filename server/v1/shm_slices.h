// Tensors a posenc.v1 request names in shared memory (SharedMemorySlice
// fields): resolved against the engine's registry, held for the call,
// viewed in place. Positions and lengths always travel in the message, so
// nothing read from a region steers a memory access.
#ifndef POSENC_SERVER_V1_SHM_SLICES_H_
#define POSENC_SERVER_V1_SHM_SLICES_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/engine.h"
#include "posenc/v1/posenc.pb.h"

namespace posenc::server {

// The bytes a slice names, for the request size check (saturating).
int64_t SliceBytes(const v1::SharedMemorySlice& slice);

class ShmSlices {
 public:
  explicit ShmSlices(Engine& engine) : engine_(engine) {}

  // The tensor `field` as `desc` describes it, in place in `slice`, whose
  // byte_size must match the tensor; `data` (the message's bytes field for
  // it) must be empty.
  [[nodiscard]] absl::StatusOr<MutableTensor> Input(absl::string_view field,
                                                    const v1::SharedMemorySlice& slice,
                                                    const v1::TensorDesc& desc,
                                                    const std::string& data);
  // Where an output goes: `slice`, which must hold it (the engine checks the
  // size once it is known).
  [[nodiscard]] absl::StatusOr<OutputTarget> Output(absl::string_view field,
                                                    const v1::SharedMemorySlice& slice);
  // INVALID_ARGUMENT when two slices resolved so far share bytes (of one
  // region, or of one object registered twice): every slice a posenc.v1
  // call names is written (a tensor computed in place, or an output), and
  // two results cannot both be in the same bytes.
  [[nodiscard]] absl::Status CheckApart() const;
  // FAILED_PRECONDITION when the caller truncated a region the call used
  // while it ran: what the call read or wrote there is void.
  [[nodiscard]] absl::Status CheckIntact() const;
  // Whether a tensor resolved so far lies in CUDA shared memory: the call
  // then runs on the device, in place (CallEnv::tensors_on_device).
  bool on_device() const { return on_device_; }
  int device() const { return device_; }  // the first such tensor's GPU

 private:
  absl::StatusOr<char*> Resolve(absl::string_view field, const v1::SharedMemorySlice& slice,
                                bool device_ok);

  Engine& engine_;
  struct Held {
    std::string field;  // "query_shm"
    std::shared_ptr<const SharedMemoryRegion> region;
    int64_t offset, size;
  };
  std::vector<Held> held_;
  bool on_device_ = false;
  int device_ = 0;
};

}  // namespace posenc::server

#endif  // POSENC_SERVER_V1_SHM_SLICES_H_
