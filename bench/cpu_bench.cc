// posenc-bench-cpu: CPU backend throughput against two baselines over the
// same bytes, on the same threads, in the same run:
//  - memcpy (read one buffer, write another), and
//  - an in-place read-modify-write of the buffer, which is what an in-place
//    kernel does and which runs faster than memcpy (no write-allocate of a
//    second buffer): the fair limit, and the one the targets are set against.
// Repetitions interleave kernel, memcpy and read-modify-write, so drift in
// the machine's speed hits all three alike; medians are reported.
// Prints a table, and JSON with --json=PATH. --only=rope|sinusoidal|alibi|small
// runs one section (the others are skipped); --filter=TEXT runs only the
// cases whose name contains TEXT (for profiling one of them).
// --only=through runs a section the default run leaves out: RoPE, the
// sinusoidal add and the ALiBi bias added to logits from one buffer into
// another, as a KServe call from one shared-memory slice into another,
// block by block through a buffer in cache (Backend::ApplyRopeThrough,
// ApplyAbsoluteThrough, ApplyAttentionBiasThrough) and the way it
// went before (a whole copy in, the in-place kernel there, a whole copy
// out, on one thread as the engine made them); "vs copy" is the figure
// there, since one copy is the least such a call can move.
// --only=copy, also left out by default, times one thread's memcpy against
// posenc::CopyHostBytes (posenc/host_copy.h) at destinations 0, 16, 100 and
// 4080 (16 before) bytes past the source modulo a page, between buffers in cache ("hot":
// the same bytes again) and from memory ("cold": along 256 MiB).
// --positions=one|cycle16 gives the sinusoidal cases' tokens one position, or
// positions 0-15 over and over, instead of 0-4095: tables that stay in L1,
// or all 16 offset rows with one anchor row, to tell what the add's tables
// cost (bench/RESULTS.md, "sixth session").
// --samples also prints every repetition of every case to stderr: "NAME rep
// I k GB/s c GB/s m GB/s r RATIO" (kernel, memcpy, read-modify-write, and
// the read-modify-write's time over the kernel's).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cpu/thread_pool.h"
#include "posenc/backend.h"
#include "posenc/host_copy.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(const std::function<void()>& fn) {
  const auto start = Clock::now();
  fn();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double Median(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

std::vector<uint8_t> Random(size_t bytes, posenc::DType dtype) {
  std::vector<uint8_t> b(bytes);
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> u(-1, 1);
  const size_t n = bytes / posenc::SizeOf(dtype);
  for (size_t i = 0; i < n; ++i) posenc::StoreElement(dtype, b.data(), i, u(rng));
  return b;
}

struct Result {
  std::string name;
  double bytes;  // read + written by the kernel
  double kernel_s, memcpy_s, rmw_s;
};

class Bench {
 public:
  Bench(int threads, int reps, std::string filter, bool samples)
      : threads_(threads),
        reps_(reps),
        filter_(std::move(filter)),
        samples_(samples),
        pool_(threads) {}

  // Whether the case named `name` is to run.
  bool Wanted(const std::string& name) const { return name.find(filter_) != std::string::npos; }

  // Times `kernel` on `bytes` of in-place data against memcpy and an in-place
  // read-modify-write of as many bytes, interleaved.
  Result Measure(const std::string& name, size_t bytes, const std::function<void()>& kernel) {
    std::vector<uint8_t> src(bytes, 1), dst(bytes, 0);
    std::vector<uint64_t> rmw(bytes / 8 + 1, 3);
    const int64_t chunks = threads_ * 4;
    auto copy = [&] {
      pool_.ParallelFor(chunks, 1, [&](int64_t b, int64_t e) {
        const size_t lo = bytes * b / chunks, hi = bytes * e / chunks;
        std::memcpy(dst.data() + lo, src.data() + lo, hi - lo);
      });
    };
    auto modify = [&] {
      const size_t words = rmw.size();
      pool_.ParallelFor(chunks, 1, [&](int64_t b, int64_t e) {
        uint64_t* w = rmw.data();
        const size_t lo = words * b / chunks, hi = words * e / chunks;
        for (size_t i = lo; i < hi; ++i) w[i] ^= 0x5a5a5a5a5a5a5a5aull;
      });
    };
    for (int i = 0; i < 2; ++i) {
      kernel();
      copy();
      modify();
    }
    std::vector<double> k, c, m;
    for (int i = 0; i < reps_; ++i) {
      k.push_back(Seconds(kernel));
      c.push_back(Seconds(copy));
      m.push_back(Seconds(modify));
    }
    if (samples_) {
      // Each repetition's three figures, in GB/s, and the read-modify-write's
      // time over the kernel's: a case's median can hide the host's bursts,
      // where memory ran faster for a few repetitions in a row.
      for (int i = 0; i < reps_; ++i) {
        std::fprintf(stderr, "%s rep %d k %.2f c %.2f m %.2f r %.3f\n", name.c_str(), i,
                     2.0 * bytes / k[i] / 1e9, 2.0 * bytes / c[i] / 1e9, 2.0 * bytes / m[i] / 1e9,
                     m[i] / k[i]);
      }
    }
    return {name, 2.0 * bytes, Median(k), Median(c), Median(m)};
  }

 private:
  int threads_, reps_;
  std::string filter_;
  bool samples_;
  posenc::ThreadPool pool_;
};

// One RoPE case: 4096 tokens x (32 query + 8 key heads) x 128 unless given.
std::function<void()> RopeKernel(posenc::Backend& cpu, posenc::DType dtype, posenc::RopeStyle style,
                                 posenc::RopeLayout layout, int64_t tokens, std::vector<uint8_t>& q,
                                 std::vector<uint8_t>& k, posenc::RopePlan* plan) {
  const int64_t Hq = 32, Hk = 8, D = 128;
  const size_t es = posenc::SizeOf(dtype);
  q = Random(tokens * Hq * D * es, dtype);
  k = Random(tokens * Hk * D * es, dtype);
  posenc::RopeOptions o;
  o.style = style;
  o.layout = layout;
  o.base = 500000;
  posenc::RopeTensors t;
  if (layout == posenc::RopeLayout::kBHSD) {
    t.query = {dtype, {1, Hq, tokens, D}, q.data(), q.size()};
    t.key = {dtype, {1, Hk, tokens, D}, k.data(), k.size()};
  } else {
    t.query = {dtype, {1, tokens, Hq, D}, q.data(), q.size()};
    t.key = {dtype, {1, tokens, Hk, D}, k.data(), k.size()};
  }
  std::vector<int64_t> offsets = {1000};
  t.positions.offsets = {posenc::DType::kInt64, {1}, offsets.data(), 8};
  auto p = posenc::PlanRope(o, t);
  if (!p.ok()) {
    std::fprintf(stderr, "plan: %s\n", p.status().ToString().c_str());
    std::exit(1);
  }
  *plan = *std::move(p);
  return [&cpu, plan, &q, &k] { (void)cpu.ApplyRope(*plan, q.data(), k.data(), {}); };
}

// --only=copy: GB/s of memcpy and CopyHostBytes on one thread, medians of
// `reps` interleaved runs, by size, distance and whether the bytes are in
// cache.
void CopyTable(int reps) {
  constexpr size_t kSpan = size_t{256} << 20, kPage = 4096;
  char* from = static_cast<char*>(std::aligned_alloc(kPage, kSpan + kPage));
  char* to = static_cast<char*>(std::aligned_alloc(kPage, kSpan + kPage));
  std::memset(from, 1, kSpan + kPage);
  std::memset(to, 2, kSpan + kPage);
  std::printf("posenc-bench-cpu --only=copy: 1 thread, median GB/s of %d interleaved runs\n", reps);
  std::printf("%9s %9s %5s %10s %14s\n", "size", "distance", "", "memcpy", "CopyHostBytes");
  for (size_t n : {size_t{4} << 10, size_t{64} << 10, size_t{256} << 10, size_t{1} << 20}) {
    for (size_t distance : {size_t{0}, size_t{16}, size_t{100}, size_t{4080}}) {
      for (bool hot : {true, false}) {
        // Hot: the same n bytes again (repeated to 64 MiB); cold: along the
        // span, each copy reading and writing bytes not touched since.
        const size_t count = hot ? std::max<size_t>(1, (size_t{64} << 20) / n) : kSpan / n;
        const auto run = [&](bool ours) {
          const auto t0 = std::chrono::steady_clock::now();
          for (size_t i = 0; i < count; ++i) {
            const size_t at = hot ? 0 : i * n;
            if (ours) {
              posenc::CopyHostBytes(to + at + distance, from + at, n);
            } else {
              std::memcpy(to + at + distance, from + at, n);
            }
            asm volatile("" ::: "memory");
          }
          const double s =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          return static_cast<double>(n * count) / s / 1e9;
        };
        std::vector<double> plain, ours;
        for (int r = 0; r < reps; ++r) {
          plain.push_back(run(false));
          ours.push_back(run(true));
        }
        std::printf("%6zu KiB %9zu %5s %10.1f %14.1f\n", n >> 10, distance, hot ? "hot" : "cold",
                    Median(plain), Median(ours));
      }
    }
  }
  std::free(from);
  std::free(to);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  int reps = 15;
  std::string json, only, filter, positions;
  bool samples = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--threads=", 0) == 0) threads = std::stoi(a.substr(10));
    if (a.rfind("--reps=", 0) == 0) reps = std::stoi(a.substr(7));
    if (a.rfind("--json=", 0) == 0) json = a.substr(7);
    if (a.rfind("--only=", 0) == 0) only = a.substr(7);
    if (a.rfind("--filter=", 0) == 0) filter = a.substr(9);
    if (a.rfind("--positions=", 0) == 0) positions = a.substr(12);
    if (a == "--samples") samples = true;
  }
  if (!positions.empty() && positions != "one" && positions != "cycle16") {
    std::fprintf(stderr, "--positions: one or cycle16, not %s\n", positions.c_str());
    return 2;
  }
  auto wanted = [&](const char* section) { return only.empty() || only == section; };
  auto cpu = posenc::CreateCpuBackend(threads);
  Bench bench(threads, reps, filter, samples);
  std::vector<Result> results;

  for (posenc::DType dtype : {posenc::DType::kFloat32, posenc::DType::kBFloat16}) {
    if (!wanted("rope")) break;
    for (posenc::RopeLayout layout : {posenc::RopeLayout::kBSHD, posenc::RopeLayout::kBHSD}) {
      for (posenc::RopeStyle style : {posenc::RopeStyle::kNeox, posenc::RopeStyle::kGptj}) {
        const std::string name = std::string("rope ") + posenc::DTypeName(dtype) +
                                 (style == posenc::RopeStyle::kNeox ? " neox " : " gptj ") +
                                 (layout == posenc::RopeLayout::kBHSD ? "bhsd" : "bshd") +
                                 " 4096x(32+8)x128";
        if (!bench.Wanted(name)) continue;
        std::vector<uint8_t> q, k;
        posenc::RopePlan plan;
        auto kernel = RopeKernel(*cpu, dtype, style, layout, 4096, q, k, &plan);
        results.push_back(bench.Measure(name, q.size() + k.size(), kernel));
      }
    }
  }
  for (posenc::DType dtype : {posenc::DType::kFloat32, posenc::DType::kBFloat16}) {
    if (!wanted("sinusoidal")) break;
    const int64_t T = 4096, d = 4096;
    const std::string name = std::string("sinusoidal add ") + posenc::DTypeName(dtype) +
                             " [4096, 4096]" + (positions.empty() ? "" : " positions " + positions);
    if (!bench.Wanted(name)) continue;
    auto x = Random(T * d * posenc::SizeOf(dtype), dtype);
    posenc::AbsoluteOptions o;
    posenc::AbsoluteTensors t;
    t.x = {dtype, {1, T, d}, x.data(), x.size()};
    std::vector<int64_t> ids(T);
    for (int64_t i = 0; i < T; ++i) ids[i] = positions == "one" ? 5 : i % 16;
    if (!positions.empty()) {
      t.positions.position_ids = {posenc::DType::kInt64, {1, T}, ids.data(), T * 8};
    }
    auto plan = posenc::PlanAbsolute(o, t);
    if (!plan.ok()) return 1;
    results.push_back(
        bench.Measure(name, x.size(), [&] { (void)cpu->ApplyAbsolute(*plan, x.data(), {}); }));
  }

  // ALiBi + causal added to bf16 logits, without and with left padding
  // (k_starts): the mask is one more compare per element, and masked
  // elements store -inf without the distance.
  for (bool left_padding : {false, true}) {
    if (!wanted("alibi")) break;
    const int64_t B = 2, H = 16, L = 1024;
    const std::string name = std::string("alibi+causal bf16 logits [2,16,1024,1024]") +
                             (left_padding ? " k_starts" : "");
    if (!bench.Wanted(name)) continue;
    auto logits = Random(B * H * L * L * 2, posenc::DType::kBFloat16);
    std::vector<int64_t> starts = {0, 0};
    if (left_padding) starts = {L / 4, L / 2};
    posenc::BiasOptions o;
    o.causal = true;
    if (left_padding) o.k_starts = {posenc::DType::kInt64, {B}, starts.data(), starts.size() * 8};
    const posenc::TensorView lv{
        posenc::DType::kBFloat16, {B, H, L, L}, logits.data(), logits.size()};
    auto plan = posenc::PlanAttentionBias(o, lv);
    if (!plan.ok()) return 1;
    results.push_back(bench.Measure(
        name, logits.size(), [&] { (void)cpu->ApplyAttentionBias(*plan, logits.data(), {}); }));
  }

  for (posenc::DType dtype : {posenc::DType::kFloat32, posenc::DType::kBFloat16}) {
    if (only != "through") break;
    for (posenc::RopeLayout layout : {posenc::RopeLayout::kBSHD, posenc::RopeLayout::kBHSD}) {
      for (bool through : {true, false}) {
        const std::string name =
            std::string(through ? "rope through " : "rope aside ") + posenc::DTypeName(dtype) +
            " neox " + (layout == posenc::RopeLayout::kBHSD ? "bhsd" : "bshd") + " 4096x(32+8)x128";
        if (!bench.Wanted(name)) continue;
        std::vector<uint8_t> q, k;
        posenc::RopePlan plan;
        (void)RopeKernel(*cpu, dtype, posenc::RopeStyle::kNeox, layout, 4096, q, k, &plan);
        std::vector<uint8_t> q_work(q.size()), k_work(k.size()), q_out(q.size()), k_out(k.size());
        posenc::RopeThrough t;
        t.query = q.data();
        t.key = k.data();
        t.query_work = q_work.data();
        t.key_work = k_work.data();
        t.query_out = q_out.data();
        t.key_out = k_out.data();
        std::function<void()> kernel = [&] { (void)cpu->ApplyRopeThrough(plan, t, {}); };
        if (!through) {
          kernel = [&] {
            std::memcpy(q_work.data(), q.data(), q.size());
            std::memcpy(k_work.data(), k.data(), k.size());
            (void)cpu->ApplyRope(plan, q_work.data(), k_work.data(), {});
            std::memcpy(q_out.data(), q_work.data(), q.size());
            std::memcpy(k_out.data(), k_work.data(), k.size());
          };
        }
        results.push_back(bench.Measure(name, q.size() + k.size(), kernel));
      }
    }
  }
  // The sinusoidal add from one buffer into another the same two ways.
  for (posenc::DType dtype : {posenc::DType::kFloat32, posenc::DType::kBFloat16}) {
    if (only != "through") break;
    for (bool through : {true, false}) {
      const int64_t T = 4096, d = 4096;
      const std::string name = std::string(through ? "sinusoidal through " : "sinusoidal aside ") +
                               posenc::DTypeName(dtype) + " [4096, 4096]";
      if (!bench.Wanted(name)) continue;
      auto x = Random(T * d * posenc::SizeOf(dtype), dtype);
      std::vector<uint8_t> work(x.size()), y(x.size());
      posenc::AbsoluteTensors t;
      t.x = {dtype, {1, T, d}, x.data(), x.size()};
      auto plan = posenc::PlanAbsolute(posenc::AbsoluteOptions{}, t);
      if (!plan.ok()) return 1;
      posenc::AbsoluteThrough at;
      at.x = x.data();
      at.y = y.data();
      std::function<void()> kernel = [&] { (void)cpu->ApplyAbsoluteThrough(*plan, at, {}); };
      if (!through) {
        kernel = [&] {
          std::memcpy(work.data(), x.data(), x.size());
          (void)cpu->ApplyAbsolute(*plan, work.data(), {});
          std::memcpy(y.data(), work.data(), x.size());
        };
      }
      results.push_back(bench.Measure(name, x.size(), kernel));
    }
  }

  // ALiBi + causal added to bf16 logits from one buffer into another, the
  // same two ways: a prefill's square rows, and a long context's decode
  // (one query a head, rows of 256 KiB: larger than a block, so they go
  // through in pieces).
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{2, 16, 1024, 1024}, std::vector<int64_t>{8, 32, 1, 131072}}) {
    for (bool through : {true, false}) {
      if (only != "through") break;
      const std::string name =
          std::string(through ? "alibi+causal through " : "alibi+causal aside ") + "bf16 [" +
          std::to_string(shape[0]) + "," + std::to_string(shape[1]) + "," +
          std::to_string(shape[2]) + "," + std::to_string(shape[3]) + "]";
      if (!bench.Wanted(name)) continue;
      auto logits = Random(shape[0] * shape[1] * shape[2] * shape[3] * 2, posenc::DType::kBFloat16);
      std::vector<uint8_t> work(logits.size()), out(logits.size());
      posenc::BiasOptions o;
      o.causal = true;
      const posenc::TensorView lv{posenc::DType::kBFloat16, shape, logits.data(), logits.size()};
      auto plan = posenc::PlanAttentionBias(o, lv);
      if (!plan.ok()) return 1;
      posenc::BiasThrough bt;
      bt.logits = logits.data();
      bt.out = out.data();
      std::function<void()> kernel = [&] { (void)cpu->ApplyAttentionBiasThrough(*plan, bt, {}); };
      if (!through) {
        kernel = [&] {
          std::memcpy(work.data(), logits.data(), logits.size());
          (void)cpu->ApplyAttentionBias(*plan, work.data(), {});
          std::memcpy(out.data(), work.data(), logits.size());
        };
      }
      results.push_back(bench.Measure(name, logits.size(), kernel));
    }
  }

  if (only == "copy") {
    CopyTable(reps);
    return 0;
  }
  std::printf("posenc-bench-cpu: %d threads, median of %d interleaved runs\n", threads, reps);
  std::printf("%-44s %9s %8s %10s %10s %8s %8s\n", "operation", "MB moved", "GB/s", "memcpy",
              "in-place", "vs copy", "vs rmw");
  for (const Result& r : results) {
    std::printf("%-44s %9.1f %8.2f %10.2f %10.2f %8.2f %8.2f\n", r.name.c_str(), r.bytes / 1e6,
                r.bytes / r.kernel_s / 1e9, r.bytes / r.memcpy_s / 1e9, r.bytes / r.rmw_s / 1e9,
                r.memcpy_s / r.kernel_s, r.rmw_s / r.kernel_s);
  }

  // Small requests must not get slower from being split across threads.
  if (threads > 1 && wanted("small") && filter.empty()) {
    auto one = posenc::CreateCpuBackend(1);
    // Medians, and minimums: the two columns of a one-chunk request run the
    // same code, so there only noise parts them, and the minimum is the
    // steadier of the two.
    std::printf(
        "\nsmall requests, 1 thread vs %d (median us, then minimum us; must not be slower on "
        "more)\n",
        threads);
    for (int64_t tokens : {1, 8, 32, 128, 512}) {
      std::vector<uint8_t> q, k;
      posenc::RopePlan plan_one, plan_many;
      auto k1 = RopeKernel(*one, posenc::DType::kBFloat16, posenc::RopeStyle::kNeox,
                           posenc::RopeLayout::kBSHD, tokens, q, k, &plan_one);
      auto kn = RopeKernel(*cpu, posenc::DType::kBFloat16, posenc::RopeStyle::kNeox,
                           posenc::RopeLayout::kBSHD, tokens, q, k, &plan_many);
      std::vector<double> t1, tn;
      for (int i = 0; i < 5 * reps; ++i) {
        t1.push_back(Seconds(k1));
        tn.push_back(Seconds(kn));
      }
      std::printf("rope bf16 %4lld tokens x (32+8) x 128: %8.1f %8.1f   %8.1f %8.1f\n",
                  static_cast<long long>(tokens), Median(t1) * 1e6, Median(tn) * 1e6,
                  *std::min_element(t1.begin(), t1.end()) * 1e6,
                  *std::min_element(tn.begin(), tn.end()) * 1e6);
    }
  }
  if (!json.empty()) {
    std::ofstream out(json);
    out << "{\"threads\": " << threads << ", \"results\": [";
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      out << (i ? ", " : "") << "{\"name\": \"" << r.name << "\", \"bytes\": " << r.bytes
          << ", \"kernel_s\": " << r.kernel_s << ", \"memcpy_s\": " << r.memcpy_s
          << ", \"rmw_s\": " << r.rmw_s << ", \"ratio_memcpy\": " << r.memcpy_s / r.kernel_s
          << ", \"ratio_rmw\": " << r.rmw_s / r.kernel_s << "}";
    }
    out << "]}\n";
  }
  return 0;
}
