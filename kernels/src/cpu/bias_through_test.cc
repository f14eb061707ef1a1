#include "cpu/bias_through.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cpu/cpu_kernels.h"
#include "failing_check.h"
#include "gtest/gtest.h"
#include "posenc/attention_bias.h"
#include "posenc/backend.h"
#include "test_tensors.h"

namespace posenc {
namespace {

using testing::Bytes;

// A bias added to fresh random logits [batch, heads, q_len, k_len].
struct Case {
  Case(BiasOptions o, DType dtype, int64_t batch, int64_t heads, int64_t q_len, int64_t k_len)
      : options(std::move(o)), dtype(dtype), shape{batch, heads, q_len, k_len} {
    logits = testing::RandomTensor(dtype, batch * heads * q_len * k_len);
  }
  BiasPlan Plan() const {
    Bytes copy = logits;
    auto plan = PlanAttentionBias(options, testing::Mutable(dtype, shape, copy).view());
    EXPECT_TRUE(plan.ok()) << plan.status();
    return *plan;
  }
  // What ApplyAttentionBias makes of the logits in place.
  Bytes Expected(Backend& b) const {
    Bytes y = logits;
    EXPECT_TRUE(b.ApplyAttentionBias(Plan(), y.data(), {}).ok());
    return y;
  }
  int64_t Rows() const { return shape[0] * shape[1] * shape[2]; }
  int64_t Elements() const { return Rows() * shape[3]; }
  std::string Name() const {
    return "form " + std::to_string(static_cast<int>(options.form)) + "/" + DTypeName(dtype) +
           "/causal " + std::to_string(options.causal) + "/window " +
           std::to_string(options.window) + "/" + std::to_string(shape[0]) + "x" +
           std::to_string(shape[1]) + "x" + std::to_string(shape[2]) + "x" +
           std::to_string(shape[3]);
  }

  BiasOptions options;
  DType dtype;
  std::vector<int64_t> shape;
  Bytes logits;
};

BiasOptions Options(BiasForm form, bool causal, int64_t window) {
  BiasOptions o;
  o.form = form;
  o.causal = causal;
  o.window = window;
  return o;
}

// Runs the through operation from c's logits into a poisoned out and
// checks it against ApplyAttentionBias in place, bit for bit, the logits
// as they were and before_write asked once a block (or piece of a row) at
// least.
void ExpectThroughGivesTheInPlaceResult(Backend& cpu, const Case& c) {
  SCOPED_TRACE(c.Name());
  const Bytes want = c.Expected(cpu);
  const BiasPlan plan = c.Plan();
  Bytes logits = c.logits;
  Bytes out = testing::Poisoned(c.dtype, c.Elements());
  BiasThrough t;
  t.logits = logits.data();
  t.out = out.data();
  std::atomic<int> asked{0};
  t.before_write = [&] {
    ++asked;
    return absl::OkStatus();
  };
  ASSERT_TRUE(cpu.ApplyAttentionBiasThrough(plan, t, {}).ok());
  EXPECT_TRUE(out == want) << "out differs from the in-place result";
  EXPECT_TRUE(logits == c.logits) << "the logits changed";
  const int64_t block = internal::BiasThroughBlockRows(plan);
  const int64_t piece = internal::BiasThroughPieceKeys(plan);
  const int64_t blocks = piece < plan.k_len ? c.Rows() * ((plan.k_len + piece - 1) / piece)
                                            : (c.Rows() + block - 1) / block;
  EXPECT_GE(asked.load(), blocks) << "once a block at least";
}

// Every form, with and without the causal mask and a window, in every
// dtype, with padded sequences (k_starts, k_lens) and queries past the
// keys' start (q_offset): over several blocks and both threads' chunks.
TEST(BiasThrough, GivesApplyAttentionBiasesResultAndLeavesTheLogits) {
  auto cpu = CreateCpuBackend(2);
  const std::vector<int64_t> k_lens = {1500, 977, 1200};
  const std::vector<int64_t> k_starts = {0, 301, 17};
  for (BiasForm form : {BiasForm::kNone, BiasForm::kCausal, BiasForm::kSymmetric}) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      BiasOptions o = Options(form, form != BiasForm::kSymmetric, 0);
      o.k_lens = testing::IntView(k_lens, {3});
      o.k_starts = testing::IntView(k_starts, {3});
      // 2400 rows: both threads, each chunk several blocks.
      const Case padded(o, dtype, 3, 4, 200, 1500);
      EXPECT_LT(internal::BiasThroughBlockRows(padded.Plan()), padded.Rows()) << "several blocks";
      ExpectThroughGivesTheInPlaceResult(*cpu, padded);
    }
    BiasOptions windowed = Options(form, true, 129);
    windowed.q_offset = 700;
    ExpectThroughGivesTheInPlaceResult(*cpu, Case(windowed, DType::kBFloat16, 1, 8, 300, 1024));
  }
  // One row; rows of one key.
  ExpectThroughGivesTheInPlaceResult(
      *cpu, Case(Options(BiasForm::kCausal, false, 0), DType::kFloat32, 1, 1, 1, 4096));
  ExpectThroughGivesTheInPlaceResult(
      *cpu, Case(Options(BiasForm::kSymmetric, false, 0), DType::kBFloat16, 2, 3, 999, 1));
}

// Rows larger than a block (a long context's decode: 100000 bfloat16 keys
// are 195 KiB) go in pieces of keys through the thread's own buffer, no
// memory of the caller's asked for: the same result, every form and
// dtype, with padding, a window and rows whose distances pass 2^24 (the
// double formulas).
TEST(BiasThrough, RowsLargerThanABlockGoInPieces) {
  auto cpu = CreateCpuBackend(2);
  const std::vector<int64_t> k_lens = {100000, 71234};
  const std::vector<int64_t> k_starts = {0, 60001};
  for (BiasForm form : {BiasForm::kNone, BiasForm::kCausal, BiasForm::kSymmetric}) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      BiasOptions o = Options(form, form == BiasForm::kCausal, 0);
      o.k_lens = testing::IntView(k_lens, {2});
      o.k_starts = testing::IntView(k_starts, {2});
      const Case padded(o, dtype, 2, 2, 3, 100000);
      ASSERT_LT(internal::BiasThroughPieceKeys(padded.Plan()), 100000) << "in pieces";
      ExpectThroughGivesTheInPlaceResult(*cpu, padded);
    }
  }
  BiasOptions windowed = Options(BiasForm::kCausal, true, 60000);
  windowed.q_offset = 30000;
  ExpectThroughGivesTheInPlaceResult(*cpu, Case(windowed, DType::kBFloat16, 1, 2, 3, 100000));
  BiasOptions far = Options(BiasForm::kSymmetric, false, 0);
  far.q_offset = (int64_t{1} << 24) + 5000;
  ExpectThroughGivesTheInPlaceResult(*cpu, Case(far, DType::kFloat32, 1, 1, 2, 60000));
  ExpectThroughGivesTheInPlaceResult(*cpu, Case(far, DType::kBFloat16, 1, 1, 2, 100000));
  // Rows that fit a block are not cut.
  EXPECT_EQ(internal::BiasThroughPieceKeys(
                Case(Options(BiasForm::kCausal, true, 0), DType::kFloat32, 1, 1, 1, 40000).Plan()),
            40000);
}

// A row computed in pieces of keys (AttentionBiasKeysCpu, cut at random)
// is the row computed whole, bit for bit: every form and dtype, cuts in
// the masked head and tail and inside the visible range, pieces shorter
// than a vector step, rows past 2^24 from their query (the double
// formulas), logits holding infinities and NaNs.
TEST(BiasThrough, PiecesOfARowAreTheWholeRowsValues) {
  std::mt19937_64& rng = testing::Rng();
  for (BiasForm form : {BiasForm::kNone, BiasForm::kCausal, BiasForm::kSymmetric}) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      for (int variant = 0; variant < 4; ++variant) {
        const int64_t k_len = 1500 + static_cast<int64_t>(rng() % 1000);
        BiasOptions o = Options(form, variant == 1 || variant == 2, variant == 2 ? 300 : 0);
        const std::vector<int64_t> k_starts = {static_cast<int64_t>(rng() % 400), 0};
        const std::vector<int64_t> k_lens = {k_len - static_cast<int64_t>(rng() % 400), k_len};
        o.k_starts = testing::IntView(k_starts, {2});
        o.k_lens = testing::IntView(k_lens, {2});
        if (variant == 3) o.q_offset = (int64_t{1} << 24) + 700;  // some keys past 2^24
        Case c(o, dtype, 2, 2, 3, k_len);
        for (int i = 0; i < 20; ++i) {
          const auto at = static_cast<int64_t>(rng() % static_cast<uint64_t>(c.Elements()));
          StoreElement(dtype, c.logits.data(), at,
                       i % 3 == 0   ? std::numeric_limits<double>::infinity()
                       : i % 3 == 1 ? -std::numeric_limits<double>::infinity()
                                    : std::nan(""));
        }
        SCOPED_TRACE(c.Name());
        const BiasPlan plan = c.Plan();
        Bytes whole = c.logits;
        internal::AttentionBiasRowsCpu(plan, whole.data(), 0, c.Rows());
        const auto elem = static_cast<int64_t>(SizeOf(dtype));
        for (int64_t row = 0; row < c.Rows(); ++row) {
          for (int64_t k = 0; k < k_len;) {
            const int64_t most = rng() % 2 == 0 ? 40 : 700;
            const int64_t n = std::min(k_len - k, 1 + static_cast<int64_t>(rng() % most));
            const int64_t at = (row * k_len + k) * elem;
            Bytes piece(c.logits.begin() + at, c.logits.begin() + at + n * elem);
            internal::AttentionBiasKeysCpu(plan, piece.data(), row, k, k + n);
            ASSERT_TRUE(std::equal(piece.begin(), piece.end(), whole.begin() + at))
                << "row " << row << ", keys [" << k << ", " << k + n << ")";
            k += n;
          }
        }
      }
    }
  }
}

// before_write's error stops the call with it: on one thread the blocks
// before it went out whole and finished, nothing after; on two, every row
// of out is finished or as it was, and the other thread asks a few more
// times at most (while the error is being recorded), not to the end.
TEST(BiasThrough, AnErrorBeforeAWriteStopsTheCallThere) {
  for (int threads : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << threads << " threads");
    auto cpu = CreateCpuBackend(threads);
    const Case c(Options(BiasForm::kCausal, true, 0), DType::kBFloat16, 2, 16, 256, 1024);
    const Bytes want = c.Expected(*cpu);
    const BiasPlan plan = c.Plan();
    const int64_t block = internal::BiasThroughBlockRows(plan);
    ASSERT_LT(6 * block, c.Rows());
    Bytes logits = c.logits;
    const Bytes poison = testing::Poisoned(c.dtype, c.Elements());
    Bytes out = poison;
    BiasThrough t;
    t.logits = logits.data();
    t.out = out.data();
    testing::FailingCheck check(3, absl::FailedPreconditionError("input \"logits\": truncated"));
    t.before_write = check.Ask();
    const absl::Status s = cpu->ApplyAttentionBiasThrough(plan, t, {});
    EXPECT_EQ(s.message(), "input \"logits\": truncated") << s;
    EXPECT_EQ(check.failing_thread_asks_after(), 0) << "the failing thread went on";
    // failing_check.h: why a loose bound for the other thread.
    EXPECT_LE(check.other_asks_after(), threads == 1 ? 0 : 8)
        << "the other thread went on after the error";
    const size_t row = 1024 * 2;
    int64_t finished = 0;
    for (int64_t r = 0; r < c.Rows(); ++r) {
      const auto at = out.begin() + r * row;
      if (std::equal(at, at + row, want.begin() + r * row)) {
        ++finished;
      } else {
        ASSERT_TRUE(std::equal(at, at + row, poison.begin())) << "row " << r;
      }
    }
    if (threads == 1) {
      EXPECT_EQ(finished, 2 * block) << "the two blocks before the error";
      EXPECT_TRUE(std::equal(out.begin(), out.begin() + 2 * block * row, want.begin()));
    } else {
      EXPECT_GT(finished, 0);
    }
    EXPECT_TRUE(logits == c.logits);
  }
}

// Refused before anything is written: out overlapping the logits (either
// way), a plan without logits (a bias built whole). A caller who left:
// CANCELLED, nothing written.
TEST(BiasThrough, RefusesWhatItCannotDoAndWritesNothing) {
  auto cpu = CreateCpuBackend(2);
  const Case c(Options(BiasForm::kCausal, true, 0), DType::kFloat32, 1, 2, 10, 64);
  const BiasPlan plan = c.Plan();
  const size_t bytes = c.logits.size();
  Bytes room(3 * bytes, 0x11);
  const Bytes before = room;
  for (size_t out_at : {bytes / 2, size_t{0}}) {
    BiasThrough t;
    t.logits = room.data() + bytes / 4;
    t.out = room.data() + out_at;
    EXPECT_EQ(cpu->ApplyAttentionBiasThrough(plan, t, {}).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(room == before);
  }
  Bytes logits = c.logits, out = testing::Poisoned(c.dtype, c.Elements());
  const Bytes poison = out;
  BiasThrough t;
  t.logits = logits.data();
  t.out = out.data();
  BiasPlan built = plan;
  built.add_to_logits = false;
  EXPECT_EQ(cpu->ApplyAttentionBiasThrough(built, t, {}).code(),
            absl::StatusCode::kInvalidArgument);
  RunContext gone;
  gone.cancelled = [] { return true; };
  EXPECT_EQ(cpu->ApplyAttentionBiasThrough(plan, t, gone).code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(out == poison);
}

}  // namespace
}  // namespace posenc
