// Every backend this build has, against the float64 reference of SPEC §5.
// Inputs are fresh random data each run; write-only outputs are poisoned with
// NaN before the kernel runs so unwritten elements fail.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "emulated_gpu_backend.h"
#include "gtest/gtest.h"
#include "posenc/backend.h"
#include "reference.h"
#include "test_tensors.h"

namespace posenc {
namespace {

using testing::Bytes;

std::unique_ptr<Backend> MakeBackend(const std::string& name) {
  if (name == "cpu") return CreateCpuBackend(3);
  if (name == "cpu1") return CreateCpuBackend(1);
  // The CUDA kernels' bodies run over their launch grid on the CPU: every
  // case below then proves the GPU code's index maps and arithmetic too.
  // An H100's 132 SMs split the heads of every small case over blockIdx.y;
  // one SM splits none, which is the shape large requests take there.
  if (name == "emulated") return testing::CreateEmulatedGpuBackend();
  if (name == "emulated_1sm") return testing::CreateEmulatedGpuBackend(1);
  auto cuda = CreateCudaBackend(0);
  return cuda.ok() ? std::move(*cuda) : nullptr;
}

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

// Adds sinusoidal PE at `ids` to fresh random [ids.size(), d] inputs on
// `backend` (bit for bit against the CPU backend, see RunMatchingCpu) and
// checks the sums against the float64 reference at SPEC §5's bar.
void ExpectSinusoidalAddMatchesReference(Backend& backend, SinusoidalLayout layout, int64_t d,
                                         DType dtype, const std::vector<int64_t>& ids) {
  const int64_t T = static_cast<int64_t>(ids.size());
  Bytes x = testing::RandomTensor(dtype, T * d);
  std::vector<double> ref = testing::ToDoubles(dtype, x);
  AbsoluteOptions o;
  o.sinusoidal_layout = layout;
  for (int64_t t = 0; t < T; ++t) {
    auto row = reference::SinusoidalRow(layout, o.base, d, ids[t]);
    for (int64_t i = 0; i < d; ++i) ref[t * d + i] += row[i];
  }
  AbsoluteTensors in;
  in.x = testing::Mutable(dtype, {T, d}, x);
  in.positions.position_ids = testing::IntView(ids, {T});
  auto plan = PlanAbsolute(o, in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  RunMatchingCpu(backend, {&x}, [&](Backend& be, const std::vector<Bytes*>& b) {
    return be.ApplyAbsolute(*plan, b[0]->data(), {});
  });
  // The reference's angle p * w (w <= 1) is good to |p| 2^-53 radians: a sum
  // that cancels is owed no more than that beyond its ulp.
  int64_t far = 0;
  for (int64_t p : ids) far = std::max(far, p < 0 ? -p : p);
  EXPECT_TRUE(testing::MatchesReference(dtype, ref, x.data(), 1e-6, std::ldexp(double(far), -52)));
}

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
// than an ulp of a residue far below that at large positions. `ref` holds the
// inputs as doubles and is updated with x.
void MakePairsCancel(const RopeOptions& o, const reference::Frequencies& f, int64_t R,
                     const std::vector<int64_t>& pos, DType dtype, Bytes& x,
                     std::vector<double>& ref, int64_t off) {
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
    if (std::abs(residue) < 0x1p-20) {
      StoreElement(dtype, x.data(), j, static_cast<float>(v_old));
    } else {
      ref[j] = v;
    }
  }
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
      if (c.cancelling) MakePairsCancel(o, it->second, R, pos, c.dtype, q, q_ref, off);
      reference::RotateHead(o, it->second, R, pos, q_ref.data() + off);
    }
    for (int64_t h = 0; c.key && h < c.key_heads; ++h) {
      const int64_t off = ElementOffset(o.layout, b, s, t, h, c.key_heads, S, D);
      if (c.cancelling) MakePairsCancel(o, it->second, R, pos, c.dtype, k, k_ref, off);
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
  const double slack = std::ldexp(static_cast<double>(max_abs), -51);
  EXPECT_TRUE(testing::MatchesReference(c.dtype, q_ref, q.data(), tol, slack)) << "query";
  if (c.key) {
    EXPECT_TRUE(testing::MatchesReference(c.dtype, k_ref, k.data(), tol, slack)) << "key";
  }
}

constexpr DType kFloatTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
constexpr RopeStyle kStyles[] = {RopeStyle::kNeox, RopeStyle::kGptj};

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

// Inputs whose rotated values are subnormal, zero, tiny, infinite or NaN:
// every backend must narrow them as FloatToBFloat16 does (the AVX-512 BF16
// CPU loop's instruction flushes results below 2^-126, so it must send them
// to the scalar contract), bit for bit with the GPU kernel's body under
// emulation. Attention scales 1, 1.5 and 0.05 (YaRN's attention_factor)
// take that loop's three bounds: unscaled, scaled, and below the smallest
// scale it takes.
TEST_P(BackendTest, RopeTinyAndZeroInputsNarrowLikeTheScalarContract) {
  std::mt19937_64& rng = testing::Rng();
  auto emulated = testing::CreateEmulatedGpuBackend();
  for (RopeStyle style : kStyles) {
    for (double attention : {1.0, 1.5, 0.05}) {
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
            // subnormals, among ordinary values; and now and then an infinity
            // or a NaN (with a random payload and sign).
            const int kind = static_cast<int>((i / 16 + rng() % 2) % 4);
            const double mag = std::ldexp(1.0 + static_cast<double>(rng() % 1000) / 1000.0,
                                          -118 - static_cast<int>(rng() % 14));
            const double sign = rng() % 2 ? -1.0 : 1.0;
            if (kind == 0) StoreElement(dtype, b->data(), i, 0.0f);
            if (kind == 1 || kind == 2)
              StoreElement(dtype, b->data(), i, static_cast<float>(sign * mag));
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
        if (attention != 1.0) {
          o.scaling.type = ScalingType::kYarn;
          o.scaling.factor = 4;
          o.scaling.original_max_position = 4096;
          o.scaling.attention_factor = attention;
        }
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

TEST_P(BackendTest, SinusoidalBothLayoutsMatchReference) {
  for (SinusoidalLayout layout :
       {SinusoidalLayout::kInterleaved, SinusoidalLayout::kConcatenated}) {
    for (int64_t d : {4, 64, 77, 512}) {
      for (DType dtype : kFloatTypes) {
        SCOPED_TRACE(::testing::Message()
                     << "layout " << int(layout) << " d " << d << " " << DTypeName(dtype));
        const int64_t B = 3, S = 6;
        Bytes x = testing::RandomTensor(dtype, B * S * d);
        std::vector<double> ref = testing::ToDoubles(dtype, x);
        std::vector<int64_t> ids(B * S);
        std::uniform_int_distribution<int64_t> p(0, 2000000);
        for (auto& v : ids) v = p(testing::Rng());
        AbsoluteOptions o;
        o.sinusoidal_layout = layout;
        o.base = d == 4 ? 100 : 10000;
        o.x_scale = std::sqrt(double(d));
        for (int64_t t = 0; t < B * S; ++t) {
          auto row = reference::SinusoidalRow(layout, o.base, d, ids[t]);
          for (int64_t i = 0; i < d; ++i) ref[t * d + i] = ref[t * d + i] * o.x_scale + row[i];
        }
        AbsoluteTensors in;
        in.x = testing::Mutable(dtype, {B, S, d}, x);
        in.positions.position_ids = testing::IntView(ids, {B, S});
        auto plan = PlanAbsolute(o, in);
        ASSERT_TRUE(plan.ok()) << plan.status();
        RunMatchingCpu(*backend_, {&x}, [&](Backend& be, const std::vector<Bytes*>& b) {
          return be.ApplyAbsolute(*plan, b[0]->data(), {});
        });
        EXPECT_TRUE(testing::MatchesReference(dtype, ref, x.data(), 1e-5));
      }
    }
  }
}

// The kernels' fixed-point phases (math/phase.h) wrap where the angle wraps
// and treat negative positions by symmetry: float32 outputs at positions out
// to +-2^31 (the limit) still meet the bar SPEC §5 sets for 10^6, and every
// 16-bit element is within one ulp out to +-10^7. (Not further: there the
// float64 reference's own angle, rounded to 2^-22 rad at 2^31, is coarser
// than an ulp of fp16's small values, so "the float64 result" depends on how
// it forms the angle: p / base^(2i/d) or p * base^(-2i/d).)
TEST_P(BackendTest, SinusoidalLargeAndNegativePositionsMatchReference) {
  for (SinusoidalLayout layout :
       {SinusoidalLayout::kInterleaved, SinusoidalLayout::kConcatenated}) {
    for (int64_t d : {64, 77}) {
      for (DType dtype : kFloatTypes) {
        SCOPED_TRACE(::testing::Message()
                     << "layout " << int(layout) << " d " << d << " " << DTypeName(dtype));
        const int64_t kLimit = dtype == DType::kFloat32 ? int64_t{1} << 31 : 10000000;
        const int64_t T = 40;
        std::vector<int64_t> ids = {kLimit, -kLimit, kLimit - 1, -(kLimit - 1), -1, 0, 1, -4096};
        std::uniform_int_distribution<int64_t> p(-kLimit, kLimit);
        while (static_cast<int64_t>(ids.size()) < T) ids.push_back(p(testing::Rng()));
        ExpectSinusoidalAddMatchesReference(*backend_, layout, d, dtype, ids);
      }
    }
  }
}

// Runs of consecutive positions: the CPU carries each anchor's 64-bit phase
// to the next (16 positions on, |anchor| up or down by 16, across zero and up
// to the +-2^31 limit) where the GPU multiplies afresh; both must still agree
// bit for bit and with the reference, in rows wide enough for the CPU's
// vector loop and its scalar tail (d = 77, 130) and aligned ones (512).
TEST_P(BackendTest, SinusoidalConsecutiveRunsMatchReference) {
  for (SinusoidalLayout layout :
       {SinusoidalLayout::kInterleaved, SinusoidalLayout::kConcatenated}) {
    for (int64_t d : {77, 130, 512}) {
      for (DType dtype : kFloatTypes) {
        SCOPED_TRACE(::testing::Message()
                     << "layout " << int(layout) << " d " << d << " " << DTypeName(dtype));
        const int64_t kLimit = dtype == DType::kFloat32 ? int64_t{1} << 31 : 10000000;
        std::vector<int64_t> ids;
        auto run = [&](int64_t from, int64_t to) {  // inclusive, either direction
          for (int64_t p = from;; p += from <= to ? 1 : -1) {
            ids.push_back(p);
            if (p == to) break;
          }
        };
        run(-50, 50);                // |anchor| down to 0, then up
        run(kLimit - 70, kLimit);    // up to the limit
        run(-kLimit, -kLimit + 40);  // from the negative limit
        run(120, 60);                // descending positive positions
        std::uniform_int_distribution<int64_t> p(-kLimit + 40, kLimit - 40);
        const int64_t start = p(testing::Rng());
        run(start, start + 37);
        const int64_t T = static_cast<int64_t>(ids.size());
        ExpectSinusoidalAddMatchesReference(*backend_, layout, d, dtype, ids);
        AbsoluteOptions o;
        o.sinusoidal_layout = layout;
        AbsoluteTensors in;
        in.positions.position_ids = testing::IntView(ids, {T});
        // Inputs the CPU's vectorised conversions must treat as the scalar
        // ones (FloatToBFloat16) do, bit for bit: NaN of either sign stays NaN
        // (quieted), infinities, overflow to inf, signed zeros.
        const float specials[] = {NAN, -NAN, INFINITY, -INFINITY, 3e38f, -3e38f, 0.0f, -0.0f};
        Bytes y = testing::RandomTensor(dtype, T * d);
        for (int64_t i = 0; i < T * d; i += 7) {
          StoreElement(dtype, y.data(), i, specials[(i / 7) % 8]);
        }
        o.x_scale = 3.0;
        in.x = testing::Mutable(dtype, {T, d}, y);
        auto special_plan = PlanAbsolute(o, in);
        ASSERT_TRUE(special_plan.ok()) << special_plan.status();
        RunMatchingCpu(*backend_, {&y}, [&](Backend& be, const std::vector<Bytes*>& b) {
          return be.ApplyAbsolute(*special_plan, b[0]->data(), {});
        });
        for (int64_t i = 0; i < T * d; i += 7) {
          // x * 3 + PE is NaN exactly where x is (inf and overflow stay inf).
          ASSERT_EQ(std::isnan(LoadElement(dtype, y.data(), i)), std::isnan(specials[(i / 7) % 8]))
              << "element " << i;
        }
      }
    }
  }
}

// Sums that cancel: x is -PE rounded to the dtype (times x_scale's
// inverse), so x * x_scale + PE is PE's rounding residue, often far below an
// ulp of PE. float32 arithmetic alone misses the one-ulp bar there; the
// kernels must find these elements (SinusoidalSumNeedsPrecise) and redo them
// in double. Consecutive positions and d = 4096 take the CPU's fused vector
// loop, d = 77 its scalar tail.
TEST_P(BackendTest, SinusoidalCancellingSumsMeetTheBar) {
  for (SinusoidalLayout layout :
       {SinusoidalLayout::kInterleaved, SinusoidalLayout::kConcatenated}) {
    for (int64_t d : {77, 4096}) {
      for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
        for (double x_scale : {1.0, 8.0}) {
          SCOPED_TRACE(::testing::Message() << "layout " << int(layout) << " d " << d << " "
                                            << DTypeName(dtype) << " x_scale " << x_scale);
          std::uniform_int_distribution<int64_t> start(0, 1000000);
          const int64_t first = start(testing::Rng());
          const int64_t T = d == 77 ? 64 : 48;
          std::vector<int64_t> ids(T);
          for (int64_t t = 0; t < T; ++t) ids[t] = first + t;
          AbsoluteOptions o;
          o.sinusoidal_layout = layout;
          o.x_scale = x_scale;
          Bytes x(T * d * SizeOf(dtype));
          std::vector<double> ref(T * d);
          std::bernoulli_distribution cancel(0.75);
          std::uniform_real_distribution<float> other(-1.0f, 1.0f);
          auto store = [&](int64_t e, double v, double pe) {
            StoreElement(dtype, x.data(), e, static_cast<float>(v));
            ref[e] = LoadElement(dtype, x.data(), e) * x_scale + pe;
          };
          for (int64_t t = 0; t < T; ++t) {
            const auto row = reference::SinusoidalRow(layout, o.base, d, ids[t]);
            for (int64_t i = 0; i < d; ++i) {
              const int64_t e = t * d + i;
              store(e, cancel(testing::Rng()) ? -row[i] / x_scale : other(testing::Rng()), row[i]);
              // Residues under 2^-20 are left out: the float64 reference's
              // own angle errs by up to ~2^-35 at these positions, which is
              // more than an ulp of a residue near 2^-30. Above 2^-20 an ulp
              // is 2^-27 or more, while float32 arithmetic errs by ~2^-22.
              if (std::abs(ref[e]) < 0x1p-20) store(e, other(testing::Rng()), row[i]);
            }
          }
          AbsoluteTensors in;
          in.x = testing::Mutable(dtype, {T, d}, x);
          in.positions.position_ids = testing::IntView(ids, {T});
          auto plan = PlanAbsolute(o, in);
          ASSERT_TRUE(plan.ok()) << plan.status();
          RunMatchingCpu(*backend_, {&x}, [&](Backend& be, const std::vector<Bytes*>& b) {
            return be.ApplyAbsolute(*plan, b[0]->data(), {});
          });
          EXPECT_TRUE(testing::MatchesReference(dtype, ref, x.data(), 1e-6));
        }
      }
    }
  }
}

TEST_P(BackendTest, Seed003TableIsReproduced) {
  // Seed 003 prints getPositionEncoding(seq_len=4, d=4, n=100).
  const double printed[4][4] = {{0., 1., 0., 1.},
                                {0.84147098, 0.54030231, 0.09983342, 0.99500417},
                                {0.90929743, -0.41614684, 0.19866933, 0.98006658},
                                {0.14112001, -0.9899925, 0.29552021, 0.95533649}};
  AbsoluteOptions o;
  o.base = 100;
  auto plan = PlanEncodingTable(o, 4, DType::kFloat32, TensorView{}, 4);
  ASSERT_TRUE(plan.ok()) << plan.status();
  Bytes out = testing::Poisoned(DType::kFloat32, 16);
  RunMatchingCpu(*backend_, {&out}, [&](Backend& be, const std::vector<Bytes*>& b) {
    return be.ApplyAbsolute(*plan, b[0]->data(), {});
  });
  for (int p = 0; p < 4; ++p) {
    for (int i = 0; i < 4; ++i) {
      EXPECT_NEAR(testing::ReadDouble(DType::kFloat32, out.data(), p * 4 + i), printed[p][i], 6e-8)
          << "PE[" << p << ", " << i << "]";
    }
  }
}

TEST_P(BackendTest, LearnedTableAddsRowsAndRejectsOutOfRange) {
  auto table = std::make_shared<LearnedTable>();
  table->name = "gpt2/wpe";
  table->rows = 50;
  table->dim = 24;
  Bytes tb = testing::RandomTensor(DType::kFloat32, 50 * 24);
  for (double v : testing::ToDoubles(DType::kFloat32, tb)) table->values.push_back(float(v));
  AbsoluteOptions o;
  o.kind = AbsoluteOptions::Kind::kLearned;
  o.table = table;
  o.x_scale = 0.5;
  for (DType dtype : kFloatTypes) {
    Bytes x = testing::RandomTensor(dtype, 7 * 24);
    std::vector<double> ref = testing::ToDoubles(dtype, x);
    std::vector<int32_t> cu = {0, 3, 7};
    std::vector<int32_t> off = {10, 46};  // the second sequence ends at 49
    for (int64_t t = 0; t < 7; ++t) {
      const int64_t pos = t < 3 ? 10 + t : 46 + (t - 3);
      for (int i = 0; i < 24; ++i)
        ref[t * 24 + i] = ref[t * 24 + i] * 0.5 + table->values[pos * 24 + i];
    }
    AbsoluteTensors in;
    in.x = testing::Mutable(dtype, {7, 24}, x);
    in.cu_seqlens = testing::IntView(cu, {3});
    in.positions.offsets = testing::IntView(off, {2});
    auto plan = PlanAbsolute(o, in);
    ASSERT_TRUE(plan.ok()) << plan.status();
    RunMatchingCpu(*backend_, {&x}, [&](Backend& be, const std::vector<Bytes*>& b) {
      return be.ApplyAbsolute(*plan, b[0]->data(), {});
    });
    EXPECT_TRUE(testing::MatchesReference(dtype, ref, x.data(), 1e-6)) << DTypeName(dtype);

    off[1] = 47;  // last token at 50: out of the table
    auto bad = PlanAbsolute(o, in);
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(bad.status().message().find("position 50"), std::string_view::npos) << bad.status();
    EXPECT_NE(bad.status().message().find("length 50"), std::string_view::npos) << bad.status();
  }
}

// -------------------------------------------------------- attention bias ----

TEST(AlibiSlopes, MatchThePaperFor1To130Heads) {
  for (int64_t n = 1; n <= 130; ++n) {
    const std::vector<double> ours = AlibiSlopes(n);
    const std::vector<double> paper = reference::PaperAlibiSlopes(n);
    ASSERT_EQ(ours.size(), paper.size()) << n;
    for (int64_t h = 0; h < n; ++h) {
      // The paper chains products, drifting by about one ulp.
      EXPECT_NEAR(ours[h], paper[h], 1e-14 * paper[h]) << "n " << n << " head " << h;
    }
  }
  EXPECT_EQ(AlibiSlopes(8)[0], 0.5);
  EXPECT_EQ(AlibiSlopes(8)[7], 1.0 / 256);
}

void CheckBias(Backend& backend, const BiasOptions& o, bool with_logits) {
  const int64_t n = o.batch * o.num_heads * o.q_len * o.k_len;
  Bytes out = with_logits ? testing::RandomTensor(o.dtype, n) : testing::Poisoned(o.dtype, n);
  std::vector<double> logits =
      with_logits ? testing::ToDoubles(o.dtype, out) : std::vector<double>(n, 0.0);
  TensorView lv;
  if (with_logits)
    lv = TensorView{o.dtype, {o.batch, o.num_heads, o.q_len, o.k_len}, out.data(), out.size()};
  auto plan = PlanAttentionBias(o, lv);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<double> ref(n);
  int64_t e = 0;
  for (int64_t b = 0; b < o.batch; ++b)
    for (int64_t h = 0; h < o.num_heads; ++h)
      for (int64_t i = 0; i < o.q_len; ++i)
        for (int64_t j = 0; j < o.k_len; ++j, ++e)
          ref[e] = logits[e] + reference::Bias(*plan, b, h, i, j);
  RunMatchingCpu(backend, {&out}, [&](Backend& be, const std::vector<Bytes*>& b) {
    return be.ApplyAttentionBias(*plan, b[0]->data(), {});
  });
  EXPECT_TRUE(testing::MatchesReference(o.dtype, ref, out.data(), 1e-6));
}

TEST_P(BackendTest, AttentionBiasFormsAndMasks) {
  std::vector<int64_t> k_lens = {9, 3};
  std::vector<int32_t> k_starts = {4, 3};
  for (DType dtype : kFloatTypes) {
    for (BiasForm form : {BiasForm::kNone, BiasForm::kCausal, BiasForm::kSymmetric}) {
      for (bool logits : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << DTypeName(dtype) << " form " << int(form) << " logits " << logits);
        BiasOptions o;
        o.dtype = dtype;
        o.form = form;
        o.batch = 2;
        o.num_heads = 12;
        o.q_len = 4;
        o.k_len = 9;
        CheckBias(*backend_, o, logits);
        o.causal = true;
        o.window = 3;
        o.k_lens = testing::IntView(k_lens, {2});
        CheckBias(*backend_, o, logits);
        o.q_offset = 2;
        o.slopes = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, -1.2};
        CheckBias(*backend_, o, logits);
        o.k_starts = testing::IntView(k_starts, {2});  // the second sequence: no real key
        CheckBias(*backend_, o, logits);
      }
    }
  }
}

// The bias `o` describes, built on `backend` into a poisoned buffer (and
// checked against the CPU backend's for a GPU one).
Bytes BuiltBias(Backend& backend, const BiasOptions& o) {
  auto plan = PlanAttentionBias(o, {});
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return {};
  Bytes out = testing::Poisoned(o.dtype, plan->NumElements());
  RunMatchingCpu(backend, {&out}, [&](Backend& be, const std::vector<Bytes*>& b) {
    return be.ApplyAttentionBias(*plan, b[0]->data(), {});
  });
  return out;
}

// Left padding on random batches (prefill and decode, with and without
// right padding, windows, own slopes, INT32 and INT64 starts): against the
// float64 reference, built and added to logits; and then the property
// k_starts promises: keys before k_starts[b] are -inf, and sequence b's
// real keys carry exactly the bias of the same sequence sent unpadded (its
// keys and queries moved left by k_starts[b]), bit for bit.
TEST_P(BackendTest, LeftPaddingMasksKeysBeforeKStartsAndMovesNoDistance) {
  std::mt19937_64& rng = testing::Rng();
  for (int trial = 0; trial < 60; ++trial) {
    BiasOptions o;
    o.dtype = kFloatTypes[rng() % 3];
    o.form =
        std::vector<BiasForm>{BiasForm::kNone, BiasForm::kCausal, BiasForm::kSymmetric}[rng() % 3];
    o.batch = 1 + rng() % 5;
    o.num_heads = 1 + rng() % 13;
    o.k_len = 1 + rng() % 70;
    o.q_len = rng() % 2 ? o.k_len : 1 + rng() % std::min<int64_t>(o.k_len, 4);
    o.causal = rng() % 4 != 0;
    o.window = rng() % 3 == 0 ? 1 + rng() % 9 : 0;
    if (rng() % 3 == 0) {
      for (int64_t h = 0; h < o.num_heads; ++h) o.slopes.push_back((int(rng() % 200) - 100) / 37.0);
    }
    const bool right_padding = rng() % 2;
    std::vector<int64_t> ends(o.batch, o.k_len), starts(o.batch);
    for (int64_t b = 0; b < o.batch; ++b) {
      if (right_padding) ends[b] = rng() % (o.k_len + 1);
      starts[b] = rng() % (ends[b] + 1);
    }
    std::vector<int32_t> starts32(starts.begin(), starts.end());
    if (right_padding) o.k_lens = testing::IntView(ends, {o.batch});
    o.k_starts =
        rng() % 2 ? testing::IntView(starts, {o.batch}) : testing::IntView(starts32, {o.batch});
    ::testing::Message what;
    what << "trial " << trial << " " << DTypeName(o.dtype) << " form " << int(o.form) << " ["
         << o.batch << ", " << o.num_heads << ", " << o.q_len << ", " << o.k_len << "] causal "
         << o.causal << " window " << o.window << " starts";
    for (int64_t s : starts) what << " " << s;
    SCOPED_TRACE(what);
    CheckBias(*backend_, o, /*with_logits=*/false);
    CheckBias(*backend_, o, /*with_logits=*/true);

    const Bytes padded = BuiltBias(*backend_, o);
    ASSERT_FALSE(padded.empty());
    for (int64_t b = 0; b < o.batch; ++b) {
      const int64_t s = starts[b];
      BiasOptions u = o;
      u.batch = 1;
      u.k_len = o.k_len - s;
      u.q_offset = (o.k_len - o.q_len) - s;
      std::vector<int64_t> end = {ends[b] - s};
      u.k_lens = testing::IntView(end, {1});
      u.k_starts = {};
      const Bytes unpadded = BuiltBias(*backend_, u);
      if (u.k_len > 0) ASSERT_FALSE(unpadded.empty());
      int64_t bad = 0;
      for (int64_t h = 0; h < o.num_heads; ++h) {
        for (int64_t i = 0; i < o.q_len; ++i) {
          const int64_t row = (b * o.num_heads + h) * o.q_len + i;
          const int64_t urow = h * o.q_len + i;
          for (int64_t j = 0; j < o.k_len; ++j) {
            const double got = testing::ReadDouble(o.dtype, padded.data(), row * o.k_len + j);
            const double want =
                j < s ? -std::numeric_limits<double>::infinity()
                      : testing::ReadDouble(o.dtype, unpadded.data(), urow * u.k_len + j - s);
            if (got != want && bad++ < 3) {
              ADD_FAILURE() << "b " << b << " h " << h << " i " << i << " j " << j << ": got "
                            << got << ", the unpadded sequence has " << want;
            }
          }
        }
      }
      EXPECT_EQ(bad, 0) << "sequence " << b;
    }
  }
}

TEST_P(BackendTest, SlidingWindowKeepsExactlyWKeys) {
  for (int64_t W : {1, 4, 16}) {
    BiasOptions o;
    o.num_heads = 2;
    o.q_len = 40;
    o.k_len = 40;
    o.causal = true;
    o.window = W;
    auto plan = PlanAttentionBias(o, {});
    ASSERT_TRUE(plan.ok());
    Bytes out = testing::Poisoned(DType::kFloat32, plan->NumElements());
    RunMatchingCpu(*backend_, {&out}, [&](Backend& be, const std::vector<Bytes*>& b) {
      return be.ApplyAttentionBias(*plan, b[0]->data(), {});
    });
    for (int64_t row = 0; row < 2 * 40; ++row) {
      const int64_t i = row % 40;
      int64_t kept = 0;
      for (int64_t j = 0; j < 40; ++j) {
        if (std::isfinite(testing::ReadDouble(DType::kFloat32, out.data(), row * 40 + j))) ++kept;
      }
      EXPECT_EQ(kept, std::min(W, i + 1)) << "window " << W << " row " << i;
    }
  }
}

// IEEE binary128, for sums that must be exact.
#ifdef __SIZEOF_FLOAT128__
using Quad = __float128;
#else
using Quad = long double;  // binary128 where there is no __float128 (aarch64)
static_assert(std::numeric_limits<long double>::digits == 113, "no binary128 type");
#endif

// The bias kernel's rounding contract, element by element and bit for bit
// (math/bias_math.h): a written bias is the double product -m * d rounded
// to float (whatever arithmetic the kernel uses to get there); a bias added
// to a logit is, for a slope that is a float and a row whose distances are
// all below 2^24, the exact sum logit - m * d rounded once to float, and
// otherwise the double product added to the logit in double and rounded to
// float; masked keys are -inf (the logit plus -inf). Then the float is
// stored as the dtype. `logit` is the stored input; `near` is the row's.
float ModelBias(const BiasPlan& p, int64_t b, int64_t h, int64_t i, int64_t j, float logit,
                bool near) {
  const float inf = std::numeric_limits<float>::infinity();
  const double ref = reference::Bias(p, b, h, i, j);
  if (std::isinf(ref)) return p.add_to_logits ? logit + -inf : -inf;
  if (!p.add_to_logits) return static_cast<float>(ref);
  if (p.form == BiasForm::kNone) return logit + 0.0f;
  const double m = p.slopes[h];
  int64_t dist = p.q_offset + i - j;
  if (p.form == BiasForm::kSymmetric) dist = std::abs(dist);
  if (static_cast<double>(static_cast<float>(m)) == m && near) {
    // Exact in binary128 for these tests' values: the float logit and the
    // 48-bit product span far fewer than 113 bits.
    return static_cast<float>(static_cast<Quad>(logit) -
                              static_cast<Quad>(m) * static_cast<Quad>(dist));
  }
  return static_cast<float>(static_cast<double>(logit) + ref);
}

// Whether every visible key of row (b, h, i) is within 2^24 of the query.
bool RowIsNear(const BiasPlan& p, int64_t b, int64_t h, int64_t i) {
  for (int64_t j = 0; j < p.k_len; ++j) {
    if (!std::isinf(reference::Bias(p, b, h, i, j)) &&
        std::abs(p.q_offset + i - j) >= (int64_t{1} << 24)) {
      return false;
    }
  }
  return true;
}

// Logits of varied magnitudes (2^-12 to 2^20; to 2^8 in float16, whose
// range ends at 65504), so that sums round at every scale; with `specials`,
// also zeros of both signs, infinities and NaN.
Bytes VariedLogits(DType dtype, int64_t n, bool specials) {
  std::mt19937_64& rng = testing::Rng();
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Bytes b(n * SizeOf(dtype));
  const float inf = std::numeric_limits<float>::infinity();
  const float special[] = {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN()};
  for (int64_t e = 0; e < n; ++e) {
    const int top = dtype == DType::kFloat16 ? 8 : 20;
    float v = std::ldexp(u(rng), static_cast<int>(rng() % (top + 13)) - 12);
    if (specials && rng() % 8 == 0) v = special[rng() % 5];
    StoreElement(dtype, b.data(), e, v);
  }
  return b;
}

// Runs `o` (onto logits when `logits` is not empty, else into a poisoned
// buffer) and checks every element against ModelBias bit for bit, or only
// the elements `sampled` picks; against the float64 reference within SPEC §5
// when `against_reference`. GPU backends also match the CPU bit for bit.
void CheckBiasBits(Backend& backend, const BiasOptions& o, Bytes logits,
                   const std::function<bool(int64_t)>& sampled, bool against_reference) {
  const bool add = !logits.empty();
  const int64_t n = o.batch * o.num_heads * o.q_len * o.k_len;
  ASSERT_GT(n, 0) << "set batch, num_heads, q_len and k_len";
  Bytes out = add ? logits : testing::Poisoned(o.dtype, n);
  TensorView lv;
  if (add) {
    lv =
        TensorView{o.dtype, {o.batch, o.num_heads, o.q_len, o.k_len}, logits.data(), logits.size()};
  }
  auto plan = PlanAttentionBias(o, lv);
  ASSERT_TRUE(plan.ok()) << plan.status();
  RunMatchingCpu(backend, {&out}, [&](Backend& be, const std::vector<Bytes*>& b) {
    return be.ApplyAttentionBias(*plan, b[0]->data(), {});
  });
  std::vector<double> ref;
  if (against_reference) ref.resize(n);
  const int es = static_cast<int>(SizeOf(o.dtype));
  int64_t bad = 0, e = 0;
  for (int64_t b = 0; b < plan->batch; ++b) {
    for (int64_t h = 0; h < plan->num_heads; ++h) {
      for (int64_t i = 0; i < plan->q_len; ++i) {
        const bool near = RowIsNear(*plan, b, h, i);
        for (int64_t j = 0; j < plan->k_len; ++j, ++e) {
          if (!against_reference && !sampled(j)) continue;
          const double logit = add ? testing::ReadDouble(o.dtype, logits.data(), e) : 0.0;
          if (against_reference) ref[e] = logit + reference::Bias(*plan, b, h, i, j);
          if (!sampled(j)) continue;
          uint8_t want[4];
          StoreElement(o.dtype, want, 0,
                       ModelBias(*plan, b, h, i, j, static_cast<float>(logit), near));
          const double got = testing::ReadDouble(o.dtype, out.data(), e);
          const double wanted = testing::ReadDouble(o.dtype, want, 0);
          const bool same = std::memcmp(out.data() + e * es, want, es) == 0 ||
                            (std::isnan(got) && std::isnan(wanted));
          if (!same && bad++ < 3) {
            ADD_FAILURE() << "b " << b << " h " << h << " i " << i << " j " << j << " (slope "
                          << plan->slopes[h] << ", logit " << logit << "): got " << got << ", want "
                          << wanted;
          }
        }
      }
    }
  }
  EXPECT_EQ(bad, 0);
  if (against_reference) EXPECT_TRUE(testing::MatchesReference(o.dtype, ref, out.data(), 1e-6));
}

// Random shapes, masks, slopes and query offsets (near and beyond the 2^24
// where the float arithmetic stops being exact, and at +-2^31), written and
// added, in every dtype: bit for bit against the rounding contract, and
// within SPEC §5 of the float64 reference.
TEST_P(BackendTest, AttentionBiasRoundsAsSpecifiedOnRandomRows) {
  std::mt19937_64& rng = testing::Rng();
  for (int trial = 0; trial < 120; ++trial) {
    BiasOptions o;
    o.dtype = kFloatTypes[rng() % 3];
    o.form =
        std::vector<BiasForm>{BiasForm::kNone, BiasForm::kCausal, BiasForm::kSymmetric}[rng() % 3];
    o.batch = 1 + rng() % 3;
    o.num_heads = 1 + rng() % 13;
    o.k_len = 1 + rng() % 80;
    o.q_len = 1 + rng() % 40;
    o.causal = rng() % 2;
    o.window = rng() % 3 == 0 ? 1 + rng() % (o.k_len + 3) : 0;
    const int64_t k = o.k_len;
    // Far rows overflow float16 (a -inf where the reference is finite):
    // those are checked bit for bit only.
    const int offset_case = rng() % 5;
    const bool far = offset_case >= 2;
    switch (offset_case) {
      case 0:  // default: bottom-right aligned
        break;
      case 1:
        o.q_offset = static_cast<int64_t>(rng() % 200) - 100;
        break;
      case 2:  // rows whose distances straddle 2^24
        o.q_offset = (int64_t{1} << 24) - o.q_len + static_cast<int64_t>(rng() % (2 * k)) - k;
        break;
      case 3:
        o.q_offset = -(int64_t{1} << 24) + static_cast<int64_t>(rng() % (2 * k)) - k;
        break;
      default:
        o.q_offset = rng() % 2 ? int64_t{1} << 31 : -(int64_t{1} << 31);
        break;
    }
    const int slopes = rng() % 4;  // default, float, not float, mixed
    if (slopes > 0) {
      for (int64_t h = 0; h < o.num_heads; ++h) {
        const bool as_float = slopes == 1 || (slopes == 3 && rng() % 2);
        const double s = as_float ? std::ldexp(static_cast<double>(1 + rng() % 4096),
                                               -12 - static_cast<int>(rng() % 12))
                                  : static_cast<double>(1 + rng() % 997) / 37.0;
        o.slopes.push_back(rng() % 4 == 0 ? -s : s);
      }
    }
    std::vector<int64_t> ends(o.batch, k), starts(o.batch, 0);
    const bool right = rng() % 2, left = rng() % 2;
    for (int64_t b = 0; b < o.batch; ++b) {
      if (right) ends[b] = rng() % (k + 1);
      if (left) starts[b] = rng() % (ends[b] + 1);
    }
    std::vector<int32_t> ends32(ends.begin(), ends.end());
    if (right) {
      o.k_lens =
          rng() % 2 ? testing::IntView(ends, {o.batch}) : testing::IntView(ends32, {o.batch});
    }
    if (left) o.k_starts = testing::IntView(starts, {o.batch});
    const int64_t n = o.batch * o.num_heads * o.q_len * k;
    for (int mode = 0; mode < 3; ++mode) {  // written, added, added with inf and NaN logits
      SCOPED_TRACE(::testing::Message()
                   << "trial " << trial << " mode " << mode << " " << DTypeName(o.dtype) << " form "
                   << int(o.form) << " [" << o.batch << ", " << o.num_heads << ", " << o.q_len
                   << ", " << k << "] q_offset " << o.q_offset.value_or(k - o.q_len) << " causal "
                   << o.causal << " window " << o.window << " slopes " << slopes << " right "
                   << right << " left " << left);
      CheckBiasBits(
          *backend_, o, mode == 0 ? Bytes{} : VariedLogits(o.dtype, n, mode == 2),
          [](int64_t) { return true; },
          /*against_reference=*/mode < 2 && !(far && o.dtype == DType::kFloat16));
    }
  }
}

// Rows longer than 2^24 keys: the CPU kernel walks them in chunks, and one
// row here is within 2^24 (float) while the next is not (double).
TEST_P(BackendTest, AttentionBiasRowsLongerThanTheFloatRange) {
  if (GetParam() == "cpu1") GTEST_SKIP() << "the cpu backend covers it";
  constexpr int64_t kBig = int64_t{1} << 24;
  for (bool add : {false, true}) {
    for (BiasForm form : {BiasForm::kCausal, BiasForm::kNone}) {
      SCOPED_TRACE(::testing::Message() << "add " << add << " form " << int(form));
      BiasOptions o;
      o.dtype = DType::kBFloat16;
      o.form = form;
      o.batch = 1;
      o.num_heads = 1;
      o.q_len = 2;
      o.k_len = kBig + 3;
      o.q_offset = kBig - 1;  // row 0 sees keys [0, 2^24), row 1 one more
      o.causal = true;
      o.slopes = {0.75};
      // Sampled: the ends, both sides of each chunk boundary, and a stride.
      auto sampled = [](int64_t j) {
        return j < 4 || j % 4099 == 0 || std::abs(j - kBig) < 4 || j > kBig;
      };
      CheckBiasBits(*backend_, o, add ? VariedLogits(o.dtype, 2 * o.k_len, false) : Bytes{},
                    sampled, /*against_reference=*/false);
    }
  }
}

// ------------------------------------------------------- planning errors ----

TEST(Planning, ErrorsNameFieldExpectationAndValue) {
  Bytes q = testing::RandomTensor(DType::kFloat32, 2 * 3 * 4 * 64);
  RopeTensors in;
  in.query = testing::Mutable(DType::kFloat32, {2, 3, 4, 64}, q);
  RopeOptions o;
  o.rotary_dim = 63;
  auto r = PlanRope(o, in);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("rotary_dim must be even"), std::string_view::npos)
      << r.status();
  EXPECT_NE(r.status().message().find("got 63"), std::string_view::npos) << r.status();

  o.rotary_dim = 0;
  in.query.nbytes -= 4;
  r = PlanRope(o, in);
  EXPECT_NE(r.status().message().find("needs 6144 bytes"), std::string_view::npos) << r.status();
  EXPECT_NE(r.status().message().find("got 6140 bytes"), std::string_view::npos) << r.status();

  in.query.nbytes += 4;
  Bytes k = testing::RandomTensor(DType::kFloat32, 2 * 3 * 4 * 32);
  in.key = testing::Mutable(DType::kFloat32, {2, 3, 4, 32}, k);
  r = PlanRope(o, in);
  EXPECT_NE(r.status().message().find("key.shape"), std::string_view::npos) << r.status();

  in.key = {};
  in.query.shape = {2, 3, 256};
  r = PlanRope(o, in);
  EXPECT_NE(r.status().message().find("rank 4"), std::string_view::npos) << r.status();
}

TEST(Planning, ZeroSizedTensorsAreLegalAndEmpty) {
  Bytes none;
  RopeTensors in;
  in.query = testing::Mutable(DType::kBFloat16, {0, 5, 4, 64}, none);
  auto r = PlanRope(RopeOptions{}, in);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->empty());
  auto cpu = CreateCpuBackend(2);
  EXPECT_TRUE(cpu->ApplyRope(*r, none.data(), nullptr, {}).ok());
}

TEST(Planning, CancelledCallStops) {
  auto cpu = CreateCpuBackend(2);
  Bytes q = testing::RandomTensor(DType::kFloat32, 64 * 8 * 64);
  RopeTensors in;
  in.query = testing::Mutable(DType::kFloat32, {1, 64, 8, 64}, q);
  auto plan = PlanRope(RopeOptions{}, in);
  ASSERT_TRUE(plan.ok());
  RunContext ctx;
  ctx.cancelled = [] { return true; };
  EXPECT_EQ(cpu->ApplyRope(*plan, q.data(), nullptr, ctx).code(), absl::StatusCode::kCancelled);
}

// Both backends run the same operations in the same order (the CUDA build
// disables FMA contraction), so their outputs agree bit for bit.
TEST_P(BackendTest, AgreesWithCpuBitForBit) {
  if (backend_->kind() == BackendKind::kCpu) GTEST_SKIP() << "compares a GPU with the CPU";
  auto cpu = CreateCpuBackend(2);
  for (DType dtype : kFloatTypes) {
    for (RopeStyle style : kStyles) {
      RopeOptions o;
      o.style = style;
      o.scaling.type = ScalingType::kYarn;
      o.scaling.factor = 8;
      o.scaling.original_max_position = 4096;
      Bytes q = testing::RandomTensor(dtype, 5 * 33 * 6 * 128);
      Bytes k = testing::RandomTensor(dtype, 5 * 33 * 2 * 128);
      Bytes q2 = q, k2 = k;
      std::vector<int64_t> off = {0, 9999999, -5, 123456, 77};
      RopeTensors t;
      t.query = testing::Mutable(dtype, {5, 33, 6, 128}, q);
      t.key = testing::Mutable(dtype, {5, 33, 2, 128}, k);
      t.positions.offsets = testing::IntView(off, {5});
      auto plan = PlanRope(o, t);
      ASSERT_TRUE(plan.ok());
      ASSERT_TRUE(backend_->ApplyRope(*plan, q.data(), k.data(), {}).ok());
      ASSERT_TRUE(cpu->ApplyRope(*plan, q2.data(), k2.data(), {}).ok());
      EXPECT_EQ(q, q2) << DTypeName(dtype) << " style " << int(style);
      EXPECT_EQ(k, k2) << DTypeName(dtype) << " style " << int(style);
    }
    AbsoluteOptions a;
    auto table = PlanEncodingTable(a, 1024, dtype, TensorView{}, 300);
    ASSERT_TRUE(table.ok());
    Bytes g = testing::Poisoned(dtype, 300 * 1024), c = testing::Poisoned(dtype, 300 * 1024);
    ASSERT_TRUE(backend_->ApplyAbsolute(*table, g.data(), {}).ok());
    ASSERT_TRUE(cpu->ApplyAbsolute(*table, c.data(), {}).ok());
    EXPECT_EQ(g, c) << "sinusoidal table " << DTypeName(dtype);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, BackendTest,
                         ::testing::Values("cpu", "cpu1", "emulated", "emulated_1sm", "cuda"));

}  // namespace
}  // namespace posenc
