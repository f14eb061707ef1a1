// Stands in for the CUDA backend when posenc is built without nvcc.
#include "posenc/backend.h"

namespace posenc {

bool BuiltWithCuda() { return false; }

int CudaDeviceCount() { return 0; }

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int /*device*/) {
  return absl::FailedPreconditionError(
      "this posenc was built without CUDA (nvcc was not found at build time); use backend CPU "
      "or AUTO");
}

}  // namespace posenc
