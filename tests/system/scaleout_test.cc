// Scale-out on one machine: three real posenc-server processes behind one
// client target (an ipv4: address list, the same round_robin path a DNS name
// with several A records takes). What a Deployment does to them (spread,
// rolling restart, a node lost, a new pod, one pod overloaded) and what the
// callers see of it.
//
// Bounds are generous on purpose: the suite shares 2 cores with other work
// and runs under AddressSanitizer in CI. What must hold exactly (no call lost,
// bitwise-identical answers, every replica used) is asserted exactly.
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "fake_dns.h"
#include "gtest/gtest.h"
#include "posenc/client.h"
#include "posenc/wire/requests.h"
#include "posenc/wire/tensors.h"
#include "reference.h"
#include "replicas.h"

namespace posenc {
namespace {

using Clock = std::chrono::steady_clock;
using testing::CallRecord;
using testing::Replica;

constexpr int kReplicas = 3;

uint64_t Seed() {
  const char* env = std::getenv("POSENC_TEST_SEED");
  const uint64_t seed = env != nullptr ? std::strtoull(env, nullptr, 10) : std::random_device{}();
  std::printf("seed %llu (POSENC_TEST_SEED to repeat)\n", static_cast<unsigned long long>(seed));
  return seed;
}

// A RoPE request of random shape and values, and its float32 query.
struct RopeCase {
  RopeOptions options;
  std::vector<int64_t> shape;  // [batch, seq, heads, head_dim]
  std::vector<float> query;
  v1::RopeRequest request;
};

RopeCase RandomRope(std::mt19937_64& rng, int64_t max_seq = 32) {
  RopeCase c;
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  c.shape = {pick(1, 3), pick(1, max_seq), pick(1, 8), 2 * pick(4, 64)};
  c.query.resize(c.shape[0] * c.shape[1] * c.shape[2] * c.shape[3]);
  std::uniform_real_distribution<float> value(-2.f, 2.f);
  for (float& v : c.query) v = value(rng);
  wire::SetRopeOptions(c.options, &c.request);
  wire::SetTensor(TensorView{DType::kFloat32, c.shape, c.query.data(), c.query.size() * 4},
                  c.request.mutable_query(), c.request.mutable_query_data());
  return c;
}

// Largest |answer - float64 reference| over the query; the answer is the
// response's float32 bytes.
double ErrorAgainstReference(const RopeCase& c, const std::string& answer) {
  const int64_t seq = c.shape[1], heads = c.shape[2], dim = c.shape[3];
  if (answer.size() != c.query.size() * 4) return INFINITY;
  const reference::Frequencies f = reference::RopeFrequencies(c.options, dim, seq);
  double worst = 0;
  std::vector<double> x(dim);
  for (int64_t row = 0; row < c.shape[0] * seq * heads; ++row) {
    const int64_t s = (row / heads) % seq;
    for (int64_t d = 0; d < dim; ++d) x[d] = c.query[row * dim + d];
    reference::RotateHead(c.options, f, dim, {s}, x.data());
    for (int64_t d = 0; d < dim; ++d) {
      float got;
      std::memcpy(&got, answer.data() + 4 * (row * dim + d), 4);
      worst = std::max(worst, std::abs(static_cast<double>(got) - x[d]));
    }
  }
  return worst;
}

class ScaleOut : public ::testing::Test {
 protected:
  // Starts kReplicas replicas with `flags`; false (with their logs) if any
  // does not come up.
  bool StartReplicas(const std::vector<std::string>& flags, int count = kReplicas) {
    for (int i = 0; i < count; ++i) {
      replicas_.push_back(std::make_unique<Replica>(POSENC_SERVER_BINARY, flags));
      if (!replicas_.back()->Start()) {
        ADD_FAILURE() << "replica " << i << " did not start:\n"
                      << replicas_.back()->process().log_text();
        return false;
      }
    }
    return true;
  }

  std::vector<int> Ports() const {
    std::vector<int> p;
    for (const auto& r : replicas_) p.push_back(r->port());
    return p;
  }

  int IndexOf(int port) const {
    for (size_t i = 0; i < replicas_.size(); ++i) {
      if (replicas_[i]->port() == port) return static_cast<int>(i);
    }
    return -1;
  }

  std::unique_ptr<Client> NewClient(ClientOptions o) {
    o.target = testing::TargetOf(Ports());
    auto client = Client::Create(o);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }

  // Calls until every replica has answered at least once (round_robin
  // connects to each in the background); false after 20 s.
  bool WaitUntilAllAnswer(Client& client, const v1::RopeRequest& request) {
    std::set<int> seen;
    const auto end = Clock::now() + std::chrono::seconds(20);
    while (seen.size() < replicas_.size() && Clock::now() < end) {
      v1::RopeResponse response;
      const CallRecord r = testing::CallRope(client, request, &response, Clock::now());
      if (r.code == grpc::StatusCode::OK) seen.insert(r.port);
    }
    return seen.size() == replicas_.size();
  }

  void RollingRestart(bool health_checking);

  std::vector<std::unique_ptr<Replica>> replicas_;
};

// 1. Calls spread over every replica, and every replica answers the same
// request with the same bytes.
TEST_F(ScaleOut, CallsSpreadOverReplicasWithIdenticalAnswers) {
  std::mt19937_64 rng(Seed());
  ASSERT_TRUE(StartReplicas({"--threads=1"}));
  std::unique_ptr<Client> client = NewClient({});
  ASSERT_NE(client, nullptr);
  std::vector<RopeCase> cases;
  for (int i = 0; i < 10; ++i) cases.push_back(RandomRope(rng));
  ASSERT_TRUE(WaitUntilAllAnswer(*client, cases[0].request));
  std::vector<double> before(kReplicas);
  for (int i = 0; i < kReplicas; ++i) before[i] = replicas_[i]->Requests("ApplyRope", "OK");

  // 300 calls: each of 10 requests 30 times, interleaved.
  constexpr int kRounds = 30;
  std::vector<std::string> first(cases.size());
  std::vector<std::set<int>> answered_by(cases.size());
  std::map<int, int> calls_seen;
  const auto epoch = Clock::now();
  for (int round = 0; round < kRounds; ++round) {
    for (size_t i = 0; i < cases.size(); ++i) {
      v1::RopeResponse response;
      const CallRecord r = testing::CallRope(*client, cases[i].request, &response, epoch);
      ASSERT_EQ(r.code, grpc::StatusCode::OK) << "call " << round << "/" << i;
      ++calls_seen[r.port];
      answered_by[i].insert(r.port);
      if (round == 0) {
        first[i] = response.query_data();
        const double err = ErrorAgainstReference(cases[i], first[i]);
        EXPECT_LT(err, 1e-5) << "request " << i << " against the float64 reference";
      } else {
        ASSERT_EQ(response.query_data(), first[i])
            << "request " << i << " answered differently by replica on port " << r.port;
      }
    }
  }
  const int total = kRounds * static_cast<int>(cases.size());
  double counted = 0;
  for (int i = 0; i < kReplicas; ++i) {
    const double n = replicas_[i]->Requests("ApplyRope", "OK") - before[i];
    counted += n;
    std::printf("replica %d (port %d): %.0f of %d calls by its /metrics, %d by the caller's peer\n",
                i, replicas_[i]->port(), n, total, calls_seen[replicas_[i]->port()]);
    EXPECT_GE(n, 0.2 * total) << "replica " << i << " got less than 20% of the calls";
    EXPECT_EQ(n, calls_seen[replicas_[i]->port()]) << "metrics and the caller disagree";
  }
  EXPECT_EQ(counted, total);
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_GE(answered_by[i].size(), 2u) << "request " << i << " met one replica only";
  }
}

// Closed-loop callers through one client, recording every call, until
// stopped; each answer is compared bitwise with `expected`.
class Load {
 public:
  Load(Client& client, const v1::RopeRequest& request, std::string expected, int callers,
       Clock::time_point epoch)
      : epoch_(epoch) {
    for (int c = 0; c < callers; ++c) {
      threads_.emplace_back([this, &client, &request, expected] {
        while (!stop_.load()) {
          v1::RopeResponse response;
          CallRecord r = testing::CallRope(client, request, &response, epoch_);
          r.answer_matches = r.code != grpc::StatusCode::OK || response.query_data() == expected;
          std::lock_guard<std::mutex> lock(mu_);
          records_.push_back(r);
        }
      });
    }
  }
  ~Load() { Stop(); }

  std::vector<CallRecord> Stop() {
    stop_ = true;
    for (std::thread& t : threads_) t.join();
    threads_.clear();
    std::lock_guard<std::mutex> lock(mu_);
    return records_;
  }

  double Now() const { return std::chrono::duration<double>(Clock::now() - epoch_).count(); }

  // Waits until `port` answers a call that started after `since`; the
  // seconds that took from `since`, or -1 after `limit` seconds.
  double WaitForTraffic(int port, double since, double limit) {
    return WaitFor([port](const CallRecord& r) { return r.port == port; }, since, limit);
  }
  // The same for a peer address ("ipv4:127.0.0.4:50051").
  double WaitForPeer(const std::string& peer, double since, double limit) {
    return WaitFor([&peer](const CallRecord& r) { return r.peer == peer; }, since, limit);
  }

 private:
  template <typename Match>
  double WaitFor(Match match, double since, double limit) {
    while (Now() < since + limit) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        double first = -1;
        for (const CallRecord& r : records_) {
          if (match(r) && r.code == grpc::StatusCode::OK && r.start_s >= since &&
              (first < 0 || r.start_s < first)) {
            first = r.start_s;
          }
        }
        if (first >= 0) return first - since;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }

  Clock::time_point epoch_;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::vector<CallRecord> records_;
};

// How a set of calls ended. A call is lost unless it ends OK, or
// UNAVAILABLE after the client's retries (its budget: max_attempts with
// backoff; tests count and bound those separately).
struct Outcome {
  int calls = 0, ok = 0, unavailable = 0, other_failures = 0, wrong_answers = 0;
  std::map<int, int> codes;
  std::map<int, std::string> a_message;  // one message per failing code
  std::vector<double> latencies;
};

Outcome Summarise(const std::vector<CallRecord>& records, double from = 0, double to = INFINITY) {
  Outcome o;
  for (const CallRecord& r : records) {
    if (r.start_s < from || r.start_s >= to) continue;
    ++o.calls;
    ++o.codes[r.code];
    if (r.code != grpc::StatusCode::OK) o.a_message.emplace(r.code, r.message);
    o.latencies.push_back(r.latency_s);
    if (!r.answer_matches) ++o.wrong_answers;
    if (r.code == grpc::StatusCode::OK) {
      ++o.ok;
    } else if (r.code == grpc::StatusCode::UNAVAILABLE) {
      ++o.unavailable;
    } else {
      ++o.other_failures;
    }
  }
  return o;
}

std::string CodesString(const Outcome& o) {
  std::string s;
  for (const auto& [code, n] : o.codes)
    s += " code" + std::to_string(code) + "=" + std::to_string(n);
  return s;
}

// Writes the calls and events for scripts/scaleout-plot.py when
// POSENC_SCALEOUT_OUT names a directory.
void WriteTimeline(const std::string& name, const std::vector<CallRecord>& records,
                   const std::vector<std::pair<double, std::string>>& events,
                   const std::map<int, int>& replica_of_port) {
  const char* out = std::getenv("POSENC_SCALEOUT_OUT");
  if (out == nullptr || *out == 0) return;
  const std::string dir = std::string(out) + "/" + name;
  mkdir(dir.c_str(), 0755);
  std::ofstream calls(dir + "/calls.csv");
  calls << "start_s,latency_s,code,replica\n";
  for (const CallRecord& r : records) {
    auto it = replica_of_port.find(r.port);
    calls << r.start_s << ',' << r.latency_s << ',' << r.code << ','
          << (it == replica_of_port.end() ? -1 : it->second) << '\n';
  }
  std::ofstream ev(dir + "/events.csv");
  ev << "t_s,event\n";
  for (const auto& [t, what] : events) ev << t << ',' << what << '\n';
  std::printf("timeline written to %s\n", dir.c_str());
}

// A client that rides out replicas leaving: five attempts, short backoff.
ClientOptions RetryingClient() {
  ClientOptions o;
  o.max_attempts = 5;
  o.initial_backoff = absl::Milliseconds(20);
  o.max_backoff = absl::Milliseconds(500);
  return o;
}

// 2. A rolling restart under load, as a Deployment rollout does it: each
// replica in turn gets SIGTERM, drains and exits 0, comes back at its
// address, and takes traffic again before the next one goes. No call is
// lost; the p99 across the rollout is printed against the steady one. Run
// with the client's health checking (the default) and without it.
void ScaleOut::RollingRestart(bool health_checking) {
  std::mt19937_64 rng(Seed());
  ASSERT_TRUE(StartReplicas({"--threads=1", "--drain_seconds=5"}));
  ClientOptions options = RetryingClient();
  if (!health_checking) options.health_check_service.clear();
  std::unique_ptr<Client> client = NewClient(options);
  ASSERT_NE(client, nullptr);
  const RopeCase c = RandomRope(rng, 8);
  ASSERT_TRUE(WaitUntilAllAnswer(*client, c.request));
  v1::RopeResponse expected;
  ASSERT_EQ(testing::CallRope(*client, c.request, &expected, Clock::now()).code,
            grpc::StatusCode::OK);
  ASSERT_LT(ErrorAgainstReference(c, expected.query_data()), 1e-5);

  std::map<int, int> replica_of_port;
  for (int i = 0; i < kReplicas; ++i) replica_of_port[replicas_[i]->port()] = i;
  std::vector<std::pair<double, std::string>> events;
  double refused_attempts = 0;  // answered UNAVAILABLE by draining replicas
  const auto epoch = Clock::now();
  Load load(*client, c.request, expected.query_data(), 4, epoch);
  std::this_thread::sleep_for(std::chrono::seconds(3));
  const double rollout_start = load.Now();
  events.emplace_back(rollout_start, "rollout starts");
  for (int i = 0; i < kReplicas; ++i) {
    events.emplace_back(load.Now(), "SIGTERM " + std::to_string(i));
    const int code = replicas_[i]->Terminate(std::chrono::seconds(20));
    events.emplace_back(load.Now(), "exited " + std::to_string(i));
    ASSERT_EQ(code, 0) << "replica " << i << " did not drain and exit 0:\n"
                       << replicas_[i]->process().log_text();
    refused_attempts += replicas_[i]->refused_while_draining();
    ASSERT_TRUE(replicas_[i]->Start()) << replicas_[i]->process().log_text();
    const double up = load.Now();
    events.emplace_back(up, "restarted " + std::to_string(i));
    // A Deployment waits for readiness; the client's reconnection backoff
    // decides when traffic comes back.
    const double wait = load.WaitForTraffic(replicas_[i]->port(), up, 20);
    ASSERT_GE(wait, 0) << "restarted replica " << i << " got no traffic in 20 s";
    std::printf(
        "replica %d: drained and exited in %.2f s (refused %.0f attempts meanwhile), traffic "
        "%.2f s after it was back\n",
        i, events[events.size() - 2].first - events[events.size() - 3].first,
        replicas_[i]->refused_while_draining(), wait);
  }
  const double rollout_end = load.Now();
  events.emplace_back(rollout_end, "rollout done");
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const std::vector<CallRecord> records = load.Stop();
  WriteTimeline(health_checking ? "rollout" : "rollout_no_health_check", records, events,
                replica_of_port);

  const Outcome all = Summarise(records);
  const Outcome steady = Summarise(records, 0, rollout_start);
  const Outcome rollout = Summarise(records, rollout_start, rollout_end);
  std::printf(
      "%d calls (%d steady before, %d during the %.1f s rollout): %d OK, %d UNAVAILABLE after "
      "up to %d attempts, %d other failures, %d wrong answers;%s; the draining replicas refused "
      "%.0f attempts, all retried (health checking %s)\n",
      all.calls, steady.calls, rollout.calls, rollout_end - rollout_start, all.ok, all.unavailable,
      options.max_attempts, all.other_failures, all.wrong_answers, CodesString(all).c_str(),
      refused_attempts, health_checking ? "on" : "off");
  std::printf("p50/p99/max ms: steady %.2f/%.2f/%.2f, rollout %.2f/%.2f/%.2f\n",
              1e3 * testing::Quantile(steady.latencies, 0.5),
              1e3 * testing::Quantile(steady.latencies, 0.99),
              1e3 * testing::Quantile(steady.latencies, 1.0),
              1e3 * testing::Quantile(rollout.latencies, 0.5),
              1e3 * testing::Quantile(rollout.latencies, 0.99),
              1e3 * testing::Quantile(rollout.latencies, 1.0));
  ASSERT_GT(steady.calls, 50) << "too little load to say anything";
  ASSERT_GT(rollout.calls, 50);
  // Without health checking round_robin keeps picking a draining replica
  // until it exits, and its refusals are retried: the retries are what
  // saves those calls. With it the replica is dropped on NOT_SERVING.
  if (!health_checking) {
    EXPECT_GT(refused_attempts, 0) << "no drain refused a call: the retries were not exercised";
  }
  EXPECT_EQ(all.other_failures, 0) << "calls lost (not OK, not UNAVAILABLE after retries)";
  EXPECT_EQ(all.wrong_answers, 0);
  // Retries absorb the drains; a call failing after all of them needs five
  // refusals in a row. Bound: 0.5% of the calls.
  EXPECT_LE(all.unavailable * 200, all.calls);
  // No call waits on a dead replica: the worst is the retry backoffs.
  EXPECT_LT(testing::Quantile(rollout.latencies, 1.0), 5.0);
}

TEST_F(ScaleOut, RollingRestartUnderLoadLosesNoCall) { RollingRestart(true); }

TEST_F(ScaleOut, RollingRestartWithoutHealthCheckingLosesNoCallEither) { RollingRestart(false); }

// 3. A node failure: SIGKILL. A call in flight on the killed replica (over
// a connection to it alone) fails fast with UNAVAILABLE, not at its
// deadline; the balanced callers go on with the survivors.
TEST_F(ScaleOut, KilledReplicaFailsFastAndSurvivorsServe) {
  std::mt19937_64 rng(Seed());
  ASSERT_TRUE(StartReplicas({"--threads=1"}));
  const ClientOptions options = RetryingClient();
  std::unique_ptr<Client> client = NewClient(options);
  ASSERT_NE(client, nullptr);
  const RopeCase c = RandomRope(rng, 8);
  ASSERT_TRUE(WaitUntilAllAnswer(*client, c.request));
  v1::RopeResponse expected;
  ASSERT_EQ(testing::CallRope(*client, c.request, &expected, Clock::now()).code,
            grpc::StatusCode::OK);

  // A caller of replica 0 alone, with a request big enough (16 MiB) that a
  // call is almost always in flight, and a 30 s deadline to tell fast
  // failure from a hang.
  std::vector<float> big(64 * 128 * 4 * 128, 0.25f);
  v1::RopeRequest big_request;
  wire::SetRopeOptions(RopeOptions{}, &big_request);
  wire::SetTensor(TensorView{DType::kFloat32, {4, 128, 64, 128}, big.data(), big.size() * 4},
                  big_request.mutable_query(), big_request.mutable_query_data());
  auto stub = v1::PositionalEncoding::NewStub(replicas_[0]->process().NewChannel(1));
  // Until its first failure (after the kill) or 30 s.
  std::atomic<int> direct_ok{0};
  grpc::Status direct_failure;
  Clock::time_point direct_failed_at, direct_failed_started;
  std::thread direct([&] {
    const auto give_up = Clock::now() + std::chrono::seconds(30);
    while (Clock::now() < give_up) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
      v1::RopeResponse response;
      const auto start = Clock::now();
      const grpc::Status s = stub->ApplyRope(&ctx, big_request, &response);
      if (!s.ok()) {
        direct_failure = s;
        direct_failed_started = start;
        direct_failed_at = Clock::now();
        return;
      }
      ++direct_ok;
    }
  });

  const auto epoch = Clock::now();
  Load load(*client, c.request, expected.query_data(), 3, epoch);
  for (int i = 0; i < 1000 && direct_ok < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GE(direct_ok, 2) << "the direct caller of replica 0 is not being answered";
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const Clock::time_point kill_time = Clock::now();
  const double kill_s = load.Now();
  const bool gone = replicas_[0]->Kill();
  direct.join();
  ASSERT_TRUE(gone);
  std::this_thread::sleep_for(std::chrono::seconds(3));
  const std::vector<CallRecord> records = load.Stop();

  const double fail_after = std::chrono::duration<double>(direct_failed_at - kill_time).count();
  const bool in_flight = direct_failed_started < kill_time;
  std::printf("direct call to the killed replica: %s after %.3f s (%s at the kill)\n",
              direct_failure.ok() ? "OK" : direct_failure.error_message().c_str(), fail_after,
              in_flight ? "in flight" : "started just after");
  EXPECT_EQ(direct_failure.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_LT(fail_after, 5.0) << "the call waited on a dead replica";

  const Outcome all = Summarise(records);
  const Outcome around = Summarise(records, kill_s - 0.5, kill_s + 0.5);
  std::map<int, int> after_by_replica;
  int after = 0;
  for (const CallRecord& r : records) {
    if (r.start_s >= kill_s + 0.5 && r.code == grpc::StatusCode::OK) {
      ++after_by_replica[IndexOf(r.port)];
      ++after;
    }
  }
  std::printf(
      "balanced callers: %d calls, %d OK, %d UNAVAILABLE after retries, %d other;%s; around the "
      "kill max %.1f ms; after it replica 1 %d, replica 2 %d, killed %d\n",
      all.calls, all.ok, all.unavailable, all.other_failures, CodesString(all).c_str(),
      1e3 * testing::Quantile(around.latencies, 1.0), after_by_replica[1], after_by_replica[2],
      after_by_replica[0]);
  EXPECT_EQ(all.other_failures, 0);
  EXPECT_EQ(all.wrong_answers, 0);
  EXPECT_LE(all.unavailable * 200, all.calls);
  EXPECT_LT(testing::Quantile(around.latencies, 1.0), 5.0);
  ASSERT_GT(after, 30);
  EXPECT_EQ(after_by_replica[0], 0);
  EXPECT_GE(after_by_replica[1], after / 4);
  EXPECT_GE(after_by_replica[2], after / 4);
}

// 4. A replica listed but down when the client starts, started mid-run,
// while the others close connections every 1.5 s (--max_connection_age_ms).
// With an ipv4: list the address is known from the start, so this shows
// the client picking up a listed replica that comes up (its reconnection
// backoff) and connection ageing under load costing no call; a DNS name
// re-resolved on each GOAWAY would add new addresses the same way.
TEST_F(ScaleOut, ReplicaStartedMidRunGetsTraffic) {
  std::mt19937_64 rng(Seed());
  const std::vector<std::string> flags = {"--threads=1", "--max_connection_age_ms=1500"};
  ASSERT_TRUE(StartReplicas(flags, 2));
  replicas_.push_back(
      std::make_unique<Replica>(POSENC_SERVER_BINARY, flags, testing::UnusedPort()));
  const ClientOptions options = RetryingClient();
  std::unique_ptr<Client> client = NewClient(options);
  ASSERT_NE(client, nullptr);
  const RopeCase c = RandomRope(rng, 8);
  v1::RopeResponse expected;
  ASSERT_EQ(testing::CallRope(*client, c.request, &expected, Clock::now()).code,
            grpc::StatusCode::OK);

  const auto epoch = Clock::now();
  Load load(*client, c.request, expected.query_data(), 3, epoch);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  ASSERT_TRUE(replicas_[2]->Start()) << replicas_[2]->process().log_text();
  const double up = load.Now();
  const double wait = load.WaitForTraffic(replicas_[2]->port(), up, 20);
  std::printf("new replica answered its first call %.2f s after it was serving\n", wait);
  ASSERT_GE(wait, 0) << "the new replica got no traffic in 20 s";
  EXPECT_LT(wait, 10.0);
  std::this_thread::sleep_for(std::chrono::seconds(4));  // more than two connection ages
  const double end = load.Now();
  const std::vector<CallRecord> records = load.Stop();

  const Outcome all = Summarise(records);
  std::map<int, int> last_two_s;
  int last_total = 0;
  for (const CallRecord& r : records) {
    if (r.start_s >= end - 2 && r.code == grpc::StatusCode::OK) {
      ++last_two_s[IndexOf(r.port)];
      ++last_total;
    }
  }
  std::printf("%d calls, %d OK,%s; last 2 s: %d / %d / %d\n", all.calls, all.ok,
              CodesString(all).c_str(), last_two_s[0], last_two_s[1], last_two_s[2]);
  EXPECT_EQ(all.ok, all.calls) << "connection ageing or the new replica cost calls";
  EXPECT_EQ(all.wrong_answers, 0);
  ASSERT_GT(last_total, 30);
  for (int i = 0; i < kReplicas; ++i) {
    EXPECT_GE(last_two_s[i], last_total / 5) << "replica " << i << " after the new one joined";
  }
}

// 4b. The same through DNS, as a headless Service does it: the name first
// resolves to two pods (127.0.0.2 and .3, one port); a third (127.0.0.4)
// is added to the answer mid-run. The servers close connections every
// 1.5 s (--max_connection_age_ms); each close makes the client re-resolve
// (here allowed every 0.5 s; gRPC's default is 30 s), and the new address
// gets traffic.
TEST_F(ScaleOut, NewPodFoundWhenConnectionAgeingMakesTheClientReResolve) {
  std::mt19937_64 rng(Seed());
  const std::vector<std::string> flags = {"--threads=1", "--max_connection_age_ms=1500"};
  replicas_.push_back(std::make_unique<Replica>(POSENC_SERVER_BINARY, flags, 0, "127.0.0.2"));
  ASSERT_TRUE(replicas_[0]->Start()) << replicas_[0]->process().log_text();
  const int port = replicas_[0]->port();
  for (const char* host : {"127.0.0.3", "127.0.0.4"}) {
    replicas_.push_back(std::make_unique<Replica>(POSENC_SERVER_BINARY, flags, port, host));
    ASSERT_TRUE(replicas_.back()->Start()) << replicas_.back()->process().log_text();
  }
  testing::FakeDns dns;
  ASSERT_GT(dns.port(), 0);
  dns.SetAddresses({"127.0.0.2", "127.0.0.3"});
  ClientOptions o = RetryingClient();
  o.target = "dns://127.0.0.1:" + std::to_string(dns.port()) +
             "/posenc-headless.test:" + std::to_string(port);
  o.min_time_between_resolutions = absl::Milliseconds(500);
  auto client = Client::Create(o);
  ASSERT_TRUE(client.ok()) << client.status();
  const RopeCase c = RandomRope(rng, 8);
  v1::RopeResponse expected;
  ASSERT_EQ(testing::CallRope(**client, c.request, &expected, Clock::now()).code,
            grpc::StatusCode::OK);

  const std::string new_pod = "ipv4:127.0.0.4:" + std::to_string(port);
  Load load(**client, c.request, expected.query_data(), 3, Clock::now());
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  dns.SetAddresses({"127.0.0.2", "127.0.0.3", "127.0.0.4"});
  const double changed = load.Now();
  const double wait = load.WaitForPeer(new_pod, changed, 20);
  std::printf("the new pod answered its first call %.2f s after DNS listed it (%d queries)\n", wait,
              dns.queries());
  ASSERT_GE(wait, 0) << "the new pod got no traffic in 20 s";
  // One connection age until a GOAWAY, then the re-resolution and a
  // connection; generous for a loaded machine.
  EXPECT_LT(wait, 6.0);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const double end = load.Now();
  const std::vector<CallRecord> records = load.Stop();

  const Outcome all = Summarise(records);
  std::map<std::string, int> last_s;
  int last_total = 0, new_pod_before = 0;
  for (const CallRecord& r : records) {
    if (r.peer == new_pod && r.start_s + r.latency_s < changed) ++new_pod_before;
    if (r.start_s >= end - 1 && r.code == grpc::StatusCode::OK) {
      ++last_s[r.peer];
      ++last_total;
    }
  }
  std::printf("%d calls, %d OK,%s; last 1 s: %d calls, %d on the new pod\n", all.calls, all.ok,
              CodesString(all).c_str(), last_total, last_s[new_pod]);
  EXPECT_EQ(new_pod_before, 0) << "calls reached the pod before DNS listed it";
  EXPECT_EQ(all.ok, all.calls) << "re-resolution or connection ageing cost calls";
  EXPECT_EQ(all.wrong_answers, 0);
  ASSERT_GT(last_total, 30);
  EXPECT_GE(last_s[new_pod], last_total / 5);
}

// 5. One replica saturated (one slot, no admission wait): it refuses with
// RESOURCE_EXHAUSTED before reading the request. Without
// retry_resource_exhausted the callers see those refusals; with it each is
// retried after a backoff, and round_robin sends the retry to the next
// replica.
TEST_F(ScaleOut, OverloadedReplicaRefusalsAreRetriedOnOthers) {
  std::mt19937_64 rng(Seed());
  ASSERT_TRUE(StartReplicas({"--threads=1"}, 2));
  replicas_.push_back(std::make_unique<Replica>(
      POSENC_SERVER_BINARY,
      std::vector<std::string>{"--threads=1", "--max_inflight=1", "--admission_wait_ms=0"}));
  ASSERT_TRUE(replicas_.back()->Start()) << replicas_.back()->process().log_text();
  // 512 KiB requests: long enough that callers overlap on the saturated one.
  std::vector<float> q(256 * 8 * 64);
  std::uniform_real_distribution<float> value(-1, 1);
  for (float& v : q) v = value(rng);
  v1::RopeRequest request;
  wire::SetRopeOptions(RopeOptions{}, &request);
  wire::SetTensor(TensorView{DType::kFloat32, {1, 256, 8, 64}, q.data(), q.size() * 4},
                  request.mutable_query(), request.mutable_query_data());

  auto run = [&](bool retry, int* refused, int* ok) {
    ClientOptions o;
    o.retry_resource_exhausted = retry;
    o.max_attempts = 5;
    o.initial_backoff = absl::Milliseconds(5);
    o.max_backoff = absl::Milliseconds(80);
    std::unique_ptr<Client> client = NewClient(o);
    ASSERT_NE(client, nullptr);
    ASSERT_TRUE(WaitUntilAllAnswer(*client, request));
    std::atomic<int> r{0}, g{0};
    std::vector<std::thread> callers;
    for (int t = 0; t < 6; ++t) {
      callers.emplace_back([&] {
        for (int i = 0; i < 30; ++i) {
          v1::RopeResponse response;
          const CallRecord rec = testing::CallRope(*client, request, &response, Clock::now());
          if (rec.code == grpc::StatusCode::RESOURCE_EXHAUSTED) ++r;
          if (rec.code == grpc::StatusCode::OK) ++g;
        }
      });
    }
    for (std::thread& t : callers) t.join();
    *refused = r;
    *ok = g;
  };
  int refused_without = 0, ok_without = 0;
  const double before = replicas_[2]->Requests("ApplyRope", "RESOURCE_EXHAUSTED");
  run(false, &refused_without, &ok_without);
  const double middle = replicas_[2]->Requests("ApplyRope", "RESOURCE_EXHAUSTED");
  auto refused_by_all = [&] {
    double n = 0;
    for (const auto& replica : replicas_) n += replica->Requests("ApplyRope", "RESOURCE_EXHAUSTED");
    return n;
  };
  const double all_middle = refused_by_all();
  ASSERT_GT(refused_without, 5) << "the replica was not saturated; nothing was tested";
  // With retry the callers back off, so they overlap on the saturated replica
  // less often than without: a round can see only a handful of refusals. Run
  // rounds until the replica has refused at least six calls, so the retries
  // were exercised, whatever the machine's timing.
  int rounds = 0, refused_with = 0, ok_with = 0;
  double after = middle;
  while (rounds < 4 && (rounds == 0 || after - middle <= 5)) {
    int refused = 0, ok = 0;
    run(true, &refused, &ok);
    refused_with += refused;
    ok_with += ok;
    ++rounds;
    after = replicas_[2]->Requests("ApplyRope", "RESOURCE_EXHAUSTED");
  }
  std::printf(
      "180 calls a round; without retry: %d refused to the caller (%d OK), the saturated "
      "replica refused %.0f; with retry, %d round(s): %d refused to the caller (%d OK), the "
      "replica refused %.0f\n",
      refused_without, ok_without, middle - before, rounds, refused_with, ok_with, after - middle);
  EXPECT_GT(after - middle, 5) << "with retry the replica should still have refused";
  // A refusal reaches the caller only after five in a row (max_attempts), so
  // every one the callers saw cost the servers five. This holds whatever the
  // timing; a ratio to the round without retry does not: the retries of one
  // call can land on the saturated replica four times running (round_robin
  // advances for every caller's pick), and a round without retry can see as
  // few as six refusals. Without retry the callers see every refusal.
  EXPECT_LE(refused_with * 5, refused_by_all() - all_middle)
      << "a call was refused to its caller before five attempts";
  EXPECT_LT(refused_with, after - middle) << "the refusals were not retried";
  EXPECT_EQ(ok_with + refused_with, 180 * rounds) << "calls failed otherwise than refused";
}

// The watched service name goes into the client's service config: anything
// that could break out of it is refused, naming the option.
TEST(ScaleOutClient, HealthCheckServiceNameIsValidated) {
  for (const std::string& bad :
       std::vector<std::string>{"posenc\"}],\"x\":{", "a b", std::string("a\0b", 3)}) {
    ClientOptions o;
    o.health_check_service = bad;
    auto client = Client::Create(o);
    ASSERT_FALSE(client.ok()) << bad;
    EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(client.status().message().find("ClientOptions.health_check_service"),
              std::string::npos)
        << client.status();
  }
  ClientOptions off;
  off.health_check_service = "";
  EXPECT_TRUE(Client::Create(off).ok());
}

TEST(ScaleOutClient, ResolutionIntervalIsValidated) {
  for (const absl::Duration bad : {absl::Milliseconds(-1), absl::Hours(25)}) {
    ClientOptions o;
    o.min_time_between_resolutions = bad;
    auto client = Client::Create(o);
    ASSERT_FALSE(client.ok()) << bad;
    EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(client.status().message().find("ClientOptions.min_time_between_resolutions"),
              std::string::npos)
        << client.status();
  }
}

}  // namespace
}  // namespace posenc
