// The kernel calls (bfloat16, and float32 sinusoidal and RoPE for comparison) that
// posenc-bench-compute and posenc-count-instructions measure, small enough to stay in L2: one place
// so that both tools time and count the same calls.
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

// The cases, each owning its buffers and plan. `tokens` scales the sizes
// (the default keeps every tensor within a 1 MiB L2).
inline std::vector<KernelCase> BFloat16Cases(Backend& backend, int64_t tokens = 16) {
  std::vector<KernelCase> cases;
  {  // float32 sinusoidal add, [tokens / 2, 4096]: as many bytes
    const int64_t rows = std::max<int64_t>(1, tokens / 2);
    auto x = std::make_shared<std::vector<float>>(rows * 4096);
    const std::vector<uint16_t> bits = NormalBFloat16(x->size());
    for (size_t i = 0; i < x->size(); ++i) {
      const uint32_t wide = static_cast<uint32_t>(bits[i]) << 16;
      std::memcpy(&(*x)[i], &wide, 4);
    }
    AbsoluteTensors t;
    t.x = {DType::kFloat32, {1, rows, 4096}, x->data(), x->size() * 4};
    auto plan = std::make_shared<AbsolutePlan>(*PlanAbsolute(AbsoluteOptions{}, t));
    cases.push_back({"float32 sinusoidal add [" + std::to_string(rows) + ", 4096]",
                     static_cast<int64_t>(x->size()), static_cast<int64_t>(x->size()) * 4,
                     [&backend, x, plan] { (void)backend.ApplyAbsolute(*plan, x->data(), {}); }});
  }
  {  // sinusoidal add, [tokens, 4096], INTERLEAVED (the default)
    auto x = std::make_shared<std::vector<uint16_t>>(NormalBFloat16(tokens * 4096));
    AbsoluteTensors t;
    t.x = {DType::kBFloat16, {1, tokens, 4096}, x->data(), x->size() * 2};
    auto plan = std::make_shared<AbsolutePlan>(*PlanAbsolute(AbsoluteOptions{}, t));
    cases.push_back({"sinusoidal add [" + std::to_string(tokens) + ", 4096]",
                     static_cast<int64_t>(x->size()), static_cast<int64_t>(x->size()) * 2,
                     [&backend, x, plan] { (void)backend.ApplyAbsolute(*plan, x->data(), {}); }});
  }
  // RoPE, bfloat16 over `tokens` tokens and float32 over half as many (as
  // many bytes).
  for (DType dtype : {DType::kBFloat16, DType::kFloat32}) {
    const bool f32 = dtype == DType::kFloat32;
    const int64_t n_tokens = f32 ? std::max<int64_t>(1, tokens / 2) : tokens;
    const int64_t size = f32 ? 4 : 2;
    for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kGptj}) {
      for (RopeLayout layout : {RopeLayout::kBSHD, RopeLayout::kBHSD}) {
        const int64_t hq = 32, hk = 8, d = 128;
        // float32 elements are the bfloat16 draws widened (exactly).
        auto q = std::make_shared<std::vector<uint16_t>>(NormalBFloat16(n_tokens * hq * d));
        auto k = std::make_shared<std::vector<uint16_t>>(NormalBFloat16(n_tokens * hk * d));
        if (f32) {
          for (auto* v : {q.get(), k.get()}) {
            std::vector<uint16_t> wide(2 * v->size(), 0);
            for (size_t i = 0; i < v->size(); ++i) wide[2 * i + 1] = (*v)[i];  // little-endian
            *v = std::move(wide);
          }
        }
        auto offsets = std::make_shared<std::vector<int64_t>>(1, 1000);
        RopeOptions o;
        o.style = style;
        o.layout = layout;
        o.base = 500000;
        const bool bhsd = layout == RopeLayout::kBHSD;
        const int64_t hq_elems = n_tokens * hq * d, hk_elems = n_tokens * hk * d;
        RopeTensors t;
        t.query = {dtype,
                   bhsd ? std::vector<int64_t>{1, hq, n_tokens, d}
                        : std::vector<int64_t>{1, n_tokens, hq, d},
                   q->data(), static_cast<size_t>(hq_elems * size)};
        t.key = {dtype,
                 bhsd ? std::vector<int64_t>{1, hk, n_tokens, d}
                      : std::vector<int64_t>{1, n_tokens, hk, d},
                 k->data(), static_cast<size_t>(hk_elems * size)};
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
