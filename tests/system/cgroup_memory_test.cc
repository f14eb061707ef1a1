// The real server in a real cgroup with a memory limit, as in a container
// (docker run -m, a pod's limits.memory): by default it sizes
// --max_inflight_bytes under the limit (engine/memory_limit.h), so callers
// that would need more than the limit get RESOURCE_EXHAUSTED and the
// kernel never kills it. The control: the same callers against the fixed
// 4 GiB budget it had before get it killed for memory, which shows that the
// limit is enforced here and the load is enough to pass it.
//
// Needs a memory cgroup this process may create a limited child in, and no
// unlimited swap: root on a cgroup v1 host (cgroup v2 gives a child the
// memory controller only where its parent holds no processes, and this
// test's cgroup holds the test); skipped elsewhere.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "engine/memory_limit.h"
#include "gtest/gtest.h"
#include "large_requests.h"
#include "posenc/v1/posenc.grpc.pb.h"
#include "server_process.h"

namespace posenc {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

bool WriteText(const std::string& path, const std::string& text) {
  const int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  close(fd);
  return ok;
}

// The number after `key` in a "key value" file (memory.oom_control,
// memory.events), or -1.
int64_t KeyedValue(const std::string& path, const std::string& key) {
  std::istringstream in(testing::ReadFile(path));
  std::string k;
  int64_t v;
  while (in >> k >> v) {
    if (k == key) return v;
  }
  return -1;
}

// Whether /proc/swaps lists a swap area below its header line.
bool MachineSwaps() {
  std::istringstream in(testing::ReadFile("/proc/swaps"));
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) lines += line.empty() ? 0 : 1;
  return lines > 1;
}

// A child of this process's memory cgroup, limited, removed at the end.
class LimitedCgroup {
 public:
  static constexpr char kPrefix[] = "posenc-cgroup-memory-test-";

  // Empty on success, else why there is none (the test skips).
  std::string Create(int64_t limit_bytes) {
    const std::optional<server::MemoryCgroup> own = server::FindMemoryCgroup(
        testing::ReadFile("/proc/self/mountinfo"), testing::ReadFile("/proc/self/cgroup"));
    if (!own.has_value()) return "no cgroup mount with the memory controller holds this process";
    v2_ = own->mount.v2;
    const std::string parent =
        own->mount.mount_point + server::RelativeToMount(own->path, own->mount.root);
    RemoveStale(parent);
    dir_ = parent + "/" + kPrefix + std::to_string(getpid());
    if (mkdir(dir_.c_str(), 0755) != 0) {
      const std::string why = "cannot create " + dir_ + ": " + std::strerror(errno);
      dir_.clear();
      return why;
    }
    const std::string limit = std::to_string(limit_bytes);
    if (!WriteText(dir_ + (v2_ ? "/memory.max" : "/memory.limit_in_bytes"), limit)) {
      // cgroup v2 gives a child the memory controller only where its parent
      // holds no processes, and this test's own cgroup holds this process.
      return "cannot set a memory limit in " + dir_;
    }
    // Swap is outside that limit: with swap the control would page rather
    // than be killed, so swap is limited too, or the machine must have none.
    const bool no_swap = v2_ ? WriteText(dir_ + "/memory.swap.max", "0")
                             : WriteText(dir_ + "/memory.memsw.limit_in_bytes", limit);
    if (!no_swap && MachineSwaps()) {
      return "this machine swaps and the cgroup's swap cannot be limited";
    }
    return "";
  }
  ~LimitedCgroup() {
    if (dir_.empty()) return;
    // The server has been reaped by now; the kernel may take a moment to
    // let its cgroup go.
    for (int i = 0; i < 50; ++i) {
      if (rmdir(dir_.c_str()) == 0) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    std::printf("could not remove %s: %s\n", dir_.c_str(), std::strerror(errno));
  }
  std::string procs() const { return dir_ + "/cgroup.procs"; }
  int64_t oom_kills() const {
    return v2_ ? KeyedValue(dir_ + "/memory.events", "oom_kill")
               : KeyedValue(dir_ + "/memory.oom_control", "oom_kill");
  }
  // The cgroup's peak charge, where the kernel keeps one (-1 elsewhere).
  int64_t peak_bytes() const {
    const std::string text =
        testing::ReadFile(dir_ + (v2_ ? "/memory.peak" : "/memory.max_usage_in_bytes"));
    return text.empty() ? -1 : std::strtoll(text.c_str(), nullptr, 10);
  }

 private:
  // Children an earlier run left (killed by a timeout before its
  // destructor): rmdir takes only empty ones, those whose server is gone.
  static void RemoveStale(const std::string& parent) {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(parent, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind(kPrefix, 0) == 0) rmdir(entry.path().c_str());
    }
  }

  std::string dir_;
  bool v2_ = false;
};

// `callers` callers sending 48 MiB requests for up to 6 s (each stops at
// its first call that ends UNAVAILABLE: the server is gone): how many
// calls ended with each code, and a message for each code.
struct Outcome {
  std::map<grpc::StatusCode, int> codes;
  std::map<grpc::StatusCode, std::string> messages;
};
Outcome Load(testing::ServerProcess& server, int callers) {
  const v1::RopeRequest req = testing::RopeRequestOfMiB(48);
  Outcome out;
  std::mutex mu;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(6);
  std::vector<std::thread> threads;
  for (int c = 0; c < callers; ++c) {
    threads.emplace_back([&, c] {
      auto stub = v1::PositionalEncoding::NewStub(server.NewChannel(c + 1));
      while (std::chrono::steady_clock::now() < end) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
        v1::RopeResponse resp;
        const grpc::Status s = stub->ApplyRope(&ctx, req, &resp);
        std::lock_guard<std::mutex> lock(mu);
        ++out.codes[s.error_code()];
        out.messages[s.error_code()] = s.error_message();
        if (s.error_code() == grpc::StatusCode::UNAVAILABLE) break;
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& [code, n] : out.codes) {
    std::printf("code %d x%d: %s\n", static_cast<int>(code), n, out.messages[code].c_str());
  }
  return out;
}

constexpr int64_t kLimit = 512 * kMiB;
constexpr int kCallers = 16;  // 16 x 48 MiB, held twice while parsed: 1.5 GiB
// A CUDA context's host memory is not in the server's fixed overhead.
constexpr char kNoGpu[] = "--enable_cuda=false";

class CgroupMemory : public ::testing::Test {
 protected:
  void SetUp() override {
#ifdef POSENC_UNDER_SANITIZER
    GTEST_SKIP() << "a sanitizer's shadow memory and quarantine would count against the limit";
#endif
    if (const std::string why = cgroup_.Create(kLimit); !why.empty()) GTEST_SKIP() << why;
    server_.cgroup_procs = cgroup_.procs();
  }

  LimitedCgroup cgroup_;
  testing::ServerProcess server_;
};

TEST_F(CgroupMemory, TheDefaultBudgetFitsUnderTheLimitAndCallersAreRefusedNotKilled) {
  ASSERT_TRUE(server_.Start(POSENC_SERVER_BINARY, {"--threads=2", "--log_level=info", kNoGpu,
                                                   "--metrics_listen=127.0.0.1:0"}))
      << server_.log_text();
  const int metrics_port = testing::MetricsPortFromLog(server_);
  ASSERT_NE(metrics_port, 0) << server_.log_text();
  // 512 MiB less the fixed 96 MiB and two messages of 64 + 4 MiB.
  const int64_t budget = kLimit - server::kFixedOverheadBytes - 2 * 68 * kMiB;
  const std::string log = server_.log_text();
  EXPECT_NE(log.find("memory: limit 512 MiB ("), std::string::npos) << log;
  EXPECT_NE(log.find("max_inflight_bytes=" + std::to_string(budget) + " (sized under the limit)"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("[warning]"), std::string::npos) << log;

  EXPECT_EQ(testing::MetricValue(metrics_port, "posenc_memory_limit_bytes"), kLimit);
  EXPECT_EQ(testing::MetricValue(metrics_port, "posenc_inflight_bytes_limit"), budget);

  // What the calls hold, as an operator's dashboard sees it during the load.
  std::atomic<bool> stop{false};
  std::atomic<double> held_peak{0};
  std::thread sampler([&] {
    while (!stop) {
      const double held = testing::MetricValue(metrics_port, "posenc_inflight_bytes");
      if (held > held_peak) held_peak = held;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  const Outcome out = Load(server_, kCallers);
  stop = true;
  sampler.join();
  std::printf("posenc_inflight_bytes peaked at %.0f MiB of %lld\n", held_peak / kMiB,
              static_cast<long long>(budget / kMiB));
  EXPECT_GT(held_peak, 48.0 * kMiB);
  EXPECT_LE(held_peak, static_cast<double>(budget));
  std::printf("cgroup peak %lld MiB of %lld; OOM kills %lld\n",
              static_cast<long long>(cgroup_.peak_bytes() / kMiB),
              static_cast<long long>(kLimit / kMiB), static_cast<long long>(cgroup_.oom_kills()));
  for (const auto& [code, n] : out.codes) {
    EXPECT_TRUE(code == grpc::StatusCode::OK || code == grpc::StatusCode::RESOURCE_EXHAUSTED)
        << n << " calls ended " << code << ": " << out.messages.at(code);
  }
  EXPECT_GT(out.codes.count(grpc::StatusCode::OK), 0u) << "it must serve what it admits";
  EXPECT_TRUE(server_.Alive()) << server_.log_text();
  EXPECT_EQ(cgroup_.oom_kills(), 0);
}

TEST_F(CgroupMemory, ControlTheOldFixedBudgetIsWarnedAboutAndGetsItKilled) {
  ASSERT_TRUE(server_.Start(POSENC_SERVER_BINARY, {"--threads=2", "--log_level=info", kNoGpu,
                                                   "--max_inflight_bytes=4294967296"}))
      << server_.log_text();
  const std::string log = server_.log_text();
  EXPECT_NE(log.find("max_inflight_bytes=4294967296 (--max_inflight_bytes)"), std::string::npos)
      << log;
  EXPECT_NE(log.find("over the memory limit of 512 MiB"), std::string::npos) << log;

  Load(server_, kCallers);
  ASSERT_TRUE(server_.Exited(std::chrono::seconds(10)))
      << "the callers did not pass the limit: the rest of this suite proves nothing here";
  EXPECT_EQ(server_.term_signal(), SIGKILL);
  EXPECT_GE(cgroup_.oom_kills(), 1);
}

}  // namespace
}  // namespace posenc
