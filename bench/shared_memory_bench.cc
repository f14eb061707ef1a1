// posenc-bench-shm: the C++ client with shared memory on (kRequire) against the
// same client on the socket (kOff), one caller, the same requests, in one
// run: client-observed latency (p50, p99) and the server's CPU time per call
// (user + system of --server_pid over the calls, so the client's own cost is
// left out). Rounds alternate the two paths.
//   posenc-bench-shm --target=127.0.0.1:PORT --server_pid=PID [--calls=N] [--rounds=R]
// (bench/shared_memory_client.sh starts the server and runs it.)
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "posenc/client.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "The server.");
ABSL_FLAG(int, server_pid, 0, "The server's process, for its CPU time (0: not measured).");
ABSL_FLAG(int, calls, 200, "Calls per path and round (prefill: a tenth).");
ABSL_FLAG(int, rounds, 3, "Rounds, each running both paths.");
ABSL_FLAG(std::string, only, "", "Run only the workloads whose name contains this.");
ABSL_FLAG(uint64_t, seed, 20261127, "Seed of the tensors' values.");
ABSL_FLAG(std::string, paths, "socket,shared_memory", "Which paths to run.");

namespace {

using Clock = std::chrono::steady_clock;

double CpuSeconds(int pid) {
  if (pid <= 0) return 0;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), {});
  std::istringstream fields(stat.substr(stat.rfind(')') + 2));
  std::string f;
  double ticks = 0;
  for (int i = 3; fields >> f; ++i) {
    if (i == 14 || i == 15) ticks += std::stod(f);
    if (i == 15) break;
  }
  return ticks / sysconf(_SC_CLK_TCK);
}

struct Workload {
  const char* name;
  posenc::DType dtype;
  int64_t batch, tokens, query_heads, key_heads, dim;
  int64_t calls_divisor;
};

struct Figures {
  double p50_us, p99_us, server_cpu_us;
};

// Standard-normal values of `dtype` (float32 or bfloat16), as bytes: what a
// model's queries and keys look like. (Constant bytes, as this bench once
// used, make every pair (x, x), whose rotation cancels and sends most pairs
// down the kernels' exact slow path: 3-4x the kernel time of real data.)
std::vector<uint8_t> NormalBytes(posenc::DType dtype, size_t count, std::mt19937_64& rng) {
  std::normal_distribution<float> normal;
  std::vector<uint8_t> out(count * posenc::SizeOf(dtype));
  for (size_t i = 0; i < count; ++i) {
    const float x = normal(rng);
    if (dtype == posenc::DType::kFloat32) {
      std::memcpy(out.data() + 4 * i, &x, 4);
    } else {
      uint32_t bits;
      std::memcpy(&bits, &x, 4);
      const uint16_t high = static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
      std::memcpy(out.data() + 2 * i, &high, 2);
    }
  }
  return out;
}

// Each call's tensors are fresh (copied from `pool` at a moving offset),
// as a model's would be; the copy is outside the timed call.
constexpr size_t kPoolExtra = 8 * 4096;

Figures Run(posenc::Client& client, const Workload& w, int calls, std::mt19937_64& rng) {
  const size_t elem = posenc::SizeOf(w.dtype);
  const size_t nq = w.batch * w.tokens * w.query_heads * w.dim;
  const size_t nk = w.batch * w.tokens * w.key_heads * w.dim;
  const std::vector<uint8_t> pool = NormalBytes(w.dtype, std::max(nq, nk) + kPoolExtra, rng);
  std::vector<uint8_t> q(nq * elem), k(nk * elem);
  auto refill = [&](int i) {
    const size_t at = static_cast<size_t>(i % 8) * (kPoolExtra / 8) * elem;
    std::memcpy(q.data(), pool.data() + at, q.size());
    std::memcpy(k.data(), pool.data() + kPoolExtra * elem - at, k.size());
  };
  refill(0);
  std::vector<int64_t> offsets(w.batch, 1000);
  posenc::RopeTensors t;
  t.query = {w.dtype, {w.batch, w.tokens, w.query_heads, w.dim}, q.data(), q.size()};
  if (w.key_heads > 0)
    t.key = {w.dtype, {w.batch, w.tokens, w.key_heads, w.dim}, k.data(), k.size()};
  t.positions.offsets = {posenc::DType::kInt64, {w.batch}, offsets.data(), offsets.size() * 8};
  posenc::RopeOptions o;
  // Warm-up: connections, the shared-memory region, the server's scratch.
  for (int i = 0; i < 5; ++i) {
    if (!client.ApplyRope(o, t).ok()) std::abort();
  }
  std::vector<double> us;
  const double cpu0 = CpuSeconds(absl::GetFlag(FLAGS_server_pid));
  for (int i = 0; i < calls; ++i) {
    refill(i);
    const auto start = Clock::now();
    const absl::Status s = client.ApplyRope(o, t);
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    if (!s.ok()) {
      std::fprintf(stderr, "%s: %s\n", w.name, s.ToString().c_str());
      std::abort();
    }
  }
  const double cpu = CpuSeconds(absl::GetFlag(FLAGS_server_pid)) - cpu0;
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us[us.size() * 99 / 100], cpu * 1e6 / calls};
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const Workload workloads[] = {
      {"tiny [1,1,1,8] f32", posenc::DType::kFloat32, 1, 1, 1, 0, 8, 1},
      {"decode 32x1x(32+8)x128 bf16", posenc::DType::kBFloat16, 32, 1, 32, 8, 128, 1},
      {"1 MiB 1x128x32x128 bf16", posenc::DType::kBFloat16, 1, 128, 32, 0, 128, 1},
      {"prefill 4096x(32+8)x128 f32", posenc::DType::kFloat32, 1, 4096, 32, 8, 128, 10},
  };
  std::unique_ptr<posenc::Client> clients[2];
  const posenc::SharedMemoryUse uses[2] = {posenc::SharedMemoryUse::kOff,
                                           posenc::SharedMemoryUse::kRequire};
  for (int i = 0; i < 2; ++i) {
    posenc::ClientOptions co;
    co.target = absl::GetFlag(FLAGS_target);
    co.shared_memory = uses[i];
    clients[i] = posenc::Client::Create(co).value();
  }
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  std::mt19937_64 rng(seed);
  std::printf("# seed %llu\n", static_cast<unsigned long long>(seed));
  std::printf("workload,round,path,p50_us,p99_us,server_cpu_us_per_call\n");
  for (const Workload& w : workloads) {
    if (std::string(w.name).find(absl::GetFlag(FLAGS_only)) == std::string::npos) continue;
    const int calls = std::max(10, absl::GetFlag(FLAGS_calls) / static_cast<int>(w.calls_divisor));
    for (int round = 1; round <= absl::GetFlag(FLAGS_rounds); ++round) {
      for (int i = 0; i < 2; ++i) {
        const char* path = i == 0 ? "socket" : "shared_memory";
        if (absl::GetFlag(FLAGS_paths).find(path) == std::string::npos) continue;
        const Figures f = Run(*clients[i], w, calls, rng);
        std::printf("%s,%d,%s,%.1f,%.1f,%.1f\n", w.name, round, path, f.p50_us, f.p99_us,
                    f.server_cpu_us);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
