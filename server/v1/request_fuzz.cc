// libFuzzer harness: any bytes as a request to any posenc.v1 method but
// ReloadTables, through the path a real call takes after admission (the
// Method's parsing, planning with its validation and budget, the CPU
// kernels, answer serialisation; for StreamRope also the error answer a
// failed message gets).
// Limits are small so the fuzzer spends its time on logic, not on memory.
// The first byte picks the method; the rest is the serialised request.
// Shared memory is on, with one region "f" (4 KiB of a /dev/shm object the
// harness made), so the *_shm fields reach slices, in-place work and
// answers written into the region; the GetSharedMemoryStatus method too.
// CUDA shared memory is on, with region "g" on a stand-in device
// (stand_in_device.h): *_shm fields naming it reach the device checks, and
// the engine, which has no GPU, refuses what would run there.
// Every call carries a posenc-call-id, the input's hash: an in-place call
// claims it (engine/attempt_ledger.h) the first time, and an input run again
// (a replay, a repeated mutation) takes the path of gRPC's retry, refused.
// Invariants: nothing crashes, leaks or hangs; an OK answer (and a stream's
// error answer) parses as the method's response, strings valid UTF-8 as a
// strict client requires; the admission's bytes never exceed the budget.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "engine/engine.h"
#include "engine/safetensors.h"
#include "grpc/grpc.h"
#include "grpcpp/support/byte_buffer.h"
#include "posenc/v1/posenc.pb.h"
#include "rpc/large_fields.h"
#include "stand_in_device.h"
#include "v1/service.h"

namespace {

// The corpus's first bytes were written for the first four.
constexpr const char* kMethods[] = {"ApplyRope",     "AddAbsoluteEncoding",  "GetEncodingTable",
                                    "AttentionBias", "StreamRope",           "ListTables",
                                    "GetServerInfo", "GetSharedMemoryStatus"};
constexpr int kNumMethods = sizeof(kMethods) / sizeof(kMethods[0]);

posenc::server::Engine* TheEngine() {
  static posenc::server::Engine* engine = [] {
    grpc_init();
    // One small learned table, so the learned paths are reachable.
    const std::string dir = std::filesystem::temp_directory_path() / "posenc_request_fuzz";
    std::filesystem::create_directories(dir);
    posenc::LearnedTable t;
    t.rows = 16;
    t.dim = 8;
    for (int i = 0; i < 16 * 8; ++i) t.values.push_back(0.01f * static_cast<float>(i));
    std::ofstream(dir + "/wpe.safetensors", std::ios::binary)
        << posenc::server::SerializeSafetensors({{"t", &t}});
    posenc::server::EngineOptions o;
    o.cpu_threads = 1;
    o.enable_cuda = false;
    o.max_request_tensor_bytes = 256 << 10;
    o.max_message_bytes = 256 << 10;
    o.max_inflight_bytes = 1 << 20;
    o.table_dir = dir;
    o.shared_memory.enabled = true;
    o.shared_memory.cuda_enabled = true;
    auto e = posenc::server::Engine::Create(o);
    if (!e.ok()) {
      std::fprintf(stderr, "engine: %s\n", e.status().ToString().c_str());
      std::abort();
    }
    const std::string key = "/posenc-v1-fuzz-" + std::to_string(::getpid());
    const int fd = ::open(("/dev/shm" + key).c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ::ftruncate(fd, 4096) != 0) {
      std::fprintf(stderr, "cannot make /dev/shm%s\n", key.c_str());
      std::abort();
    }
    ::close(fd);
    const absl::Status registered = (*e)->shared_memory().Register("f", key, 0, 4096);
    ::unlink(("/dev/shm" + key).c_str());
    static auto* device = new posenc::testing::StandInDevice(4096);
    (*e)->shared_memory().SetDeviceOpener(device->Opener(), "");
    const absl::Status on_device = (*e)->shared_memory().RegisterCuda("g", device->handle, 0, 4096);
    if (!registered.ok() || !on_device.ok()) {
      std::fprintf(stderr, "register: %s %s\n", registered.ToString().c_str(),
                   on_device.ToString().c_str());
      std::abort();
    }
    return e->release();
  }();
  return engine;
}

const posenc::server::Method& MethodNamed(const std::string& name) {
  static const auto* methods = new std::vector<posenc::server::Method>(
      posenc::server::PositionalEncodingService(TheEngine()).Methods());
  for (const auto& m : *methods) {
    if (m.name == name) return m;
  }
  std::abort();
}

template <typename Response>
bool ParsesAs(const grpc::ByteBuffer& answer) {
  std::vector<grpc::Slice> slices;
  if (!answer.Dump(&slices).ok()) return false;
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  Response r;
  return r.ParseFromString(bytes);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > (256 << 10)) return 0;
  posenc::server::Engine* engine = TheEngine();
  const int which = data[0] % kNumMethods;
  const posenc::server::Method& method = MethodNamed(kMethods[which]);
  grpc::Slice slice(reinterpret_cast<const char*>(data + 1), size - 1);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer answer;
  auto admission = engine->admission().Enter();
  if (!admission.ok() || !admission->TryGrow(2 * static_cast<int64_t>(size)).ok()) std::abort();
  // The reactor's look at a request before it is parsed (Method::light).
  (void)posenc::server::TensorBytesOf(request, {2, 4}, {20, 21});
  const posenc::RunContext rc;
  posenc::server::CallFacts facts;
  posenc::server::MethodCall call{rc, method.admitted() ? &*admission : nullptr,
                                  std::chrono::steady_clock::now(), &facts};
  call.call_id =
      std::to_string(std::hash<std::string_view>{}({reinterpret_cast<const char*>(data), size}));
  const absl::Status s = posenc::server::RunMethod(method, &request, &answer, call);
  if (admission->bytes() > engine->options().max_inflight_bytes) std::abort();
  static const bool verbose = std::getenv("POSENC_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "%s: %s\n", kMethods[which], s.ToString().c_str());
  if (!s.ok() && method.error_answer) {
    grpc::ByteBuffer error;
    if (!method.error_answer(s, facts, &error).ok() || !ParsesAs<posenc::v1::RopeResponse>(error)) {
      std::abort();
    }
  }
  if (s.ok()) {
    bool ok = false;
    switch (which) {
      case 0:
      case 4:
        ok = ParsesAs<posenc::v1::RopeResponse>(answer);
        break;
      case 1:
        ok = ParsesAs<posenc::v1::AbsoluteEncodingResponse>(answer);
        break;
      case 2:
        ok = ParsesAs<posenc::v1::EncodingTableResponse>(answer);
        break;
      case 3:
        ok = ParsesAs<posenc::v1::AttentionBiasResponse>(answer);
        break;
      case 5:
        ok = ParsesAs<posenc::v1::ListTablesResponse>(answer);
        break;
      case 6:
        ok = ParsesAs<posenc::v1::ServerInfo>(answer);
        break;
      case 7:
        ok = ParsesAs<posenc::v1::SharedMemoryStatus>(answer);
        break;
    }
    if (!ok) std::abort();
  } else if (s.code() == absl::StatusCode::kInternal || s.code() == absl::StatusCode::kUnknown) {
    std::fprintf(stderr, "server fault on fuzzed input: %s\n", s.ToString().c_str());
    std::abort();
  }
  return 0;
}
