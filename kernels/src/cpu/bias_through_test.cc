#include "cpu/bias_through.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

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

// Runs the through operation from c's logits into a poisoned out (through
// `work` when given) and checks it against ApplyAttentionBias in place, bit
// for bit, the logits as they were and before_write asked once a block at
// least.
void ExpectThroughGivesTheInPlaceResult(Backend& cpu, const Case& c, Bytes* work = nullptr) {
  SCOPED_TRACE(c.Name());
  const Bytes want = c.Expected(cpu);
  const BiasPlan plan = c.Plan();
  Bytes logits = c.logits;
  Bytes out = testing::Poisoned(c.dtype, c.Elements());
  BiasThrough t;
  t.logits = logits.data();
  t.out = out.data();
  if (work != nullptr) t.work = work->data();
  std::atomic<int> asked{0};
  t.before_write = [&] {
    ++asked;
    return absl::OkStatus();
  };
  ASSERT_TRUE(cpu.ApplyAttentionBiasThrough(plan, t, {}).ok());
  EXPECT_TRUE(out == want) << "out differs from the in-place result";
  EXPECT_TRUE(logits == c.logits) << "the logits changed";
  const int64_t block = internal::BiasThroughBlockRows(plan);
  EXPECT_GE(asked.load(), (c.Rows() + block - 1) / block) << "once a block at least";
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

// Rows larger than a block go through the work memory, at their own
// offsets: the same result, refused without one.
TEST(BiasThrough, RowsLargerThanABlockGoThroughTheWorkMemory) {
  auto cpu = CreateCpuBackend(2);
  // bfloat16 rows of 100000 keys (195 KiB) take the vector loops.
  Bytes wide_work = testing::Poisoned(DType::kBFloat16, 2 * 3 * 100000);
  ExpectThroughGivesTheInPlaceResult(
      *cpu, Case(Options(BiasForm::kCausal, true, 0), DType::kBFloat16, 1, 2, 3, 100000),
      &wide_work);
  const Case c(Options(BiasForm::kCausal, true, 0), DType::kFloat32, 1, 2, 5, 70000);
  const BiasPlan plan = c.Plan();
  ASSERT_TRUE(cpu->BiasThroughNeedsWork(plan));
  ASSERT_FALSE(cpu->BiasThroughNeedsWork(
      Case(Options(BiasForm::kCausal, true, 0), DType::kFloat32, 1, 2, 5, 40000).Plan()));
  Bytes logits = c.logits, out = testing::Poisoned(c.dtype, c.Elements());
  const Bytes poison = out;
  BiasThrough t;
  t.logits = logits.data();
  t.out = out.data();
  EXPECT_EQ(cpu->ApplyAttentionBiasThrough(plan, t, {}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(out == poison);
  Bytes work = testing::Poisoned(c.dtype, c.Elements());
  ExpectThroughGivesTheInPlaceResult(*cpu, c, &work);
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
    std::atomic<int> asked{0};
    t.before_write = [&] {
      return ++asked == 3 ? absl::FailedPreconditionError("input \"logits\": truncated")
                          : absl::OkStatus();
    };
    const absl::Status s = cpu->ApplyAttentionBiasThrough(plan, t, {});
    EXPECT_EQ(s.message(), "input \"logits\": truncated") << s;
    EXPECT_LE(asked.load(), threads == 1 ? 3 : 6) << "a thread went on after the error";
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
// way), a work memory overlapping either, a plan without logits (a bias
// built whole). A caller who left: CANCELLED, nothing written.
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
  const Case wide(Options(BiasForm::kCausal, true, 0), DType::kFloat32, 1, 1, 2, 70000);
  const size_t wide_bytes = wide.logits.size();
  Bytes wide_room(3 * wide_bytes, 0x11);
  const Bytes wide_before = wide_room;
  for (size_t work_at : {wide_bytes / 2, 3 * wide_bytes / 2}) {
    BiasThrough t;
    t.logits = wide_room.data();
    t.out = wide_room.data() + 2 * wide_bytes;
    t.work = wide_room.data() + work_at;
    EXPECT_EQ(cpu->ApplyAttentionBiasThrough(wide.Plan(), t, {}).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(wide_room == wide_before);
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
