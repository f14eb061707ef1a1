// The CUDA backend's through calls (ApplyRopeThrough, ApplyAbsoluteThrough,
// ApplyAttentionBiasThrough) on the fake CUDA runtime: from host memory into
// other host memory, staged whole, in chunks through the two slots, or
// straight from and to memory the backend pinned. Results are the CPU's in
// place bit for bit, the inputs stay as they were, and the outputs receive
// nothing until every kernel has succeeded and the caller's check
// (before_write) has passed, so they may overlap the inputs.
#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "cuda_backend.h"
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

constexpr size_t kChunkBytes = 4096;  // every call below is chunked with it

std::unique_ptr<Backend> OnFake(FakeDeviceRuntime& rt, size_t chunk_bytes) {
  DeviceInfo info;
  info.name = "fake";
  cuda::CudaBackendOptions options;
  options.chunk_bytes = chunk_bytes;
  auto b = cuda::CreateCudaBackendOn(rt, 0, info, 132, options);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? std::move(*b) : nullptr;
}

using BeforeWrite = std::function<absl::Status()>;

// One operation from `input` (one buffer: RoPE's query, then its key) into
// an output of its size, and the CPU's result in place (`want`).
struct Operation {
  std::string name;
  Bytes input, want;
  std::function<absl::Status(Backend& b, const char* in, char* out, BeforeWrite before_write)> run;
};

// RoPE of 2 sequences x 25 tokens x (8 + 2) heads x 64 bf16, in `layout`.
Operation Rope(RopeLayout layout) {
  constexpr int64_t kB = 2, kS = 25, kQH = 8, kKH = 2, kD = 64;
  const bool bhsd = layout == RopeLayout::kBHSD;
  const auto shape = [&](int64_t heads) {
    return bhsd ? std::vector<int64_t>{kB, heads, kS, kD} : std::vector<int64_t>{kB, kS, heads, kD};
  };
  Operation op;
  op.name = bhsd ? "rope bhsd" : "rope bshd";
  const int64_t q_elems = kB * kS * kQH * kD, k_elems = kB * kS * kKH * kD;
  op.input = testing::RandomTensor(DType::kBFloat16, q_elems + k_elems);
  op.want = op.input;
  static const std::vector<int64_t> offsets = {7, 3000};
  const auto plan_on = [=](uint8_t* data) {
    RopeTensors t;
    RopeOptions o;
    o.layout = layout;
    t.query = MutableTensor{DType::kBFloat16, shape(kQH), data, size_t(q_elems) * 2};
    t.key = MutableTensor{DType::kBFloat16, shape(kKH), data + q_elems * 2, size_t(k_elems) * 2};
    t.positions.offsets = testing::IntView(offsets, {kB});
    return PlanRope(o, t);
  };
  auto plan = plan_on(op.want.data());
  EXPECT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(
      CreateCpuBackend(1)->ApplyRope(*plan, op.want.data(), op.want.data() + q_elems * 2, {}).ok());
  op.run = [plan = *plan, q_bytes = q_elems * 2](Backend& b, const char* in, char* out,
                                                 BeforeWrite before_write) {
    RopeThrough t;
    t.query = in;
    t.key = in + q_bytes;
    t.query_out = out;
    t.key_out = out + q_bytes;
    t.before_write = std::move(before_write);
    return b.ApplyRopeThrough(plan, t, {});
  };
  return op;
}

// The sinusoidal encoding added to [1, 100, 64] float32.
Operation Sinusoidal() {
  constexpr int64_t kT = 100, kD = 64;
  Operation op;
  op.name = "sinusoidal";
  op.input = testing::RandomTensor(DType::kFloat32, kT * kD);
  op.want = op.input;
  AbsoluteTensors t;
  t.x = testing::Mutable(DType::kFloat32, {1, kT, kD}, op.want);
  auto plan = PlanAbsolute(AbsoluteOptions{}, t);
  EXPECT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(CreateCpuBackend(1)->ApplyAbsolute(*plan, op.want.data(), {}).ok());
  op.run = [plan = *plan](Backend& b, const char* in, char* out, BeforeWrite before_write) {
    AbsoluteThrough t;
    t.x = in;
    t.y = out;
    t.before_write = std::move(before_write);
    return b.ApplyAbsoluteThrough(plan, t, {});
  };
  return op;
}

// ALiBi + causal with left padding added to [2, 3, 41, 100] bf16 logits.
Operation Bias() {
  static const std::vector<int64_t> starts = {0, 37}, ends = {100, 91};
  BiasOptions o;
  o.form = BiasForm::kCausal;
  o.causal = true;
  o.batch = 2;
  o.num_heads = 3;
  o.q_len = 41;
  o.k_len = 100;
  o.dtype = DType::kBFloat16;
  o.k_starts = testing::IntView(starts, {2});
  o.k_lens = testing::IntView(ends, {2});
  Operation op;
  op.name = "bias";
  op.input = testing::RandomTensor(DType::kBFloat16, 2 * 3 * 41 * 100);
  op.want = op.input;
  auto plan = PlanAttentionBias(
      o, TensorView{DType::kBFloat16, {2, 3, 41, 100}, op.want.data(), op.want.size()});
  EXPECT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(CreateCpuBackend(1)->ApplyAttentionBias(*plan, op.want.data(), {}).ok());
  op.run = [plan = *plan](Backend& b, const char* in, char* out, BeforeWrite before_write) {
    BiasThrough t;
    t.logits = in;
    t.out = out;
    t.before_write = std::move(before_write);
    return b.ApplyAttentionBiasThrough(plan, t, {});
  };
  return op;
}

std::vector<Operation> Operations() {
  std::vector<Operation> ops;
  ops.push_back(Rope(RopeLayout::kBSHD));
  ops.push_back(Rope(RopeLayout::kBHSD));
  ops.push_back(Sinusoidal());
  ops.push_back(Bias());
  return ops;
}

// Where a call's input and output lie.
enum class Placement {
  kStagedWhole,
  kChunked,
  kPinned,
  kOnlyTheInputPinned,   // chunked
  kOnlyTheOutputPinned,  // staged whole
};

// Chunked but where staged whole.
size_t ChunkBytesFor(Placement p) {
  return p == Placement::kStagedWhole || p == Placement::kOnlyTheOutputPinned ? size_t{4} << 20
                                                                              : kChunkBytes;
}

const char* Name(Placement p) {
  switch (p) {
    case Placement::kStagedWhole:
      return "staged whole";
    case Placement::kChunked:
      return "chunked";
    case Placement::kPinned:
      return "pinned";
    case Placement::kOnlyTheInputPinned:
      return "only the input pinned";
    case Placement::kOnlyTheOutputPinned:
      return "only the output pinned";
  }
  return "?";
}

// Every operation, from memory of every kind into memory of every kind
// (an output 3 bytes past a multiple of 8: the device buffer is aligned,
// the caller's memory need not be): the CPU's result, the input as it was,
// and before_write asked once, while the output was still untouched.
TEST(CudaThrough, GivesTheCpusResultsFromAnyHostMemoryIntoAny) {
  for (Placement placement : {Placement::kStagedWhole, Placement::kChunked, Placement::kPinned,
                              Placement::kOnlyTheInputPinned, Placement::kOnlyTheOutputPinned}) {
    FakeDeviceRuntime rt;
    auto b = OnFake(rt, ChunkBytesFor(placement));
    ASSERT_NE(b, nullptr);
    for (const Operation& op : Operations()) {
      SCOPED_TRACE(op.name + ", " + Name(placement));
      const size_t n = op.input.size();
      std::vector<uint64_t> words(n / 8 + 1), out_words(n / 8 + 2);
      char* in = reinterpret_cast<char*>(words.data());
      char* out = reinterpret_cast<char*>(out_words.data()) + 3;
      const bool pin_in =
          placement == Placement::kPinned || placement == Placement::kOnlyTheInputPinned;
      const bool pin_out =
          placement == Placement::kPinned || placement == Placement::kOnlyTheOutputPinned;
      if (pin_in) ASSERT_TRUE(b->PinHostMemory(in, n).ok());
      if (pin_out) ASSERT_TRUE(b->PinHostMemory(out, n).ok());
      std::memcpy(in, op.input.data(), n);
      const Bytes poison(n, 0x7f);
      std::memcpy(out, poison.data(), n);
      int asked = 0;
      const auto before_write = [&]() -> absl::Status {
        ++asked;
        EXPECT_TRUE(Bytes(out, out + n) == poison) << "the output was written before the check";
        return absl::OkStatus();
      };
      const int64_t direct = rt.bytes_copied_direct();
      const int launches = rt.launches();
      const absl::Status s = op.run(*b, in, out, before_write);
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_TRUE(Bytes(out, out + n) == op.want) << "the CPU's result";
      EXPECT_TRUE(Bytes(in, in + n) == op.input) << "the input as it was";
      EXPECT_EQ(asked, 1);
      EXPECT_EQ(rt.bytes_copied_direct() - direct,
                placement == Placement::kPinned ? static_cast<int64_t>(2 * n) : 0)
          << "pinned: up once from the input, down once into the output";
      if (placement == Placement::kChunked) EXPECT_GT(rt.launches() - launches, 2);
      if (pin_out) b->UnpinHostMemory(out);
      if (pin_in) b->UnpinHostMemory(in);
    }
  }
}

// Every input is read before any result is written, so an output may be its
// input, or overlap it anywhere: still the CPU's result. Staged whole, in
// chunks, and straight from and to pinned memory.
TEST(CudaThrough, AnOutputMayOverlapItsInput) {
  for (Placement placement : {Placement::kStagedWhole, Placement::kChunked, Placement::kPinned}) {
    FakeDeviceRuntime rt;
    auto b = OnFake(rt, ChunkBytesFor(placement));
    ASSERT_NE(b, nullptr);
    for (const Operation& op : Operations()) {
      const size_t n = op.input.size();
      std::vector<uint64_t> words((2 * n + 4096) / 8);
      char* memory = reinterpret_cast<char*>(words.data());
      if (placement == Placement::kPinned) {
        ASSERT_TRUE(b->PinHostMemory(memory, words.size() * 8).ok());
      }
      for (ptrdiff_t shift : {ptrdiff_t{0}, ptrdiff_t{1000}, -ptrdiff_t(n / 2) - 2}) {
        SCOPED_TRACE(::testing::Message() << op.name << ", " << Name(placement) << ", the output "
                                          << shift << " bytes from the input");
        std::memset(memory, 0x7f, words.size() * 8);
        char* in = memory + n;
        std::memcpy(in, op.input.data(), n);
        const int64_t direct = rt.bytes_copied_direct();
        ASSERT_TRUE(op.run(*b, in, in + shift, nullptr).ok());
        EXPECT_TRUE(Bytes(in + shift, in + shift + n) == op.want);
        if (placement == Placement::kPinned) {
          EXPECT_EQ(rt.bytes_copied_direct() - direct, static_cast<int64_t>(2 * n));
        }
      }
      if (placement == Placement::kPinned) b->UnpinHostMemory(memory);
    }
  }
}

// A call whose check fails, or whose kernel fails (the first, or a later
// chunk's), leaves the output as it was (the server may then run it on the
// CPU); the check is never asked once a kernel failed.
TEST(CudaThrough, ACallThatFailsBeforeItsResultsComeDownLeavesTheOutput) {
  for (Placement placement : {Placement::kStagedWhole, Placement::kChunked, Placement::kPinned,
                              Placement::kOnlyTheInputPinned}) {
    FakeDeviceRuntime rt;
    auto b = OnFake(rt, ChunkBytesFor(placement));
    ASSERT_NE(b, nullptr);
    for (const Operation& op : Operations()) {
      SCOPED_TRACE(op.name + ", " + Name(placement));
      const size_t n = op.input.size();
      std::vector<uint64_t> words(2 * (n / 8 + 1));
      char* in = reinterpret_cast<char*>(words.data());
      char* out = in + n;
      if (placement == Placement::kPinned) {
        ASSERT_TRUE(b->PinHostMemory(words.data(), words.size() * 8).ok());
      } else if (placement == Placement::kOnlyTheInputPinned) {
        ASSERT_TRUE(b->PinHostMemory(in, n).ok());
      }
      std::memcpy(in, op.input.data(), n);
      const Bytes poison(n, 0x7f);
      const auto untouched = [&] {
        return Bytes(out, out + n) == poison && Bytes(in, in + n) == op.input;
      };
      int asked = 0;
      const auto count = [&] {
        ++asked;
        return absl::OkStatus();
      };

      std::memcpy(out, poison.data(), n);
      const absl::Status refused = op.run(*b, in, out, [] {
        return absl::FailedPreconditionError("the input's object was truncated");
      });
      EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
      EXPECT_TRUE(untouched());

      const bool chunked =
          placement == Placement::kChunked || placement == Placement::kOnlyTheInputPinned;
      for (int skip : {0, chunked ? 3 : 0}) {
        rt.FailNext(FakeDeviceRuntime::Op::kLaunch, cudaErrorInvalidValue, skip);
        EXPECT_EQ(op.run(*b, in, out, count).code(), absl::StatusCode::kUnimplemented) << skip;
        EXPECT_EQ(asked, 0) << "asked after a kernel failed";
        EXPECT_TRUE(untouched());
      }

      EXPECT_TRUE(b->health().ok());
      ASSERT_TRUE(op.run(*b, in, out, count).ok());
      EXPECT_TRUE(Bytes(out, out + n) == op.want);
      if (placement == Placement::kPinned) b->UnpinHostMemory(words.data());
      if (placement == Placement::kOnlyTheInputPinned) b->UnpinHostMemory(in);
    }
  }
}

// Through calls take host memory, and an output for every tensor: refused
// before anything runs otherwise.
TEST(CudaThrough, RefusesDeviceMemoryAndMissingOutputs) {
  FakeDeviceRuntime rt;
  auto b = OnFake(rt, kChunkBytes);
  ASSERT_NE(b, nullptr);
  std::vector<Operation> ops = Operations();
  const size_t most = std::max({ops[0].input.size(), ops[2].input.size(), ops[3].input.size()});
  void* theirs = nullptr;
  ASSERT_EQ(rt.Malloc(&theirs, most), cudaSuccess);
  const cudaIpcMemHandle_t h = rt.IpcHandleOf(theirs);
  absl::StatusOr<void*> device =
      b->OpenSharedDeviceMemory(absl::string_view(h.reserved, sizeof(h)), most);
  ASSERT_TRUE(device.ok()) << device.status();
  const int launches = rt.launches();
  for (const Operation& op : ops) {
    SCOPED_TRACE(op.name);
    Bytes in = op.input;
    const absl::Status s =
        op.run(*b, reinterpret_cast<const char*>(in.data()), static_cast<char*>(*device), nullptr);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("host memory"), std::string::npos) << s;
  }
  // RoPE without the key's output.
  RopeThrough t;
  Bytes q = testing::RandomTensor(DType::kFloat32, 4 * 2 * 8), k = q, out = q;
  RopeTensors tensors;
  tensors.query = testing::Mutable(DType::kFloat32, {1, 4, 2, 8}, q);
  tensors.key = testing::Mutable(DType::kFloat32, {1, 4, 2, 8}, k);
  auto plan = PlanRope(RopeOptions{}, tensors);
  ASSERT_TRUE(plan.ok());
  t.query = q.data();
  t.key = k.data();
  t.query_out = out.data();
  EXPECT_EQ(b->ApplyRopeThrough(*plan, t, {}).code(), absl::StatusCode::kInvalidArgument);
  // A table (no input) and a bias built without logits have nothing to
  // come through.
  auto table = PlanEncodingTable(AbsoluteOptions{}, 8, DType::kFloat32, {}, 4);
  ASSERT_TRUE(table.ok());
  AbsoluteThrough at{q.data(), out.data(), nullptr};
  EXPECT_EQ(b->ApplyAbsoluteThrough(*table, at, {}).code(), absl::StatusCode::kInvalidArgument);
  BiasOptions o;
  o.batch = 1;
  o.num_heads = 2;
  o.q_len = 4;
  o.k_len = 4;
  auto built = PlanAttentionBias(o, {});
  ASSERT_TRUE(built.ok()) << built.status();
  BiasThrough bt{q.data(), out.data(), nullptr};
  EXPECT_EQ(b->ApplyAttentionBiasThrough(*built, bt, {}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rt.launches(), launches);
  b->CloseSharedDeviceMemory(*device);
  rt.Free(theirs);
}

}  // namespace
}  // namespace posenc
