// Scale-out on one machine: three real posenc-server processes behind one
// client target (an ipv4: address list, the same round_robin path a DNS name
// with several A records takes). What a Deployment does to them (spread,
// rolling restart, a node lost, a new pod, one pod overloaded) and what the
// callers see of it.
//
// Bounds are generous on purpose: the suite shares 2 cores with other work
// and runs under AddressSanitizer in CI. What must hold exactly (no call lost,
// bitwise-identical answers, every replica used) is asserted exactly.
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

}  // namespace
}  // namespace posenc
