// The CUDA backend's host side on a fake CUDA runtime (tests/support/
// fake_device_runtime.h), on any machine: what it does when the device runs
// out of memory, when a copy or a launch fails, when the context is lost,
// and under concurrent calls. Results are compared with the CPU backend's
// bit for bit; the kernels are the emulated grid.
#include "cuda_backend.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absolute_body.h"
#include "bias_body.h"
#include "fake_device_runtime.h"
#include "gtest/gtest.h"
#include "posenc/absolute.h"
#include "posenc/attention_bias.h"
#include "posenc/rope.h"
#include "test_tensors.h"

namespace posenc {
namespace {

using testing::Bytes;
using testing::FakeDeviceRuntime;

std::unique_ptr<Backend> OnFake(FakeDeviceRuntime& rt, size_t chunk_bytes = size_t{4} << 20,
                                size_t max_idle_staging_bytes = size_t{16} << 20) {
  DeviceInfo info;
  info.name = "fake";
  cuda::CudaBackendOptions options;
  options.chunk_bytes = chunk_bytes;
  options.max_idle_staging_bytes = max_idle_staging_bytes;
  auto b = cuda::CreateCudaBackendOn(rt, 0, info, 132, options);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? std::move(*b) : nullptr;
}

// Uniform in [-1, 1) as bfloat16, from a generator of the caller's (the
// shared one in test_tensors.h is not for concurrent callers).
Bytes RandomBf16(int64_t n, std::mt19937_64& rng) {
  Bytes b(n * 2);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t i = 0; i < n; ++i) StoreElement(DType::kBFloat16, b.data(), i, u(rng));
  return b;
}

// A RoPE call of `tokens` x 8 heads x 64 bf16 with a key; returns the
// status and leaves the rotated bytes in *q / *k. Values drawn from `seed`,
// itself drawn from the printed test seed.
struct RopeCase {
  RopeCase(int64_t tokens, uint64_t seed, RopeLayout layout = RopeLayout::kBSHD)
      : tokens(tokens), layout(layout) {
    std::mt19937_64 rng(seed);
    q = RandomBf16(tokens * 8 * 64, rng);
    k = RandomBf16(tokens * 2 * 64, rng);
  }
  absl::Status Run(Backend& b, Bytes* qo, Bytes* ko) const {
    *qo = q;
    *ko = k;
    RopeTensors t;
    RopeOptions o;
    o.layout = layout;
    std::vector<int64_t> cu = {0, tokens / 3, tokens};
    if (layout == RopeLayout::kTHD) {
      t.query = testing::Mutable(DType::kBFloat16, {tokens, 8, 64}, *qo);
      t.key = testing::Mutable(DType::kBFloat16, {tokens, 2, 64}, *ko);
      t.cu_seqlens = testing::IntView(cu, {3});
    } else {
      const bool bhsd = layout == RopeLayout::kBHSD;
      t.query = testing::Mutable(
          DType::kBFloat16,
          bhsd ? std::vector<int64_t>{1, 8, tokens, 64} : std::vector<int64_t>{1, tokens, 8, 64},
          *qo);
      t.key = testing::Mutable(
          DType::kBFloat16,
          bhsd ? std::vector<int64_t>{1, 2, tokens, 64} : std::vector<int64_t>{1, tokens, 2, 64},
          *ko);
      t.positions.offsets = testing::IntView(offsets, {1});
    }
    auto plan = PlanRope(o, t);
    if (!plan.ok()) return plan.status();
    return b.ApplyRope(*plan, t.query.data, t.key.data, {});
  }
  // The case's BSHD tensors laid at q and k (memory of the test's: a
  // pinned region, shared device memory), positions as Run gives them.
  RopeTensors TensorsAt(char* q, char* k) const {
    RopeTensors t;
    t.query = {DType::kBFloat16, {1, tokens, 8, 64}, q, this->q.size()};
    t.key = {DType::kBFloat16, {1, tokens, 2, 64}, k, this->k.size()};
    t.positions.offsets = testing::IntView(offsets, {1});
    return t;
  }
  int64_t tokens;
  RopeLayout layout;
  Bytes q, k;
  std::vector<int64_t> offsets = {17};
};

void ExpectMatchesCpu(const RopeCase& c, const Bytes& q, const Bytes& k) {
  auto cpu = CreateCpuBackend(1);
  Bytes cq, ck;
  ASSERT_TRUE(c.Run(*cpu, &cq, &ck).ok());
  EXPECT_EQ(q, cq);
  EXPECT_EQ(k, ck);
  EXPECT_NE(q, c.q) << "rotated";
}

TEST(CudaBackendOnFakeRuntime, RotatesAsTheCpuDoes) {
  FakeDeviceRuntime rt;
  auto b = OnFake(rt);
  ASSERT_NE(b, nullptr);
  const RopeCase c(33, testing::Rng()());
  Bytes q, k;
  ASSERT_TRUE(c.Run(*b, &q, &k).ok());
  ExpectMatchesCpu(c, q, k);
  EXPECT_EQ(rt.launches(), 1);
}

// Out of device memory is the request's problem, not the backend's.
TEST(CudaBackendOnFakeRuntime, OutOfDeviceMemoryIsResourceExhaustedAndTheBackendStaysUsable) {
  FakeDeviceRuntime rt(/*device_memory_bytes=*/64 << 10);
  auto b = OnFake(rt);
  ASSERT_NE(b, nullptr);
  const RopeCase big(1024, testing::Rng()()), small(4, testing::Rng()());
  Bytes q, k;
  const absl::Status s = big.Run(*b, &q, &k);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(q, big.q) << "a failed call leaves the caller's tensor as it was";
  EXPECT_TRUE(b->health().ok());
  ASSERT_TRUE(small.Run(*b, &q, &k).ok());
  ExpectMatchesCpu(small, q, k);
  rt.set_device_memory(int64_t{1} << 30);
  ASSERT_TRUE(big.Run(*b, &q, &k).ok());
  ExpectMatchesCpu(big, q, k);
}

// A launch the kernels do not cover is UNIMPLEMENTED (the server then runs
// the CPU), and its error does not linger for the next call on the thread.
TEST(CudaBackendOnFakeRuntime, AFailedLaunchLeavesNoStaleErrorBehind) {
  FakeDeviceRuntime rt;
  auto b = OnFake(rt);
  ASSERT_NE(b, nullptr);
  const RopeCase c(9, testing::Rng()());
  Bytes q, k;
  rt.FailNext(FakeDeviceRuntime::Op::kLaunch, cudaErrorInvalidValue);
  EXPECT_EQ(c.Run(*b, &q, &k).code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(q, c.q);
  rt.FailNext(FakeDeviceRuntime::Op::kMemcpy, cudaErrorInvalidValue);
  EXPECT_FALSE(c.Run(*b, &q, &k).ok());
  EXPECT_TRUE(b->health().ok());
  ASSERT_TRUE(c.Run(*b, &q, &k).ok());
  ExpectMatchesCpu(c, q, k);
}

// A fault in a kernel (here reported when the stream is waited for, as on a
// GPU) loses the context: this call fails, the caller's bytes stay, and the
// backend refuses every later call with the first cause.
TEST(CudaBackendOnFakeRuntime, ALostContextFailsTheBackendForGood) {
  FakeDeviceRuntime rt;
  auto b = OnFake(rt);
  ASSERT_NE(b, nullptr);
  const RopeCase c(9, testing::Rng()());
  Bytes q, k;
  rt.FailNext(FakeDeviceRuntime::Op::kStreamSynchronize, cudaErrorIllegalAddress);
  const absl::Status s = c.Run(*b, &q, &k);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(q, c.q);
  EXPECT_EQ(b->health().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(b->health().message().find("illegal"), std::string::npos) << b->health();
  const absl::Status later = c.Run(*b, &q, &k);
  EXPECT_EQ(later.code(), absl::StatusCode::kFailedPrecondition) << later;
  EXPECT_EQ(q, c.q);
}

// More callers than workers: each gets its own stream and buffers, and every
// result is the CPU's.
TEST(CudaBackendOnFakeRuntime, ConcurrentCallsMatchTheCpu) {
  FakeDeviceRuntime rt;
  auto b = OnFake(rt);
  ASSERT_NE(b, nullptr);
  const uint64_t seed = testing::Rng()();
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      auto cpu = CreateCpuBackend(1);
      std::mt19937_64 rng(seed + t);
      for (int i = 0; i < 6; ++i) {
        const RopeCase c(1 + static_cast<int64_t>(rng() % 64), rng());
        Bytes q, k, cq, ck;
        if (!c.Run(*b, &q, &k).ok() || !c.Run(*cpu, &cq, &ck).ok() || q != cq || k != ck) {
          ++wrong;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(rt.launches(), 48);
}

// Worker buffers grow to fit, at least doubling, and are reused: a run of
// growing requests stays within a few allocations' worth of device memory.
TEST(CudaBackendOnFakeRuntime, BuffersGrowAndAreReused) {
  FakeDeviceRuntime rt;
  auto b = OnFake(rt);
  ASSERT_NE(b, nullptr);
  int64_t largest = 0;
  for (int64_t tokens = 1; tokens <= 512; tokens *= 2) {
    const RopeCase c(tokens, testing::Rng()());
    Bytes q, k;
    ASSERT_TRUE(c.Run(*b, &q, &k).ok()) << tokens;
    largest = static_cast<int64_t>(q.size() + k.size());
  }
  // One worker served them all in turn: its buffer is below 4x the largest
  // request (doubling from below it, plus the small side tables).
  EXPECT_GT(rt.device_bytes_in_use(), largest);
  EXPECT_LT(rt.device_bytes_in_use(), 4 * largest);
  EXPECT_LT(rt.pinned_bytes_in_use(), 4 * largest);
}

// Large calls go in chunks of tokens over two streams; the results are the
// same bytes, one launch per chunk. BHSD chunks are gathered head by head.
TEST(CudaBackendOnFakeRuntime, ChunkedStagingGivesTheCpusResults) {
  FakeDeviceRuntime rt;
  auto b = OnFake(rt, /*chunk_bytes=*/4096);
  ASSERT_NE(b, nullptr);
  // 64 tokens x (8 + 2) heads x 64 bf16: 1280 bytes a token, 3 a chunk.
  for (RopeLayout layout : {RopeLayout::kBSHD, RopeLayout::kTHD, RopeLayout::kBHSD}) {
    const int before = rt.launches();
    const RopeCase c(64, testing::Rng()(), layout);
    Bytes q, k;
    ASSERT_TRUE(c.Run(*b, &q, &k).ok());
    ExpectMatchesCpu(c, q, k);
    EXPECT_EQ(rt.launches() - before, 22) << static_cast<int>(layout);
  }
  // The sinusoidal add in place, and a table written whole (no input).
  for (bool has_input : {true, false}) {
    std::mt19937_64 rng(testing::Rng()());
    const int64_t T = 100, d = 256;  // 512 bytes a bf16 row: 8 rows a chunk
    Bytes x = RandomBf16(T * d, rng), cpu_x = x;
    AbsoluteOptions o;
    absl::StatusOr<AbsolutePlan> plan;
    std::vector<int64_t> positions(T);
    for (int64_t t = 0; t < T; ++t) positions[t] = 3 * t + 1;
    if (has_input) {
      AbsoluteTensors t;
      t.x = testing::Mutable(DType::kBFloat16, {1, T, d}, x);
      plan = PlanAbsolute(o, t);
    } else {
      plan = PlanEncodingTable(o, d, DType::kBFloat16, testing::IntView(positions, {T}), 0);
    }
    ASSERT_TRUE(plan.ok()) << plan.status();
    const int before = rt.launches();
    ASSERT_TRUE(b->ApplyAbsolute(*plan, x.data(), {}).ok());
    EXPECT_EQ(rt.launches() - before, 13);
    auto cpu = CreateCpuBackend(1);
    ASSERT_TRUE(cpu->ApplyAbsolute(*plan, cpu_x.data(), {}).ok());
    EXPECT_EQ(x, cpu_x) << "has_input " << has_input;
  }
}

// BHSD in chunks: a chunk stays within one sequence (50 tokens of each of
// 2 sequences, 3 a chunk: 17 chunks a sequence, the last of 2 tokens), its
// rows gathered from every head; positions differ per sequence.
TEST(CudaBackendOnFakeRuntime, ChunkedBhsdStaysWithinASequence) {
  FakeDeviceRuntime rt;
  auto b = OnFake(rt, /*chunk_bytes=*/4096);
  ASSERT_NE(b, nullptr);
  auto cpu = CreateCpuBackend(1);
  std::mt19937_64 rng(testing::Rng()());
  const int64_t B = 2, S = 50;
  Bytes q = RandomBf16(B * 8 * S * 64, rng), k = RandomBf16(B * 2 * S * 64, rng);
  Bytes cq = q, ck = k;
  std::vector<int64_t> offsets = {5, 1000};
  const auto plan_on = [&](Bytes& qb, Bytes& kb) {
    RopeTensors t;
    RopeOptions o;
    o.layout = RopeLayout::kBHSD;
    t.query = testing::Mutable(DType::kBFloat16, {B, 8, S, 64}, qb);
    t.key = testing::Mutable(DType::kBFloat16, {B, 2, S, 64}, kb);
    t.positions.offsets = testing::IntView(offsets, {B});
    return PlanRope(o, t);
  };
  auto plan = plan_on(q, k);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const int before = rt.launches();
  ASSERT_TRUE(b->ApplyRope(*plan, q.data(), k.data(), {}).ok());
  EXPECT_EQ(rt.launches() - before, 34);
  auto cpu_plan = plan_on(cq, ck);
  ASSERT_TRUE(cpu_plan.ok());
  ASSERT_TRUE(cpu->ApplyRope(*cpu_plan, cq.data(), ck.data(), {}).ok());
  EXPECT_EQ(q, cq);
  EXPECT_EQ(k, ck);
}

// ALiBi + causal with left padding ([batch = 2, heads, q_len, k_len] keys
// [starts[b], ends[b])) on the fake runtime's backend `b` and on the CPU:
// added to random bf16 logits, or built as poisoned float32. Expects the
// same bytes and returns the launches the backend made.
int BiasLikeTheCpu(Backend& b, FakeDeviceRuntime& rt, DType dtype, int64_t heads, int64_t q_len,
                   int64_t k_len, std::vector<int64_t> starts, std::vector<int64_t> ends,
                   std::mt19937_64& rng) {
  BiasOptions o;
  o.form = BiasForm::kCausal;
  o.causal = true;
  o.batch = 2;
  o.num_heads = heads;
  o.q_len = q_len;
  o.k_len = k_len;
  o.dtype = dtype;
  o.k_starts = testing::IntView(starts, {2});
  o.k_lens = testing::IntView(ends, {2});
  const int64_t n = o.batch * o.num_heads * o.q_len * o.k_len;
  const bool add = dtype == DType::kBFloat16;
  Bytes out = add ? RandomBf16(n, rng) : testing::Poisoned(dtype, n);
  Bytes cpu_out = out;
  TensorView logits;
  if (add) {
    logits = TensorView{dtype, {o.batch, o.num_heads, o.q_len, o.k_len}, out.data(), out.size()};
  }
  auto plan = PlanAttentionBias(o, logits);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return -1;
  const int before = rt.launches();
  EXPECT_TRUE(b.ApplyAttentionBias(*plan, out.data(), {}).ok());
  const int launches = rt.launches() - before;
  EXPECT_TRUE(CreateCpuBackend(1)->ApplyAttentionBias(*plan, cpu_out.data(), {}).ok());
  EXPECT_EQ(out, cpu_out) << DTypeName(dtype);
  return launches;
}

// Large biases go in chunks of rows too, added to logits or built; left
// padding and the causal mask cross the chunks' edges.
TEST(CudaBackendOnFakeRuntime, ChunkedBiasesGiveTheCpusResults) {
  FakeDeviceRuntime rt;
  auto b = OnFake(rt, /*chunk_bytes=*/4096);
  ASSERT_NE(b, nullptr);
  std::mt19937_64 rng(testing::Rng()());
  // 2 x 3 x 41 rows of 100 keys: bf16 rows of 200 bytes, 20 a chunk, 13
  // chunks (the last short); float32 rows of 400, 10 a chunk, 25 chunks.
  EXPECT_EQ(BiasLikeTheCpu(*b, rt, DType::kBFloat16, 3, 41, 100, {0, 37}, {100, 91}, rng), 13);
  EXPECT_EQ(BiasLikeTheCpu(*b, rt, DType::kFloat32, 3, 41, 100, {0, 37}, {100, 91}, rng), 25);
}

// A chunk that fails fails the call before anything reaches the caller:
// its bytes stay as they were (the server may run the call on the CPU).
TEST(CudaBackendOnFakeRuntime, AChunkThatFailsLeavesTheCallersBytes) {
  FakeDeviceRuntime rt;
  auto b = OnFake(rt, /*chunk_bytes=*/4096);
  ASSERT_NE(b, nullptr);
  const RopeCase c(64, testing::Rng()());
  Bytes q, k;
  rt.FailNext(FakeDeviceRuntime::Op::kLaunch, cudaErrorInvalidValue, /*skip=*/5);
  EXPECT_EQ(c.Run(*b, &q, &k).code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(q, c.q);
  EXPECT_EQ(k, c.k);
  rt.FailNext(FakeDeviceRuntime::Op::kMemcpy, cudaErrorInvalidValue, /*skip=*/30);
  EXPECT_FALSE(c.Run(*b, &q, &k).ok());
  EXPECT_EQ(q, c.q);
  EXPECT_TRUE(b->health().ok());
  ASSERT_TRUE(c.Run(*b, &q, &k).ok());
  ExpectMatchesCpu(c, q, k);
}

// On a large grid a sinusoidal thread takes 4 consecutive tokens and forms
// each anchor's sin/cos once for those that share it. Positions here run on,
// jump (so a thread's tokens change anchor midway), go negative and repeat;
// the emulated grid gives the CPU's bytes in both layouts.
TEST(CudaBackendOnFakeRuntime, SinusoidalThreadsTakeSeveralTokensAndShareTheirAnchors) {
  const int64_t T = 8203, d = 1024;  // the last block's last thread has 3 tokens
  cuda::AbsoluteParams shape{};
  shape.num_tokens = T;
  shape.dim = d;
  shape.dtype = DType::kBFloat16;
  ASSERT_FALSE(cuda::PlanAbsoluteLaunch(&shape).empty());
  EXPECT_EQ(shape.tokens_per_thread, 4) << "2051 groups of 4 tokens x 128 threads";
  cuda::AbsoluteParams f32 = shape;
  f32.dtype = DType::kFloat32;
  ASSERT_FALSE(cuda::PlanAbsoluteLaunch(&f32).empty());
  EXPECT_EQ(f32.tokens_per_thread, 1) << "float32 rows keep a token a thread";
  FakeDeviceRuntime rt;
  auto b = OnFake(rt, /*chunk_bytes=*/size_t{64} << 20);  // one launch, not 4 MiB chunks
  ASSERT_NE(b, nullptr);
  auto cpu = CreateCpuBackend(1);
  std::mt19937_64 rng(testing::Rng()());
  std::vector<int64_t> positions(T);
  int64_t p = -37;
  for (int64_t t = 0; t < T; ++t) {
    const uint64_t r = rng() % 16;
    p = r == 0 ? static_cast<int64_t>(rng() % 4000000) - 2000000 : r == 1 ? p : p + 1;
    positions[t] = p;
  }
  for (SinusoidalLayout layout :
       {SinusoidalLayout::kInterleaved, SinusoidalLayout::kConcatenated}) {
    AbsoluteOptions o;
    o.sinusoidal_layout = layout;
    Bytes x = RandomBf16(T * d, rng), cpu_x = x;
    AbsoluteTensors t;
    t.x = testing::Mutable(DType::kBFloat16, {T, d}, x);
    t.positions.position_ids = testing::IntView(positions, {T});
    auto plan = PlanAbsolute(o, t);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const int before = rt.launches();
    ASSERT_TRUE(b->ApplyAbsolute(*plan, x.data(), {}).ok());
    EXPECT_EQ(rt.launches() - before, 1);
    ASSERT_TRUE(cpu->ApplyAbsolute(*plan, cpu_x.data(), {}).ok());
    EXPECT_EQ(x, cpu_x) << "layout " << static_cast<int>(layout);
  }
}

// Long bias rows on a large grid are shared by fewer threads, each writing
// several packets of its row (the row's plan is made once per thread). The
// emulated grid runs that shape and gives the CPU's bytes: added to bf16
// logits with ALiBi, causal and left padding, and built as float32.
TEST(CudaBackendOnFakeRuntime, LongBiasRowsTakeSeveralPacketsPerThread) {
  cuda::BiasParams shape{};
  shape.batch = 2;
  shape.heads = 8;
  shape.q_len = 256;
  shape.k_len = 1024;
  shape.row_count = shape.batch * shape.heads * shape.q_len;
  shape.dtype = DType::kBFloat16;
  ASSERT_FALSE(cuda::PlanBiasLaunch(&shape).empty());
  ASSERT_EQ(shape.width, 8);
  EXPECT_EQ(shape.threads_per_row, 64) << "128 packets a row, 2 a thread";
  FakeDeviceRuntime rt;
  auto b = OnFake(rt, /*chunk_bytes=*/size_t{64} << 20);  // one launch, not 4 MiB chunks
  ASSERT_NE(b, nullptr);
  std::mt19937_64 rng(testing::Rng()());
  for (DType dtype : {DType::kBFloat16, DType::kFloat32}) {
    EXPECT_EQ(BiasLikeTheCpu(*b, rt, dtype, shape.heads, shape.q_len, shape.k_len, {0, 300},
                             {1024, 1000}, rng),
              1);
  }
}

// Chunked calls stage through two chunk-sized pinned slots: a call many
// times larger than max_idle_staging_bytes allocates no pinned memory once
// the first call has sized the slots, and what stays is two chunks plus the
// side tables.
TEST(CudaBackendOnFakeRuntime, ChunkedCallsStageThroughTwoSlotsAllocatedOnce) {
  FakeDeviceRuntime rt;
  auto b = OnFake(rt, /*chunk_bytes=*/4096, /*max_idle_staging_bytes=*/64 << 10);
  ASSERT_NE(b, nullptr);
  const RopeCase large(400, testing::Rng()());  // 500 KiB, 134 chunks of 3 tokens
  Bytes q, k;
  ASSERT_TRUE(large.Run(*b, &q, &k).ok());
  ExpectMatchesCpu(large, q, k);
  const int allocations = rt.pinned_allocations();
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(large.Run(*b, &q, &k).ok());
    ExpectMatchesCpu(large, q, k);
  }
  EXPECT_EQ(rt.pinned_allocations(), allocations) << "no pinned allocation per call";
  EXPECT_LT(rt.pinned_bytes_in_use(), 4 * 4096 + 4096) << "two slots and the side tables";
  // What the backend says such a call stages (for the server's budget):
  // two slots of 3 tokens of 1280 bytes; a call under two chunks, whole;
  // rows larger than a chunk, two of them.
  EXPECT_EQ(b->StagingBytes(static_cast<int64_t>(q.size() + k.size()), 1280), 2 * 3 * 1280);
  EXPECT_EQ(b->StagingBytes(8000, 1280), 8000 + 2 * 256);
  EXPECT_EQ(b->StagingBytes(1 << 20, 10000), 2 * 10240);
}

// What a call pins beyond its tensors' staging is what its plan announced
// (PlanCost::device_side_bytes), which the server charges to the call:
// also where the side tables outgrow the tensors (eight position axes of a
// small head, a sinusoidal add on rows of four), staged whole or chunked.
TEST(CudaBackendOnFakeRuntime, WhatACallPinsStaysWithinItsPlansAnnouncedCost) {
  const uint64_t seed = testing::Rng()();
  std::mt19937_64 rng(seed);
  for (const size_t chunk_bytes : {size_t{4096}, size_t{4} << 20}) {
    SCOPED_TRACE(::testing::Message() << "chunk_bytes " << chunk_bytes << ", seed " << seed);
    FakeDeviceRuntime rt;
    auto b = OnFake(rt, chunk_bytes, /*max_idle_staging_bytes=*/0);
    ASSERT_NE(b, nullptr);
    const int64_t tokens = 1000 + static_cast<int64_t>(rng() % 3000);
    PlanCost cost;
    const ReserveFn note = [&](const PlanCost& c) {
      cost = c;
      return absl::OkStatus();
    };
    const auto pinned_for = [&](const std::function<absl::Status()>& call) -> int64_t {
      rt.ResetPinnedPeak();
      const int64_t before = rt.pinned_bytes_in_use();
      EXPECT_TRUE(call().ok());
      return rt.pinned_bytes_peak() - before;
    };

    // RoPE over eight axes (2 rotary dims each) of a float16 [1, T, 1, 16].
    Bytes q = testing::RandomTensor(DType::kFloat16, tokens * 16);
    std::vector<int64_t> ids(tokens * 8);
    for (auto& id : ids) id = static_cast<int64_t>(rng() % 4096);
    RopeTensors t;
    t.query = testing::Mutable(DType::kFloat16, {1, tokens, 1, 16}, q);
    t.positions.position_ids = testing::IntView(ids, {1, tokens, 8});
    RopeOptions o;
    o.axis_mode = AxisMode::kAxial;
    o.axis_dims = std::vector<int64_t>(8, 2);
    auto plan = PlanRope(o, t, note);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const int64_t q_bytes = static_cast<int64_t>(q.size());
    ASSERT_GT(cost.device_side_bytes, q_bytes) << "the side tables outgrow the tensor";
    EXPECT_LE(pinned_for([&] { return b->ApplyRope(*plan, q.data(), nullptr, {}); }),
              b->StagingBytes(q_bytes, 32) + cost.device_side_bytes);

    // The sinusoidal add on float16 rows of 4.
    Bytes x = testing::RandomTensor(DType::kFloat16, tokens * 4);
    AbsoluteTensors a;
    a.x = testing::Mutable(DType::kFloat16, {tokens, 4}, x);
    auto abs_plan = PlanAbsolute(AbsoluteOptions{}, a, note);
    ASSERT_TRUE(abs_plan.ok()) << abs_plan.status();
    const int64_t x_bytes = static_cast<int64_t>(x.size());
    EXPECT_LE(pinned_for([&] { return b->ApplyAbsolute(*abs_plan, x.data(), {}); }),
              b->StagingBytes(x_bytes, 8) + cost.device_side_bytes);

    // An ALiBi bias built for many heads and short rows.
    BiasOptions bo;
    bo.batch = 3;
    bo.num_heads = 64 + static_cast<int64_t>(rng() % 64);
    bo.q_len = 2;
    bo.k_len = 2;
    bo.dtype = DType::kFloat32;
    auto bias_plan = PlanAttentionBias(bo, TensorView(), note);
    ASSERT_TRUE(bias_plan.ok()) << bias_plan.status();
    Bytes out = testing::Poisoned(DType::kFloat32, bias_plan->NumElements());
    const int64_t out_bytes = static_cast<int64_t>(out.size());
    EXPECT_LE(pinned_for([&] { return b->ApplyAttentionBias(*bias_plan, out.data(), {}); }),
              b->StagingBytes(out_bytes, 8) + cost.device_side_bytes);
  }
}

// A copy that fails after results began reaching the caller cannot leave the
// caller's bytes as they were: the call says DATA_LOSS (never retried on
// the CPU). One that fails before leaves them untouched.
TEST(CudaBackendOnFakeRuntime, AChunkedDownloadThatFailsMidwayIsDataLoss) {
  FakeDeviceRuntime rt;
  auto b = OnFake(rt, /*chunk_bytes=*/4096);
  ASSERT_NE(b, nullptr);
  // 64 tokens, 22 chunks of q and k: 1 + 44 copies up; the first two chunks'
  // 4 copies down, then chunk 0 reaches the caller before chunk 2's copies.
  const RopeCase c(64, testing::Rng()());
  Bytes q, k;
  rt.FailNext(FakeDeviceRuntime::Op::kMemcpy, cudaErrorInvalidValue, /*skip=*/45);
  EXPECT_NE(c.Run(*b, &q, &k).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(q, c.q) << "nothing written before the first download";
  EXPECT_EQ(k, c.k);
  rt.FailNext(FakeDeviceRuntime::Op::kMemcpy, cudaErrorInvalidValue, /*skip=*/49);
  const absl::Status s = c.Run(*b, &q, &k);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(q, c.q) << "chunk 0 had arrived";
  EXPECT_TRUE(b->health().ok());
  ASSERT_TRUE(c.Run(*b, &q, &k).ok());
  ExpectMatchesCpu(c, q, k);
}

// Tensors in memory the backend pinned (a registered shared-memory region)
// go straight to the device and back: no staging copy, the same results;
// a call that fails leaves them as they were; unpinned, calls stage again.
TEST(CudaBackendOnFakeRuntime, PinnedHostMemorySkipsStaging) {
  FakeDeviceRuntime rt;
  auto b = OnFake(rt);
  ASSERT_NE(b, nullptr);
  const RopeCase c(40, testing::Rng()());
  const size_t qn = c.q.size(), kn = c.k.size();
  std::vector<uint64_t> words((qn + kn + 4096) / 8 + 1);
  char* region = reinterpret_cast<char*>(words.data());
  const size_t region_bytes = words.size() * 8;
  ASSERT_TRUE(b->PinHostMemory(region, region_bytes).ok());
  EXPECT_EQ(rt.registered_bytes(), static_cast<int64_t>(region_bytes));
  char* q = region + 64;
  char* k = q + qn;
  auto run = [&] {
    std::memcpy(q, c.q.data(), qn);
    std::memcpy(k, c.k.data(), kn);
    RopeTensors t = c.TensorsAt(q, k);
    auto plan = PlanRope(RopeOptions{}, t);
    EXPECT_TRUE(plan.ok());
    return b->ApplyRope(*plan, q, k, {});
  };
  ASSERT_TRUE(run().ok());
  EXPECT_EQ(rt.bytes_copied_direct(), static_cast<int64_t>(2 * (qn + kn)))
      << "up and down, straight from and to the region";
  EXPECT_LT(rt.pinned_bytes_in_use(), static_cast<int64_t>(qn + kn))
      << "the pinned buffer holds the side tables only";
  ExpectMatchesCpu(c, Bytes(q, q + qn), Bytes(k, k + kn));
  // A failed launch: nothing came back into the region.
  rt.FailNext(FakeDeviceRuntime::Op::kLaunch, cudaErrorInvalidValue);
  EXPECT_EQ(run().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(Bytes(q, q + qn), c.q);
  // Copies: the side tables, q and k up, then q and k down. The first copy
  // down failing leaves the region; the second, once q's is queued, is
  // DATA_LOSS (the region is partly written).
  rt.FailNext(FakeDeviceRuntime::Op::kMemcpy, cudaErrorInvalidValue, /*skip=*/3);
  EXPECT_NE(run().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(Bytes(q, q + qn), c.q);
  rt.FailNext(FakeDeviceRuntime::Op::kMemcpy, cudaErrorInvalidValue, /*skip=*/4);
  EXPECT_EQ(run().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(Bytes(q, q + qn), c.q) << "q came back before k's copy failed";
  // The absolute encoding and a bias built into the region, direct too.
  const int64_t before = rt.bytes_copied_direct();
  {
    AbsoluteOptions o;
    auto plan = PlanEncodingTable(o, 64, DType::kFloat32, {}, 9);
    ASSERT_TRUE(plan.ok());
    ASSERT_TRUE(b->ApplyAbsolute(*plan, q, {}).ok());
    Bytes cpu_table(9 * 64 * 4);
    ASSERT_TRUE(CreateCpuBackend(1)->ApplyAbsolute(*plan, cpu_table.data(), {}).ok());
    EXPECT_EQ(Bytes(q, q + cpu_table.size()), cpu_table);
  }
  EXPECT_EQ(rt.bytes_copied_direct() - before, 9 * 64 * 4) << "a table only comes back";
  b->UnpinHostMemory(region);
  EXPECT_EQ(rt.registered_bytes(), 0);
  const int64_t after = rt.bytes_copied_direct();
  ASSERT_TRUE(run().ok());
  EXPECT_EQ(rt.bytes_copied_direct(), after) << "unpinned: staged again";
  ExpectMatchesCpu(c, Bytes(q, q + qn), Bytes(k, k + kn));
}

// RoPE from pinned host memory into other pinned host memory (KServe
// outputs in slices of their own, ApplyRopeThrough): the inputs go up, are
// rotated in the device buffer, and the results come straight down into
// the outputs. No host copy, the inputs stay as they were, and the outputs
// receive only finished values: a failure before the results come down
// leaves them. (cuda_through_test.cc covers every operation and placement.)
TEST(CudaBackendOnFakeRuntime, RopeIntoPinnedHostMemoryMovesEachByteOnceEachWay) {
  FakeDeviceRuntime rt;
  auto b = OnFake(rt);
  ASSERT_NE(b, nullptr);
  const RopeCase c(40, testing::Rng()());
  const size_t qn = c.q.size(), kn = c.k.size();
  std::vector<uint64_t> words((2 * (qn + kn) + 4096) / 8 + 1);
  char* region = reinterpret_cast<char*>(words.data());
  ASSERT_TRUE(b->PinHostMemory(region, words.size() * 8).ok());
  char* q = region + 64;
  char* k = q + qn;
  char* q_out = k + kn + 2;  // any alignment: the device buffer is aligned
  char* k_out = q_out + qn;
  std::memcpy(q, c.q.data(), qn);
  std::memcpy(k, c.k.data(), kn);
  const Bytes poison(qn + kn, 0x7f);
  RopeTensors t = c.TensorsAt(q, k);
  auto plan = PlanRope(RopeOptions{}, t);
  ASSERT_TRUE(plan.ok());
  const auto outputs = [&] { return Bytes(q_out, q_out + qn + kn); };
  auto run = [&](void* qo, void* ko) {
    std::memcpy(q_out, poison.data(), qn + kn);
    RopeThrough through;
    through.query = q;
    through.key = k;
    through.query_out = qo;
    through.key_out = ko;
    return b->ApplyRopeThrough(*plan, through, {});
  };

  ASSERT_TRUE(run(q_out, k_out).ok());
  EXPECT_EQ(rt.bytes_copied_direct(), static_cast<int64_t>(2 * (qn + kn)))
      << "each input up once, each result down once, straight from and to the region";
  EXPECT_LT(rt.pinned_bytes_in_use(), static_cast<int64_t>(qn + kn))
      << "the pinned buffer holds the side tables only";
  EXPECT_EQ(Bytes(q, q + qn), c.q) << "the input stays as it was";
  EXPECT_EQ(Bytes(k, k + kn), c.k);
  ExpectMatchesCpu(c, Bytes(q_out, q_out + qn), Bytes(k_out, k_out + kn));

  // An output outside the pinned memory: the call is staged, nothing
  // straight from or to the region, the same results.
  Bytes elsewhere(kn, 0x7f);
  const int64_t direct = rt.bytes_copied_direct();
  ASSERT_TRUE(run(q_out, elsewhere.data()).ok());
  EXPECT_EQ(rt.bytes_copied_direct(), direct);
  ExpectMatchesCpu(c, Bytes(q_out, q_out + qn), elsewhere);
  // ApplyRopeInto takes shared device memory only.
  EXPECT_EQ(b->ApplyRopeInto(*plan, q, k, q_out, k_out, {}).code(),
            absl::StatusCode::kInvalidArgument);

  // A failed launch, and a first copy down that fails: the outputs were
  // never written. A second copy down failing once the first is queued:
  // DATA_LOSS. The inputs stay as they were throughout.
  rt.FailNext(FakeDeviceRuntime::Op::kLaunch, cudaErrorInvalidValue);
  EXPECT_EQ(run(q_out, k_out).code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(outputs(), poison);
  rt.FailNext(FakeDeviceRuntime::Op::kMemcpy, cudaErrorInvalidValue, /*skip=*/3);
  EXPECT_NE(run(q_out, k_out).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(outputs(), poison);
  rt.FailNext(FakeDeviceRuntime::Op::kMemcpy, cudaErrorInvalidValue, /*skip=*/4);
  EXPECT_EQ(run(q_out, k_out).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(Bytes(q, q + qn), c.q);
  EXPECT_EQ(Bytes(k, k + kn), c.k);

  // An output that is its own input: rotated in place, as ApplyRope does.
  ASSERT_TRUE(run(q, k_out).ok());
  ExpectMatchesCpu(c, Bytes(q, q + qn), Bytes(k_out, k_out + kn));
  b->UnpinHostMemory(region);
}

// cudaHostRegister of a large region takes a while (it locks each page):
// calls on memory pinned earlier go on meanwhile. The registration here is
// held until the call is done, or 20 s: a backend that holds its lock
// across the registration lets the call finish only after it.
TEST(CudaBackendOnFakeRuntime, CallsOnPinnedMemoryDoNotWaitBehindAnotherPinning) {
  FakeDeviceRuntime rt;
  auto b = OnFake(rt);
  ASSERT_NE(b, nullptr);
  const RopeCase c(40, testing::Rng()());
  const size_t qn = c.q.size(), kn = c.k.size();
  std::vector<uint64_t> first((qn + kn) / 8 + 1), second(4096);
  char* q = reinterpret_cast<char*>(first.data());
  char* k = q + qn;
  ASSERT_TRUE(b->PinHostMemory(q, first.size() * 8).ok());
  std::promise<void> registering, call_done;
  bool call_finished_first = false;
  rt.set_before_host_register([&] {
    registering.set_value();
    call_finished_first =
        call_done.get_future().wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  });
  std::thread pin([&] { EXPECT_TRUE(b->PinHostMemory(second.data(), second.size() * 8).ok()); });
  registering.get_future().wait();
  std::memcpy(q, c.q.data(), qn);
  std::memcpy(k, c.k.data(), kn);
  RopeTensors t = c.TensorsAt(q, k);
  auto plan = PlanRope(RopeOptions{}, t);
  ASSERT_TRUE(plan.ok());
  const int64_t direct = rt.bytes_copied_direct();
  EXPECT_TRUE(b->ApplyRope(*plan, q, k, {}).ok());
  call_done.set_value();
  pin.join();
  EXPECT_TRUE(call_finished_first) << "the call waited for the other region's registration";
  EXPECT_EQ(rt.bytes_copied_direct() - direct, static_cast<int64_t>(2 * (qn + kn)));
  ExpectMatchesCpu(c, Bytes(q, q + qn), Bytes(k, k + kn));
  EXPECT_TRUE(b->HostPinned(second.data(), second.size() * 8));
  b->UnpinHostMemory(second.data());
  b->UnpinHostMemory(q);
}

// Pinning is best effort: refused, calls still work (staged).
TEST(CudaBackendOnFakeRuntime, PinningThatFailsChangesNothing) {
  FakeDeviceRuntime rt;
  auto b = OnFake(rt);
  ASSERT_NE(b, nullptr);
  std::vector<uint64_t> words(4096);
  rt.FailNext(FakeDeviceRuntime::Op::kHostRegister, cudaErrorHostMemoryAlreadyRegistered);
  EXPECT_FALSE(b->PinHostMemory(words.data(), words.size() * 8).ok());
  EXPECT_TRUE(b->health().ok());
  const RopeCase c(8, testing::Rng()());
  Bytes q, k;
  ASSERT_TRUE(c.Run(*b, &q, &k).ok());
  ExpectMatchesCpu(c, q, k);
  EXPECT_EQ(rt.bytes_copied_direct(), 0);
  b->UnpinHostMemory(words.data());  // not pinned: nothing to do
}

// Device memory another process shared (a CUDA IPC handle): the kernels run
// on the tensors where they are; only the side tables move.
TEST(CudaBackendOnFakeRuntime, ComputesInSharedDeviceMemoryWithoutMovingTheTensors) {
  FakeDeviceRuntime rt;
  auto b = OnFake(rt, /*chunk_bytes=*/4096);  // a host call this size would be chunked
  ASSERT_NE(b, nullptr);
  const RopeCase c(40, testing::Rng()());
  const size_t qn = c.q.size(), kn = c.k.size();
  // The other process's allocation, and the handle it sends.
  void* theirs = nullptr;
  ASSERT_EQ(rt.Malloc(&theirs, qn + kn + 512), cudaSuccess);
  const cudaIpcMemHandle_t h = rt.IpcHandleOf(theirs);
  absl::StatusOr<void*> opened =
      b->OpenSharedDeviceMemory(absl::string_view(h.reserved, sizeof(h)), qn + kn + 512);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(rt.ipc_open(), 1);
  char* q = static_cast<char*>(*opened) + 256;
  char* k = q + qn;
  std::memcpy(q, c.q.data(), qn);  // the fake's device memory is host memory
  std::memcpy(k, c.k.data(), kn);
  RopeTensors t = c.TensorsAt(q, k);
  auto plan = PlanRope(RopeOptions{}, t);
  ASSERT_TRUE(plan.ok());
  const int64_t copied = rt.bytes_copied();
  ASSERT_TRUE(b->ApplyRope(*plan, q, k, {}).ok());
  EXPECT_LT(rt.bytes_copied() - copied, static_cast<int64_t>(qn / 4))
      << "only positions and frequencies went up; nothing came down";
  EXPECT_EQ(rt.launches(), 1) << "one launch, not chunks";
  EXPECT_LT(rt.pinned_bytes_in_use(), static_cast<int64_t>(qn + kn))
      << "the pinned buffer holds the side tables only";
  ExpectMatchesCpu(c, Bytes(q, q + qn), Bytes(k, k + kn));

  // The absolute encoding added in place there too.
  std::vector<int64_t> positions(c.tokens);
  for (int64_t i = 0; i < c.tokens; ++i) positions[i] = 3 * i;
  Bytes x = c.q, cpu_x = c.q;
  std::memcpy(q, x.data(), qn);
  AbsoluteTensors a;
  a.x = {DType::kBFloat16, {c.tokens, 8 * 64}, q, qn};
  a.positions.position_ids = testing::IntView(positions, {c.tokens});
  auto abs_plan = PlanAbsolute(AbsoluteOptions{}, a);
  ASSERT_TRUE(abs_plan.ok()) << abs_plan.status();
  ASSERT_TRUE(b->ApplyAbsolute(*abs_plan, q, {}).ok());
  ASSERT_TRUE(CreateCpuBackend(1)->ApplyAbsolute(*abs_plan, cpu_x.data(), {}).ok());
  EXPECT_EQ(Bytes(q, q + qn), cpu_x);

  // Copies: wholly in the mapping or wholly outside it. One that runs past
  // the mapping's end is refused, not copied on the CPU.
  Bytes host(64, 0x11), back(64, 0);
  char* end = static_cast<char*>(*opened) + qn + kn + 512;
  ASSERT_TRUE(b->CopyMemory(end - 64, host.data(), 64).ok());
  ASSERT_TRUE(b->CopyMemory(back.data(), end - 64, 64).ok());
  EXPECT_EQ(back, host);
  EXPECT_EQ(b->CopyMemory(back.data(), end - 32, 64).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b->CopyMemory(end - 32, host.data(), 64).code(), absl::StatusCode::kInvalidArgument);
  Bytes wide(256, 0);
  EXPECT_EQ(b->CopyMemory(wide.data(), static_cast<char*>(*opened) - 128, 256).code(),
            absl::StatusCode::kInvalidArgument);

  // A call with one tensor on the device and one in host memory is refused
  // before anything runs.
  Bytes host_k = c.k;
  const int launches = rt.launches();
  EXPECT_EQ(b->ApplyRope(*plan, q, host_k.data(), {}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rt.launches(), launches);

  b->CloseSharedDeviceMemory(*opened);
  EXPECT_EQ(rt.ipc_open(), 0);
  EXPECT_TRUE(b->health().ok());
  ASSERT_EQ(rt.Free(theirs), cudaSuccess);
}

// A tensor in shared device memory may start at any element-aligned
// address (a caller's slice at offset 2, say): the kernels' vector accesses
// narrow to what its address allows, so the call computes as the CPU does
// and never meets cudaErrorMisalignedAddress, which would lose the GPU.
TEST(CudaBackendOnFakeRuntime, TensorsInSharedDeviceMemoryAtAnyElementAlignedAddressRun) {
  FakeDeviceRuntime rt;
  auto b = OnFake(rt);
  ASSERT_NE(b, nullptr);
  const uint64_t seed = testing::Rng()();
  const RopeCase c(12, seed);
  const size_t qn = c.q.size(), kn = c.k.size();
  void* theirs = nullptr;
  ASSERT_EQ(rt.Malloc(&theirs, qn + kn + 1024), cudaSuccess);
  const cudaIpcMemHandle_t h = rt.IpcHandleOf(theirs);
  absl::StatusOr<void*> opened =
      b->OpenSharedDeviceMemory(absl::string_view(h.reserved, sizeof(h)), qn + kn + 1024);
  ASSERT_TRUE(opened.ok()) << opened.status();
  for (const size_t shift : {2, 4, 6, 8, 10, 14}) {
    SCOPED_TRACE(::testing::Message() << "shift " << shift << ", seed " << seed);
    char* q = static_cast<char*>(*opened) + 256 + shift;
    char* k = q + qn + 2 * (shift % 4);  // key on another alignment than query's
    std::memcpy(q, c.q.data(), qn);
    std::memcpy(k, c.k.data(), kn);
    auto plan = PlanRope(RopeOptions{}, c.TensorsAt(q, k));
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_TRUE(b->ApplyRope(*plan, q, k, {}).ok());
    ExpectMatchesCpu(c, Bytes(q, q + qn), Bytes(k, k + kn));

    // The absolute encoding and the bias there too: rows of 8 x 64 bf16.
    std::vector<int64_t> positions(c.tokens);
    for (int64_t i = 0; i < c.tokens; ++i) positions[i] = 5 * i + 1;
    std::memcpy(q, c.q.data(), qn);
    AbsoluteTensors a;
    a.x = {DType::kBFloat16, {c.tokens, 8 * 64}, q, qn};
    a.positions.position_ids = testing::IntView(positions, {c.tokens});
    auto abs_plan = PlanAbsolute(AbsoluteOptions{}, a);
    ASSERT_TRUE(abs_plan.ok()) << abs_plan.status();
    ASSERT_TRUE(b->ApplyAbsolute(*abs_plan, q, {}).ok());
    Bytes cpu_x = c.q;
    ASSERT_TRUE(CreateCpuBackend(1)->ApplyAbsolute(*abs_plan, cpu_x.data(), {}).ok());
    EXPECT_EQ(Bytes(q, q + qn), cpu_x);

    std::memcpy(q, c.q.data(), qn);
    BiasOptions o;
    o.form = BiasForm::kCausal;
    o.causal = true;
    o.batch = 1;
    o.num_heads = 8;
    o.q_len = c.tokens / 2;
    o.k_len = 64;
    o.dtype = DType::kBFloat16;
    const int64_t n = o.num_heads * o.q_len * o.k_len;
    TensorView logits{DType::kBFloat16, {1, o.num_heads, o.q_len, o.k_len}, q, size_t(n) * 2};
    auto bias_plan = PlanAttentionBias(o, logits);
    ASSERT_TRUE(bias_plan.ok()) << bias_plan.status();
    ASSERT_TRUE(b->ApplyAttentionBias(*bias_plan, q, {}).ok());
    Bytes cpu_logits(c.q.begin(), c.q.begin() + n * 2);
    ASSERT_TRUE(CreateCpuBackend(1)->ApplyAttentionBias(*bias_plan, cpu_logits.data(), {}).ok());
    EXPECT_EQ(Bytes(q, q + n * 2), cpu_logits);
    ASSERT_TRUE(b->health().ok()) << b->health();
  }
  b->CloseSharedDeviceMemory(*opened);
  ASSERT_EQ(rt.Free(theirs), cudaSuccess);
}

// A handle that does not open, or opens on too small an allocation, is the
// caller's mistake: a clear INVALID_ARGUMENT, nothing left open, and the
// backend serves on.
TEST(CudaBackendOnFakeRuntime, HandlesThatDoNotFitAreRefusedAndTheBackendServesOn) {
  FakeDeviceRuntime rt;
  auto b = OnFake(rt);
  ASSERT_NE(b, nullptr);
  void* theirs = nullptr;
  ASSERT_EQ(rt.Malloc(&theirs, 4096), cudaSuccess);
  const cudaIpcMemHandle_t h = rt.IpcHandleOf(theirs);
  const absl::string_view raw(h.reserved, sizeof(h));

  absl::Status s = b->OpenSharedDeviceMemory(raw.substr(0, 63), 4096).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("64 bytes, got 63"), std::string::npos) << s;

  std::string forged(raw);
  forged[3] ^= 0x55;
  s = b->OpenSharedDeviceMemory(forged, 4096).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("does not open on device 0"), std::string::npos) << s;

  s = b->OpenSharedDeviceMemory(raw, 4097).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("4096 bytes"), std::string::npos) << s;
  EXPECT_EQ(rt.ipc_open(), 0) << "opened, measured, closed again";

  rt.FailNext(FakeDeviceRuntime::Op::kIpcOpen, cudaErrorMapBufferObjectFailed);
  EXPECT_EQ(b->OpenSharedDeviceMemory(raw, 4096).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(b->health().ok());

  // Opened twice (two regions on one allocation): one mapping, two closes.
  absl::StatusOr<void*> one = b->OpenSharedDeviceMemory(raw, 1024);
  absl::StatusOr<void*> two = b->OpenSharedDeviceMemory(raw, 4096);
  ASSERT_TRUE(one.ok() && two.ok());
  EXPECT_EQ(*one, *two);
  b->CloseSharedDeviceMemory(*one);
  EXPECT_EQ(rt.ipc_open(), 1);
  b->CloseSharedDeviceMemory(*two);
  EXPECT_EQ(rt.ipc_open(), 0);

  const RopeCase c(8, testing::Rng()());
  Bytes q, k;
  ASSERT_TRUE(c.Run(*b, &q, &k).ok());
  ExpectMatchesCpu(c, q, k);

  // A lost context while opening is the backend's failure, reported as such.
  rt.FailNext(FakeDeviceRuntime::Op::kIpcOpen, cudaErrorIllegalAddress);
  s = b->OpenSharedDeviceMemory(raw, 4096).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_EQ(b->health().code(), absl::StatusCode::kFailedPrecondition);
}

// The CPU backend has no device memory to open.
TEST(CudaBackendOnFakeRuntime, TheCpuBackendRefusesSharedDeviceMemory) {
  EXPECT_EQ(CreateCpuBackend(1)->OpenSharedDeviceMemory(std::string(64, 'x'), 64).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// Pinned staging stays bounded: a call that grew a worker's buffer past
// max_idle_staging_bytes frees it afterwards; smaller ones keep theirs for
// the next call. What stays is what the backend says it keeps.
TEST(CudaBackendOnFakeRuntime, LargeStagingIsFreedAfterItsCall) {
  FakeDeviceRuntime rt;
  auto b = OnFake(rt, size_t{4} << 20, /*max_idle_staging_bytes=*/64 << 10);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->ResidentHostBytes(), 4 * (64 << 10));
  const RopeCase small(8, testing::Rng()()), large(400, testing::Rng()());
  Bytes q, k;
  ASSERT_TRUE(small.Run(*b, &q, &k).ok());
  const int64_t kept = rt.pinned_bytes_in_use();
  EXPECT_GT(kept, 0);
  EXPECT_LE(kept, 64 << 10);
  ASSERT_TRUE(large.Run(*b, &q, &k).ok());  // 400 x 10 x 64 bf16: 500 KiB
  ExpectMatchesCpu(large, q, k);
  EXPECT_LE(rt.pinned_bytes_in_use(), b->ResidentHostBytes()) << "the large buffer is gone";
  ASSERT_TRUE(small.Run(*b, &q, &k).ok());
  ExpectMatchesCpu(small, q, k);
}

}  // namespace
}  // namespace posenc
