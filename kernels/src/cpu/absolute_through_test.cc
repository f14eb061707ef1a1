#include "cpu/absolute_through.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "failing_check.h"
#include "gtest/gtest.h"
#include "posenc/absolute.h"
#include "posenc/backend.h"
#include "test_tensors.h"

namespace posenc {
namespace {

using testing::Bytes;

// An absolute-encoding case with a fresh random x [batch, seq, dim].
struct Case {
  Case(AbsoluteOptions o, DType dtype, int64_t batch, int64_t seq, int64_t dim)
      : options(std::move(o)), dtype(dtype), batch(batch), seq(seq), dim(dim) {
    x = testing::RandomTensor(dtype, batch * seq * dim);
    offsets.resize(batch);
    for (int64_t b = 0; b < batch; ++b) offsets[b] = 37 * b + 5;
  }
  AbsolutePlan Plan() const {
    Bytes copy = x;
    AbsoluteTensors t;
    t.x = testing::Mutable(dtype, {batch, seq, dim}, copy);
    t.positions.offsets = testing::IntView(offsets, {batch});
    auto plan = PlanAbsolute(options, t);
    EXPECT_TRUE(plan.ok()) << plan.status();
    return *plan;
  }
  // What ApplyAbsolute makes of x in place.
  Bytes Expected(Backend& b) const {
    Bytes y = x;
    EXPECT_TRUE(b.ApplyAbsolute(Plan(), y.data(), {}).ok());
    return y;
  }
  std::string Name() const {
    return std::string(options.kind == AbsoluteOptions::Kind::kLearned ? "learned" : "sinusoidal") +
           "/" + std::to_string(static_cast<int>(options.sinusoidal_layout)) + "/" +
           DTypeName(dtype) + "/x_scale " + std::to_string(options.x_scale) + "/" +
           std::to_string(batch) + "x" + std::to_string(seq) + "x" + std::to_string(dim);
  }

  AbsoluteOptions options;
  DType dtype;
  int64_t batch, seq, dim;
  Bytes x;
  std::vector<int64_t> offsets;
};

std::shared_ptr<const LearnedTable> RandomTable(int64_t rows, int64_t dim) {
  const unsigned seed = std::random_device()();
  std::printf("table seed %u\n", seed);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto t = std::make_shared<LearnedTable>();
  t->name = "t";
  t->rows = rows;
  t->dim = dim;
  t->values.resize(rows * dim);
  for (float& v : t->values) v = u(rng);
  return t;
}

// From x into a poisoned y, block by block: ApplyAbsolute's in-place result
// bit for bit, for the sinusoidal encoding's layouts (the fused pass and
// the row-by-row one: float16, x_scale 0, odd d) and a learned table, in
// every dtype, over several blocks and both threads' chunks; x as it was.
TEST(AbsoluteThrough, GivesApplyAbsolutesResultAndLeavesX) {
  auto cpu = CreateCpuBackend(2);
  std::vector<Case> cases;
  for (SinusoidalLayout layout :
       {SinusoidalLayout::kInterleaved, SinusoidalLayout::kConcatenated}) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      AbsoluteOptions o;
      o.sinusoidal_layout = layout;
      cases.emplace_back(o, dtype, 3, 211, 256);
    }
    AbsoluteOptions scaled;
    scaled.sinusoidal_layout = layout;
    scaled.x_scale = 16.0;
    cases.emplace_back(scaled, DType::kBFloat16, 2, 300, 1024);
    AbsoluteOptions zero = scaled;
    zero.x_scale = 0.0;
    cases.emplace_back(zero, DType::kFloat32, 1, 2000, 33);
  }
  AbsoluteOptions learned;
  learned.kind = AbsoluteOptions::Kind::kLearned;
  learned.table = RandomTable(2048, 96);
  cases.emplace_back(learned, DType::kBFloat16, 2, 700, 96);
  cases.emplace_back(learned, DType::kFloat32, 1, 1, 96);
  // 4096 tokens of 4096: both threads, 21 blocks a chunk at most.
  cases.emplace_back(AbsoluteOptions{}, DType::kFloat32, 1, 4096, 4096);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.Name());
    const Bytes want = c.Expected(*cpu);
    const AbsolutePlan plan = c.Plan();
    if (c.batch * c.seq > 1) {
      EXPECT_LT(internal::AbsoluteThroughBlockTokens(plan), plan.num_tokens) << "several blocks";
    }
    Bytes x = c.x;
    Bytes y = testing::Poisoned(c.dtype, static_cast<int64_t>(c.x.size() / SizeOf(c.dtype)));
    AbsoluteThrough t;
    t.x = x.data();
    t.y = y.data();
    std::atomic<int> asked{0};
    t.before_write = [&] {
      ++asked;
      return absl::OkStatus();
    };
    ASSERT_TRUE(cpu->ApplyAbsoluteThrough(plan, t, {}).ok());
    EXPECT_TRUE(y == want) << "y differs from the in-place result";
    EXPECT_TRUE(x == c.x) << "x changed";
    const int64_t block = internal::AbsoluteThroughBlockTokens(plan);
    EXPECT_GE(asked.load(), (plan.num_tokens + block - 1) / block) << "once a block at least";
  }
}

// before_write's error stops the call with it: on one thread the blocks
// before it went out whole and finished, nothing after; on two, every
// token of y is finished or as it was, and the other thread asks a few
// more times at most (while the error is being recorded), not to the end.
TEST(AbsoluteThrough, AnErrorBeforeAWriteStopsTheCallThere) {
  for (int threads : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << threads << " threads");
    auto cpu = CreateCpuBackend(threads);
    const Case c(AbsoluteOptions{}, DType::kFloat32, 1, 8192, 1024);
    const Bytes want = c.Expected(*cpu);
    const AbsolutePlan plan = c.Plan();
    const int64_t block = internal::AbsoluteThroughBlockTokens(plan);
    ASSERT_LT(6 * block, plan.num_tokens);
    Bytes x = c.x;
    const Bytes poison = testing::Poisoned(c.dtype, 8192 * 1024);
    Bytes y = poison;
    AbsoluteThrough t;
    t.x = x.data();
    t.y = y.data();
    testing::FailingCheck check(3, absl::FailedPreconditionError("input \"x\": truncated"));
    t.before_write = check.Ask();
    const absl::Status s = cpu->ApplyAbsoluteThrough(plan, t, {});
    EXPECT_EQ(s.message(), "input \"x\": truncated") << s;
    EXPECT_EQ(check.failing_thread_asks_after(), 0) << "the failing thread went on";
    // failing_check.h: why a loose bound for the other thread.
    EXPECT_LE(check.other_asks_after(), threads == 1 ? 0 : 8)
        << "the other thread went on after the error";
    const size_t row = 1024 * 4;
    int64_t finished = 0;
    for (int64_t tok = 0; tok < plan.num_tokens; ++tok) {
      const auto at = y.begin() + tok * row;
      if (std::equal(at, at + row, want.begin() + tok * row)) {
        ++finished;
      } else {
        ASSERT_TRUE(std::equal(at, at + row, poison.begin())) << "token " << tok;
      }
    }
    if (threads == 1) {
      EXPECT_EQ(finished, 2 * block) << "the two blocks before the error";
      EXPECT_TRUE(std::equal(y.begin(), y.begin() + 2 * block * row, want.begin()));
    } else {
      EXPECT_GT(finished, 0);
    }
    EXPECT_TRUE(x == c.x);
  }
}

// Refused before anything is written: y overlapping x (either way), a plan
// without input (a table). A caller who left: CANCELLED, nothing written.
TEST(AbsoluteThrough, RefusesWhatItCannotDoAndWritesNothing) {
  auto cpu = CreateCpuBackend(2);
  const Case c(AbsoluteOptions{}, DType::kFloat32, 1, 100, 64);
  const AbsolutePlan plan = c.Plan();
  const size_t bytes = c.x.size();
  Bytes room(2 * bytes, 0x11);
  const Bytes before = room;
  for (size_t y_at : {bytes / 2, size_t{0}}) {
    AbsoluteThrough t;
    t.x = room.data() + bytes / 4;
    t.y = room.data() + y_at;
    EXPECT_EQ(cpu->ApplyAbsoluteThrough(plan, t, {}).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(room == before);
  }
  Bytes x = c.x, y = testing::Poisoned(c.dtype, 100 * 64);
  const Bytes poison = y;
  AbsoluteThrough t;
  t.x = x.data();
  t.y = y.data();
  AbsolutePlan table = plan;
  table.has_input = false;
  EXPECT_EQ(cpu->ApplyAbsoluteThrough(table, t, {}).code(), absl::StatusCode::kInvalidArgument);
  RunContext gone;
  gone.cancelled = [] { return true; };
  EXPECT_EQ(cpu->ApplyAbsoluteThrough(plan, t, gone).code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(y == poison);
}

}  // namespace
}  // namespace posenc
