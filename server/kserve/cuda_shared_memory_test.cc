// KServe requests naming CUDA shared memory, run in process on an engine
// whose CUDA backend sits on the fake CUDA runtime (tests/support/
// fake_device_runtime.h): the registry, the front's placement of each
// tensor and the engine's routing are the real ones; the device is host
// memory and the kernels are the emulated grid. Every result is compared
// bit for bit with the same request sent with its tensors in the message
// and computed by the CPU backend.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "cuda_backend.h"
#include "cuda_runtime.h"
#include "engine/engine.h"
#include "fake_device_runtime.h"
#include "fake_gpu_engine.h"
#include "gtest/gtest.h"
#include "kserve/infer.h"
#include "kserve/models.h"
#include "kserve/shared_memory.h"

namespace posenc::server::kserve {
namespace {

using inference::ModelInferRequest;
using inference::ModelInferResponse;
using testing::FakeDeviceRuntime;

constexpr int64_t kTokens = 24, kHeads = 4, kDim = 64;
constexpr int64_t kQueryBytes = kTokens * kHeads * kDim * 4;  // FP32
constexpr int64_t kRegionBytes = 4 * kQueryBytes;

void Slice(google::protobuf::Map<std::string, inference::InferParameter>* p, int64_t size,
           int64_t offset, const char* region = "gpu") {
  (*p)[kShmRegion].set_string_param(region);
  (*p)[kShmByteSize].set_int64_param(size);
  (*p)[kShmOffset].set_int64_param(offset);
}

// A rope request for `query`: in `region` at `in_offset` (-1: in the
// message), its output to the region at `out_offset` (-1: the answer).
ModelInferRequest RopeRequest(const std::string& query, int64_t in_offset, int64_t out_offset,
                              const char* backend = "", const char* region = "gpu") {
  ModelInferRequest req;
  req.set_model_name("rope");
  auto* in = req.add_inputs();
  in->set_name("query");
  in->set_datatype("FP32");
  for (int64_t d : {int64_t{1}, kTokens, kHeads, kDim}) in->add_shape(d);
  if (in_offset >= 0) {
    Slice(in->mutable_parameters(), kQueryBytes, in_offset, region);
  } else {
    req.add_raw_input_contents(query);
  }
  auto* out = req.add_outputs();
  out->set_name("query_out");
  if (out_offset >= 0) Slice(out->mutable_parameters(), kQueryBytes, out_offset, region);
  if (*backend != '\0') (*req.mutable_parameters())["backend"].set_string_param(backend);
  return req;
}

// A request to `model` whose one tensor worked on, `input` (FP32 of
// `shape`), is in the message (`socket_bytes`; in_region null) or at
// `in_offset` of `in_region`, its result `output` going to `out_offset` of
// `out_region` (null: the answer); `backend` as a parameter unless empty.
ModelInferRequest OneTensorRequest(const char* model, const char* input, const char* output,
                                   const std::vector<int64_t>& shape,
                                   const std::string& socket_bytes, const char* in_region,
                                   int64_t in_offset, const char* out_region, int64_t out_offset,
                                   const char* backend) {
  int64_t bytes = 4;
  for (int64_t d : shape) bytes *= d;
  ModelInferRequest req;
  req.set_model_name(model);
  auto* in = req.add_inputs();
  in->set_name(input);
  in->set_datatype("FP32");
  for (int64_t d : shape) in->add_shape(d);
  auto* out = req.add_outputs();
  out->set_name(output);
  if (in_region == nullptr) {
    req.add_raw_input_contents(socket_bytes);
  } else {
    Slice(in->mutable_parameters(), bytes, in_offset, in_region);
  }
  if (out_region != nullptr) Slice(out->mutable_parameters(), bytes, out_offset, out_region);
  if (*backend != '\0') (*req.mutable_parameters())["backend"].set_string_param(backend);
  return req;
}

// A rope request for `tokens` tokens of query (kHeads x kDim FP32) on the
// CPU, as OneTensorRequest.
ModelInferRequest BigRopeRequest(int64_t tokens, const std::string& socket_bytes,
                                 const char* in_region, int64_t in_offset, const char* out_region,
                                 int64_t out_offset) {
  return OneTensorRequest("rope", "query", "query_out", {1, tokens, kHeads, kDim}, socket_bytes,
                          in_region, in_offset, out_region, out_offset, "cpu");
}

// An engine on two CPU threads with system shared memory on.
std::unique_ptr<Engine> CpuEngine() {
  EngineOptions o;
  o.enable_cuda = false;
  o.cpu_threads = 2;
  o.shared_memory.enabled = true;
  auto made = Engine::Create(o);
  EXPECT_TRUE(made.ok()) << made.status();
  return made.ok() ? std::move(*made) : nullptr;
}

// A /dev/shm object of `bytes` registered as `name` (its key unlinked at
// once: the registry holds its own reference), and its descriptor, for
// the test to write, read and truncate; -1, the failure reported, when it
// could not be made. `before` runs just before the registration.
int RegisteredObject(Engine& engine, const std::string& name, int64_t bytes,
                     const std::function<void()>& before = nullptr) {
  const std::string key = absl::StrCat("/posenc-kserve-", name, "-", ::getpid());
  const int fd = ::open(("/dev/shm" + key).c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) {
    ADD_FAILURE() << "cannot create " << key;
    return -1;
  }
  absl::Status s = absl::InternalError("ftruncate failed");
  if (::ftruncate(fd, bytes) == 0) {
    if (before) before();
    s = engine.shared_memory().Register(name, key, 0, bytes);
  }
  ::unlink(("/dev/shm" + key).c_str());
  if (!s.ok()) {
    ADD_FAILURE() << "registering \"" << name << "\": " << s;
    ::close(fd);
    return -1;
  }
  return fd;
}

absl::Status RunOn(Engine& engine, ModelInferRequest req, ModelInferResponse* resp,
                   std::string* backend, ModelKind model = ModelKind::kRope) {
  auto admission = engine.Admit(0);
  if (!admission.ok()) return admission.status();
  RunContext ctx;
  return RunInfer(engine, BuiltInModel(model), &req, resp, ctx, *admission, backend,
                  &engine.shared_memory());
}

// A sinusoidal request for x [1, tokens, dim] FP32, as OneTensorRequest.
ModelInferRequest SinusoidalRequest(int64_t tokens, int64_t dim, const std::string& socket_bytes,
                                    const char* in_region, int64_t in_offset,
                                    const char* out_region, int64_t out_offset,
                                    const char* backend = "cpu") {
  return OneTensorRequest("sinusoidal", "x", "y", {1, tokens, dim}, socket_bytes, in_region,
                          in_offset, out_region, out_offset, backend);
}

// What the CPU backend answers to `req`, whose input `input` is in the
// message: the one output's bytes, checked to differ from the input.
std::string CpuAnswer(Engine& engine, ModelInferRequest req, ModelKind model,
                      const std::string& input) {
  ModelInferResponse resp;
  std::string backend;
  EXPECT_TRUE(RunOn(engine, std::move(req), &resp, &backend, model).ok());
  EXPECT_EQ(backend, "cpu");
  EXPECT_NE(resp.raw_output_contents(0), input) << "computed";
  return resp.raw_output_contents(0);
}

// What the CPU backend makes of `x` ([1, tokens, dim] FP32) with the
// sinusoidal encoding, sent in the message.
std::string SinusoidalResult(Engine& engine, const std::string& x, int64_t tokens, int64_t dim) {
  return CpuAnswer(engine, SinusoidalRequest(tokens, dim, x, nullptr, 0, nullptr, 0),
                   ModelKind::kSinusoidal, x);
}

// An attention bias request adding the causal ALiBi bias to logits of
// `shape` ([batch, heads, q_len, k_len] FP32), as OneTensorRequest.
ModelInferRequest BiasRequest(const std::vector<int64_t>& shape, const std::string& socket_bytes,
                              const char* in_region, int64_t in_offset, const char* out_region,
                              int64_t out_offset, const char* backend = "cpu") {
  ModelInferRequest req = OneTensorRequest("attention_bias", "logits", "bias", shape, socket_bytes,
                                           in_region, in_offset, out_region, out_offset, backend);
  (*req.mutable_parameters())["causal"].set_bool_param(true);
  return req;
}

// What the CPU backend makes of `logits` of `shape` with BiasRequest's
// bias, sent in the message.
std::string BiasResult(Engine& engine, const std::string& logits,
                       const std::vector<int64_t>& shape) {
  return CpuAnswer(engine, BiasRequest(shape, logits, nullptr, 0, nullptr, 0),
                   ModelKind::kAttentionBias, logits);
}

// What the CPU backend makes of `query` (`tokens` tokens) sent in the
// message.
std::string CpuResult(Engine& engine, const std::string& query, int64_t tokens = kTokens) {
  return CpuAnswer(engine, BigRopeRequest(tokens, query, nullptr, 0, nullptr, 0), ModelKind::kRope,
                   query);
}

// Seeded uniform FP32 values in [-2, 2), the seed printed.
std::string RandomQuery(int64_t bytes = kQueryBytes) {
  const unsigned seed = std::random_device()();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::string q(bytes, '\0');
  for (int64_t i = 0; i < bytes / 4; ++i) {
    const float v = u(rng);
    std::memcpy(q.data() + 4 * i, &v, 4);
  }
  return q;
}

// Where a tensor of a query-and-key rope request lies: a slice of a region.
struct SliceAt {
  const char* region;
  int64_t offset;
};

// A rope request on the CPU for query and key (each [1, tokens, kHeads,
// kDim] FP32) in shared memory, each output to a slice.
ModelInferRequest RopeQueryKeyRequest(int64_t tokens, SliceAt query, SliceAt key, SliceAt query_out,
                                      SliceAt key_out) {
  const int64_t bytes = tokens * kHeads * kDim * 4;
  ModelInferRequest req;
  req.set_model_name("rope");
  for (const auto& [name, at] : {std::pair{"query", query}, std::pair{"key", key}}) {
    auto* in = req.add_inputs();
    in->set_name(name);
    in->set_datatype("FP32");
    for (int64_t d : {int64_t{1}, tokens, kHeads, kDim}) in->add_shape(d);
    Slice(in->mutable_parameters(), bytes, at.offset, at.region);
  }
  for (const auto& [name, at] :
       {std::pair{"query_out", query_out}, std::pair{"key_out", key_out}}) {
    auto* out = req.add_outputs();
    out->set_name(name);
    Slice(out->mutable_parameters(), bytes, at.offset, at.region);
  }
  (*req.mutable_parameters())["backend"].set_string_param("cpu");
  return req;
}

class CudaSharedMemoryOnFakeRuntime : public ::testing::Test {
 protected:
  void SetUp() override {
    query_ = RandomQuery();
    // The other process's allocation, holding the query at offset 0 and
    // poison after it; registered by its handle.
    device_ = gpu_.Allocate(kRegionBytes, 0x7f);
    std::memcpy(device_, query_.data(), kQueryBytes);
    ASSERT_TRUE(
        engine_->shared_memory().RegisterCuda("gpu", gpu_.Handle(device_), 0, kRegionBytes).ok());
  }

  // The fake's device memory is host memory: the test reads it directly.
  std::string DeviceBytes(int64_t offset, int64_t n) const {
    return std::string(device_ + offset, static_cast<size_t>(n));
  }

  ModelInferRequest Request(int64_t in_offset, int64_t out_offset, const char* backend = "") {
    return RopeRequest(query_, in_offset, out_offset, backend);
  }
  absl::Status Run(ModelInferRequest req, ModelInferResponse* resp, std::string* backend) {
    return RunOn(*engine_, std::move(req), resp, backend);
  }
  std::string Expected() { return CpuResult(*engine_, query_); }

  testing::FakeGpuEngine gpu_;
  FakeDeviceRuntime& rt_ = gpu_.runtime();
  Engine* engine_ = &gpu_.engine();
  char* device_ = nullptr;
  std::string query_;
};

TEST_F(CudaSharedMemoryOnFakeRuntime, InPlaceOnTheDeviceWithNoCopyOfTheTensor) {
  const std::string want = Expected();
  const int64_t copied = rt_.bytes_copied();
  ModelInferResponse resp;
  std::string backend;
  ASSERT_TRUE(Run(Request(0, 0), &resp, &backend).ok());
  EXPECT_EQ(backend, "cuda:0");
  EXPECT_EQ(DeviceBytes(0, kQueryBytes), want);
  EXPECT_EQ(DeviceBytes(kQueryBytes, 8), std::string(8, '\x7f')) << "nothing past the tensor";
  EXPECT_LT(rt_.bytes_copied() - copied, kQueryBytes / 8) << "only the side tables moved";
  ASSERT_EQ(resp.outputs_size(), 1);
  EXPECT_EQ(resp.outputs(0).parameters().at(kShmRegion).string_param(), "gpu");
  EXPECT_TRUE(resp.raw_output_contents(0).empty());
}

TEST_F(CudaSharedMemoryOnFakeRuntime, ToTheAnswerOrAnotherSliceTheInputStaysAsItWas) {
  // To the answer: computed in host memory, brought there by a device copy
  // (the host never reads device memory itself: on a GPU that would fault).
  // To another slice: on the device, by device-to-device copies.
  const std::string want = Expected();
  ModelInferResponse resp;
  std::string backend;
  int64_t copied = rt_.bytes_copied();
  ASSERT_TRUE(Run(Request(0, -1), &resp, &backend).ok());
  EXPECT_EQ(resp.raw_output_contents(0), want);
  EXPECT_EQ(DeviceBytes(0, kQueryBytes), query_);
  EXPECT_GE(rt_.bytes_copied() - copied, kQueryBytes);

  ModelInferResponse resp2;
  copied = rt_.bytes_copied();
  ASSERT_TRUE(Run(Request(0, 2 * kQueryBytes), &resp2, &backend).ok());
  EXPECT_GE(rt_.bytes_copied() - copied, 2 * kQueryBytes);
  EXPECT_EQ(DeviceBytes(2 * kQueryBytes, kQueryBytes), want);
  EXPECT_EQ(DeviceBytes(0, kQueryBytes), query_);
  EXPECT_EQ(DeviceBytes(kQueryBytes, kQueryBytes), std::string(kQueryBytes, '\x7f'));
}

// RoPE's query_out over the key's input on the device (one region), the
// reverse: each result is that of its tensor's input as it was (both
// computed aside, in host memory, and copied into their slices once done).
// Both tensors in place on one device slice put both results in the same
// bytes: refused before any work (the key used to be rotated from the
// rotated query; since, which result landed there was not specified).
TEST_F(CudaSharedMemoryOnFakeRuntime, OneTensorsOutputOnTheOthersInputOnTheDevice) {
  const std::string k = RandomQuery();
  const std::string rq = Expected(), rk = CpuResult(*engine_, k);
  struct Case {
    const char* what;
    int64_t query, key, query_out, key_out;
  };
  const Case cases[] = {
      {"query_out on key", 0, kQueryBytes, kQueryBytes, 2 * kQueryBytes},
      {"key_out on query", kQueryBytes, 0, 2 * kQueryBytes, kQueryBytes},
      {"both in place on one slice", kQueryBytes, kQueryBytes, kQueryBytes, kQueryBytes},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const bool same = c.query == c.key;
    std::memset(device_, 0x7f, kRegionBytes);
    std::memcpy(device_ + c.query, query_.data(), kQueryBytes);
    if (!same) std::memcpy(device_ + c.key, k.data(), kQueryBytes);
    ModelInferResponse resp;
    std::string backend;
    ModelInferRequest req = RopeQueryKeyRequest(kTokens, {"gpu", c.query}, {"gpu", c.key},
                                                {"gpu", c.query_out}, {"gpu", c.key_out});
    req.mutable_parameters()->erase("backend");
    const absl::Status s = Run(std::move(req), &resp, &backend);
    if (same) {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      EXPECT_NE(s.message().find("share bytes"), absl::string_view::npos) << s;
      EXPECT_EQ(DeviceBytes(c.query, kQueryBytes), query_) << "left as it was";
      continue;
    }
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(DeviceBytes(c.key_out, kQueryBytes), rk) << "key_out";
    EXPECT_EQ(DeviceBytes(c.query_out, kQueryBytes), rq) << "query_out";
  }
}

// perf_analyzer's way with --shared-memory=cuda: the output in a slice of
// its own. Rotated on the device from one slice into the other (no host in
// between); the input stays as it was, and concurrent calls writing one
// output slice each leave finished values there.
TEST_F(CudaSharedMemoryOnFakeRuntime, ToAnotherDeviceSliceOnTheDevice) {
  const std::string want = Expected();
  const int launches = rt_.launches();
  ModelInferResponse resp;
  std::string backend;
  ASSERT_TRUE(Run(Request(0, 2 * kQueryBytes), &resp, &backend).ok());
  EXPECT_EQ(backend, "cuda:0") << "on the device, not through the host";
  EXPECT_EQ(rt_.launches(), launches + 1);
  EXPECT_EQ(DeviceBytes(2 * kQueryBytes, kQueryBytes), want);
  EXPECT_EQ(DeviceBytes(0, kQueryBytes), query_);
  std::vector<std::thread> callers;
  std::atomic<int> failed{0};
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int i = 0; i < 10; ++i) {
        ModelInferResponse r;
        std::string b;
        if (!Run(Request(0, 2 * kQueryBytes), &r, &b).ok()) ++failed;
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(DeviceBytes(2 * kQueryBytes, kQueryBytes), want);
  EXPECT_EQ(DeviceBytes(0, kQueryBytes), query_);
}

// perf_analyzer's way with --shared-memory=system on a GPU server: the
// input in one slice of a /dev/shm region, the output in another. The GPU
// pinned the region when it was registered, so the query goes up from its
// slice and comes back rotated straight into the output slice: no scratch
// buffer, no host copy, each byte over the bus once each way. Calls the
// CPU serves (asked for, or left to it by a GPU that gave up under AUTO)
// go block by block through its threads' own buffers instead, also with no
// scratch buffer. Either way the input stays as it was and the output
// receives the finished result only.
TEST(SystemSharedMemoryOnAFakeGpu, RopeIntoAnotherSliceGoesStraightThroughTheDevice) {
  testing::FakeGpuEngine gpu(BackendChoice::kAuto, /*auto_gpu_min_bytes=*/0);
  Engine& engine = gpu.engine();
  FakeDeviceRuntime& rt = gpu.runtime();
  const std::string query = RandomQuery();
  const std::string want = CpuResult(engine, query);
  const int fd = RegisteredObject(engine, "sys", kRegionBytes);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(rt.registered_bytes(), kRegionBytes) << "pinned by the GPU at registration";
  ASSERT_EQ(::pwrite(fd, query.data(), kQueryBytes, 0), kQueryBytes);
  const std::string poison(kQueryBytes, '\x7f');
  const auto read = [&](int64_t offset) {
    std::string s(kQueryBytes, '\0');
    EXPECT_EQ(::pread(fd, s.data(), kQueryBytes, offset), kQueryBytes);
    return s;
  };
  const auto run = [&](const char* backend, std::string* served) {
    EXPECT_EQ(::pwrite(fd, poison.data(), kQueryBytes, 2 * kQueryBytes), kQueryBytes);
    ModelInferResponse resp;
    const absl::Status s =
        RunOn(engine, RopeRequest(query, 0, 2 * kQueryBytes, backend, "sys"), &resp, served);
    if (s.ok()) {
      EXPECT_EQ(resp.outputs(0).parameters().at(kShmRegion).string_param(), "sys");
      EXPECT_TRUE(resp.raw_output_contents().empty() || resp.raw_output_contents(0).empty());
    }
    return s;
  };

  std::string served;
  const int64_t direct = rt.bytes_copied_direct();
  ASSERT_TRUE(run("", &served).ok());
  EXPECT_EQ(served, "cuda:0");
  EXPECT_EQ(rt.bytes_copied_direct() - direct, 2 * kQueryBytes) << "up once, down once";
  EXPECT_EQ(engine.scratch().idle_buffers(), 0) << "no scratch buffer was lent";
  EXPECT_EQ(read(2 * kQueryBytes), want);
  EXPECT_EQ(read(0), query);

  // The GPU gives up (a launch that fails) under AUTO: the CPU, aside.
  rt.FailNext(FakeDeviceRuntime::Op::kLaunch, cudaErrorInvalidValue);
  ASSERT_TRUE(run("", &served).ok());
  EXPECT_EQ(served, "cpu");
  EXPECT_EQ(read(2 * kQueryBytes), want);
  EXPECT_EQ(read(0), query);
  EXPECT_EQ(engine.scratch().idle_buffers(), 0) << "block by block, through the CPU's own buffers";

  // The CPU asked for: the same.
  ASSERT_TRUE(run("cpu", &served).ok());
  EXPECT_EQ(served, "cpu");
  EXPECT_EQ(read(2 * kQueryBytes), want);
  EXPECT_EQ(read(0), query);
  EXPECT_EQ(engine.scratch().idle_buffers(), 0);

  // CUDA asked for and the launch failing: the failure, the output as it was.
  rt.FailNext(FakeDeviceRuntime::Op::kLaunch, cudaErrorInvalidValue);
  EXPECT_FALSE(run("cuda", &served).ok());
  EXPECT_EQ(read(2 * kQueryBytes), poison);
  EXPECT_EQ(read(0), query);

  ASSERT_TRUE(engine.shared_memory().Unregister("sys").ok());
  EXPECT_EQ(rt.registered_bytes(), 0) << "unpinned once unregistered";
  ::close(fd);
}

// A region the GPU will not pin (cudaHostRegister refused: say, the
// device's limit on locked memory) still serves its calls, staged through
// the backend's pinned buffers, and the server's log says why it is slower.
TEST(SystemSharedMemoryOnAFakeGpu, ARegionTheGpuWillNotPinIsStagedAndTheLogSaysWhy) {
  std::vector<std::string> warnings;
  testing::FakeGpuEngine gpu(BackendChoice::kCuda, int64_t{1} << 20,
                             [&](absl::string_view m) { warnings.emplace_back(m); });
  Engine& engine = gpu.engine();
  FakeDeviceRuntime& rt = gpu.runtime();
  const std::string query = RandomQuery();
  const std::string want = CpuResult(engine, query);
  const int fd = RegisteredObject(engine, "sys", kRegionBytes, [&] {
    rt.FailNext(FakeDeviceRuntime::Op::kHostRegister, cudaErrorHostMemoryAlreadyRegistered);
  });
  ASSERT_GE(fd, 0);
  EXPECT_EQ(rt.registered_bytes(), 0);
  ASSERT_EQ(warnings.size(), 1u);
  for (const char* said : {"\"sys\"", "not pinned for cuda:0", "cudaHostRegister"}) {
    EXPECT_NE(warnings[0].find(said), std::string::npos) << said << " in: " << warnings[0];
  }
  ASSERT_EQ(::pwrite(fd, query.data(), kQueryBytes, 0), kQueryBytes);
  const std::string poison(kQueryBytes, '\x7f');
  ASSERT_EQ(::pwrite(fd, poison.data(), kQueryBytes, 2 * kQueryBytes), kQueryBytes);
  ModelInferResponse resp;
  std::string served;
  const int64_t direct = rt.bytes_copied_direct();
  ASSERT_TRUE(
      RunOn(engine, RopeRequest(query, 0, 2 * kQueryBytes, "", "sys"), &resp, &served).ok());
  EXPECT_EQ(served, "cuda:0");
  EXPECT_EQ(rt.bytes_copied_direct(), direct) << "nothing straight from the unpinned region";
  EXPECT_EQ(engine.scratch().idle_buffers(), 0) << "through the GPU's staging, no scratch buffer";
  std::string out(kQueryBytes, '\0');
  ASSERT_EQ(::pread(fd, out.data(), kQueryBytes, 2 * kQueryBytes), kQueryBytes);
  EXPECT_EQ(out, want);
  ASSERT_EQ(::pread(fd, out.data(), kQueryBytes, 0), kQueryBytes);
  EXPECT_EQ(out, query);
  ASSERT_TRUE(engine.shared_memory().Unregister("sys").ok());
  EXPECT_EQ(warnings.size(), 1u);
  ::close(fd);
}

// The sinusoidal encoding and a bias added to logits, from one slice into
// another on a GPU, which pinned the region: the input goes up from its
// slice and the result comes down straight into the other, as RoPE's (no
// scratch buffer, no host copy): the CPU's result bit for bit, the input
// as it was. A GPU that gives up under AUTO leaves the call to the CPU,
// which goes block by block through its own buffers.
TEST(SystemSharedMemoryOnAFakeGpu, SinusoidalAndBiasIntoAnotherSliceGoStraightThroughTheDevice) {
  testing::FakeGpuEngine gpu(BackendChoice::kAuto, /*auto_gpu_min_bytes=*/0);
  Engine& engine = gpu.engine();
  FakeDeviceRuntime& rt = gpu.runtime();
  constexpr int64_t kT = 96, kD = 128, kBytes = kT * kD * 4;
  const std::vector<int64_t> logits_shape = {1, 2, 48, kD};  // kBytes too
  const std::string x = RandomQuery(kBytes);
  std::string served;
  struct Operation {
    ModelKind model;
    std::string want;
    std::function<ModelInferRequest(const char* backend)> request;
  };
  const Operation operations[] = {
      {ModelKind::kSinusoidal, SinusoidalResult(engine, x, kT, kD),
       [&](const char* backend) {
         return SinusoidalRequest(kT, kD, "", "sys", 0, "sys", kBytes, backend);
       }},
      {ModelKind::kAttentionBias, BiasResult(engine, x, logits_shape),
       [&](const char* backend) {
         return BiasRequest(logits_shape, "", "sys", 0, "sys", kBytes, backend);
       }},
  };
  const int fd = RegisteredObject(engine, "sys", 2 * kBytes);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(rt.registered_bytes(), 2 * kBytes) << "pinned by the GPU at registration";
  const std::string poison(kBytes, '\x7f');
  for (const Operation& op : operations) {
    for (const char* backend : {"cuda", ""}) {
      SCOPED_TRACE(::testing::Message()
                   << KindName(op.model) << ", "
                   << (*backend == '\0' ? "AUTO, the launch failing" : backend));
      if (*backend == '\0') rt.FailNext(FakeDeviceRuntime::Op::kLaunch, cudaErrorInvalidValue);
      ASSERT_EQ(::pwrite(fd, x.data(), kBytes, 0), kBytes);
      ASSERT_EQ(::pwrite(fd, poison.data(), kBytes, kBytes), kBytes);
      const int64_t direct = rt.bytes_copied_direct();
      ModelInferResponse r;
      ASSERT_TRUE(RunOn(engine, op.request(backend), &r, &served, op.model).ok());
      EXPECT_EQ(served, *backend == '\0' ? "cpu" : "cuda:0");
      if (*backend != '\0') {
        EXPECT_EQ(rt.bytes_copied_direct() - direct, 2 * kBytes) << "up once, down once";
      }
      std::string y(kBytes, '\0'), x_now(kBytes, '\0');
      ASSERT_EQ(::pread(fd, y.data(), kBytes, kBytes), kBytes);
      ASSERT_EQ(::pread(fd, x_now.data(), kBytes, 0), kBytes);
      EXPECT_TRUE(y == op.want);
      EXPECT_TRUE(x_now == x);
      EXPECT_EQ(engine.scratch().idle_buffers(), 0) << "no scratch buffer was lent";
    }
  }
  ASSERT_TRUE(engine.shared_memory().Unregister("sys").ok());
  ::close(fd);
}

// From a region the GPU did not pin, a GPU's call from one slice into
// another goes through its pinned staging (the input into it, up, down,
// out of it into the output slice): its staging charged to the call, and
// no scratch buffer. So a budget that holds the staging serves it on the
// GPU, AUTO or asked for; one that does not sends it, under AUTO, to the
// CPU, which needs neither, and refuses it with the GPU asked for, the
// output left as it was. The sinusoidal encoding and RoPE.
TEST(SystemSharedMemoryOnAFakeGpu, CallsIntoAnotherSliceNeedOnlyTheGpusStaging) {
  testing::FakeGpuEngine gpu(BackendChoice::kAuto, /*auto_gpu_min_bytes=*/0);
  Engine& engine = gpu.engine();
  FakeDeviceRuntime& rt = gpu.runtime();
  constexpr int64_t kT = 256, kD = 256, kBytes = kT * kD * 4;  // 256 KiB
  const std::string x = RandomQuery(kBytes);
  std::string served;
  const std::string sinusoidal_want = SinusoidalResult(engine, x, kT, kD);
  const std::string query = RandomQuery();
  const std::string rope_want = CpuResult(engine, query);
  const int fd = RegisteredObject(engine, "sys", 2 * kBytes, [&] {
    rt.FailNext(FakeDeviceRuntime::Op::kHostRegister, cudaErrorHostMemoryAlreadyRegistered);
  });
  ASSERT_GE(fd, 0);
  ASSERT_EQ(rt.registered_bytes(), 0) << "not pinned: staged";
  // Other calls hold all of the budget but `free_tensors` of a tensor.
  auto others = engine.Admit(0);
  ASSERT_TRUE(others.ok()) << others.status();
  AdmissionControl& budget = engine.admission();
  const auto hold = [&](int64_t tensor, double free_tensors) {
    others->Reset();
    others = engine.Admit(0);
    ASSERT_TRUE(others.ok());
    ASSERT_TRUE(others
                    ->TryGrow(budget.options().max_bytes - budget.bytes() -
                              static_cast<int64_t>(free_tensors * static_cast<double>(tensor)))
                    .ok());
  };
  const std::string poison(kBytes, '\x7f');
  const auto output = [&](int64_t bytes) {
    std::string s(bytes, '\0');
    EXPECT_EQ(::pread(fd, s.data(), bytes, kBytes), bytes);
    return s;
  };
  for (double free_tensors : {1.5, 0.5}) {
    for (const char* backend : {"", "cuda"}) {
      SCOPED_TRACE(::testing::Message() << (*backend == '\0' ? "AUTO" : backend) << ", "
                                        << free_tensors << " tensors of the budget free");
      const bool staging_fits = free_tensors > 1;
      // A call's outcome: `want` in the output from the GPU where its
      // staging fits, else from the CPU under AUTO; else refused, the
      // output (`bytes`) as it was.
      const auto expect = [&](const absl::Status& s, const std::string& want, int64_t bytes) {
        if (staging_fits || *backend == '\0') {
          ASSERT_TRUE(s.ok()) << s;
          EXPECT_EQ(served, staging_fits ? "cuda:0" : "cpu");
          EXPECT_TRUE(output(bytes) == want);
        } else {
          EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
          EXPECT_TRUE(output(bytes) == poison.substr(0, bytes));
        }
      };
      ASSERT_EQ(::pwrite(fd, x.data(), kBytes, 0), kBytes);
      ASSERT_EQ(::pwrite(fd, poison.data(), kBytes, kBytes), kBytes);
      hold(kBytes, free_tensors);
      ModelInferResponse r;
      expect(RunOn(engine, SinusoidalRequest(kT, kD, "", "sys", 0, "sys", kBytes, backend), &r,
                   &served, ModelKind::kSinusoidal),
             sinusoidal_want, kBytes);
      // RoPE of kQueryBytes from the region into its second half.
      ASSERT_EQ(::pwrite(fd, query.data(), kQueryBytes, 0), kQueryBytes);
      ASSERT_EQ(::pwrite(fd, poison.data(), kQueryBytes, kBytes), kQueryBytes);
      hold(kQueryBytes, free_tensors);
      ModelInferResponse rr;
      expect(RunOn(engine, RopeRequest(query, 0, kBytes, backend, "sys"), &rr, &served), rope_want,
             kQueryBytes);
      EXPECT_EQ(engine.scratch().idle_buffers(), 0) << "no scratch buffer was lent";
    }
  }
  others->Reset();
  ASSERT_TRUE(engine.shared_memory().Unregister("sys").ok());
  ::close(fd);
}

// A GPU that gives up on such a call (under AUTO) gives its staging
// charge back before the CPU runs it: while the CPU computes, the call
// holds less than a tensor (its plan), where the staging was a whole
// tensor. For the sinusoidal encoding and RoPE, through the engine, with
// host buffers the GPU did not pin.
TEST(SystemSharedMemoryOnAFakeGpu, AGpuThatGivesUpGivesTheStagingChargeBack) {
  testing::FakeGpuEngine gpu(BackendChoice::kAuto, /*auto_gpu_min_bytes=*/0);
  Engine& engine = gpu.engine();
  constexpr int64_t kT = 256, kD = 256, kBytes = kT * kD * 4;  // 256 KiB
  std::string x = RandomQuery(kBytes), out(kBytes, '\0');
  for (bool rope : {false, true}) {
    SCOPED_TRACE(rope ? "rope" : "sinusoidal");
    auto call = engine.Admit(0);
    ASSERT_TRUE(call.ok()) << call.status();
    RunContext ctx;
    CallEnv env{ctx, *call};
    int64_t held_while_computing = -1;
    env.inputs_intact = [&] {
      held_while_computing = call->bytes();
      return absl::OkStatus();
    };
    gpu.runtime().FailNext(FakeDeviceRuntime::Op::kLaunch, cudaErrorInvalidValue);
    absl::StatusOr<std::string> served;
    if (rope) {
      RopeTensors t;
      t.query = MutableTensor{DType::kFloat32, {1, kT, 4, kD / 4}, x.data(), kBytes};
      env.query_out = out.data();
      served = engine.ApplyRope(RopeOptions{}, t, env);
    } else {
      AbsoluteTensors t;
      t.x = MutableTensor{DType::kFloat32, {1, kT, kD}, x.data(), kBytes};
      env.x_out = out.data();
      served = engine.AddAbsolute(AbsoluteOptions{}, t, env);
    }
    ASSERT_TRUE(served.ok()) << served.status();
    EXPECT_EQ(*served, "cpu");
    ASSERT_GE(held_while_computing, 0) << "the inputs were never checked";
    EXPECT_LT(held_while_computing, kBytes) << "the GPU's staging charge was still held";
  }
}

// An input whose object the caller truncated (after the request found its
// region, before the server read it) reads as zeros: the call fails, and
// the output slice, which other calls may share, is left as it was rather
// than given the rotated zeros.
TEST(SystemSharedMemoryOnAFakeGpu, AnInputTruncatedUnderTheCallWritesNothingToTheOutputSlice) {
  testing::FakeGpuEngine gpu;
  Engine& engine = gpu.engine();
  const std::string query = RandomQuery();
  std::vector<int> fds;
  for (const char* name : {"in", "out"}) {
    fds.push_back(RegisteredObject(engine, name, kQueryBytes));
    ASSERT_GE(fds.back(), 0);
  }
  ASSERT_EQ(::pwrite(fds[0], query.data(), kQueryBytes, 0), kQueryBytes);
  const std::string poison(kQueryBytes, '\x7f');
  ASSERT_EQ(::pwrite(fds[1], poison.data(), kQueryBytes, 0), kQueryBytes);
  ASSERT_EQ(::ftruncate(fds[0], 0), 0);
  ModelInferRequest req = RopeRequest(query, 0, -1, "cpu", "in");
  Slice(req.mutable_outputs(0)->mutable_parameters(), kQueryBytes, 0, "out");
  ModelInferResponse resp;
  std::string served;
  const absl::Status s = RunOn(engine, std::move(req), &resp, &served);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("truncated"), std::string::npos) << s;
  std::string out(kQueryBytes, '\0');
  ASSERT_EQ(::pread(fds[1], out.data(), kQueryBytes, 0), kQueryBytes);
  EXPECT_EQ(out, poison);
  for (int fd : fds) ::close(fd);
}

// An input truncated while calls rotate it into another slice on the CPU,
// block by block on two threads (RopeThrough): each call either gives the
// whole result, or fails as truncated with every token of the output
// slice either as it was or finished, never the rotation of the zero pages
// that stand in for the truncated ones. Rounds truncate at random moments.
// Calls from a 16 MiB input slice into an output slice while another
// thread truncates the input's object at a random moment, round after
// round (a fresh input region each): a call either succeeds with `want`
// or fails with FAILED_PRECONDITION, every `row`-byte token of the output
// then either finished or as it was (poisoned). `request(in_region)`
// makes the call, its output to offset 0 of region "out". At least 12
// rounds, and more (up to 40) until one has failed midway, which it
// asserts: about a third do (1-5 of 12 in a run here).
void TruncatedMidCall(Engine& engine, const std::string& input, const std::string& want,
                      int64_t row, ModelKind model,
                      const std::function<ModelInferRequest(const char*)>& request) {
  const auto bytes = static_cast<int64_t>(input.size());
  const int64_t tokens = bytes / row;
  std::mt19937 rng(std::random_device{}());  // when to truncate
  const std::string poison(bytes, '\xff');
  std::string served;
  const int out_fd = RegisteredObject(engine, "out", bytes);
  ASSERT_GE(out_fd, 0);
  int failed_midway = 0, rounds = 0;
  for (int round = 0; round < 40 && (round < 12 || failed_midway == 0); ++round, ++rounds) {
    const std::string name = absl::StrCat("in", round);
    const int in_fd = RegisteredObject(engine, name, bytes);
    ASSERT_GE(in_fd, 0);
    ASSERT_EQ(::pwrite(in_fd, input.data(), bytes, 0), bytes);
    std::atomic<bool> truncated{false};
    std::thread vandal([&, delay = std::uniform_int_distribution<int>(0, 20000)(rng)] {
      std::this_thread::sleep_for(std::chrono::microseconds(delay));
      EXPECT_EQ(::ftruncate(in_fd, 0), 0);
      truncated = true;
    });
    // A failed ASSERT below returns: the thread must be joined first.
    absl::Cleanup join = [&vandal] {
      if (vandal.joinable()) vandal.join();
    };
    for (int call = 0; call < 200; ++call) {
      ASSERT_EQ(::pwrite(out_fd, poison.data(), bytes, 0), bytes);
      ModelInferResponse resp;
      const absl::Status s = RunOn(engine, request(name.c_str()), &resp, &served, model);
      std::string out(bytes, '\0');
      ASSERT_EQ(::pread(out_fd, out.data(), bytes, 0), bytes);
      if (s.ok()) {
        ASSERT_TRUE(out == want) << "round " << round << " call " << call;
        continue;
      }
      ASSERT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
      ASSERT_NE(s.message().find("truncated"), std::string::npos) << s;
      int64_t finished = 0;
      for (int64_t t = 0; t < tokens; ++t) {
        const std::string_view at(out.data() + t * row, row);
        if (at == std::string_view(want.data() + t * row, row)) {
          ++finished;
        } else {
          ASSERT_TRUE(at == std::string_view(poison.data(), row))
              << "round " << round << ": token " << t << " is neither finished nor untouched";
        }
      }
      if (finished > 0) ++failed_midway;
      break;
    }
    vandal.join();
    ASSERT_TRUE(truncated);
    ASSERT_TRUE(engine.shared_memory().Unregister(name).ok());
    ::close(in_fd);
  }
  std::printf("%d of %d rounds failed after writing some finished tokens\n", failed_midway, rounds);
  EXPECT_GT(failed_midway, 0) << "no truncation landed mid-call: the check went untested";
  ASSERT_TRUE(engine.shared_memory().Unregister("out").ok());
  ::close(out_fd);
}

TEST(SystemSharedMemoryOnTheCpu, AnInputTruncatedMidCallLeavesOnlyFinishedTokensInTheOutput) {
  std::unique_ptr<Engine> made = CpuEngine();
  ASSERT_NE(made, nullptr);
  // 16384 tokens x 4 x 64 FP32 (16 MiB): both threads, 85 blocks.
  constexpr int64_t kBigTokens = 16384, kRow = kHeads * kDim * 4;
  const std::string query = RandomQuery(kBigTokens * kRow);
  const std::string want = CpuResult(*made, query, kBigTokens);
  TruncatedMidCall(*made, query, want, kRow, ModelKind::kRope, [](const char* in_region) {
    return BigRopeRequest(kBigTokens, "", in_region, 0, "out", 0);
  });
}

// The same for the sinusoidal encoding, x from one slice into y in another.
TEST(SystemSharedMemoryOnTheCpu, AnXTruncatedMidCallLeavesOnlyFinishedTokensInY) {
  std::unique_ptr<Engine> made = CpuEngine();
  ASSERT_NE(made, nullptr);
  constexpr int64_t kTokens4k = 4096, kDim1k = 1024, kRow = kDim1k * 4;  // 16 MiB, 86 blocks
  const std::string x = RandomQuery(kTokens4k * kRow);
  const std::string want = SinusoidalResult(*made, x, kTokens4k, kDim1k);
  TruncatedMidCall(*made, x, want, kRow, ModelKind::kSinusoidal, [](const char* in_region) {
    return SinusoidalRequest(kTokens4k, kDim1k, "", in_region, 0, "out", 0);
  });
}

// The same for a bias added to logits in one slice, into another.
TEST(SystemSharedMemoryOnTheCpu, LogitsTruncatedMidCallLeaveOnlyFinishedRowsInTheBias) {
  std::unique_ptr<Engine> made = CpuEngine();
  ASSERT_NE(made, nullptr);
  const std::vector<int64_t> shape = {1, 16, 256, 1024};  // 16 MiB, 86 blocks
  const std::string logits = RandomQuery(16 * 256 * 1024 * 4);
  const std::string want = BiasResult(*made, logits, shape);
  TruncatedMidCall(
      *made, logits, want, 1024 * 4, ModelKind::kAttentionBias,
      [&shape](const char* in_region) { return BiasRequest(shape, "", in_region, 0, "out", 0); });
}

// One object registered twice ("a" from its start, "b" from a quarter of
// the input in): x in "a" and y in "b" are partly the same bytes, at two
// addresses. Block by block, later blocks would read x the earlier ones had
// overwritten; the call takes a scratch buffer instead and gives the whole
// x's result, for RoPE, the sinusoidal encoding and the bias alike.
TEST(SystemSharedMemoryOnTheCpu, SlicesOfOneObjectRegisteredTwiceAreSeenToOverlap) {
  std::unique_ptr<Engine> made = CpuEngine();
  ASSERT_NE(made, nullptr);
  Engine& engine = *made;
  constexpr int64_t kT = 4096, kBytes = kT * kHeads * kDim * 4;  // 4 MiB, 21 blocks
  const std::string x = RandomQuery(kBytes);
  std::string served;
  const std::string rope_want = CpuResult(engine, x, kT);
  const std::string sinusoidal_want = SinusoidalResult(engine, x, kT, kHeads * kDim);
  const std::vector<int64_t> logits_shape = {1, 4, kT / 4, kHeads * kDim};  // kBytes too
  const std::string bias_want = BiasResult(engine, x, logits_shape);
  const std::string key = absl::StrCat("/posenc-kserve-twice-", ::getpid());
  const int fd = ::open(("/dev/shm" + key).c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, 2 * kBytes), 0);
  ASSERT_TRUE(engine.shared_memory().Register("a", key, 0, 2 * kBytes).ok());
  ASSERT_TRUE(engine.shared_memory().Register("b", key, kBytes / 4, kBytes).ok());
  ::unlink(("/dev/shm" + key).c_str());
  for (ModelKind model : {ModelKind::kRope, ModelKind::kSinusoidal, ModelKind::kAttentionBias}) {
    SCOPED_TRACE(KindName(model));
    ASSERT_EQ(::pwrite(fd, x.data(), kBytes, 0), kBytes);
    ModelInferRequest req = model == ModelKind::kRope ? BigRopeRequest(kT, "", "a", 0, "b", 0)
                            : model == ModelKind::kSinusoidal
                                ? SinusoidalRequest(kT, kHeads * kDim, "", "a", 0, "b", 0)
                                : BiasRequest(logits_shape, "", "a", 0, "b", 0);
    ModelInferResponse r;
    ASSERT_TRUE(RunOn(engine, std::move(req), &r, &served, model).ok());
    std::string y(kBytes, '\0');
    ASSERT_EQ(::pread(fd, y.data(), kBytes, kBytes / 4), kBytes);
    EXPECT_TRUE(y == (model == ModelKind::kRope         ? rope_want
                      : model == ModelKind::kSinusoidal ? sinusoidal_want
                                                        : bias_want));
    EXPECT_EQ(engine.scratch().idle_buffers(), 1) << "through a scratch buffer";
  }
  ASSERT_TRUE(engine.shared_memory().Unregister("a").ok());
  ASSERT_TRUE(engine.shared_memory().Unregister("b").ok());
  ::close(fd);
}

// One tensor's output on the other tensor's input, in line with it or
// shifted by half a tensor, or both tensors on the same bytes, each in
// place; in one region, or through two registrations of one object ("a"
// from its start, "b" from half a tensor in: b:x is a:x + kBytes / 2),
// which the engine, comparing addresses, cannot see. Each output is the
// result of its tensor's input as it was, as if every input were read
// before any result went out. Where both results would go to the same
// bytes the call is refused before any work (OutputSet::CheckApart), also
// through two registrations.
TEST(SystemSharedMemoryOnTheCpu, OneTensorsOutputOnTheOthersInputGetsTheInputsAsTheyWere) {
  std::unique_ptr<Engine> made = CpuEngine();
  ASSERT_NE(made, nullptr);
  Engine& engine = *made;
  constexpr int64_t kT = 4096, kBytes = kT * kHeads * kDim * 4;  // 4 MiB, 21 blocks
  const std::string q = RandomQuery(kBytes), k = RandomQuery(kBytes);
  const std::string rq = CpuResult(engine, q, kT), rk = CpuResult(engine, k, kT);
  const std::string key = absl::StrCat("/posenc-kserve-cross-", ::getpid());
  const int fd = ::open(("/dev/shm" + key).c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, 4 * kBytes), 0);
  ASSERT_TRUE(engine.shared_memory().Register("a", key, 0, 4 * kBytes).ok());
  ASSERT_TRUE(engine.shared_memory().Register("b", key, kBytes / 2, 3 * kBytes + kBytes / 2).ok());
  ::unlink(("/dev/shm" + key).c_str());
  const auto read = [&](int64_t at) {
    std::string s(kBytes, '\0');
    EXPECT_EQ(::pread(fd, s.data(), kBytes, at), kBytes);
    return s;
  };
  struct Case {
    const char* what;
    SliceAt query, key, query_out, key_out;
    bool same_input;  // key's bytes are query's (both in place on them)
  };
  constexpr int64_t kHalf = kBytes / 2;
  const Case cases[] = {
      {"query_out on key, another registration",
       {"a", 0},
       {"a", kBytes},
       {"b", kHalf},
       {"a", 2 * kBytes},
       false},
      {"query_out on key, one region",
       {"a", 0},
       {"a", kBytes},
       {"a", kBytes},
       {"a", 2 * kBytes},
       false},
      {"query_out on key's second half, another registration",
       {"a", 2 * kBytes},
       {"a", 0},
       {"b", 0},
       {"a", 3 * kBytes},
       false},
      {"key_out on query's second half, another registration",
       {"a", 0},
       {"a", 2 * kBytes},
       {"a", 3 * kBytes},
       {"b", 0},
       false},
      {"key_out on query, one region",
       {"a", kBytes},
       {"a", 0},
       {"a", 2 * kBytes},
       {"a", kBytes},
       false},
      {"each on the other's input, another registration",
       {"a", 0},
       {"a", kBytes},
       {"b", kHalf},
       {"a", 0},
       false},
      {"both in place on one slice",
       {"a", kBytes},
       {"a", kBytes},
       {"a", kBytes},
       {"a", kBytes},
       true},
      {"both in place on one slice, two registrations",
       {"a", kBytes},
       {"b", kHalf},
       {"a", kBytes},
       {"b", kHalf},
       true},
  };
  const auto object_offset = [](SliceAt at) {
    return (at.region[0] == 'b' ? kHalf : 0) + at.offset;
  };
  const std::string poison(4 * kBytes, '\xff');
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string& k_in = c.same_input ? q : k;
    ASSERT_EQ(::pwrite(fd, poison.data(), poison.size(), 0), 4 * kBytes);
    ASSERT_EQ(::pwrite(fd, q.data(), kBytes, object_offset(c.query)), kBytes);
    ASSERT_EQ(::pwrite(fd, k_in.data(), kBytes, object_offset(c.key)), kBytes);
    ModelInferResponse r;
    std::string served;
    const absl::Status s =
        RunOn(engine, RopeQueryKeyRequest(kT, c.query, c.key, c.query_out, c.key_out), &r, &served);
    // Outputs on the same bytes (of the object: two registrations too)
    // cannot both hold their results: refused before any work.
    const bool outputs_meet = !(object_offset(c.query_out) + kBytes <= object_offset(c.key_out) ||
                                object_offset(c.key_out) + kBytes <= object_offset(c.query_out));
    if (outputs_meet) {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      EXPECT_NE(s.message().find("share bytes"), absl::string_view::npos) << s;
      EXPECT_TRUE(read(object_offset(c.query)) == q) << "left as it was";
      continue;
    }
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(served, "cpu");
    EXPECT_TRUE(read(object_offset(c.key_out)) == (c.same_input ? rq : rk)) << "key_out";
    EXPECT_TRUE(read(object_offset(c.query_out)) == rq) << "query_out";
  }
  ASSERT_TRUE(engine.shared_memory().Unregister("a").ok());
  ASSERT_TRUE(engine.shared_memory().Unregister("b").ok());
  ::close(fd);
}

// `input` from one slice of a region into another: the result `want` of a
// fresh CPU engine (want_of; sent in the message), the input as it was;
// block by block through the CPU threads' own buffers where the output
// lies apart from the input, so that no scratch buffer is lent, and
// through a scratch buffer where it overlaps the input (then the result of
// the whole input as it was, as if it were all read first). `request(in_at, out_at)` makes the
// call, region "r".
void IntoAnotherSliceIsTheAnswersResult(
    ModelKind model, const std::string& input, const std::function<std::string(Engine&)>& want_of,
    const std::function<ModelInferRequest(int64_t, int64_t)>& request) {
  std::unique_ptr<Engine> made = CpuEngine();
  ASSERT_NE(made, nullptr);
  Engine& engine = *made;
  const auto bytes = static_cast<int64_t>(input.size());
  std::string served;
  const std::string want = want_of(engine);
  ASSERT_EQ(engine.scratch().idle_buffers(), 0);
  const int fd = RegisteredObject(engine, "r", 3 * bytes);
  ASSERT_GE(fd, 0);
  const std::string poison(bytes, '\xff');
  const auto read = [&](int64_t at) {
    std::string s(bytes, '\0');
    EXPECT_EQ(::pread(fd, s.data(), bytes, at), bytes);
    return s;
  };
  for (const auto& [in_at, out_at, lent] : {std::tuple<int64_t, int64_t, int>{0, 2 * bytes, 0},
                                            {bytes, 0, 0},
                                            {0, bytes / 2, 1},
                                            {bytes / 2, 0, 1}}) {
    SCOPED_TRACE(::testing::Message() << "input at " << in_at << ", output at " << out_at);
    ASSERT_EQ(::pwrite(fd, poison.data(), bytes, out_at), bytes);
    ASSERT_EQ(::pwrite(fd, input.data(), bytes, in_at), bytes);
    ModelInferResponse r;
    ASSERT_TRUE(RunOn(engine, request(in_at, out_at), &r, &served, model).ok());
    EXPECT_EQ(served, "cpu");
    EXPECT_EQ(r.outputs(0).parameters().at(kShmOffset).int64_param(), out_at);
    EXPECT_TRUE(r.raw_output_contents().empty() || r.raw_output_contents(0).empty());
    EXPECT_TRUE(read(out_at) == want);
    const bool apart = in_at + bytes <= out_at || out_at + bytes <= in_at;
    if (apart) EXPECT_TRUE(read(in_at) == input) << "the input changed";
    EXPECT_EQ(engine.scratch().idle_buffers(), lent);
  }
  ASSERT_TRUE(engine.shared_memory().Unregister("r").ok());
  ::close(fd);
}

TEST(SystemSharedMemoryOnTheCpu, SinusoidalIntoAnotherSliceIsTheAnswersResult) {
  constexpr int64_t kT = 3000, kD = 768;  // 9 MiB
  const std::string x = RandomQuery(kT * kD * 4);
  IntoAnotherSliceIsTheAnswersResult(
      ModelKind::kSinusoidal, x,
      [&](Engine& engine) { return SinusoidalResult(engine, x, kT, kD); },
      [](int64_t in_at, int64_t out_at) {
        return SinusoidalRequest(kT, kD, "", "r", in_at, "r", out_at);
      });
}

// The same for a bias added to logits; rows larger than a block (70000
// keys, 273 KiB, a long context's decode) go in pieces through the
// threads' buffers too: no scratch buffer where the output lies apart.
TEST(SystemSharedMemoryOnTheCpu, BiasIntoAnotherSliceIsTheAnswersResult) {
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{1, 3, 1000, 768}, std::vector<int64_t>{1, 2, 4, 70000}}) {
    SCOPED_TRACE(::testing::Message() << "k_len " << shape[3]);
    const std::string logits = RandomQuery(shape[0] * shape[1] * shape[2] * shape[3] * 4);
    IntoAnotherSliceIsTheAnswersResult(
        ModelKind::kAttentionBias, logits,
        [&](Engine& engine) { return BiasResult(engine, logits, shape); },
        [&shape](int64_t in_at, int64_t out_at) {
          return BiasRequest(shape, "", "r", in_at, "r", out_at);
        });
  }
}

// An output slice overlapping the input slice (perf_analyzer never names
// one; a client may): the result is that of the whole input as it was, in
// either direction, as if every input were read before any result went
// out (blocks written as they finish would rotate rotated values).
TEST(SystemSharedMemoryOnTheCpu, AnOutputOverlappingItsInputGetsTheWholeInputsResult) {
  std::unique_ptr<Engine> made = CpuEngine();
  ASSERT_NE(made, nullptr);
  Engine& engine = *made;
  constexpr int64_t kTokens4k = 4096, kBytes = kTokens4k * kHeads * kDim * 4;  // 21 blocks
  const std::string query = RandomQuery(kBytes);
  const std::string want = CpuResult(engine, query, kTokens4k);
  std::string served;
  const int fd = RegisteredObject(engine, "r", kBytes * 3 / 2);
  ASSERT_GE(fd, 0);
  for (const auto& [in_at, out_at] :
       {std::pair<int64_t, int64_t>{0, kBytes / 2}, std::pair<int64_t, int64_t>{kBytes / 2, 0}}) {
    ASSERT_EQ(::pwrite(fd, query.data(), kBytes, in_at), kBytes);
    ModelInferResponse r;
    ASSERT_TRUE(
        RunOn(engine, BigRopeRequest(kTokens4k, "", "r", in_at, "r", out_at), &r, &served).ok());
    std::string out(kBytes, '\0');
    ASSERT_EQ(::pread(fd, out.data(), kBytes, out_at), kBytes);
    EXPECT_TRUE(out == want) << "input at " << in_at << ", output at " << out_at;
  }
  ASSERT_TRUE(engine.shared_memory().Unregister("r").ok());
  ::close(fd);
}

// Tensors go from slice to slice through each CPU thread's own block
// buffer, in either layout (BHSD's blocks, one stretch a head, gathered
// into it): the call is lent no scratch buffer of the tensor's size, and
// so is not refused for lack of budget for one.
TEST(SystemSharedMemoryOnTheCpu, CallsIntoAnotherSliceNeedNoScratchBudget) {
  EngineOptions o;
  o.enable_cuda = false;
  o.cpu_threads = 2;
  o.shared_memory.enabled = true;
  o.max_request_tensor_bytes = 16 << 20;
  o.max_inflight_bytes = 128 << 20;  // the region (32 MiB) is held in it
  auto made = Engine::Create(o);
  ASSERT_TRUE(made.ok()) << made.status();
  Engine& engine = **made;
  constexpr int64_t kBigTokens = 16384, kBig = kBigTokens * kHeads * kDim * 4;  // 16 MiB
  const std::string query = RandomQuery(kBig);
  const std::string want = CpuResult(engine, query, kBigTokens);
  ASSERT_EQ(engine.scratch().idle_buffers(), 0);
  const int fd = RegisteredObject(engine, "r", 2 * kBig);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, query.data(), kBig, 0), kBig);
  const std::string poison(kBig, '\xff');
  const auto call = [&](ModelInferRequest req) {
    EXPECT_EQ(::pwrite(fd, poison.data(), kBig, kBig), kBig);
    ModelInferResponse resp;
    std::string served;
    return RunOn(engine, std::move(req), &resp, &served);
  };
  const auto out = [&] {
    std::string s(kBig, '\0');
    EXPECT_EQ(::pread(fd, s.data(), kBig, kBig), kBig);
    return s;
  };
  // Other calls hold all but 8 MiB of the budget: less than the tensor.
  auto others = engine.Admit(0);
  ASSERT_TRUE(others.ok()) << others.status();
  AdmissionControl& budget = engine.admission();
  ASSERT_TRUE(others->TryGrow(budget.options().max_bytes - budget.bytes() - (8 << 20)).ok());

  ASSERT_TRUE(call(BigRopeRequest(kBigTokens, "", "r", 0, "r", kBig)).ok());
  EXPECT_TRUE(out() == want);
  EXPECT_EQ(engine.scratch().idle_buffers(), 0) << "no scratch buffer was lent";

  // The same bytes as a BHSD tensor, [1, heads, tokens, dim]: the answer
  // it gets in the message, within the same budget.
  const auto as_bhsd = [&](ModelInferRequest req) {
    auto* shape = req.mutable_inputs(0)->mutable_shape();
    shape->Clear();
    for (int64_t d : {int64_t{1}, kHeads, kBigTokens, kDim}) shape->Add(d);
    (*req.mutable_parameters())["layout"].set_string_param("bhsd");
    return req;
  };
  ASSERT_TRUE(call(as_bhsd(BigRopeRequest(kBigTokens, "", "r", 0, "r", kBig))).ok());
  EXPECT_EQ(engine.scratch().idle_buffers(), 0) << "no scratch buffer was lent";
  const std::string bhsd_out = out();
  others->Reset();
  EXPECT_TRUE(bhsd_out ==
              CpuAnswer(engine, as_bhsd(BigRopeRequest(kBigTokens, query, nullptr, 0, nullptr, 0)),
                        ModelKind::kRope, query));
  ASSERT_TRUE(engine.shared_memory().Unregister("r").ok());
  ::close(fd);
}

// Unregistering and registering the region again while calls use it:
// every call either finds it (and computes right) or is told it is not
// registered; an unregister waits for the calls holding it, and every
// handle opened is closed.
TEST_F(CudaSharedMemoryOnFakeRuntime, UnregisteringUnderLoadHurtsNoCall) {
  const std::string want = Expected();
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, not_found{0}, other{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 3; ++c) {
    callers.emplace_back([&] {
      while (!stop.load()) {
        ModelInferResponse r;
        std::string b;
        const absl::Status s = Run(Request(0, 2 * kQueryBytes), &r, &b);
        if (s.ok()) {
          ++ok;
        } else if (s.code() == absl::StatusCode::kNotFound) {
          ++not_found;
        } else {
          ++other;
          ADD_FAILURE() << s;
        }
      }
    });
  }
  const std::string handle = gpu_.Handle(device_);
  // At least 200 rounds, and on until the callers have seen both.
  for (int i = 0; i < 200 || ok.load() < 20 || not_found.load() < 5; ++i) {
    ASSERT_LT(i, 200000) << "the callers never ran";
    ASSERT_TRUE(
        engine_->shared_memory().Unregister("gpu", absl::InfiniteFuture(), MemoryKind::kCuda).ok());
    std::this_thread::sleep_for(std::chrono::microseconds(100));
    ASSERT_TRUE(engine_->shared_memory().RegisterCuda("gpu", handle, 0, kRegionBytes).ok());
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  stop = true;
  for (std::thread& t : callers) t.join();
  std::printf("ok %d, not found %d\n", ok.load(), not_found.load());
  EXPECT_GT(ok.load(), 0);
  EXPECT_EQ(other.load(), 0);
  EXPECT_EQ(rt_.ipc_open(), 1) << "only the registration standing is open";
  EXPECT_EQ(DeviceBytes(2 * kQueryBytes, kQueryBytes), want);
  EXPECT_EQ(DeviceBytes(0, kQueryBytes), query_);
}

TEST_F(CudaSharedMemoryOnFakeRuntime, RequestsTheDeviceCannotServeAreRefusedByName) {
  ModelInferResponse resp;
  std::string backend;
  // The CPU cannot reach device memory.
  absl::Status s = Run(Request(0, 0, "cpu"), &resp, &backend);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("CUDA shared memory"), std::string::npos) << s;
  // Misaligned for its elements, in place on the device.
  std::memcpy(static_cast<char*>(device_) + 2, query_.data(), kQueryBytes);
  s = Run(Request(2, 2), &resp, &backend);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("multiple of its element size"), std::string::npos) << s;
  // Past the region.
  s = Run(Request(kRegionBytes - 8, kRegionBytes - 8), &resp, &backend);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("\"gpu\""), std::string::npos) << s;
  EXPECT_TRUE(engine_->Ready().ok()) << "none of these hurt the backend";
}

TEST_F(CudaSharedMemoryOnFakeRuntime, UnregisteredRegionsAreGoneAndTheirHandlesClosed) {
  EXPECT_EQ(rt_.ipc_open(), 1);
  ASSERT_TRUE(
      engine_->shared_memory().Unregister("gpu", absl::InfiniteFuture(), MemoryKind::kCuda).ok());
  EXPECT_EQ(rt_.ipc_open(), 0);
  ModelInferResponse resp;
  std::string backend;
  EXPECT_EQ(Run(Request(0, 0), &resp, &backend).code(), absl::StatusCode::kNotFound);
}

// A server whose default is the CPU still computes device tensors on the
// GPU when the request leaves the backend to it: they cannot be computed
// anywhere else.
TEST(CudaSharedMemoryDefaults, ADefaultOfCpuStillServesDeviceTensorsOnTheGpu) {
  testing::FakeGpuEngine gpu(BackendChoice::kCpu);
  const std::string query = RandomQuery();
  char* device = gpu.Allocate(kRegionBytes, 0x7f);
  std::memcpy(device, query.data(), kQueryBytes);
  ASSERT_TRUE(
      gpu.engine().shared_memory().RegisterCuda("gpu", gpu.Handle(device), 0, kRegionBytes).ok());
  const std::string want = CpuResult(gpu.engine(), query);
  ModelInferResponse resp;
  std::string backend;
  ASSERT_TRUE(RunOn(gpu.engine(), RopeRequest(query, 0, 0), &resp, &backend).ok());
  EXPECT_EQ(backend, "cuda:0");
  EXPECT_EQ(std::string(device, kQueryBytes), want);
  // The same request with its tensors in the message goes to the CPU.
  ModelInferResponse socket;
  ASSERT_TRUE(RunOn(gpu.engine(), RopeRequest(query, -1, -1), &socket, &backend).ok());
  EXPECT_EQ(backend, "cpu");
}

// Two GPUs served: staged calls spread over both, a region is opened by
// the backend of its own device and its calls run there, a device not
// served is refused naming those that are, and a GPU that fails is routed
// around.
TEST(CudaSharedMemoryOnTwoFakeGpus, RegionsRunOnTheirDeviceAndStagedCallsSpread) {
  FakeDeviceRuntime rt0, rt1;
  std::vector<Engine::Gpu> gpus;
  for (auto [device, rt] : {std::pair<int, FakeDeviceRuntime*>{0, &rt0}, {1, &rt1}}) {
    DeviceInfo info;
    info.name = absl::StrCat("fake", device);
    rt->set_ordinal(device);
    auto b = cuda::CreateCudaBackendOn(*rt, device, info, 132);
    ASSERT_TRUE(b.ok()) << b.status();
    gpus.push_back({device, std::move(*b)});
  }
  EngineOptions o;
  o.shared_memory.enabled = true;
  o.shared_memory.cuda_enabled = true;
  o.auto_by_measured_cost = false;
  o.default_backend = BackendChoice::kCuda;
  auto made = Engine::CreateWithGpus(o, CreateCpuBackend(1), std::move(gpus), "");
  ASSERT_TRUE(made.ok()) << made.status();
  Engine& engine = **made;
  const std::string query = RandomQuery();
  const std::string want = CpuResult(engine, query);

  // Staged: in turn on each GPU, each giving the CPU's bytes.
  std::set<std::string> served;
  for (int i = 0; i < 4; ++i) {
    ModelInferResponse resp;
    std::string backend;
    ASSERT_TRUE(RunOn(engine, RopeRequest(query, -1, -1), &resp, &backend).ok());
    EXPECT_EQ(resp.raw_output_contents(0), want);
    served.insert(backend);
  }
  EXPECT_EQ(served, (std::set<std::string>{"cuda:0", "cuda:1"}));
  EXPECT_EQ(rt0.launches(), 2);
  EXPECT_EQ(rt1.launches(), 2);

  // A region on device 1: opened and computed there.
  void* mem = nullptr;
  ASSERT_EQ(rt1.Malloc(&mem, kRegionBytes), cudaSuccess);
  std::memcpy(mem, query.data(), kQueryBytes);
  const cudaIpcMemHandle_t h = rt1.IpcHandleOf(mem);
  const std::string raw(h.reserved, sizeof(h));
  ASSERT_TRUE(engine.shared_memory().RegisterCuda("gpu", raw, 1, kRegionBytes).ok());
  EXPECT_EQ(rt1.ipc_open(), 1);
  EXPECT_EQ(rt0.ipc_open(), 0);
  ModelInferResponse resp;
  std::string backend;
  ASSERT_TRUE(RunOn(engine, RopeRequest(query, 0, 0), &resp, &backend).ok());
  EXPECT_EQ(backend, "cuda:1");
  EXPECT_EQ(std::string(static_cast<char*>(mem), kQueryBytes), want);

  const absl::Status s = engine.shared_memory().RegisterCuda("gpu2", raw, 2, kRegionBytes);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("device(s) 0, 1"), std::string::npos) << s;

  // A system region is pinned by the primary GPU (0) only: RoPE from one
  // of its slices into another goes there every time, with no host copy,
  // rather than in turn to GPU 1, which would stage it.
  const std::string key = "/posenc-kserve-two-gpus-" + std::to_string(::getpid());
  const int fd = ::open(("/dev/shm" + key).c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, kRegionBytes), 0);
  ASSERT_EQ(::pwrite(fd, query.data(), kQueryBytes, 0), kQueryBytes);
  const absl::Status sys = engine.shared_memory().Register("sys", key, 0, kRegionBytes);
  ::unlink(("/dev/shm" + key).c_str());
  ASSERT_TRUE(sys.ok()) << sys;
  EXPECT_EQ(rt0.registered_bytes(), kRegionBytes);
  EXPECT_EQ(rt1.registered_bytes(), 0);
  const int64_t direct0 = rt0.bytes_copied_direct();
  const int launches1 = rt1.launches();
  for (int i = 0; i < 4; ++i) {
    ModelInferResponse r;
    ASSERT_TRUE(
        RunOn(engine, RopeRequest(query, 0, 2 * kQueryBytes, "", "sys"), &r, &backend).ok());
    EXPECT_EQ(backend, "cuda:0");
    std::string out(kQueryBytes, '\0');
    ASSERT_EQ(::pread(fd, out.data(), kQueryBytes, 2 * kQueryBytes), kQueryBytes);
    EXPECT_EQ(out, want);
  }
  EXPECT_EQ(rt0.bytes_copied_direct() - direct0, 4 * 2 * kQueryBytes);
  EXPECT_EQ(rt1.launches(), launches1);
  EXPECT_EQ(engine.scratch().idle_buffers(), 0);
  ASSERT_TRUE(engine.shared_memory().Unregister("sys").ok());
  ::close(fd);

  // GPU 1 loses its context: staged calls all go to GPU 0, and the server
  // stays ready.
  rt1.FailNext(FakeDeviceRuntime::Op::kLaunch, cudaErrorIllegalAddress);
  for (int i = 0; i < 4; ++i) {
    ModelInferResponse r;
    RunOn(engine, RopeRequest(query, -1, -1), &r, &backend).IgnoreError();
  }
  const int launches0 = rt0.launches();
  for (int i = 0; i < 3; ++i) {
    ModelInferResponse r;
    ASSERT_TRUE(RunOn(engine, RopeRequest(query, -1, -1), &r, &backend).ok());
    EXPECT_EQ(backend, "cuda:0");
    EXPECT_EQ(r.raw_output_contents(0), want);
  }
  EXPECT_EQ(rt0.launches(), launches0 + 3);
  EXPECT_TRUE(engine.Ready().ok());
  ASSERT_TRUE(
      engine.shared_memory().Unregister("gpu", absl::InfiniteFuture(), MemoryKind::kCuda).ok());
  made->reset();
  rt1.Free(mem);
}

// A call is charged what the GPU stages of it (Backend::StagingBytes), no
// more: a large call (chunked) two chunks of rows, not its whole tensor;
// one in memory the GPU pinned (in place in a registered region),
// nothing. So a budget that holds that much but not the tensor serves
// them on the GPU, AUTO or asked for.
TEST(GpuStaging, IsChargedWhatTheGpuStages) {
  testing::FakeGpuEngine gpu(BackendChoice::kAuto, /*auto_gpu_min_bytes=*/0);
  Engine& engine = gpu.engine();
  AdmissionControl& budget = engine.admission();
  // Other calls hold all of the budget but `free` bytes.
  auto others = engine.Admit(0);
  ASSERT_TRUE(others.ok()) << others.status();
  const auto leave = [&](int64_t free) {
    others->Reset();
    others = engine.Admit(0);
    ASSERT_TRUE(others.ok());
    ASSERT_TRUE(others->TryGrow(budget.options().max_bytes - budget.bytes() - free).ok());
  };
  // 4096 tokens x 1024 FP32 (16 MiB, four times the 4 MiB chunks), in the
  // process's own memory: staged in two slots of 1024 tokens, 8 MiB.
  constexpr int64_t kT = 4096, kD = 1024, kBytes = kT * kD * 4;
  const std::string x = RandomQuery(kBytes);
  const std::string want = SinusoidalResult(engine, x, kT, kD);
  for (const char* backend : {"", "cuda"}) {
    SCOPED_TRACE(*backend == '\0' ? "AUTO" : backend);
    leave(kBytes * 3 / 4);
    std::string y = x;
    auto call = engine.Admit(0);
    ASSERT_TRUE(call.ok()) << call.status();
    RunContext ctx;
    CallEnv env{ctx, *call};
    env.backend = *backend == '\0' ? BackendChoice::kAuto : BackendChoice::kCuda;
    AbsoluteTensors t;
    t.x = MutableTensor{DType::kFloat32, {1, kT, kD}, y.data(), kBytes};
    absl::StatusOr<std::string> served = engine.AddAbsolute(AbsoluteOptions{}, t, env);
    ASSERT_TRUE(served.ok()) << served.status();
    EXPECT_EQ(*served, "cuda:0");
    EXPECT_TRUE(y == want);
  }
  // RoPE in place in a region the GPU pinned: nothing staged, nothing
  // charged, with a budget that holds half the tensor.
  const std::string query = RandomQuery();
  const std::string rope_want = CpuResult(engine, query);
  others->Reset();  // registering takes the region's size of the budget
  const int fd = RegisteredObject(engine, "sys", kQueryBytes);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(gpu.runtime().registered_bytes(), kQueryBytes);
  for (const char* backend : {"", "cuda"}) {
    SCOPED_TRACE(*backend == '\0' ? "AUTO" : backend);
    ASSERT_EQ(::pwrite(fd, query.data(), kQueryBytes, 0), kQueryBytes);
    leave(kQueryBytes / 2);
    const int64_t direct = gpu.runtime().bytes_copied_direct();
    ModelInferResponse r;
    std::string served;
    const absl::Status s = RunOn(engine, RopeRequest(query, 0, 0, backend, "sys"), &r, &served);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(served, "cuda:0");
    EXPECT_EQ(gpu.runtime().bytes_copied_direct() - direct, 2 * kQueryBytes);
    std::string out(kQueryBytes, '\0');
    ASSERT_EQ(::pread(fd, out.data(), kQueryBytes, 0), kQueryBytes);
    EXPECT_TRUE(out == rope_want);
  }
  others->Reset();
  ASSERT_TRUE(engine.shared_memory().Unregister("sys").ok());
  ::close(fd);
}

// A call that may run on a GPU also holds the side tables the GPU stages
// beside its tensors (PlanCost::device_side_bytes: positions, frequencies),
// which can outgrow the tensors: float16 rows of 4 carry 8 bytes of
// tensor and 8 of position a token. A budget with room for the plan and
// the tensor's staging but not for the side tables refuses the call that
// asked for CUDA; one asking for the CPU needs none of them.
TEST(GpuStaging, ChargesTheSideTablesTheGpuStages) {
  testing::FakeGpuEngine gpu(BackendChoice::kCuda, /*auto_gpu_min_bytes=*/0);
  Engine& engine = gpu.engine();
  AdmissionControl& budget = engine.admission();
  constexpr int64_t kT = 1 << 16, kD = 4, kBytes = kT * kD * 2;
  // float16 values in (-1, -0.5] and [0.5, 1).
  const unsigned seed = std::random_device()();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  std::string x(kBytes, '\0');
  for (int64_t i = 0; i < kT * kD; ++i) {
    const auto h = static_cast<uint16_t>(0x3800 | (rng() & 0x83ff));
    std::memcpy(&x[2 * i], &h, 2);
  }
  AbsoluteTensors t;
  std::string y = x;
  t.x = MutableTensor{DType::kFloat16, {1, kT, kD}, y.data(), kBytes};
  PlanCost cost;
  ASSERT_TRUE(PlanAbsolute(AbsoluteOptions{}, t, [&](const PlanCost& c) {
                cost = c;
                return absl::OkStatus();
              }).ok());
  ASSERT_GT(cost.device_side_bytes, kBytes);
  const int64_t staging = engine.gpus()[0].backend->StagingBytes(kBytes, kD * 2);
  auto others = engine.Admit(0);
  ASSERT_TRUE(others.ok()) << others.status();
  for (const bool room : {false, true}) {
    for (const BackendChoice choice : {BackendChoice::kCuda, BackendChoice::kCpu}) {
      SCOPED_TRACE(::testing::Message() << (room ? "room" : "no room") << ", "
                                        << (choice == BackendChoice::kCuda ? "cuda" : "cpu"));
      const int64_t free = cost.plan_bytes + staging + (room ? cost.device_side_bytes : 0);
      others->Reset();
      others = engine.Admit(0);
      ASSERT_TRUE(others.ok());
      ASSERT_TRUE(others->TryGrow(budget.options().max_bytes - budget.bytes() - free).ok());
      y = x;
      auto call = engine.Admit(0);
      ASSERT_TRUE(call.ok()) << call.status();
      RunContext ctx;
      CallEnv env{ctx, *call};
      env.backend = choice;
      absl::StatusOr<std::string> served = engine.AddAbsolute(AbsoluteOptions{}, t, env);
      if (room || choice == BackendChoice::kCpu) {
        ASSERT_TRUE(served.ok()) << served.status();
        EXPECT_EQ(*served, choice == BackendChoice::kCuda ? "cuda:0" : "cpu");
        EXPECT_NE(y, x);
      } else {
        EXPECT_EQ(served.status().code(), absl::StatusCode::kResourceExhausted) << served.status();
        EXPECT_EQ(y, x);
      }
    }
  }
}

// The GPU's pinned staging is in the memory budget: what it keeps between
// calls from the start, and a call's own staging while it runs. A budget
// too full for that sends an AUTO call to the CPU; a call that asked for
// CUDA is told the server is saturated.
TEST(GpuStaging, IsHeldInTheBudget) {
  FakeDeviceRuntime rt;
  DeviceInfo info;
  info.name = "fake";
  auto cuda = cuda::CreateCudaBackendOn(rt, 0, info, 132);
  ASSERT_TRUE(cuda.ok());
  const int64_t resident = (*cuda)->ResidentHostBytes();
  EngineOptions o;
  o.auto_by_measured_cost = false;
  o.auto_gpu_min_bytes = 0;
  o.max_request_tensor_bytes = kQueryBytes;
  o.max_inflight_bytes = resident + 2 * o.message_limit();  // the least it may be
  auto made = Engine::CreateWith(o, CreateCpuBackend(1), std::move(*cuda), "");
  ASSERT_TRUE(made.ok()) << made.status();
  Engine& engine = **made;
  EXPECT_EQ(engine.inflight_bytes(), resident) << "held from the start";
  // Other calls hold all but one and a half queries' bytes.
  AdmissionControl::Ticket others = engine.admission().Holder();
  ASSERT_TRUE(others.TryGrow(2 * o.message_limit() - kQueryBytes - kQueryBytes / 2).ok());
  const std::string query = RandomQuery();
  // The request (kQueryBytes, admitted) plus its staging does not fit.
  ModelInferRequest req = RopeRequest(query, -1, -1);
  auto admission = engine.Admit(kQueryBytes);
  ASSERT_TRUE(admission.ok()) << admission.status();
  ModelInferResponse resp;
  std::string backend;
  ASSERT_TRUE(RunInfer(engine, BuiltInModel(ModelKind::kRope), &req, &resp, RunContext{},
                       *admission, &backend)
                  .ok());
  EXPECT_EQ(backend, "cpu") << "AUTO: the CPU, which stages nothing";
  EXPECT_EQ(rt.launches(), 0);
  ModelInferRequest on_gpu = RopeRequest(query, -1, -1, "cuda");
  ModelInferResponse refused;
  const absl::Status s = RunInfer(engine, BuiltInModel(ModelKind::kRope), &on_gpu, &refused,
                                  RunContext{}, *admission, &backend);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  // A budget that cannot even hold the resident staging refuses to start.
  auto cuda2 = cuda::CreateCudaBackendOn(rt, 0, info, 132);
  ASSERT_TRUE(cuda2.ok());
  EngineOptions tiny = o;
  tiny.max_inflight_bytes = resident / 2;
  tiny.max_request_tensor_bytes = 1024;
  tiny.max_message_bytes = 1 << 20;
  const absl::Status start =
      Engine::CreateWith(tiny, CreateCpuBackend(1), std::move(*cuda2), "").status();
  EXPECT_EQ(start.code(), absl::StatusCode::kInvalidArgument) << start;
  EXPECT_NE(start.message().find("pinned staging"), std::string::npos) << start;
  // Nor does one that holds it but not, beside it, what every call reserves
  // before it is read (such a server refused every tensor call after
  // --admission_wait, its readiness OK).
  auto cuda3 = cuda::CreateCudaBackendOn(rt, 0, info, 132);
  ASSERT_TRUE(cuda3.ok());
  EngineOptions short_by_one = o;
  short_by_one.max_inflight_bytes = resident + 2 * o.message_limit() - 1;
  const absl::Status short_start =
      Engine::CreateWith(short_by_one, CreateCpuBackend(1), std::move(*cuda3), "").status();
  EXPECT_EQ(short_start.code(), absl::StatusCode::kInvalidArgument) << short_start;
  EXPECT_NE(short_start.message().find("still leave twice --max_message_bytes"), std::string::npos)
      << short_start;
}

// The other process of the GPU test below: a model server's part. It runs
// in a fresh process (this binary again, started with POSENC_CUDA_IPC_CHILD
// naming its pipe ends), not in a forked copy of the test: CUDA cannot be
// used in a forked child of a process that has already initialised it (an
// earlier test may have), and cudaMalloc failed there on an H200
// (2026-11-27), which skipped the test. Protocol on its pipes: it sends
// 'r'; reads the query; sends 'y' and its IPC handle, or a letter saying
// what failed; reads a byte, then sends the region's bytes; reads a byte
// and frees the memory.
[[noreturn]] void RunIpcChild(int from_parent, int to_parent) {
  const auto fail = [&](char why) {
    (void)!::write(to_parent, &why, 1);
    ::_exit(0);
  };
  const auto read_all = [&](void* to, size_t n) {
    size_t got = 0;
    while (got < n) {
      const ssize_t r = ::read(from_parent, static_cast<char*>(to) + got, n - got);
      if (r <= 0) return false;
      got += static_cast<size_t>(r);
    }
    return true;
  };
  char ready = 'r';
  (void)!::write(to_parent, &ready, 1);
  std::string query(kQueryBytes, '\0');
  if (!read_all(query.data(), query.size())) ::_exit(1);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) fail('n');
  void* d = nullptr;
  if (cudaMalloc(&d, kRegionBytes) != cudaSuccess) fail('m');
  cudaMemset(d, 0x7f, kRegionBytes);
  cudaMemcpy(d, query.data(), kQueryBytes, cudaMemcpyHostToDevice);
  cudaIpcMemHandle_t h;
  if (cudaIpcGetMemHandle(&h, d) != cudaSuccess) fail('h');
  char ok = 'y';
  (void)!::write(to_parent, &ok, 1);
  (void)!::write(to_parent, &h, sizeof(h));
  char go = 0;
  (void)!read_all(&go, 1);  // the parent is done with it
  std::string back(kRegionBytes, '\0');
  cudaMemcpy(back.data(), d, kRegionBytes, cudaMemcpyDeviceToHost);
  (void)!::write(to_parent, back.data(), back.size());
  char bye = 0;
  (void)!read_all(&bye, 1);  // unregistered: now it may go
  cudaFree(d);
  ::_exit(0);
}

// Before main: in the child process, be the child and nothing else.
const bool kIsIpcChild = [] {
  const char* fds = std::getenv("POSENC_CUDA_IPC_CHILD");
  int from_parent = -1, to_parent = -1;
  if (fds == nullptr || std::sscanf(fds, "%d,%d", &from_parent, &to_parent) != 2) return false;
  RunIpcChild(from_parent, to_parent);
}();

// The real thing, on a GPU (skipped without one): another process (a model
// server, here a fresh run of this binary: RunIpcChild) allocates device
// memory, fills it and sends its IPC handle; this process's server
// registers it, rotates the tensor in place on the device, and the child
// reads back exactly what the CPU backend computes. A forged handle and one
// of a smaller size are refused without hurting the backend.
TEST(CudaSharedMemoryOnAGpu, AnotherProcesssTensorIsRotatedInPlaceOnTheDevice) {
  const std::string query = RandomQuery();
  int down[2], up[2];  // parent -> child, child -> parent
  ASSERT_EQ(::pipe(down), 0);
  ASSERT_EQ(::pipe(up), 0);
  // The child's environment, made before the fork: between fork and exec
  // the child only calls what is safe there.
  const std::string marker = absl::StrCat("POSENC_CUDA_IPC_CHILD=", down[0], ",", up[1]);
  std::vector<char*> env;
  for (char** e = environ; *e != nullptr; ++e) env.push_back(*e);
  env.push_back(const_cast<char*>(marker.c_str()));
  env.push_back(nullptr);
  char* const args[] = {const_cast<char*>("cuda_shared_memory_test"), nullptr};
  // A child that dies early is an end of file to read and an error to
  // write, not a signal that ends the whole test binary.
  ::signal(SIGPIPE, SIG_IGN);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  // Each side keeps only its own ends, so a side that dies is an end of
  // file to the other, never a hang.
  ::close(child == 0 ? up[0] : up[1]);
  ::close(child == 0 ? down[1] : down[0]);
  if (child == 0) {
    ::execve("/proc/self/exe", args, env.data());
    const char why = 'e';  // exec failed
    (void)!::write(up[1], &why, 1);
    ::_exit(0);
  }
  // However the test ends, the child is told to go (its pipes close) and
  // reaped.
  struct Reap {
    int down, up;
    pid_t child;
    ~Reap() {
      ::close(down);
      ::close(up);
      if (child > 0) ::waitpid(child, nullptr, 0);
    }
  } reap{down[1], up[0], child};
  const auto read_all = [&](void* to, size_t n) {
    size_t got = 0;
    while (got < n) {
      const ssize_t r = ::read(up[0], static_cast<char*>(to) + got, n - got);
      if (r <= 0) return false;
      got += static_cast<size_t>(r);
    }
    return true;
  };
  char state = 0;
  ASSERT_TRUE(read_all(&state, 1));
  ASSERT_EQ(state, 'r') << "the child process did not start";
  ASSERT_EQ(::write(down[1], query.data(), query.size()), static_cast<ssize_t>(query.size()));
  ASSERT_TRUE(read_all(&state, 1));
  // 'n': no GPU here. Any other answer is a failure of the GPU path ('m'
  // cudaMalloc, 'h' cudaIpcGetMemHandle).
  if (state == 'n') GTEST_SKIP() << "no GPU here";
  ASSERT_EQ(state, 'y') << "the child's CUDA failed ('m' cudaMalloc, 'h' cudaIpcGetMemHandle)";
  cudaIpcMemHandle_t h;
  ASSERT_TRUE(read_all(&h, sizeof(h)));
  EngineOptions o;
  o.shared_memory.cuda_enabled = true;
  o.auto_by_measured_cost = false;
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  SharedMemoryRegistry& registry = (*engine)->shared_memory();
  const std::string raw(h.reserved, sizeof(h));
  // Every byte changed: on an H200 (2026-11-28) a handle with byte 9
  // flipped still opened the child's allocation, so that byte is not part of
  // what the driver checks.
  std::string forged = raw;
  for (char& c : forged) c = static_cast<char>(c ^ 0x5a);
  absl::Status s = registry.RegisterCuda("forged", forged, 0, kRegionBytes);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  // Had it opened, it must close before the child frees its memory (freeing
  // exported memory still mapped here is undefined; that H200 run aborted).
  if (s.ok()) {
    EXPECT_TRUE(registry.Unregister("forged", absl::InfiniteFuture(), MemoryKind::kCuda).ok());
  }
  s = registry.RegisterCuda("big", raw, 0, uint64_t{1} << 40);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  ASSERT_TRUE(registry.RegisterCuda("gpu", raw, 0, kRegionBytes).ok());
  const std::string want = CpuResult(**engine, query);
  ModelInferResponse resp;
  std::string backend;
  ASSERT_TRUE(RunOn(**engine, RopeRequest(query, 0, 0), &resp, &backend).ok());
  EXPECT_EQ(backend, "cuda:0");
  // Again, to the answer this time: through a device copy, leaving the
  // (now rotated) tensor in the region as it is.
  const std::string twice = CpuResult(**engine, want);
  ModelInferResponse answer;
  ASSERT_TRUE(RunOn(**engine, RopeRequest(query, 0, -1), &answer, &backend).ok());
  EXPECT_EQ(answer.raw_output_contents(0), twice);
  // And into another slice, on the device (perf_analyzer's way).
  ModelInferResponse into;
  ASSERT_TRUE(RunOn(**engine, RopeRequest(query, 0, kQueryBytes), &into, &backend).ok());
  EXPECT_EQ(backend, "cuda:0");
  EXPECT_TRUE((*engine)->Ready().ok());
  const char go = 'g';
  ASSERT_EQ(::write(down[1], &go, 1), 1);
  std::string back(kRegionBytes, '\0');
  ASSERT_TRUE(read_all(back.data(), back.size()));
  EXPECT_EQ(back.substr(0, kQueryBytes), want) << "rotated in place, bit for bit";
  EXPECT_EQ(back.substr(kQueryBytes, kQueryBytes), twice) << "rotated into the next slice";
  EXPECT_EQ(back.substr(2 * kQueryBytes), std::string(kRegionBytes - 2 * kQueryBytes, '\x7f'));
  ASSERT_TRUE(registry.Unregister("gpu", absl::InfiniteFuture(), MemoryKind::kCuda).ok());
  ASSERT_EQ(::write(down[1], &go, 1), 1);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  reap.child = -1;  // reaped
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

}  // namespace
}  // namespace posenc::server::kserve
