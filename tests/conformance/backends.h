// What every conformance suite of tests/conformance shares: the backends
// this build has (the CPU backend on 3 and 1 threads, the CUDA kernels on
// the emulated grid with many SMs and with one, a real GPU when visible), a
// fixture parametrised over them, and the bit-for-bit check of a GPU
// backend's results against the CPU backend's.
#ifndef POSENC_TESTS_CONFORMANCE_BACKENDS_H_
#define POSENC_TESTS_CONFORMANCE_BACKENDS_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "posenc/backend.h"
#include "test_tensors.h"

namespace posenc::testing {

constexpr DType kFloatTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
constexpr RopeStyle kStyles[] = {RopeStyle::kNeox, RopeStyle::kGptj};

// The backend a suite's parameter names ("cpu", "cpu1", "emulated",
// "emulated_1sm", "cuda"); null when this machine has none.
std::unique_ptr<Backend> MakeBackend(const std::string& name);

// Every TEST_P of the suites runs on each backend (bit_for_bit_test.cc
// instantiates it once for the whole binary); a backend not present skips.
class BackendTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    backend_ = MakeBackend(GetParam());
    if (backend_ == nullptr) GTEST_SKIP() << "no " << GetParam() << " device visible";
  }
  std::unique_ptr<Backend> backend_;
};

// Runs a kernel on `backend` over `buffers`; for a GPU backend (real or
// emulated) runs the CPU backend over copies too: the two must agree bit for
// bit, since they share their arithmetic (kernels/src/math) and neither
// contracts into FMA.
void RunMatchingCpu(Backend& backend, const std::vector<Bytes*>& buffers,
                    const std::function<absl::Status(Backend&, const std::vector<Bytes*>&)>& run);

}  // namespace posenc::testing

#endif  // POSENC_TESTS_CONFORMANCE_BACKENDS_H_
