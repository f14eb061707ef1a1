// Any bytes as a KServe v2 ModelInferRequest, through the call path
// ModelInfer runs on an admitted call (its Method), and as a message of
// ModelStreamInfer. A finding is a crash, a sanitizer report, an
// INTERNAL/UNKNOWN status (a server fault where a client error was due), an
// answer (or a stream's error answer) that does not parse, strings valid
// UTF-8 as a strict client requires, an answer with a different number of
// outputs and raw contents (those in shared memory empty), or admission
// holding more than its budget.
//
// System shared memory is on, with region "f" (4 KiB of a /dev/shm object,
// unlinked at once: the registry holds its descriptor), so inputs and
// outputs naming it go through the read and write paths, and region "h"
// (bytes 1024-3071 of the same object, mapped again: slices of "f" and "h"
// can be the same bytes at two addresses). CUDA shared
// memory is on too, with region "g" (4 KiB of a stand-in device in host
// memory, stand_in_device.h): references to it go through the device
// placements and copies, and the engine, which has no GPU, refuses what
// would run there.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "grpc/grpc.h"
#include "grpcpp/support/byte_buffer.h"
#include "kserve/grpc_service.pb.h"
#include "kserve/service.h"
#include "stand_in_device.h"

namespace {

struct Harness {
  std::unique_ptr<posenc::server::Engine> engine;
  std::unique_ptr<posenc::server::KServeService> service;
  std::vector<posenc::server::Method> methods;  // ModelInfer, ModelStreamInfer
};

Harness& TheHarness() {
  static Harness* h = [] {
    grpc_init();
    posenc::server::EngineOptions o;
    o.cpu_threads = 1;
    o.enable_cuda = false;
    o.max_request_tensor_bytes = 256 << 10;
    o.max_message_bytes = 256 << 10;
    o.max_inflight_bytes = 1 << 20;
    o.shared_memory.enabled = true;
    o.shared_memory.cuda_enabled = true;
    auto e = posenc::server::Engine::Create(o);
    if (!e.ok()) {
      std::fprintf(stderr, "engine: %s\n", e.status().ToString().c_str());
      std::abort();
    }
    auto* harness = new Harness{std::move(*e), nullptr};
    harness->service = std::make_unique<posenc::server::KServeService>(harness->engine.get());
    for (posenc::server::Method& m : harness->service->Methods()) {
      if (m.name == "ModelInfer" || m.name == "ModelStreamInfer") {
        harness->methods.push_back(std::move(m));
      }
    }
    const std::string key = "/posenc-fuzz-" + std::to_string(::getpid());
    const int fd = ::open(("/dev/shm" + key).c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ::ftruncate(fd, 4096) != 0) {
      std::fprintf(stderr, "cannot make /dev/shm%s\n", key.c_str());
      std::abort();
    }
    ::close(fd);
    absl::Status registered = harness->service->shared_memory().Register("f", key, 0, 4096);
    if (registered.ok()) {
      registered = harness->service->shared_memory().Register("h", key, 1024, 2048);
    }
    ::unlink(("/dev/shm" + key).c_str());
    static auto* device = new posenc::testing::StandInDevice(4096);
    harness->engine->shared_memory().SetDeviceOpener(device->Opener(), "");
    const absl::Status on_device =
        harness->engine->shared_memory().RegisterCuda("g", device->handle, 0, 4096);
    if (!registered.ok() || !on_device.ok()) {
      std::fprintf(stderr, "register: %s %s\n", registered.ToString().c_str(),
                   on_device.ToString().c_str());
      std::abort();
    }
    return harness;
  }();
  return *h;
}

template <typename Message>
bool Parses(const grpc::ByteBuffer& bytes, Message* m) {
  grpc::Slice joined;
  return bytes.DumpToSingleSlice(&joined).ok() &&
         m->ParseFromArray(joined.begin(), static_cast<int>(joined.size()));
}

// An OK answer: every output has its raw contents, empty when it went to
// shared memory.
bool WellFormed(const inference::ModelInferResponse& r) {
  if (r.outputs_size() != r.raw_output_contents_size()) return false;
  for (int i = 0; i < r.outputs_size(); ++i) {
    if (r.outputs(i).parameters().contains("shared_memory_region") &&
        !r.raw_output_contents(i).empty()) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (256 << 10)) return 0;
  Harness& h = TheHarness();
  static const bool verbose = std::getenv("POSENC_FUZZ_VERBOSE") != nullptr;
  for (const posenc::server::Method& method : h.methods) {
    grpc::Slice slice(reinterpret_cast<const char*>(data), size);
    grpc::ByteBuffer request(&slice, 1), answer;
    auto admission = h.engine->admission().Enter();
    if (!admission.ok() || !admission->TryGrow(2 * static_cast<int64_t>(size)).ok()) std::abort();
    const posenc::RunContext rc;
    posenc::server::CallFacts facts;
    posenc::server::MethodCall call{rc, &*admission, std::chrono::steady_clock::now(), &facts};
    const absl::Status s = posenc::server::RunMethod(method, &request, &answer, call);
    if (admission->bytes() > h.engine->options().max_inflight_bytes) std::abort();
    if (verbose) std::fprintf(stderr, "%s: %s\n", method.name.c_str(), s.ToString().c_str());
    const bool stream = static_cast<bool>(method.error_answer);
    if (s.ok()) {
      inference::ModelInferResponse r;
      inference::ModelStreamInferResponse sr;
      const bool parsed = stream ? Parses(answer, &sr) : Parses(answer, &r);
      if (!parsed || !WellFormed(stream ? sr.infer_response() : r)) std::abort();
    } else if (s.code() == absl::StatusCode::kInternal || s.code() == absl::StatusCode::kUnknown) {
      std::fprintf(stderr, "server fault on fuzzed input: %s\n", s.ToString().c_str());
      std::abort();
    } else if (stream) {
      grpc::ByteBuffer error;
      inference::ModelStreamInferResponse sr;
      if (!method.error_answer(s, facts, &error).ok() || !Parses(error, &sr)) std::abort();
    }
  }
  return 0;
}
