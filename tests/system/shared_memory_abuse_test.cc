// A caller cannot hurt the server through its shared-memory region: against
// the real binary, honest callers rotate tensors in place in their own
// regions while abusers truncate, re-extend and rewrite theirs thousands of
// times, during their own calls and between them. The server must never
// die or wedge, every honest result must be bit for bit what the socket path
// gives, and an abuser's calls may only fail with a clear code.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kserve/grpc_service.grpc.pb.h"
#include "server_process.h"

namespace posenc {
namespace {

using inference::GRPCInferenceService;
using inference::ModelInferRequest;
using inference::ModelInferResponse;

constexpr int64_t kTokens = 64, kHeads = 4, kDim = 64;
constexpr int64_t kBytes = kTokens * kHeads * kDim * 4;

// A POSIX shared-memory object of kBytes, mapped here too.
class Region {
 public:
  explicit Region(const std::string& name) : name_(name) {
    key_ = "/posenc-abuse-" + std::to_string(::getpid()) + "-" + name;
    fd_ = ::open(("/dev/shm" + key_).c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    EXPECT_GE(fd_, 0);
    Extend();
    map_ = static_cast<char*>(::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0));
    EXPECT_NE(map_, MAP_FAILED);
  }
  ~Region() {
    ::munmap(map_, kBytes);
    ::close(fd_);
    ::unlink(("/dev/shm" + key_).c_str());
  }
  void Extend() { EXPECT_EQ(::ftruncate(fd_, kBytes), 0); }
  void Truncate(int64_t size) { EXPECT_EQ(::ftruncate(fd_, size), 0); }
  // Writes through the descriptor (the mapping would fault while truncated).
  void Put(const std::string& bytes) {
    EXPECT_EQ(::pwrite(fd_, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
  }
  std::string Get() const { return std::string(map_, kBytes); }
  const std::string& name() const { return name_; }
  const std::string& key() const { return key_; }

 private:
  std::string name_, key_;
  int fd_ = -1;
  char* map_ = nullptr;
};

void SetShm(google::protobuf::Map<std::string, inference::InferParameter>* p,
            const std::string& region) {
  (*p)["shared_memory_region"].set_string_param(region);
  (*p)["shared_memory_byte_size"].set_int64_param(kBytes);
}

// query -> query_out, both in `region` (in place), or both on the socket.
ModelInferRequest Rope(const std::string& region, const std::string& socket_bytes = "") {
  ModelInferRequest r;
  r.set_model_name("rope");
  auto* in = r.add_inputs();
  in->set_name("query");
  in->set_datatype("FP32");
  for (int64_t d : {int64_t{1}, kTokens, kHeads, kDim}) in->add_shape(d);
  auto* out = r.add_outputs();
  out->set_name("query_out");
  if (region.empty()) {
    r.add_raw_input_contents(socket_bytes);
  } else {
    SetShm(in->mutable_parameters(), region);
    SetShm(out->mutable_parameters(), region);
  }
  return r;
}

grpc::Status Register(GRPCInferenceService::Stub& stub, const Region& r) {
  grpc::ClientContext ctx;
  inference::SystemSharedMemoryRegisterRequest req;
  req.set_name(r.name());
  req.set_key(r.key());
  req.set_byte_size(kBytes);
  inference::SystemSharedMemoryRegisterResponse resp;
  return stub.SystemSharedMemoryRegister(&ctx, req, &resp);
}

grpc::Status Unregister(GRPCInferenceService::Stub& stub, const std::string& name) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  inference::SystemSharedMemoryUnregisterRequest req;
  req.set_name(name);
  inference::SystemSharedMemoryUnregisterResponse resp;
  return stub.SystemSharedMemoryUnregister(&ctx, req, &resp);
}

grpc::Status Infer(GRPCInferenceService::Stub& stub, const ModelInferRequest& req,
                   ModelInferResponse* resp) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  return stub.ModelInfer(&ctx, req, resp);
}

TEST(SharedMemoryAbuse, TruncatingAndRewritingRegionsUnderLoadHurtsNoOne) {
  testing::ServerProcess server;
  ASSERT_TRUE(server.Start(POSENC_SERVER_BINARY, {"--enable_system_shared_memory", "--threads=2",
                                                  "--max_shared_memory_regions=16"}))
      << server.log_text();
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  std::string q(kBytes, '\0');
  for (int64_t i = 0; i < kBytes / 4; ++i) {
    const float v = std::normal_distribution<float>()(rng);
    std::memcpy(&q[i * 4], &v, 4);
  }
  // What the socket path gives.
  auto stub = GRPCInferenceService::NewStub(server.channel());
  ModelInferResponse socket_answer;
  ASSERT_TRUE(Infer(*stub, Rope("", q), &socket_answer).ok());
  const std::string want = socket_answer.raw_output_contents(0);
  ASSERT_EQ(want.size(), static_cast<size_t>(kBytes));

  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(12);
  std::atomic<int> honest_calls{0}, honest_wrong{0}, abused_ok{0}, abused_refused{0};
  std::atomic<int> truncations{0}, reregistrations{0};
  std::mutex mu;
  std::map<std::string, int> unexpected;  // "code: message" -> count
  auto note = [&](const grpc::Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    ++unexpected[std::to_string(s.error_code()) + ": " + s.error_message()];
  };

  std::vector<std::thread> threads;
  for (int h = 0; h < 2; ++h) {  // honest callers, a region each
    threads.emplace_back([&, h] {
      auto s = GRPCInferenceService::NewStub(server.NewChannel(10 + h));
      Region r("honest" + std::to_string(h));
      if (!Register(*s, r).ok()) return note(grpc::Status(grpc::StatusCode::INTERNAL, "register"));
      while (std::chrono::steady_clock::now() < deadline) {
        r.Put(q);
        ModelInferResponse resp;
        const grpc::Status st = Infer(*s, Rope(r.name()), &resp);
        if (!st.ok()) {
          note(st);
          continue;
        }
        ++honest_calls;
        if (r.Get() != want) ++honest_wrong;
      }
    });
  }
  for (int a = 0; a < 2; ++a) {  // abusers: one calls, one truncates, same region
    threads.emplace_back([&, a] {
      auto s = GRPCInferenceService::NewStub(server.NewChannel(20 + a));
      auto region = std::make_unique<Region>("abused" + std::to_string(a));
      if (!Register(*s, *region).ok()) {
        return note(grpc::Status(grpc::StatusCode::INTERNAL, "register"));
      }
      std::atomic<bool> stop{false};
      std::thread vandal([&] {
        std::mt19937_64 vr(seed + 100 + a);
        while (!stop) {
          region->Truncate(static_cast<int64_t>(vr() % 3) * 4096);
          ++truncations;
          std::this_thread::sleep_for(std::chrono::microseconds(vr() % 300));
          region->Extend();
          // Eight random bytes a draw: byte by byte, an unoptimised or
          // sanitized build drew too slowly to truncate 2000 times.
          std::string junk(kBytes, '\0');
          for (int64_t at = 0; at + 8 <= kBytes; at += 8) {
            const uint64_t word = vr();
            std::memcpy(junk.data() + at, &word, 8);
          }
          region->Put(junk);
        }
      });
      while (std::chrono::steady_clock::now() < deadline) {
        ModelInferResponse resp;
        const grpc::Status st = Infer(*s, Rope(region->name()), &resp);
        if (st.ok()) {
          ++abused_ok;
        } else if (st.error_code() == grpc::StatusCode::FAILED_PRECONDITION &&
                   st.error_message().find("truncated") != std::string::npos) {
          ++abused_refused;
          // Void now: unregister (waits for its calls) and register again,
          // at a moment the vandal has the object whole.
          if (!Unregister(*s, region->name()).ok()) {
            note(grpc::Status(grpc::StatusCode::INTERNAL, "unregister"));
          }
          grpc::Status again;
          for (int i = 0; i < 1000; ++i) {
            again = Register(*s, *region);
            if (again.error_code() != grpc::StatusCode::INVALID_ARGUMENT) break;
          }
          if (!again.ok()) note(again);
          ++reregistrations;
        } else {
          note(st);
        }
      }
      stop = true;
      vandal.join();
    });
  }
  for (std::thread& t : threads) t.join();

  std::printf(
      "honest calls %d (wrong %d); abused calls ok %d, refused %d; truncations %d, "
      "re-registrations %d\n",
      honest_calls.load(), honest_wrong.load(), abused_ok.load(), abused_refused.load(),
      truncations.load(), reregistrations.load());
  for (const auto& [what, n] : unexpected) ADD_FAILURE() << n << " x " << what;
  EXPECT_TRUE(server.Alive()) << server.log_text();
  EXPECT_EQ(honest_wrong.load(), 0) << "an honest caller's result differs from the socket path";
  EXPECT_GT(honest_calls.load(), 100);
  EXPECT_GE(truncations.load(), 2000) << "too few truncations to mean anything";
  EXPECT_GT(abused_refused.load(), 0) << "no call ever met a truncated region";
  // And the server still answers on the socket, correctly.
  ModelInferResponse after;
  ASSERT_TRUE(Infer(*stub, Rope("", q), &after).ok());
  EXPECT_EQ(after.raw_output_contents(0), want);
}

}  // namespace
}  // namespace posenc
