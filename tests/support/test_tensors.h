// Test helpers: random tensors in any dtype, reading them back as double, and
// the comparisons of SPEC §5.
#ifndef POSENC_TESTS_TEST_TENSORS_H_
#define POSENC_TESTS_TEST_TENSORS_H_

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "posenc/dtype.h"
#include "posenc/tensor.h"

namespace posenc::testing {

using Bytes = std::vector<uint8_t>;

// Fresh random data each run, reproducible from the printed seed:
// POSENC_TEST_SEED=<seed> replays a failing run.
inline std::mt19937_64& Rng() {
  static std::mt19937_64 rng([] {
    const char* env = std::getenv("POSENC_TEST_SEED");
    const uint64_t seed = env != nullptr
                              ? std::strtoull(env, nullptr, 10)
                              : (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
    std::fprintf(stderr, "random seed %llu (POSENC_TEST_SEED to replay)\n",
                 static_cast<unsigned long long>(seed));
    return seed;
  }());
  return rng;
}

inline double ReadDouble(DType dtype, const void* data, int64_t i) {
  return IsFloating(dtype) ? LoadElement(dtype, data, i) : std::nan("");
}

// Uniform in [-1, 1), stored in `dtype`.
inline Bytes RandomTensor(DType dtype, int64_t n) {
  Bytes b(n * SizeOf(dtype));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t i = 0; i < n; ++i) StoreElement(dtype, b.data(), i, u(Rng()));
  return b;
}

inline std::vector<double> ToDoubles(DType dtype, const Bytes& b) {
  const int64_t n = b.size() / SizeOf(dtype);
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = ReadDouble(dtype, b.data(), i);
  return v;
}

// Bytes that read as NaN in every float dtype: unwritten outputs show.
inline Bytes Poisoned(DType dtype, int64_t n) { return Bytes(n * SizeOf(dtype), 0xff); }

// Spacing of `dtype` at |v| (one unit in the last place).
inline double Ulp(DType dtype, double v) {
  const int mant = dtype == DType::kFloat16 ? 10 : dtype == DType::kBFloat16 ? 7 : 23;
  const int emin = dtype == DType::kFloat16 ? -14 : -126;
  const int e =
      v == 0 ? emin : std::max(emin, static_cast<int>(std::floor(std::log2(std::abs(v)))));
  return std::ldexp(1.0, e - mant);
}

// SPEC §5: float32 within `fp32_rel` in relative norm; 16-bit types within
// one ulp of the float64 result element by element, plus `abs_slack` where
// the float64 result is itself only that good (a sinusoid at position p: its
// angle p * w is rounded by up to |p| 2^-53, more than an ulp of a sum that
// cancels to ~1e-8 at p = 10^7). Infinities must match.
inline ::testing::AssertionResult MatchesReference(DType dtype, const std::vector<double>& ref,
                                                   const void* out, double fp32_rel,
                                                   double abs_slack = 0) {
  double err2 = 0, ref2 = 0;
  int64_t bad = 0;
  std::string first;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double o = ReadDouble(dtype, out, i);
    const double r = ref[i];
    if (std::isinf(r) || std::isinf(o)) {
      if (o != r) {
        if (bad++ == 0)
          first = "element " + std::to_string(i) + ": got " + std::to_string(o) + ", want " +
                  std::to_string(r);
      }
      continue;
    }
    if (std::isnan(o)) {
      if (bad++ == 0) first = "element " + std::to_string(i) + " is NaN (unwritten?)";
      continue;
    }
    err2 += (o - r) * (o - r);
    ref2 += r * r;
    if (dtype != DType::kFloat32 && std::abs(o - r) > Ulp(dtype, r) + abs_slack) {
      if (bad++ == 0) {
        char text[160];
        std::snprintf(text, sizeof text, "element %lld: got %.9g, want %.17g (ulp %.3g)",
                      static_cast<long long>(i), o, r, Ulp(dtype, r));
        first = text;
      }
    }
  }
  if (bad > 0) return ::testing::AssertionFailure() << bad << " bad elements; first " << first;
  const double rel = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  if (dtype == DType::kFloat32 && rel > fp32_rel) {
    return ::testing::AssertionFailure() << "relative error " << rel << " > " << fp32_rel;
  }
  return ::testing::AssertionSuccess();
}

template <typename T>
TensorView IntView(const std::vector<T>& v, std::vector<int64_t> shape) {
  return TensorView{sizeof(T) == 4 ? DType::kInt32 : DType::kInt64, std::move(shape), v.data(),
                    v.size() * sizeof(T)};
}

inline MutableTensor Mutable(DType dtype, std::vector<int64_t> shape, Bytes& b) {
  return MutableTensor{dtype, std::move(shape), b.data(), b.size()};
}

}  // namespace posenc::testing

#endif  // POSENC_TESTS_TEST_TENSORS_H_
