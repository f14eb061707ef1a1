// Which of the CPU kernels' optional instruction sets this machine has.
#include <cstdlib>
#include <string_view>

#include "cpu_kernels.h"

namespace posenc::internal {

bool CpuHasAvx2() {
#ifdef POSENC_CPU_BF16_WIDE
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("bmi2") && std::getenv("POSENC_NO_AVX2") == nullptr;
  }();
  return has;
#else
  return false;  // the loops are not compiled in
#endif
}

bool CpuHasAvx512() {
#ifdef POSENC_CPU_BF16_WIDE
  static const bool has = [] {
    __builtin_cpu_init();
#ifdef POSENC_EMULATE_AVX512
    const bool cpu_has = true;  // the intrinsics are emulated
#else
    const bool cpu_has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#endif
    return CpuHasAvx2() && cpu_has && std::getenv("POSENC_NO_AVX512") == nullptr;
  }();
  return has;
#else
  return false;  // the loops are not compiled in
#endif
}

bool CpuHasAvx512Bf16() {
#ifdef POSENC_CPU_BF16_WIDE
#ifdef POSENC_EMULATE_AVX512
  static const bool cpu_has = true;  // the intrinsics are emulated
#else
  static const bool cpu_has = __builtin_cpu_supports("avx512bf16");
#endif
  static const bool has =
      CpuHasAvx512() && cpu_has && std::getenv("POSENC_NO_AVX512BF16") == nullptr;
  return has;
#else
  return false;  // the loops are not compiled in (nor is x86's feature probe)
#endif
}

bool CpuIsIntel() {
#ifdef POSENC_CPU_BF16_WIDE
  static const bool is = [] {
    // The tests set it to run either policy on any machine.
    if (const char* vendor = std::getenv("POSENC_CPU_VENDOR")) {
      return std::string_view(vendor) == "intel";
    }
    __builtin_cpu_init();
    return __builtin_cpu_is("intel") != 0;
  }();
  return is;
#else
  return false;  // x86's probe is not compiled in
#endif
}

bool CpuTakesLaneTest() {
  static const bool takes = [] {
    if (const char* chosen = std::getenv("POSENC_LANE_TEST")) {
      return std::string_view(chosen) == "1";
    }
    return !CpuIsIntel();
  }();
  return takes;
}

}  // namespace posenc::internal
