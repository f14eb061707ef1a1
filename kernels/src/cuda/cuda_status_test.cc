// ClassifyCudaError / CudaErrorStatus over error codes alone: no device is
// touched (cudaGetErrorName and cudaGetErrorString are table lookups in the
// runtime), so this runs on machines without a GPU.
#include "cuda_status.h"

#include <gtest/gtest.h>

#include <string>

namespace posenc::cuda {
namespace {

using absl::StatusCode;

struct Case {
  cudaError_t error;
  StatusCode runtime_code;  // from a runtime API call
  StatusCode launch_code;   // from a launcher
  bool sticky;
};

// The classification, spelled out: a change to it must change this table.
const Case kCases[] = {
    {cudaSuccess, StatusCode::kOk, StatusCode::kOk, false},
    {cudaErrorMemoryAllocation, StatusCode::kResourceExhausted, StatusCode::kResourceExhausted,
     false},
    {cudaErrorInvalidValue, StatusCode::kInternal, StatusCode::kUnimplemented, false},
    {cudaErrorInvalidConfiguration, StatusCode::kInternal, StatusCode::kUnimplemented, false},
    {cudaErrorLaunchOutOfResources, StatusCode::kInternal, StatusCode::kUnimplemented, false},
    {cudaErrorNoKernelImageForDevice, StatusCode::kUnimplemented, StatusCode::kUnimplemented,
     false},
    {cudaErrorInvalidDeviceFunction, StatusCode::kUnimplemented, StatusCode::kUnimplemented, false},
    {cudaErrorUnsupportedPtxVersion, StatusCode::kUnimplemented, StatusCode::kUnimplemented, false},
    {cudaErrorNoDevice, StatusCode::kFailedPrecondition, StatusCode::kFailedPrecondition, false},
    {cudaErrorInsufficientDriver, StatusCode::kFailedPrecondition, StatusCode::kFailedPrecondition,
     false},
    {cudaErrorInitializationError, StatusCode::kFailedPrecondition, StatusCode::kFailedPrecondition,
     false},
    {cudaErrorDevicesUnavailable, StatusCode::kUnavailable, StatusCode::kUnavailable, false},
    {cudaErrorCudartUnloading, StatusCode::kUnavailable, StatusCode::kUnavailable, false},
    {cudaErrorNotReady, StatusCode::kInternal, StatusCode::kInternal, false},
    {cudaErrorUnknown, StatusCode::kInternal, StatusCode::kInternal, false},
    // Sticky: the context is lost whatever call reports it.
    {cudaErrorIllegalAddress, StatusCode::kInternal, StatusCode::kInternal, true},
    {cudaErrorLaunchFailure, StatusCode::kInternal, StatusCode::kInternal, true},
    {cudaErrorLaunchTimeout, StatusCode::kInternal, StatusCode::kInternal, true},
    {cudaErrorAssert, StatusCode::kInternal, StatusCode::kInternal, true},
    {cudaErrorHardwareStackError, StatusCode::kInternal, StatusCode::kInternal, true},
    {cudaErrorIllegalInstruction, StatusCode::kInternal, StatusCode::kInternal, true},
    {cudaErrorMisalignedAddress, StatusCode::kInternal, StatusCode::kInternal, true},
    {cudaErrorInvalidAddressSpace, StatusCode::kInternal, StatusCode::kInternal, true},
    {cudaErrorInvalidPc, StatusCode::kInternal, StatusCode::kInternal, true},
    {cudaErrorTensorMemoryLeak, StatusCode::kInternal, StatusCode::kInternal, true},
    {cudaErrorECCUncorrectable, StatusCode::kInternal, StatusCode::kInternal, true},
    {cudaErrorNvlinkUncorrectable, StatusCode::kInternal, StatusCode::kInternal, true},
    {cudaErrorContained, StatusCode::kInternal, StatusCode::kInternal, true},
    {cudaErrorMpsClientTerminated, StatusCode::kInternal, StatusCode::kInternal, true},
    {cudaErrorExternalDevice, StatusCode::kInternal, StatusCode::kInternal, true},
};

TEST(ClassifyCudaError, MatchesTheTable) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(cudaGetErrorName(c.error));
    const CudaErrorClass runtime = ClassifyCudaError(c.error, CudaCall::kRuntime);
    const CudaErrorClass launch = ClassifyCudaError(c.error, CudaCall::kLaunch);
    EXPECT_EQ(runtime.code, c.runtime_code);
    EXPECT_EQ(launch.code, c.launch_code);
    EXPECT_EQ(runtime.sticky, c.sticky);
    EXPECT_EQ(launch.sticky, c.sticky);
  }
}

// Every code the runtime may return, known to this table or not: only
// success is OK, and a sticky error is never mistaken for something the
// caller could retry or route around per request.
TEST(ClassifyCudaError, EveryCodeIsAnErrorAndStickyMeansInternal) {
  for (int raw = 1; raw <= 1000; ++raw) {
    const auto e = static_cast<cudaError_t>(raw);
    for (CudaCall call : {CudaCall::kRuntime, CudaCall::kLaunch}) {
      const CudaErrorClass c = ClassifyCudaError(e, call);
      EXPECT_NE(c.code, StatusCode::kOk) << raw;
      if (c.sticky) {
        EXPECT_EQ(c.code, StatusCode::kInternal) << raw;
      }
    }
  }
}

TEST(CudaErrorStatus, OkForSuccess) {
  EXPECT_TRUE(CudaErrorStatus(cudaSuccess, "cudaMalloc").ok());
  EXPECT_TRUE(CudaErrorStatus(cudaSuccess, "launching", CudaCall::kLaunch).ok());
}

TEST(CudaErrorStatus, MessagesNameTheStepTheErrorAndWhatFollows) {
  const absl::Status oom = CudaErrorStatus(cudaErrorMemoryAllocation, "growing a buffer");
  EXPECT_EQ(oom.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(oom.message().find("out of memory in growing a buffer"), std::string::npos)
      << oom.message();
  EXPECT_NE(oom.message().find("cudaErrorMemoryAllocation"), std::string::npos) << oom.message();

  const absl::Status shape =
      CudaErrorStatus(cudaErrorInvalidValue, "launching the RoPE kernel", CudaCall::kLaunch);
  EXPECT_EQ(shape.code(), StatusCode::kUnimplemented);
  EXPECT_NE(shape.message().find("launching the RoPE kernel"), std::string::npos)
      << shape.message();
  EXPECT_NE(shape.message().find("CPU backend serves it"), std::string::npos) << shape.message();

  const absl::Status fault = CudaErrorStatus(cudaErrorIllegalAddress, "cudaStreamSynchronize");
  EXPECT_EQ(fault.code(), StatusCode::kInternal);
  EXPECT_NE(fault.message().find("cudaErrorIllegalAddress"), std::string::npos) << fault.message();
  EXPECT_NE(fault.message().find("until the process restarts"), std::string::npos)
      << fault.message();

  const absl::Status other = CudaErrorStatus(cudaErrorUnknown, "cudaMemcpyAsync");
  EXPECT_EQ(other.code(), StatusCode::kInternal);
  EXPECT_NE(other.message().find("CUDA error in cudaMemcpyAsync: cudaErrorUnknown"),
            std::string::npos)
      << other.message();
}

}  // namespace
}  // namespace posenc::cuda
