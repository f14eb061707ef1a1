#include "backends.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_format.h"
#include "emulated_gpu_backend.h"
#ifdef POSENC_HAVE_CUDA
#include "cuda_backend.h"
#include "fake_device_runtime.h"
#endif

namespace posenc::testing {
namespace {

// The conformance variants that turn AVX-512 loops off ("avx512." and
// "avx2.", tests/conformance/CMakeLists.txt) set
// POSENC_TEST_SKIP_WITHOUT_AVX512: on a CPU without AVX-512 they would
// repeat the plain run's loops exactly, so they skip, saying why. The
// emulated twins never set it.
class SkipRepeatsWithoutAvx512 : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* skip = std::getenv("POSENC_TEST_SKIP_WITHOUT_AVX512");
    if (skip == nullptr || std::strcmp(skip, "1") != 0) return;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return;
#endif
    GTEST_SKIP() << "this CPU has no AVX-512: turning its loops off changes nothing here, and "
                    "the plain run already ran these loops";
  }
};
::testing::Environment* const kSkipRepeats =
    ::testing::AddGlobalTestEnvironment(new SkipRepeatsWithoutAvx512);

}  // namespace

std::unique_ptr<Backend> MakeBackend(const std::string& name) {
  if (name == "cpu") return CreateCpuBackend(3);
  if (name == "cpu1") return CreateCpuBackend(1);
  // The CUDA kernels' bodies run over their launch grid on the CPU: every
  // case below then proves the GPU code's index maps and arithmetic too.
  // An H100's 132 SMs split the heads of every small case over blockIdx.y;
  // one SM splits none, which is the shape large requests take there.
  if (name == "emulated") return CreateEmulatedGpuBackend();
  if (name == "emulated_1sm") return CreateEmulatedGpuBackend(1);
  // The CUDA backend itself (staging, worker streams, buffers, errors) on a
  // fake CUDA runtime whose kernels are the emulated grid: the host side of
  // the GPU path, proven on every machine.
  if (name == "host_runtime") {
#ifdef POSENC_HAVE_CUDA
    static FakeDeviceRuntime* runtime = new FakeDeviceRuntime;
    DeviceInfo info;
    info.name = "CUDA backend on a fake runtime";
    auto b = cuda::CreateCudaBackendOn(*runtime, 0, info, 132);
    return b.ok() ? std::move(*b) : nullptr;
#else
    return nullptr;
#endif
  }
  auto cuda = CreateCudaBackend(0);
  return cuda.ok() ? std::move(*cuda) : nullptr;
}

void RunMatchingCpu(Backend& backend, const std::vector<Bytes*>& buffers,
                    const std::function<absl::Status(Backend&, const std::vector<Bytes*>&)>& run) {
  std::vector<Bytes> copies;
  for (Bytes* b : buffers) copies.push_back(*b);
  const absl::Status s = run(backend, buffers);
  ASSERT_TRUE(s.ok()) << s;
  if (backend.kind() == BackendKind::kCpu) return;
  std::vector<Bytes*> on_cpu;
  for (Bytes& c : copies) on_cpu.push_back(&c);
  auto cpu = CreateCpuBackend(2);
  ASSERT_TRUE(run(*cpu, on_cpu).ok());
  for (size_t i = 0; i < buffers.size(); ++i) {
    const Bytes& got = *buffers[i];
    const Bytes& cpu_got = copies[i];
    ASSERT_EQ(got.size(), cpu_got.size());
    int64_t differ = 0, first = -1;
    for (size_t b = 0; b < got.size(); ++b) {
      if (got[b] == cpu_got[b]) continue;
      if (first < 0) first = static_cast<int64_t>(b);
      ++differ;
    }
    if (differ == 0) continue;
    const size_t at = static_cast<size_t>(first) / 4 * 4;  // the 4-byte word holding it
    uint32_t word = 0, cpu_word = 0;
    std::memcpy(&word, got.data() + at, std::min<size_t>(4, got.size() - at));
    std::memcpy(&cpu_word, cpu_got.data() + at, std::min<size_t>(4, got.size() - at));
    ADD_FAILURE() << "buffer " << i << ": the " << backend.device().name
                  << " result differs from the CPU backend's in " << differ << " of " << got.size()
                  << " bytes; first at byte " << first << " (word at " << at << ": "
                  << absl::StrFormat("0x%08x, CPU 0x%08x", word, cpu_word) << ")";
  }
}

}  // namespace posenc::testing
