#include "cuda_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace posenc::cuda {
namespace {

// Sticky errors. The CUDA Runtime API reference (Data types, enum cudaError,
// https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html,
// also the comments in driver_types.h) says of each of these that it "leaves
// the process in an inconsistent state and any further CUDA work will return
// the same error. To continue using CUDA, the process must be terminated and
// relaunched." Uncorrectable ECC and NVLink errors carry no such sentence but
// are hardware faults whose results cannot be trusted, so they are treated
// the same way: better to lose the GPU than to serve wrong numbers.
bool IsSticky(cudaError_t e) {
  switch (e) {
    case cudaErrorECCUncorrectable:     // 214
    case cudaErrorNvlinkUncorrectable:  // 220
    case cudaErrorContained:            // 226
    case cudaErrorIllegalAddress:       // 700
    case cudaErrorLaunchTimeout:        // 702
    case cudaErrorAssert:               // 710
    case cudaErrorHardwareStackError:   // 714
    case cudaErrorIllegalInstruction:   // 715
    case cudaErrorMisalignedAddress:    // 716
    case cudaErrorInvalidAddressSpace:  // 717
    case cudaErrorInvalidPc:            // 718
    case cudaErrorLaunchFailure:        // 719
    case cudaErrorTensorMemoryLeak:     // 721
    case cudaErrorMpsClientTerminated:  // 810
    case cudaErrorExternalDevice:       // 911
      return true;
    default:
      return false;
  }
}

}  // namespace

CudaErrorClass ClassifyCudaError(cudaError_t e, CudaCall call) {
  if (e == cudaSuccess) return {absl::StatusCode::kOk, false};
  if (IsSticky(e)) return {absl::StatusCode::kInternal, true};
  switch (e) {
    case cudaErrorMemoryAllocation:
      return {absl::StatusCode::kResourceExhausted, false};
    // This build has no code this GPU can run: every kernel fails the same
    // way, and the CPU backend can take the work.
    case cudaErrorInvalidDeviceFunction:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorInvalidPtx:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorJitCompilerNotFound:
      return {absl::StatusCode::kUnimplemented, false};
    // From a launcher these mean the kernels cannot take this shape (a
    // variant they do not cover, a grid or block past the device's limits);
    // from any other call they are a mistake of the host code.
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
    case cudaErrorLaunchOutOfResources:
      return {call == CudaCall::kLaunch ? absl::StatusCode::kUnimplemented
                                        : absl::StatusCode::kInternal,
              false};
    // No usable driver or device: nothing a retry here would change.
    case cudaErrorInitializationError:
    case cudaErrorInsufficientDriver:
    case cudaErrorStubLibrary:
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorDeviceUninitialized:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
      return {absl::StatusCode::kFailedPrecondition, false};
    // Busy or exclusive-process devices, and a runtime that is shutting down
    // with the process: another replica or a later try may succeed.
    case cudaErrorDevicesUnavailable:
    case cudaErrorCudartUnloading:
      return {absl::StatusCode::kUnavailable, false};
    default:
      return {absl::StatusCode::kInternal, false};
  }
}

absl::Status CudaErrorStatus(cudaError_t e, absl::string_view what, CudaCall call) {
  const CudaErrorClass c = ClassifyCudaError(e, call);
  if (c.code == absl::StatusCode::kOk) return absl::OkStatus();
  const std::string error = absl::StrCat(cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
  if (c.sticky) {
    return absl::Status(c.code, absl::StrCat("CUDA error in ", what, ": ", error,
                                             "; the CUDA context is lost until the process "
                                             "restarts, so the CUDA backend takes no more work"));
  }
  switch (c.code) {
    case absl::StatusCode::kResourceExhausted:
      return absl::Status(c.code, absl::StrCat("out of memory in ", what, ": ", error));
    case absl::StatusCode::kUnimplemented:
      return absl::Status(c.code,
                          absl::StrCat(what, ": the CUDA kernels cannot take this request (", error,
                                       "); the CPU backend serves it"));
    default:
      return absl::Status(c.code, absl::StrCat("CUDA error in ", what, ": ", error));
  }
}

}  // namespace posenc::cuda
