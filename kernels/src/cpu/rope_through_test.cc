#include "cpu/rope_through.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "failing_check.h"
#include "gtest/gtest.h"
#include "posenc/backend.h"
#include "posenc/rope.h"
#include "test_tensors.h"

namespace posenc {
namespace {

using testing::Bytes;

// A RoPE case with fresh random query and key: their plan, and the result
// ApplyRope gives in place (what going through must give, bit for bit).
struct Case {
  Case(RopeLayout layout, DType dtype, RopeStyle style, int64_t batch, int64_t seq, bool with_key)
      : dtype(dtype), batch(batch), seq(seq) {
    options.layout = layout;
    options.style = style;
    options.rotary_dim = kHead - 16;  // the last 16 of each head pass through
    q = testing::RandomTensor(dtype, batch * seq * kQueryHeads * kHead);
    if (with_key) k = testing::RandomTensor(dtype, batch * seq * kKeyHeads * kHead);
    cu = {0, seq / 3 * batch, batch * seq};
    offsets.resize(batch);
    for (int64_t b = 0; b < batch; ++b) offsets[b] = 7 * b + 3;
  }
  RopeTensors At(Bytes& query, Bytes& key) const {
    RopeTensors t;
    const auto shape = [&](int64_t heads) -> std::vector<int64_t> {
      switch (options.layout) {
        case RopeLayout::kBHSD:
          return {batch, heads, seq, kHead};
        case RopeLayout::kTHD:
          return {batch * seq, heads, kHead};
        default:
          return {batch, seq, heads, kHead};
      }
    };
    t.query = testing::Mutable(dtype, shape(kQueryHeads), query);
    if (!key.empty()) t.key = testing::Mutable(dtype, shape(kKeyHeads), key);
    if (options.layout == RopeLayout::kTHD) {
      t.cu_seqlens = testing::IntView(cu, {3});
    } else {
      t.positions.offsets = testing::IntView(offsets, {batch});
    }
    return t;
  }
  RopePlan Plan() const {
    Bytes qq = q, kk = k;
    auto plan = PlanRope(options, At(qq, kk));
    EXPECT_TRUE(plan.ok()) << plan.status();
    return *plan;
  }
  // The in-place result.
  void Expected(Backend& b, Bytes* qo, Bytes* ko) const {
    *qo = q;
    *ko = k;
    const RopePlan plan = Plan();
    ASSERT_TRUE(b.ApplyRope(plan, qo->data(), ko->empty() ? nullptr : ko->data(), {}).ok());
  }

  static constexpr int64_t kQueryHeads = 8, kKeyHeads = 2, kHead = 64;
  RopeOptions options;
  DType dtype;
  int64_t batch, seq;
  Bytes q, k;
  std::vector<int64_t> cu, offsets;
};

// Case c's query (no key) through work memory into a poisoned output.
struct QueryThrough {
  explicit QueryThrough(const Case& c)
      : in(c.q),
        work(c.q.size()),
        out(testing::Poisoned(c.dtype, static_cast<int64_t>(c.q.size() / SizeOf(c.dtype)))),
        poison(out) {
    t.query = in.data();
    t.query_work = work.data();
    t.query_out = out.data();
  }
  Bytes in, work, out;
  const Bytes poison;
  RopeThrough t;
};

std::string Name(const Case& c) {
  return std::to_string(static_cast<int>(c.options.layout)) + "/" +
         std::to_string(static_cast<int>(c.dtype)) + "/" +
         std::to_string(static_cast<int>(c.options.style)) + "/" + std::to_string(c.batch) + "x" +
         std::to_string(c.seq) + (c.k.empty() ? "" : "+key");
}

// Into outputs of their own through work memory: the in-place result bit
// for bit in every layout, dtype and style, across several blocks (and,
// for the largest, both threads' chunks); the inputs as they were; every
// output element written (they start poisoned).
TEST(RopeThrough, GivesApplyRopesResultAndLeavesTheInputs) {
  auto cpu = CreateCpuBackend(2);
  std::vector<Case> cases;
  for (RopeLayout layout : {RopeLayout::kBSHD, RopeLayout::kBHSD, RopeLayout::kTHD}) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      cases.emplace_back(layout, dtype, RopeStyle::kNeox, 3, 97, true);
    }
    cases.emplace_back(layout, DType::kBFloat16, RopeStyle::kGptj, 2, 301, false);
    cases.emplace_back(layout, DType::kFloat32, RopeStyle::kGptj, 1, 1, true);
  }
  // 8192 tokens: ParallelFor splits them between the threads.
  cases.emplace_back(RopeLayout::kBHSD, DType::kFloat32, RopeStyle::kNeox, 2, 4096, true);
  cases.emplace_back(RopeLayout::kBHSD, DType::kBFloat16, RopeStyle::kGptj, 2, 4096, true);
  cases.emplace_back(RopeLayout::kBSHD, DType::kBFloat16, RopeStyle::kNeox, 2, 4096, true);
  for (const Case& c : cases) {
    SCOPED_TRACE(Name(c));
    Bytes want_q, want_k;
    c.Expected(*cpu, &want_q, &want_k);
    const RopePlan plan = c.Plan();
    ASSERT_GT(plan.num_tokens, 0);
    if (c.batch * c.seq > 1) {
      EXPECT_LT(internal::RopeThroughBlockTokens(plan), plan.num_tokens) << "several blocks";
    }
    Bytes q_in = c.q, k_in = c.k;
    Bytes q_out = testing::Poisoned(c.dtype, c.q.size() / SizeOf(c.dtype));
    Bytes k_out = testing::Poisoned(c.dtype, c.k.size() / SizeOf(c.dtype));
    // Blocks go through the thread's own buffer, BHSD's (one stretch a
    // head) gathered head after head: no work memory is given them, so a
    // use of it would crash.
    EXPECT_FALSE(cpu->RopeThroughNeedsWork(plan));
    RopeThrough t;
    t.query = q_in.data();
    t.query_out = q_out.data();
    if (!c.k.empty()) {
      t.key = k_in.data();
      t.key_out = k_out.data();
    }
    std::atomic<int> asked{0};
    t.before_write = [&] {
      ++asked;
      return absl::OkStatus();
    };
    ASSERT_TRUE(cpu->ApplyRopeThrough(plan, t, {}).ok());
    EXPECT_TRUE(q_out == want_q) << "query_out differs from the in-place result";
    EXPECT_TRUE(k_out == want_k) << "key_out differs from the in-place result";
    EXPECT_TRUE(q_in == c.q && k_in == c.k) << "an input changed";
    const int64_t block = internal::RopeThroughBlockTokens(plan);
    EXPECT_GE(asked.load(), (plan.num_tokens + block - 1) / block) << "once a block at least";
  }
}

// An output that partly overlaps its own input, lies on the other tensor's
// input, or on the other output is refused before anything is written:
// blocks on several threads would read what another had already written.
TEST(RopeThrough, OutputsOverlappingOtherTensorsAreRefusedBeforeAnyWrite) {
  auto cpu = CreateCpuBackend(2);
  const Case c(RopeLayout::kBSHD, DType::kBFloat16, RopeStyle::kNeox, 2, 97, true);
  const RopePlan plan = c.Plan();
  const size_t qn = c.q.size(), kn = c.k.size();
  // One arena: query, key, then room for outputs.
  Bytes arena(2 * (qn + kn) + 256, 0);
  const auto reset = [&] {
    std::fill(arena.begin(), arena.end(), 0x5a);
    std::memcpy(arena.data(), c.q.data(), qn);
    std::memcpy(arena.data() + qn, c.k.data(), kn);
  };
  uint8_t* q = arena.data();
  uint8_t* k = q + qn;
  uint8_t* free_space = k + kn;
  struct Bad {
    const char* what;
    uint8_t *query_out, *key_out;
  };
  const Bad cases[] = {
      {"query_out shifted over the query", q + 64, free_space + qn},
      {"query_out over the key", k, free_space},
      {"key_out over the query", free_space, q + 128},
      {"key_out over query_out", free_space, free_space + 64},
  };
  for (const Bad& b : cases) {
    SCOPED_TRACE(b.what);
    reset();
    const Bytes before = arena;
    RopeThrough t;
    t.query = q;
    t.key = k;
    t.query_out = b.query_out;
    t.key_out = b.key_out;
    EXPECT_EQ(cpu->ApplyRopeThrough(plan, t, {}).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(arena == before) << "written before the refusal";
  }
  // Both in place, and both apart: served.
  Bytes want_q, want_k;
  c.Expected(*cpu, &want_q, &want_k);
  reset();
  RopeThrough in_place;
  in_place.query = in_place.query_out = q;
  in_place.key = in_place.key_out = k;
  ASSERT_TRUE(cpu->ApplyRopeThrough(plan, in_place, {}).ok());
  EXPECT_TRUE(Bytes(q, q + qn) == want_q && Bytes(k, k + kn) == want_k);
  reset();
  RopeThrough apart;
  apart.query = q;
  apart.key = k;
  apart.query_out = free_space;
  apart.key_out = free_space + qn;
  ASSERT_TRUE(cpu->ApplyRopeThrough(plan, apart, {}).ok());
  EXPECT_TRUE(Bytes(free_space, free_space + qn) == want_q);
  EXPECT_TRUE(Bytes(free_space + qn, free_space + qn + kn) == want_k);
}

// A tensor whose work memory is its input and output is rotated in place
// there, beside one that goes through (KServe: key_out not asked for).
TEST(RopeThrough, ATensorWithoutAnOutputOfItsOwnIsRotatedInPlace) {
  auto cpu = CreateCpuBackend(2);
  for (RopeLayout layout : {RopeLayout::kBSHD, RopeLayout::kBHSD}) {
    const Case c(layout, DType::kBFloat16, RopeStyle::kNeox, 2, 700, true);
    SCOPED_TRACE(Name(c));
    Bytes want_q, want_k;
    c.Expected(*cpu, &want_q, &want_k);
    Bytes q_in = c.q, key = c.k;
    Bytes q_work = testing::Poisoned(c.dtype, c.q.size() / 2), q_out = q_work;
    RopeThrough t;
    t.query = q_in.data();
    t.query_work = q_work.data();
    t.query_out = q_out.data();
    t.key = t.key_work = t.key_out = key.data();
    ASSERT_TRUE(cpu->ApplyRopeThrough(c.Plan(), t, {}).ok());
    EXPECT_TRUE(q_out == want_q);
    EXPECT_TRUE(key == want_k);
    EXPECT_TRUE(q_in == c.q);
  }
}

// The same on two threads, each with chunks of its own: the first error is
// the call's, both stop, and every token of the output is either finished
// or as it was.
TEST(RopeThrough, AnErrorOnOneThreadStopsBoth) {
  auto cpu = CreateCpuBackend(2);
  const Case c(RopeLayout::kBSHD, DType::kFloat32, RopeStyle::kNeox, 1, 16384, false);
  Bytes want_q, want_k;
  c.Expected(*cpu, &want_q, &want_k);
  const RopePlan plan = c.Plan();
  QueryThrough x(c);
  RopeThrough& t = x.t;
  testing::FailingCheck check(5, absl::FailedPreconditionError("input \"query\": truncated"));
  t.before_write = check.Ask();
  const absl::Status s = cpu->ApplyRopeThrough(plan, t, {});
  EXPECT_EQ(s.message(), "input \"query\": truncated") << s;
  EXPECT_EQ(check.failing_thread_asks_after(), 0) << "the failing thread went on";
  // The other thread may be asking at that moment (and longer, where the
  // failing one is descheduled before it sets the stop: failing_check.h).
  EXPECT_LE(check.other_asks_after(), 8) << "the other thread went on after the error";
  const size_t row = Case::kQueryHeads * Case::kHead * 4;
  int64_t finished = 0;
  for (int64_t tok = 0; tok < plan.num_tokens; ++tok) {
    const auto at = x.out.begin() + tok * row;
    if (std::equal(at, at + row, want_q.begin() + tok * row)) {
      ++finished;
    } else {
      ASSERT_TRUE(std::equal(at, at + row, x.poison.begin())) << "token " << tok;
    }
  }
  EXPECT_GT(finished, 0);
  EXPECT_TRUE(x.in == c.q);
}

// A token larger than a block (1024 heads of 64 float32: 256 KiB) goes
// through the work memory at its own offsets, not a thread buffer that
// size: the same result, the input as it was, in either layout.
TEST(RopeThrough, TokensLargerThanABlockGoThroughTheWorkMemory) {
  auto cpu = CreateCpuBackend(2);
  for (RopeLayout layout : {RopeLayout::kBSHD, RopeLayout::kBHSD}) {
    SCOPED_TRACE(layout == RopeLayout::kBHSD ? "BHSD" : "BSHD");
    Bytes q = testing::RandomTensor(DType::kFloat32, 3 * 1024 * 64);
    RopeTensors t;
    t.query = testing::Mutable(DType::kFloat32,
                               layout == RopeLayout::kBHSD ? std::vector<int64_t>{1, 1024, 3, 64}
                                                           : std::vector<int64_t>{1, 3, 1024, 64},
                               q);
    RopeOptions o;
    o.layout = layout;
    auto plan = PlanRope(o, t);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_EQ(internal::RopeThroughBlockTokens(*plan), 1);
    Bytes want = q;
    ASSERT_TRUE(cpu->ApplyRope(*plan, want.data(), nullptr, {}).ok());
    const Bytes in = q;
    Bytes work = testing::Poisoned(DType::kFloat32, q.size() / 4), out = work;
    RopeThrough through;
    through.query = q.data();
    through.query_work = work.data();
    through.query_out = out.data();
    ASSERT_TRUE(cpu->ApplyRopeThrough(*plan, through, {}).ok());
    EXPECT_TRUE(out == want);
    EXPECT_TRUE(q == in);
    EXPECT_TRUE(work == want) << "rotated in the work memory";
    // A work memory that is its input, with an output elsewhere, would
    // rotate the input: refused before anything is written.
    const Bytes untouched = out;
    through.query_work = q.data();
    EXPECT_EQ(cpu->ApplyRopeThrough(*plan, through, {}).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(q == in && out == untouched);
    // So would none at all, where the plan needs it.
    EXPECT_TRUE(cpu->RopeThroughNeedsWork(*plan));
    through.query_work = nullptr;
    EXPECT_EQ(cpu->ApplyRopeThrough(*plan, through, {}).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(q == in && out == untouched);
  }
}

// before_write's error stops the call with it: the blocks before it went
// out whole and finished, nothing after it did (one thread: blocks in
// order). In BHSD a block's tokens are written in every head.
TEST(RopeThrough, AnErrorBeforeAWriteStopsTheCallThere) {
  auto cpu = CreateCpuBackend(1);
  for (RopeLayout layout : {RopeLayout::kBHSD, RopeLayout::kBSHD}) {
    const Case c(layout, DType::kFloat32, RopeStyle::kNeox, 1, 1000, false);
    SCOPED_TRACE(Name(c));
    Bytes want_q, want_k;
    c.Expected(*cpu, &want_q, &want_k);
    const RopePlan plan = c.Plan();
    const int64_t block = internal::RopeThroughBlockTokens(plan);
    ASSERT_LT(3 * block, plan.num_tokens);
    QueryThrough x(c);
    RopeThrough& t = x.t;
    t.query_work = nullptr;
    int asked = 0;
    t.before_write = [&] {
      return ++asked == 3 ? absl::FailedPreconditionError("input \"query\": truncated")
                          : absl::OkStatus();
    };
    const absl::Status s = cpu->ApplyRopeThrough(plan, t, {});
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_EQ(s.message(), "input \"query\": truncated");
    EXPECT_EQ(asked, 3);
    // Each head's rows of the first two blocks' tokens: finished; the
    // rest as it was.
    const size_t row = Case::kHead * 4;
    for (int64_t h = 0; h < Case::kQueryHeads; ++h) {
      for (int64_t tok = 0; tok < plan.num_tokens; ++tok) {
        const size_t at = layout == RopeLayout::kBHSD
                              ? static_cast<size_t>(h * plan.num_tokens + tok) * row
                              : static_cast<size_t>(tok * Case::kQueryHeads + h) * row;
        const Bytes& expected = tok < 2 * block ? want_q : x.poison;
        ASSERT_TRUE(std::equal(x.out.begin() + at, x.out.begin() + at + row, expected.begin() + at))
            << "head " << h << ", token " << tok;
      }
    }
    EXPECT_TRUE(x.in == c.q);
    // A caller who left: CANCELLED, nothing written.
    x.out = x.poison;
    t.before_write = nullptr;
    RunContext gone;
    gone.cancelled = [] { return true; };
    EXPECT_EQ(cpu->ApplyRopeThrough(plan, t, gone).code(), absl::StatusCode::kCancelled);
    EXPECT_TRUE(x.out == x.poison);
  }
}

}  // namespace
}  // namespace posenc
