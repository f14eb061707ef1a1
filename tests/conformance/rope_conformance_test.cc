// RoPE on every backend against the float64 reference of SPEC §5: layouts,
// position forms, head dims, partial and inverse rotation, every scaling,
// multi-axis, cancelling pairs. Inputs are fresh random data each run.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "backends.h"
#include "emulated_gpu_backend.h"
#include "gtest/gtest.h"
#include "posenc/backend.h"
#include "reference.h"
#include "test_tensors.h"

namespace posenc {
namespace {

using testing::BackendTest;
using testing::Bytes;
using testing::kFloatTypes;
using testing::kStyles;
using testing::RunMatchingCpu;

// ---------------------------------------------------------------- RoPE ----

enum class Pos { kDefault, kIds, kOffsets };

struct RopeCase {
  RopeOptions options;
  DType dtype = DType::kFloat32;
  int64_t batch = 2, seq = 7, query_heads = 4, key_heads = 2, head_dim = 64;
  std::vector<int64_t> cu_seqlens;  // THD: sequence boundaries over `seq` tokens
  Pos pos = Pos::kIds;
  int64_t pos_center = 0;  // random positions drawn around this value
  int64_t pos_spread = 3000;
  bool key = true;
  bool cancelling = false;  // inputs drawn so rotated values cancel (MakePairsCancel)
  int magnitude = 0;        // inputs drawn in [-2^magnitude, 2^magnitude) (then rounded)
};

int64_t ElementOffset(RopeLayout layout, int64_t b, int64_t s, int64_t t, int64_t h, int64_t H,
                      int64_t S, int64_t D) {
  switch (layout) {
    case RopeLayout::kBSHD:
      return ((b * S + s) * H + h) * D;
    case RopeLayout::kBHSD:
      return ((b * H + h) * S + s) * D;
    case RopeLayout::kTHD:
      return (t * H + h) * D;
  }
  return 0;
}

std::vector<int64_t> Shape(RopeLayout layout, int64_t B, int64_t S, int64_t H, int64_t D) {
  switch (layout) {
    case RopeLayout::kBSHD:
      return {B, S, H, D};
    case RopeLayout::kBHSD:
      return {B, H, S, D};
    case RopeLayout::kTHD:
      return {S, H, D};
  }
  return {};
}

// Redraws about three pairs in four of the head at x[off, off + R) so that
// one of their rotated values cancels: v becomes u cot(a) (or -u tan(a))
// rounded to the dtype, so u cos(a) - v sin(a) (or v cos(a) + u sin(a)) is
// only that rounding's residue, up to an ulp of v times |sin(a)| and spread
// down to zero. These are the results the 16-bit cancellation bound
// (math/angle.h) exists for: a kernel that trusts float32 arithmetic too far
// into them misses the one-ulp bar. Residues under 2^-20 keep their random
// v: the float64 reference's own angle errs by up to |p| 2^-52 rad, more
// than an ulp of a residue far below that at large positions (2^-20 of
// inputs of magnitude 1: the threshold scales with 2^magnitude). `ref`
// holds the inputs as doubles and is updated with x.
void MakePairsCancel(const RopeOptions& o, const reference::Frequencies& f, int64_t R,
                     const std::vector<int64_t>& pos, DType dtype, Bytes& x,
                     std::vector<double>& ref, int64_t off, int magnitude) {
  std::bernoulli_distribution cancel(0.75);
  const int64_t half = R / 2;
  for (int64_t k = 0; k < half; ++k) {
    if (!cancel(testing::Rng())) continue;
    double angle = double(pos[f.axis[k]]) * f.inv_freq[k];
    if (o.inverse) angle = -angle;
    const double c = std::cos(angle), s = std::sin(angle);
    const int64_t i = off + (o.style == RopeStyle::kNeox ? k : 2 * k);
    const int64_t j = off + (o.style == RopeStyle::kNeox ? k + half : 2 * k + 1);
    const double u = ref[i];
    const bool first = std::abs(s) > std::abs(c);  // cancel the first result, else the second
    const double v_old = ref[j];
    StoreElement(dtype, x.data(), j, static_cast<float>(first ? u * c / s : -u * s / c));
    const double v = LoadElement(dtype, x.data(), j);
    const double residue = first ? u * c - v * s : v * c + u * s;
    if (std::abs(residue) < std::ldexp(0x1p-20, magnitude)) {
      StoreElement(dtype, x.data(), j, static_cast<float>(v_old));
    } else {
      ref[j] = v;
    }
  }
}

// Options whose tokens take attention scale `attention`: YaRN's
// attention_factor (factor 4, 4096 original positions), or no scaling at 1.
void ScaleAttention(double attention, RopeOptions* o) {
  if (attention == 1.0) return;
  o->scaling.type = ScalingType::kYarn;
  o->scaling.factor = 4;
  o->scaling.original_max_position = 4096;
  o->scaling.attention_factor = attention;
}

// Runs one case on `backend`; returns the rotated query for further checks.
void CheckRope(Backend& backend, const RopeCase& c) {
  const RopeOptions& o = c.options;
  const bool packed = o.layout == RopeLayout::kTHD;
  const int64_t B = packed ? 1 : c.batch, S = c.seq, D = c.head_dim;
  const int64_t T = B * S;
  const int A = NumPositionAxes(o);
  const int64_t R = o.rotary_dim == 0 ? D : o.rotary_dim;
  std::vector<int64_t> cu = c.cu_seqlens;
  if (packed && cu.empty()) cu = {0, S};
  const int64_t num_seq = packed ? static_cast<int64_t>(cu.size()) - 1 : B;

  // Token -> (sequence, index) and the positions the test expects.
  std::vector<int64_t> tok_seq(T), tok_idx(T);
  for (int64_t t = 0; t < T; ++t) {
    if (packed) {
      int64_t s = 0;
      while (cu[s + 1] <= t) ++s;
      tok_seq[t] = s;
      tok_idx[t] = t - cu[s];
    } else {
      tok_seq[t] = t / S;
      tok_idx[t] = t % S;
    }
  }
  std::vector<int64_t> ids(T * A);
  std::vector<int64_t> offsets(num_seq);
  std::uniform_int_distribution<int64_t> spread(-c.pos_spread, c.pos_spread);
  for (auto& v : offsets) v = c.pos_center + spread(testing::Rng());
  for (int64_t t = 0; t < T; ++t) {
    for (int a = 0; a < A; ++a) {
      int64_t p = tok_idx[t];
      if (c.pos == Pos::kIds) p = c.pos_center + spread(testing::Rng());
      if (c.pos == Pos::kOffsets) p = offsets[tok_seq[t]] + tok_idx[t];
      ids[t * A + a] = p;
    }
  }
  std::vector<int64_t> seq_len(num_seq, 0);
  int64_t max_abs = 0;
  for (int64_t t = 0; t < T; ++t) {
    for (int a = 0; a < A; ++a) {
      seq_len[tok_seq[t]] = std::max(seq_len[tok_seq[t]], ids[t * A + a] + 1);
      max_abs = std::max(max_abs, std::abs(ids[t * A + a]));
    }
  }

  Bytes q = testing::RandomTensor(c.dtype, T * c.query_heads * D);
  Bytes k = c.key ? testing::RandomTensor(c.dtype, T * c.key_heads * D) : Bytes{};
  for (Bytes* b : {&q, &k}) {
    const int64_t n = static_cast<int64_t>(b->size() / SizeOf(c.dtype));
    for (int64_t i = 0; c.magnitude != 0 && i < n; ++i) {
      StoreElement(c.dtype, b->data(), i,
                   std::ldexp(static_cast<float>(LoadElement(c.dtype, b->data(), i)), c.magnitude));
    }
  }
  std::vector<double> q_ref = testing::ToDoubles(c.dtype, q);
  std::vector<double> k_ref = c.key ? testing::ToDoubles(c.dtype, k) : std::vector<double>{};

  std::map<int64_t, reference::Frequencies> freq_cache;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t L = seq_len[tok_seq[t]];
    auto it = freq_cache.find(L);
    if (it == freq_cache.end())
      it = freq_cache.emplace(L, reference::RopeFrequencies(o, R, L)).first;
    std::vector<int64_t> pos(ids.begin() + t * A, ids.begin() + (t + 1) * A);
    const int64_t b = packed ? 0 : tok_seq[t], s = packed ? t : tok_idx[t];
    for (int64_t h = 0; h < c.query_heads; ++h) {
      const int64_t off = ElementOffset(o.layout, b, s, t, h, c.query_heads, S, D);
      if (c.cancelling) MakePairsCancel(o, it->second, R, pos, c.dtype, q, q_ref, off, c.magnitude);
      reference::RotateHead(o, it->second, R, pos, q_ref.data() + off);
    }
    for (int64_t h = 0; c.key && h < c.key_heads; ++h) {
      const int64_t off = ElementOffset(o.layout, b, s, t, h, c.key_heads, S, D);
      if (c.cancelling) MakePairsCancel(o, it->second, R, pos, c.dtype, k, k_ref, off, c.magnitude);
      reference::RotateHead(o, it->second, R, pos, k_ref.data() + off);
    }
  }

  RopeTensors in;
  in.query = testing::Mutable(c.dtype, Shape(o.layout, B, S, c.query_heads, D), q);
  if (c.key) in.key = testing::Mutable(c.dtype, Shape(o.layout, B, S, c.key_heads, D), k);
  std::vector<int64_t> ids_shape = packed ? std::vector<int64_t>{T} : std::vector<int64_t>{B, S};
  if (A > 1) ids_shape.push_back(A);
  if (c.pos == Pos::kIds) in.positions.position_ids = testing::IntView(ids, ids_shape);
  std::vector<int32_t> offsets32(offsets.begin(), offsets.end());
  if (c.pos == Pos::kOffsets) in.positions.offsets = testing::IntView(offsets32, {num_seq});
  if (packed) in.cu_seqlens = testing::IntView(cu, {static_cast<int64_t>(cu.size())});

  auto plan = PlanRope(o, in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  RunMatchingCpu(backend, {&q, &k}, [&](Backend& be, const std::vector<Bytes*>& b) {
    return be.ApplyRope(*plan, b[0]->data(), c.key ? b[1]->data() : nullptr, {});
  });
  const double tol = max_abs <= 1000000 ? 1e-6 : 1e-5;
  // The reference's angle p * f is good to |p| 2^-52 rad against the
  // kernel's (each rounds its own f): a result that cancels is owed that much
  // beyond its ulp.
  const double slack = std::ldexp(static_cast<double>(max_abs), c.magnitude - 51);
  EXPECT_TRUE(testing::MatchesReference(c.dtype, q_ref, q.data(), tol, slack)) << "query";
  if (c.key) {
    EXPECT_TRUE(testing::MatchesReference(c.dtype, k_ref, k.data(), tol, slack)) << "key";
  }
}

TEST_P(BackendTest, RopeAwkwardHeadDimsBothStylesAllDtypes) {
  for (int64_t D : {64, 80, 112, 120, 128, 256}) {
    for (RopeStyle style : kStyles) {
      for (DType dtype : kFloatTypes) {
        SCOPED_TRACE(::testing::Message() << "head_dim " << D << " style " << int(style)
                                          << " dtype " << DTypeName(dtype));
        RopeCase c;
        c.options.style = style;
        c.dtype = dtype;
        c.head_dim = D;
        c.query_heads = 17;
        c.key_heads = 3;
        c.seq = 5;
        CheckRope(*backend_, c);
      }
    }
  }
}

// Pairs whose rotated values cancel (MakePairsCancel), where 16-bit outputs
// lean on the cancellation bound: each must still land within one ulp of
// the float64 result, and (RunMatchingCpu) every backend must pick the same
// pairs for double. The head sizes give the CPU's AVX-512 loop each kind
// of tail: 8 pairs (80), 16 (96, and rotary dim 32), 8 and 4 one by one
// (rotary dim 24); BHSD gives each row of its runs its own token (and
// rotation and angle).
TEST_P(BackendTest, RopeCancellingPairsMeetTheBar) {
  for (auto [D, R] :
       {std::pair<int64_t, int64_t>{128, 128}, {80, 80}, {96, 96}, {128, 32}, {64, 24}}) {
    for (RopeStyle style : kStyles) {
      for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
        for (int64_t center : {0, 1000000}) {
          for (RopeLayout layout : {RopeLayout::kBSHD, RopeLayout::kBHSD}) {
            SCOPED_TRACE(::testing::Message()
                         << "head_dim " << D << " rotary " << R << " style " << int(style) << " "
                         << DTypeName(dtype) << " positions near " << center << " layout "
                         << int(layout));
            RopeCase c;
            c.options.style = style;
            c.options.layout = layout;
            c.options.rotary_dim = R;
            c.dtype = dtype;
            c.head_dim = D;
            c.seq = 16;
            c.query_heads = 8;
            c.key_heads = 2;
            c.pos_center = center;
            c.cancelling = true;
            CheckRope(*backend_, c);
          }
        }
      }
    }
  }
}

// Cancelling pairs among bfloat16 inputs near the bottom of the float
// range, where the cancellation bound itself is subnormal (inputs under
// 2^-115): the CPU's AVX2 loop tests pairs against a bound it forms in
// bfloat16 bits (PairTestBF16x16), which must stay at or above the scalar
// one there too, or it narrows by rounding a pair the scalar contract
// recomputes in double (RunMatchingCpu: bit for bit with the emulated GPU
// body). Attention scales 1 and 1.5 (YaRN's attention_factor), a power of
// two and not.
TEST_P(BackendTest, RopeTinyCancellingPairsMeetTheBar) {
  for (int magnitude : {-112, -118, -124}) {
    for (RopeStyle style : kStyles) {
      for (double attention : {1.0, 1.5}) {
        for (RopeLayout layout : {RopeLayout::kBSHD, RopeLayout::kBHSD}) {
          SCOPED_TRACE(::testing::Message()
                       << "inputs under 2^" << magnitude << " style " << int(style)
                       << " attention scale " << attention << " layout " << int(layout));
          RopeCase c;
          c.options.style = style;
          c.options.layout = layout;
          ScaleAttention(attention, &c.options);
          c.dtype = DType::kBFloat16;
          c.head_dim = 128;
          c.seq = 16;
          c.query_heads = 8;
          c.key_heads = 2;
          c.cancelling = true;
          c.magnitude = magnitude;
          CheckRope(*backend_, c);
        }
      }
    }
  }
}

TEST_P(BackendTest, RopeLayoutsAndPositionForms) {
  for (RopeLayout layout : {RopeLayout::kBSHD, RopeLayout::kBHSD, RopeLayout::kTHD}) {
    for (Pos pos : {Pos::kDefault, Pos::kIds, Pos::kOffsets}) {
      for (DType dtype : kFloatTypes) {
        SCOPED_TRACE(::testing::Message() << "layout " << int(layout) << " pos " << int(pos)
                                          << " dtype " << DTypeName(dtype));
        RopeCase c;
        c.options.layout = layout;
        c.dtype = dtype;
        c.pos = pos;
        c.query_heads = 8;
        c.key_heads = 1;  // multi-query attention
        c.head_dim = 128;
        if (layout == RopeLayout::kTHD) {
          c.seq = 23;
          c.cu_seqlens = {0, 5, 5, 22, 23};  // uneven, with an empty sequence
        }
        CheckRope(*backend_, c);
      }
    }
  }
}

// Head-major sequences longer than the CPU's token blocks: float32 BHSD
// takes blocks of up to 256 tokens (128 for 256-dim heads: rope_cpu.cc's
// BlockTokens), the other dtypes 32. 300 tokens a sequence end one block
// part way through the next; each block's runs span both sequences where
// the block crosses from one into the other.
TEST_P(BackendTest, RopeHeadMajorSequencesLongerThanABlock) {
  for (int64_t D : {64, 128, 256}) {
    for (RopeStyle style : kStyles) {
      for (DType dtype : kFloatTypes) {
        SCOPED_TRACE(::testing::Message() << "head_dim " << D << " style " << int(style)
                                          << " dtype " << DTypeName(dtype));
        RopeCase c;
        c.options.layout = RopeLayout::kBHSD;
        c.options.style = style;
        c.dtype = dtype;
        c.pos = Pos::kOffsets;
        c.batch = 2;
        c.seq = 300;
        c.query_heads = 3;
        c.key_heads = 1;
        c.head_dim = D;
        CheckRope(*backend_, c);
      }
    }
  }
}

TEST_P(BackendTest, RopeDecodeShapesWithoutKey) {
  // One token per sequence: the GPU splits heads across the grid here.
  for (int64_t batch : {1, 3, 64, 256}) {
    RopeCase c;
    c.batch = batch;
    c.seq = 1;
    c.pos = Pos::kOffsets;
    c.pos_center = 5000;
    c.key = false;
    c.query_heads = 32;
    c.dtype = DType::kBFloat16;
    CheckRope(*backend_, c);
  }
  for (DType dtype : kFloatTypes) {  // with GQA keys
    RopeCase c;
    c.batch = 7;
    c.seq = 1;
    c.pos = Pos::kOffsets;
    c.query_heads = 32;
    c.key_heads = 8;
    c.dtype = dtype;
    CheckRope(*backend_, c);
  }
}

// Inputs whose rotated values are subnormal, zero, tiny, huge, infinite or
// NaN: every backend must narrow them as FloatToBFloat16 does (the AVX-512
// BF16 CPU loop's instruction flushes results below 2^-126, so it must send
// them to the scalar contract), bit for bit with the GPU kernel's body under
// emulation. Attention scales 1, 1.5 and 0.05 (YaRN's attention_factor)
// take that loop's three bounds: unscaled, scaled, and below the smallest
// scale it takes; 1000, the largest a plan takes, makes the products of
// inputs near 2^118 and over overflow (the AVX2 loop's 16-bit test must
// send those pairs to the scalar contract).
TEST_P(BackendTest, RopeTinyAndZeroInputsNarrowLikeTheScalarContract) {
  std::mt19937_64& rng = testing::Rng();
  auto emulated = testing::CreateEmulatedGpuBackend();
  for (RopeStyle style : kStyles) {
    for (double attention : {1.0, 1.5, 0.05, 1000.0}) {
      for (DType dtype : kFloatTypes) {
        SCOPED_TRACE(::testing::Message() << "style " << int(style) << " " << DTypeName(dtype)
                                          << " attention scale " << attention);
        const int64_t T = 9, Hq = 3, Hk = 1, D = 128;
        Bytes q = testing::RandomTensor(dtype, T * Hq * D);
        Bytes k = testing::RandomTensor(dtype, T * Hk * D);
        for (Bytes* b : {&q, &k}) {
          const int64_t n = static_cast<int64_t>(b->size()) / static_cast<int64_t>(SizeOf(dtype));
          for (int64_t i = 0; i < n; ++i) {
            // Runs of zeros, of values near the smallest normal float and of
            // subnormals, of values near the largest (whose |u| + |v|
            // overflows to inf in float, and with it the cancellation bound)
            // or from 2^116 up (which the AVX2 loop's 16-bit test leaves to
            // the scalar contract at large attention scales), among
            // ordinary values; and now and then an infinity or a NaN (with a
            // random payload and sign).
            const int kind = static_cast<int>((i / 16 + rng() % 2) % 5);
            const double mag = std::ldexp(1.0 + static_cast<double>(rng() % 1000) / 1000.0,
                                          -118 - static_cast<int>(rng() % 14));
            const double sign = rng() % 2 ? -1.0 : 1.0;
            if (kind == 0) StoreElement(dtype, b->data(), i, 0.0f);
            if (kind == 1 || kind == 2)
              StoreElement(dtype, b->data(), i, static_cast<float>(sign * mag));
            if (kind == 4 && dtype != DType::kFloat16) {
              const int exponent = rng() % 2 ? 126 + static_cast<int>(rng() % 2)
                                             : 116 + static_cast<int>(rng() % 10);
              const double huge =
                  std::ldexp(1.0 + static_cast<double>(rng() % 1000) / 1000.0, exponent);
              StoreElement(dtype, b->data(), i, static_cast<float>(sign * std::min(huge, 3.3e38)));
            }
            if (rng() % 97 == 0) {
              const uint32_t bits = (rng() % 2 ? 0xff800000u : 0x7f800000u) |
                                    (rng() % 2 ? static_cast<uint32_t>(rng() % 0x400000) << 1 : 0u);
              float special;
              std::memcpy(&special, &bits, 4);
              StoreElement(dtype, b->data(), i, special);  // +-inf, or a NaN
            }
          }
        }
        std::vector<int32_t> offsets = {static_cast<int32_t>(rng() % 100000)};
        RopeTensors t;
        t.query = testing::Mutable(dtype, {1, T, Hq, D}, q);
        t.key = testing::Mutable(dtype, {1, T, Hk, D}, k);
        t.positions.offsets = testing::IntView(offsets, {1});
        RopeOptions o;
        o.style = style;
        ScaleAttention(attention, &o);
        auto plan = PlanRope(o, t);
        ASSERT_TRUE(plan.ok()) << plan.status();
        Bytes q2 = q, k2 = k;
        ASSERT_TRUE(backend_->ApplyRope(*plan, q.data(), k.data(), {}).ok());
        ASSERT_TRUE(emulated->ApplyRope(*plan, q2.data(), k2.data(), {}).ok());
        EXPECT_TRUE(q == q2) << "query differs from the scalar contract (emulated GPU body)";
        EXPECT_TRUE(k == k2) << "key differs from the scalar contract (emulated GPU body)";
      }
    }
  }
}

TEST_P(BackendTest, RopeNarrowRotaryDims) {
  // Rotary dims whose halves are not multiples of 8 (16-byte accesses of
  // 16-bit elements) and an odd head size.
  for (auto [D, R] : {std::pair<int64_t, int64_t>{64, 24}, {120, 120}, {40, 12}, {9, 4}}) {
    for (RopeStyle style : kStyles) {
      for (DType dtype : kFloatTypes) {
        SCOPED_TRACE(::testing::Message() << "head_dim " << D << " rotary " << R << " style "
                                          << int(style) << " " << DTypeName(dtype));
        RopeCase c;
        c.options.style = style;
        c.options.rotary_dim = R;
        c.dtype = dtype;
        c.head_dim = D;
        c.query_heads = 5;
        c.key_heads = 2;
        CheckRope(*backend_, c);
      }
    }
  }
}

TEST_P(BackendTest, RopePartialRotaryInverseNegativeAndLargePositions) {
  for (DType dtype : kFloatTypes) {
    RopeCase c;
    c.dtype = dtype;
    c.head_dim = 80;
    c.options.rotary_dim = 32;  // GPT-NeoX / Phi partial rotary
    CheckRope(*backend_, c);
    c.options.inverse = true;
    c.pos_center = -40000;  // negative positions: rotating by a delta
    CheckRope(*backend_, c);
    c.options.inverse = false;
    c.pos_center = 999000;  // near 10^6: the 1e-6 bar
    CheckRope(*backend_, c);
    c.pos_center = 9990000;  // near 10^7: the 1e-5 bar
    c.options.style = RopeStyle::kGptj;
    CheckRope(*backend_, c);
  }
}

TEST_P(BackendTest, RopeEveryScaling) {
  std::vector<std::pair<std::string, RopeScaling>> scalings;
  RopeScaling s;
  s.type = ScalingType::kLinear;
  s.factor = 4;
  scalings.emplace_back("linear", s);
  s = {};
  s.type = ScalingType::kDynamicNtk;
  s.factor = 2;
  s.original_max_position = 2048;
  scalings.emplace_back("dynamic", s);
  s = {};
  s.type = ScalingType::kYarn;
  s.factor = 40;
  s.original_max_position = 4096;
  s.mscale = 1.0;
  s.mscale_all_dim = 0.8;
  scalings.emplace_back("yarn-mscale", s);
  s.mscale.reset();
  s.truncate = false;
  s.beta_fast = 24;
  scalings.emplace_back("yarn-untruncated", s);
  s = {};
  s.type = ScalingType::kLlama3;
  scalings.emplace_back("llama3", s);
  s = {};
  s.type = ScalingType::kLongRope;
  s.factor = 32;
  s.original_max_position = 4096;
  std::uniform_real_distribution<double> u(1.0, 8.0);
  for (int k = 0; k < 32; ++k) {
    s.short_factor.push_back(u(testing::Rng()));
    s.long_factor.push_back(u(testing::Rng()) * 4);
  }
  scalings.emplace_back("longrope", s);
  s.longrope_mode = LongRopeMode::kLong;
  scalings.emplace_back("longrope-long", s);
  s = {};
  s.type = ScalingType::kExplicit;
  for (int k = 0; k < 32; ++k) s.inv_freq.push_back(u(testing::Rng()) / 8);
  s.attention_factor = 0.7;
  scalings.emplace_back("explicit", s);

  for (const auto& [name, scaling] : scalings) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      SCOPED_TRACE(name + " " + std::string(DTypeName(dtype)));
      RopeCase c;
      c.options.scaling = scaling;
      c.options.base = name == "llama3" ? 500000 : 10000;
      c.dtype = dtype;
      c.options.layout = RopeLayout::kTHD;
      c.seq = 30;
      c.cu_seqlens = {0, 10, 30};
      c.pos_center = 3000;  // some sequences above, some below 4096 / 2048
      c.pos_spread = 2500;
      CheckRope(*backend_, c);
    }
  }
}

TEST_P(BackendTest, RopeMultiAxis) {
  struct AxisCase {
    const char* name;
    AxisMode mode;
    std::vector<int64_t> dims;
    RopeStyle style;
    int64_t head_dim;
  };
  const AxisCase cases[] = {
      {"vit-2d", AxisMode::kAxial, {32, 32}, RopeStyle::kGptj, 64},
      {"qwen2-vl-vision", AxisMode::kAxial, {40, 40}, RopeStyle::kNeox, 80},
      {"flux", AxisMode::kAxial, {16, 56, 56}, RopeStyle::kGptj, 128},
      {"qwen2-vl-mrope", AxisMode::kMrope, {16, 24, 24}, RopeStyle::kNeox, 128},
      {"qwen3-vl-interleaved", AxisMode::kMropeInterleaved, {24, 20, 20}, RopeStyle::kNeox, 128},
  };
  for (const AxisCase& a : cases) {
    for (DType dtype : {DType::kFloat32, DType::kFloat16}) {
      SCOPED_TRACE(std::string(a.name) + " " + std::string(DTypeName(dtype)));
      RopeCase c;
      c.options.axis_mode = a.mode;
      (a.mode == AxisMode::kAxial ? c.options.axis_dims : c.options.sections) = a.dims;
      c.options.style = a.style;
      c.head_dim = a.head_dim;
      c.dtype = dtype;
      c.pos_center = 100;
      c.pos_spread = 100;
      CheckRope(*backend_, c);
    }
  }
}

TEST_P(BackendTest, RopeInverseUndoesForward) {
  RopeOptions o;
  Bytes q = testing::RandomTensor(DType::kFloat32, 3 * 9 * 4 * 64);
  const Bytes original = q;
  RopeTensors in;
  in.query = testing::Mutable(DType::kFloat32, {3, 9, 4, 64}, q);
  std::vector<int64_t> off = {123456, -7, 0};
  in.positions.offsets = testing::IntView(off, {3});
  auto fwd = PlanRope(o, in);
  o.inverse = true;
  auto inv = PlanRope(o, in);
  ASSERT_TRUE(fwd.ok() && inv.ok());
  ASSERT_TRUE(backend_->ApplyRope(*fwd, q.data(), nullptr, {}).ok());
  EXPECT_FALSE(testing::MatchesReference(
      DType::kFloat32, testing::ToDoubles(DType::kFloat32, original), q.data(), 1e-3));
  ASSERT_TRUE(backend_->ApplyRope(*inv, q.data(), nullptr, {}).ok());
  EXPECT_TRUE(testing::MatchesReference(
      DType::kFloat32, testing::ToDoubles(DType::kFloat32, original), q.data(), 1e-6));
}

TEST_P(BackendTest, DynamicScalingIgnoresBatchCompanions) {
  // A sequence's result must not depend on what it is batched with.
  RopeOptions o;
  o.layout = RopeLayout::kTHD;
  o.scaling.type = ScalingType::kDynamicNtk;
  o.scaling.factor = 4;
  o.scaling.original_max_position = 16;
  Bytes alone = testing::RandomTensor(DType::kFloat32, 8 * 2 * 32);
  Bytes batched = alone;
  Bytes other = testing::RandomTensor(DType::kFloat32, 100 * 2 * 32);
  batched.insert(batched.end(), other.begin(), other.end());
  std::vector<int64_t> cu_alone = {0, 8}, cu_batched = {0, 8, 108};
  RopeTensors a, b;
  a.query = testing::Mutable(DType::kFloat32, {8, 2, 32}, alone);
  a.cu_seqlens = testing::IntView(cu_alone, {2});
  b.query = testing::Mutable(DType::kFloat32, {108, 2, 32}, batched);
  b.cu_seqlens = testing::IntView(cu_batched, {3});
  auto pa = PlanRope(o, a);
  auto pb = PlanRope(o, b);
  ASSERT_TRUE(pa.ok() && pb.ok());
  ASSERT_TRUE(backend_->ApplyRope(*pa, alone.data(), nullptr, {}).ok());
  ASSERT_TRUE(backend_->ApplyRope(*pb, batched.data(), nullptr, {}).ok());
  EXPECT_EQ(0, std::memcmp(alone.data(), batched.data(), alone.size()));
}

// ---------------------------------------------------- absolute encodings ----

}  // namespace
}  // namespace posenc
