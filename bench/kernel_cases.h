// The kernel calls (bfloat16, and float32 sinusoidal and RoPE for
// comparison) that posenc-bench-compute and posenc-count-instructions
// measure, small enough to stay in L2: one place so that both tools time and
// count the same calls.
#ifndef POSENC_BENCH_KERNEL_CASES_H_
#define POSENC_BENCH_KERNEL_CASES_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "posenc/backend.h"

namespace posenc::bench {

// One kernel call on its own buffers: `run` applies it in place.
struct KernelCase {
  std::string name;
  int64_t elements = 0;
  int64_t bytes = 0;  // of the tensors it rewrites
  std::function<void()> run;
};

// bfloat16 values drawn from N(0, 1) (seed 1: the same inputs every run).
inline std::vector<uint16_t> NormalBFloat16(size_t n) {
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<uint16_t> v(n);
  for (auto& e : v) {
    const float f = normal(rng);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    e = static_cast<uint16_t>(bits >> 16);
  }
  return v;
}

// n elements of `dtype` (bfloat16 or float32) as bytes: NormalBFloat16's
// draws, widened exactly for float32, so both dtypes see the same values.
inline std::shared_ptr<std::vector<uint8_t>> NormalTensor(DType dtype, size_t n) {
  const std::vector<uint16_t> draws = NormalBFloat16(n);
  const size_t size = dtype == DType::kFloat32 ? 4 : 2;
  auto bytes = std::make_shared<std::vector<uint8_t>>(n * size);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t wide = static_cast<uint32_t>(draws[i]) << 16;
    if (size == 4) {
      std::memcpy(bytes->data() + 4 * i, &wide, 4);
    } else {
      std::memcpy(bytes->data() + 2 * i, &draws[i], 2);
    }
  }
  return bytes;
}

// The cases, each owning its buffers and plan: bfloat16 over `tokens`
// tokens, and float32 (for comparison) over half as many, as many bytes.
// `tokens` scales the sizes (the default keeps every tensor within a 1 MiB
// L2).
inline std::vector<KernelCase> KernelCases(Backend& backend, int64_t tokens = 16) {
  std::vector<KernelCase> cases;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    const bool f32 = dtype == DType::kFloat32;
    const int64_t n_tokens = f32 ? std::max<int64_t>(1, tokens / 2) : tokens;
    const std::string prefix = f32 ? "float32 " : "";
    {  // sinusoidal add, [n_tokens, 4096], INTERLEAVED (the default)
      auto x = NormalTensor(dtype, static_cast<size_t>(n_tokens * 4096));
      AbsoluteTensors t;
      t.x = {dtype, {1, n_tokens, 4096}, x->data(), x->size()};
      auto plan = std::make_shared<AbsolutePlan>(*PlanAbsolute(AbsoluteOptions{}, t));
      cases.push_back({prefix + "sinusoidal add [" + std::to_string(n_tokens) + ", 4096]",
                       n_tokens * 4096, static_cast<int64_t>(x->size()),
                       [&backend, x, plan] { (void)backend.ApplyAbsolute(*plan, x->data(), {}); }});
    }
  }
  // RoPE, the same split of dtypes and tokens.
  for (DType dtype : {DType::kBFloat16, DType::kFloat32}) {
    const bool f32 = dtype == DType::kFloat32;
    const int64_t n_tokens = f32 ? std::max<int64_t>(1, tokens / 2) : tokens;
    const int64_t size = f32 ? 4 : 2;
    for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kGptj}) {
      for (RopeLayout layout : {RopeLayout::kBSHD, RopeLayout::kBHSD}) {
        const int64_t hq = 32, hk = 8, d = 128;
        const int64_t hq_elems = n_tokens * hq * d, hk_elems = n_tokens * hk * d;
        auto q = NormalTensor(dtype, static_cast<size_t>(hq_elems));
        auto k = NormalTensor(dtype, static_cast<size_t>(hk_elems));
        auto offsets = std::make_shared<std::vector<int64_t>>(1, 1000);
        RopeOptions o;
        o.style = style;
        o.layout = layout;
        o.base = 500000;
        const bool bhsd = layout == RopeLayout::kBHSD;
        RopeTensors t;
        t.query = {dtype,
                   bhsd ? std::vector<int64_t>{1, hq, n_tokens, d}
                        : std::vector<int64_t>{1, n_tokens, hq, d},
                   q->data(), q->size()};
        t.key = {dtype,
                 bhsd ? std::vector<int64_t>{1, hk, n_tokens, d}
                      : std::vector<int64_t>{1, n_tokens, hk, d},
                 k->data(), k->size()};
        t.positions.offsets = {DType::kInt64, {1}, offsets->data(), 8};
        auto plan = std::make_shared<RopePlan>(*PlanRope(o, t));
        const int64_t n = hq_elems + hk_elems;
        cases.push_back({std::string(f32 ? "float32 rope " : "rope ") +
                             (style == RopeStyle::kNeox ? "neox " : "gptj ") +
                             (bhsd ? "bhsd " : "bshd ") + std::to_string(n_tokens) + "x(32+8)x128",
                         n, n * size, [&backend, q, k, offsets, plan] {
                           (void)backend.ApplyRope(*plan, q->data(), k->data(), {});
                         }});
      }
    }
  }
  for (bool left_padding : {false, true}) {  // ALiBi + causal added to logits
    const int64_t b = 2, h = 2, l = 16 * tokens;
    auto x = std::make_shared<std::vector<uint16_t>>(NormalBFloat16(b * h * l * l));
    auto starts = std::make_shared<std::vector<int64_t>>(
        left_padding ? std::vector<int64_t>{l / 4, l / 2} : std::vector<int64_t>{0, 0});
    BiasOptions o;
    o.causal = true;
    if (left_padding) o.k_starts = {DType::kInt64, {b}, starts->data(), starts->size() * 8};
    auto plan = std::make_shared<BiasPlan>(*PlanAttentionBias(
        o, TensorView{DType::kBFloat16, {b, h, l, l}, x->data(), x->size() * 2}));
    cases.push_back(
        {"alibi+causal [2,2," + std::to_string(l) + "," + std::to_string(l) + "]" +
             (left_padding ? " k_starts" : ""),
         static_cast<int64_t>(x->size()), static_cast<int64_t>(x->size()) * 2,
         [&backend, x, starts, plan] { (void)backend.ApplyAttentionBias(*plan, x->data(), {}); }});
  }
  return cases;
}

}  // namespace posenc::bench

#endif  // POSENC_BENCH_KERNEL_CASES_H_
