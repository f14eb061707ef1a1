// The real posenc-server's lifecycle under conditions that used to break it:
// a drain under steady traffic (refused arrivals must not extend it, and no
// call may end CANCELLED), a caller that stops reading (the process must
// still exit by its drain deadline), and TLS flags that are incomplete or
// point at bad files (refused at start-up, naming the flag).
#include <sys/stat.h>

#include <atomic>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "posenc/v1/posenc.grpc.pb.h"
#include "server_process.h"

namespace posenc {
namespace {

using Clock = std::chrono::steady_clock;

v1::RopeRequest SmallRope(int64_t tokens = 16) {
  v1::RopeRequest r;
  r.mutable_query()->set_dtype(v1::DATA_TYPE_FLOAT32);
  for (int64_t d : {int64_t{1}, tokens, int64_t{8}, int64_t{64}}) r.mutable_query()->add_shape(d);
  r.set_query_data(std::string(tokens * 8 * 64 * 4, '\x01'));
  return r;
}

// Callers keep calling through SIGTERM, each call on its own, without client
// retries. Calls that start after the signal must end UNAVAILABLE (retryable
// elsewhere), never CANCELLED; none may end otherwise; and the server must
// exit long before --drain_seconds, since refused arrivals do not count as
// traffic to wait for.
TEST(Lifecycle, DrainUnderSteadyTrafficEndsPromptlyAndRefusesWithUnavailable) {
  testing::ServerProcess server;
  ASSERT_TRUE(server.Start(POSENC_SERVER_BINARY, {"--drain_seconds=20", "--threads=2"}))
      << server.log_text();
  std::atomic<bool> stop{false};
  std::atomic<int64_t> sigterm_ns{0};
  std::mutex mu;
  std::map<grpc::StatusCode, int> before, after;
  std::map<grpc::StatusCode, std::string> messages;
  std::vector<std::thread> callers;
  for (int c = 0; c < 8; ++c) {
    callers.emplace_back([&, c] {
      auto stub = v1::PositionalEncoding::NewStub(server.NewChannel(c + 1));
      const v1::RopeRequest req = SmallRope();
      while (!stop) {
        const int64_t started = Clock::now().time_since_epoch().count();
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
        v1::RopeResponse resp;
        const grpc::Status s = stub->ApplyRope(&ctx, req, &resp);
        std::lock_guard<std::mutex> lock(mu);
        const int64_t t = sigterm_ns.load();
        (t != 0 && started >= t ? after : before)[s.error_code()]++;
        messages[s.error_code()] = s.error_message();
      }
    });
  }
  // SIGTERM once calls are being answered (not after a fixed time, which a
  // loaded machine may spend connecting).
  const auto count = [&](std::map<grpc::StatusCode, int>& codes, grpc::StatusCode code) {
    std::lock_guard<std::mutex> lock(mu);
    return codes[code];
  };
  for (const auto end = Clock::now() + std::chrono::seconds(20);
       count(before, grpc::StatusCode::OK) == 0 && Clock::now() < end;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const auto t0 = Clock::now();
  sigterm_ns = t0.time_since_epoch().count();
  ASSERT_EQ(kill(server.pid(), SIGTERM), 0);
  const bool exited = server.Exited(std::chrono::seconds(25));
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  // Calls after the exit too: at least 200 ms of them, and until one has
  // been refused (the drain itself may be too short to see one).
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (const auto end = Clock::now() + std::chrono::seconds(10);
       count(after, grpc::StatusCode::UNAVAILABLE) == 0 && Clock::now() < end;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  stop = true;
  for (auto& t : callers) t.join();
  ASSERT_TRUE(exited) << "no exit within 25 s of SIGTERM";
  std::printf(
      "drain: exited %.2f s after SIGTERM (--drain_seconds=20); before: %d OK; after: "
      "%d UNAVAILABLE, %d CANCELLED, %d OK\n",
      seconds, before[grpc::StatusCode::OK], after[grpc::StatusCode::UNAVAILABLE],
      after[grpc::StatusCode::CANCELLED], after[grpc::StatusCode::OK]);
  EXPECT_EQ(server.exit_code(), 0) << "signal " << server.term_signal() << "\n"
                                   << server.log_text();
  // Well under the 20 s drain (loose: a loaded machine is slow to tear a
  // process down, but a drain held open by arrivals would take all 20).
  EXPECT_LT(seconds, 12.0) << "refused arrivals must not keep the server draining";
  EXPECT_GT(before[grpc::StatusCode::OK], 0);
  EXPECT_GT(after[grpc::StatusCode::UNAVAILABLE], 0);
  // OK is possible for a call that reached the server before the signal did.
  EXPECT_EQ(after[grpc::StatusCode::CANCELLED], 0);
  for (const auto& [code, n] : after) {
    if (n == 0) continue;
    EXPECT_TRUE(code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::OK)
        << n << " calls started after SIGTERM ended " << code << ": " << messages[code];
  }
  for (const auto& [code, n] : before) {
    if (n == 0) continue;
    EXPECT_TRUE(code == grpc::StatusCode::OK || code == grpc::StatusCode::UNAVAILABLE)
        << n << " calls started before SIGTERM ended " << code << ": " << messages[code];
  }
}

// A caller that sends requests on a stream and never reads the answers
// wedges its call (the server's writes wait on flow control). SIGTERM must
// still end the process by the drain deadline, not leave it hanging.
// While it drains, the server says so on the health service: readiness (its
// service's name, and "", which Kubernetes' gRPC probe and clients' health
// checking ask) turns NOT_SERVING at once, so traffic goes elsewhere;
// liveness stays SERVING, so the kubelet does not restart it meanwhile.
TEST(Lifecycle, AStalledCallerCannotHoldTheServerPastItsDrainDeadline) {
  testing::ServerProcess server;
  ASSERT_TRUE(server.Start(POSENC_SERVER_BINARY, {"--drain_seconds=4", "--log_level=info",
                                                  "--metrics_listen=127.0.0.1:0"}))
      << server.log_text();
  const int metrics_port = testing::MetricsPortFromLog(server);
  ASSERT_NE(metrics_port, 0) << server.log_text();
  auto stub = v1::PositionalEncoding::NewStub(server.NewChannel(1));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto stream = stub->StreamRope(&ctx);
  // A 32 MiB answer, far more than the caller's transport buffers unread:
  // the server's write waits for a reader that never comes. SIGTERM once
  // the message has been computed (its answer is being written), not after
  // a fixed time: before its read the stream would be idle and the drain
  // would not be cut short.
  ASSERT_TRUE(stream->Write(SmallRope(16384)));
  const std::string computed = R"(posenc_requests_total{code="OK",method="StreamRope"})";
  for (const auto end = Clock::now() + std::chrono::seconds(30);
       testing::MetricValue(metrics_port, computed) < 1 && Clock::now() < end;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(testing::MetricValue(metrics_port, computed), 1.0) << "the message was never computed";
  auto health = grpc::health::v1::Health::NewStub(server.NewChannel(2));
  const auto status_of = [&](const char* service) {
    grpc::ClientContext hc;
    hc.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    grpc::health::v1::HealthCheckResponse resp;
    const grpc::Status s = health->Check(&hc, req, &resp);
    return s.ok() ? resp.status() : grpc::health::v1::HealthCheckResponse::UNKNOWN;
  };
  using Health = grpc::health::v1::HealthCheckResponse;
  for (const char* service : {"", "posenc.v1.PositionalEncoding", "liveness"}) {
    EXPECT_EQ(status_of(service), Health::SERVING) << service << " before SIGTERM";
  }
  const auto t0 = Clock::now();
  ASSERT_EQ(kill(server.pid(), SIGTERM), 0);
  // The stalled stream holds the drain open for its 4 s.
  bool not_ready = false;
  for (const auto end = t0 + std::chrono::seconds(3); !not_ready && Clock::now() < end;) {
    not_ready = status_of("posenc.v1.PositionalEncoding") == Health::NOT_SERVING;
    if (!not_ready) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(not_ready) << "readiness still SERVING while draining";
  EXPECT_EQ(status_of(""), Health::NOT_SERVING);
  EXPECT_EQ(status_of("liveness"), Health::SERVING);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(4)) << "seen before the drain's deadline";
  const bool exited = server.Exited(std::chrono::seconds(15));
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  ctx.TryCancel();
  ASSERT_TRUE(exited) << "the server hung on a caller that stopped reading";
  std::printf("stalled caller: exited %.2f s after SIGTERM (--drain_seconds=4), code %d\n", seconds,
              server.exit_code());
  // Exit code 3 says the deadline cut the drain short; the time only that
  // it did not wait far past it (loose: teardown on a loaded machine).
  EXPECT_LT(seconds, 4 + 8.0);
  EXPECT_EQ(server.exit_code(), 3) << "a drain cut short by its deadline exits 3";
}

// Flags that used to be taken silently: refused at start-up with a message
// naming the flag (an unknown log level used to turn every log line off,
// including the fatal ones; a negative thread count was accepted; an
// unwritable port file went unnoticed).
TEST(Lifecycle, BadFlagsRefuseToStartNamingTheFlag) {
  struct Bad {
    std::vector<std::string> flags;
    std::string names;
  };
  for (const Bad& b : std::vector<Bad>{
           {{"--log_level=verbose"}, "--log_level"},
           {{"--log_level=INFO2"}, "--log_level"},
           {{"--log_format=xml"}, "--log_format"},
           {{"--log_format="}, "--log_format"},
           {{"--slow_call_ms=-1"}, "--slow_call_ms"},
           {{"--threads=-3"}, "--threads"},
           {{"--port_file=/proc/no/such/dir/port"}, "--port_file"},
           {{"--max_inflight_bytes=1000"}, "--max_inflight_bytes"},
           {{"--max_memory_bytes=-1"}, "--max_memory_bytes"},
       }) {
    testing::ServerProcess server;
    // The fixture's own --port_file comes first; a later one wins.
    EXPECT_FALSE(server.Start(POSENC_SERVER_BINARY, b.flags)) << b.names;
    ASSERT_TRUE(server.Exited(std::chrono::seconds(10))) << b.names;
    EXPECT_NE(server.exit_code(), 0) << b.names;
    EXPECT_NE(server.log_text().find(b.names), std::string::npos)
        << "the refusal should name " << b.names << ": " << server.log_text();
  }
  // Case does not matter where it is natural.
  testing::ServerProcess upper;
  EXPECT_TRUE(upper.Start(POSENC_SERVER_BINARY, {"--log_level=WARNING"})) << upper.log_text();
}

// Every flag comes from POSENC_<FLAG> when the command line does not set it
// (Abseil's flag reflection; a hand-written list used to skip
// POSENC_MAX_INFLIGHT_BYTES and POSENC_MAX_MEMORY_BYTES): a value the server
// must refuse proves the variable was read, and a malformed one names it.
TEST(Lifecycle, EnvironmentSetsEveryFlag) {
  struct Case {
    const char* var;
    const char* value;
    std::string named;
  };
  for (const Case& c : std::vector<Case>{
           {"POSENC_MAX_INFLIGHT_BYTES", "1024", "--max_inflight_bytes (1024)"},
           {"POSENC_MAX_INFLIGHT_BYTES", "banana", "POSENC_MAX_INFLIGHT_BYTES=banana"},
           {"POSENC_MAX_MEMORY_BYTES", "-5", "--max_memory_bytes must be >= 0"},
           {"POSENC_LOG_FORMAT", "xml", "--log_format"},
           {"POSENC_CUDA_DEVICES", "0,x", "--cuda_devices must be 'all' or comma-separated"},
       }) {
    ASSERT_EQ(setenv(c.var, c.value, 1), 0);
    testing::ServerProcess server;
    const bool started = server.Start(POSENC_SERVER_BINARY, {});
    unsetenv(c.var);
    EXPECT_FALSE(started) << c.var << "=" << c.value << " was ignored";
    ASSERT_TRUE(server.Exited(std::chrono::seconds(10))) << c.var;
    EXPECT_NE(server.exit_code(), 0) << c.var;
    EXPECT_NE(server.log_text().find(c.named), std::string::npos)
        << "the refusal should name " << c.named << ": " << server.log_text();
  }
  // The command line wins over the environment.
  ASSERT_EQ(setenv("POSENC_MAX_INFLIGHT_BYTES", "1024", 1), 0);
  testing::ServerProcess server;
  const bool started = server.Start(POSENC_SERVER_BINARY, {"--max_inflight_bytes=1073741824"});
  unsetenv("POSENC_MAX_INFLIGHT_BYTES");
  EXPECT_TRUE(started) << server.log_text();
}

// gRPC sets SO_REUSEPORT by default: a second server on a taken port would
// start and silently share its traffic. It must fail instead.
TEST(Lifecycle, ASecondServerOnTheSamePortFails) {
  testing::ServerProcess first;
  ASSERT_TRUE(first.Start(POSENC_SERVER_BINARY, {})) << first.log_text();
  testing::ServerProcess second;
  EXPECT_FALSE(
      second.Start(POSENC_SERVER_BINARY, {"--listen=127.0.0.1:" + std::to_string(first.port())}));
  ASSERT_TRUE(second.Exited(std::chrono::seconds(10)));
  EXPECT_NE(second.exit_code(), 0);
  EXPECT_NE(second.log_text().find("in use"), std::string::npos) << second.log_text();
}

// Overload refuses calls by the thousand a second; the log must not grow with
// them (it used to write one warning per refusal): at most one line a second,
// counting the refusals it did not write.
TEST(Lifecycle, OverloadLogsAtMostOneLineASecond) {
  testing::ServerProcess server;
  ASSERT_TRUE(server.Start(POSENC_SERVER_BINARY,
                           {"--max_inflight=1", "--admission_wait_ms=0", "--threads=1"}))
      << server.log_text();
  std::atomic<int64_t> refused{0};
  std::atomic<bool> stop{false};
  const auto start = Clock::now();
  std::vector<std::thread> callers;
  for (int c = 0; c < 6; ++c) {
    callers.emplace_back([&, c] {
      auto stub = v1::PositionalEncoding::NewStub(server.NewChannel(c + 1));
      const v1::RopeRequest req = SmallRope(256);
      while (!stop) {
        grpc::ClientContext ctx;
        v1::RopeResponse resp;
        if (stub->ApplyRope(&ctx, req, &resp).error_code() == grpc::RESOURCE_EXHAUSTED) ++refused;
      }
    });
  }
  // At least 2.5 s of overload, and on until the log has summed up the
  // refusals it left out (a loaded machine may refuse slowly at first).
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  for (const auto end = start + std::chrono::seconds(20);
       server.log_text().find("more refusals") == std::string::npos && Clock::now() < end;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  stop = true;
  for (std::thread& t : callers) t.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const std::string log = server.log_text();
  int lines = 0;
  for (size_t at = log.find(" refused: "); at != std::string::npos;
       at = log.find(" refused: ", at + 1)) {
    ++lines;
  }
  std::printf("%lld refusals in %.1f s, %d log lines mentioning them\n",
              static_cast<long long>(refused.load()), seconds, lines);
  ASSERT_GT(refused.load(), 20) << "the server was never overloaded; nothing was tested";
  EXPECT_LE(lines, static_cast<int>(seconds) + 2) << log;
  EXPECT_NE(log.find("more refusals"), std::string::npos) << log;
}

// --help lists the server's flags; --version says version, build and CUDA.
TEST(Lifecycle, HelpAndVersionTellTheTruth) {
  const std::string out = "/tmp/posenc_lifecycle_help.txt";
  ASSERT_EQ(
      std::system((std::string(POSENC_SERVER_BINARY) + " --help > " + out + " 2>&1").c_str()) >> 8,
      1);
  const std::string help = testing::ReadFile(out);
  EXPECT_NE(help.find("--max_inflight_bytes"), std::string::npos) << help;
  EXPECT_EQ(help.find("No flags matched"), std::string::npos) << help;
  ASSERT_EQ(
      std::system((std::string(POSENC_SERVER_BINARY) + " --version > " + out + " 2>&1").c_str()),
      0);
  const std::string version = testing::ReadFile(out);
  EXPECT_NE(version.find("posenc-server 0."), std::string::npos) << version;
#ifdef NDEBUG
  EXPECT_NE(version.find("release build"), std::string::npos) << version;
#endif
  EXPECT_NE(version.find("CUDA"), std::string::npos) << version;
  std::remove(out.c_str());
}

// TLS: what the flags name must exist, be readable PEM and belong together;
// otherwise the server refuses to start (exit 2) and says which flag.
class TlsFlags : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char pattern[] = "/tmp/posenc_tlsflags_XXXXXX";
    dir_ = new std::string(mkdtemp(pattern));
    const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    const std::string script =
        "set -e; cd " + *dir_ + "; openssl req -x509 " + key +
        " -keyout server.key -out server.pem -days 2 -subj /CN=localhost; openssl req -x509 " +
        key + " -keyout other.key -out other.pem -days 2 -subj /CN=other; " +
        "echo 'not a pem file' > garbage.pem; mkfifo fifo.pem";
    ASSERT_EQ(std::system(("bash -c '" + script + "' > " + *dir_ + "/openssl.log 2>&1").c_str()), 0)
        << testing::ReadFile(*dir_ + "/openssl.log");
  }
  static void TearDownTestSuite() {
    std::system(("rm -rf " + *dir_).c_str());
    delete dir_;
  }
  static std::string Path(const std::string& name) { return *dir_ + "/" + name; }

  // Starts the server with `flags`, expecting a refusal naming `flag`.
  static void ExpectRefused(const std::vector<std::string>& flags, const std::string& flag,
                            const std::string& what) {
    testing::ServerProcess server;
    const auto t0 = Clock::now();
    EXPECT_FALSE(server.Start(POSENC_SERVER_BINARY, flags)) << "started with " << what;
    ASSERT_TRUE(server.Exited(std::chrono::seconds(10))) << what;
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10.0) << what;
    EXPECT_EQ(server.exit_code(), 2) << what << ": " << server.log_text();
    EXPECT_NE(server.log_text().find(flag), std::string::npos)
        << what << ": the log should name " << flag << ": " << server.log_text();
  }

  static std::string* dir_;
};
std::string* TlsFlags::dir_ = nullptr;

TEST_F(TlsFlags, IncompleteOrBadFilesRefuseToStartNamingTheFlag) {
  ExpectRefused({"--tls_client_ca=" + Path("server.pem")}, "--tls_cert",
                "a client CA without a certificate (used to serve plaintext)");
  ExpectRefused({"--tls_cert=" + Path("server.pem")}, "--tls_key", "a certificate without a key");
  ExpectRefused({"--tls_cert=" + Path("missing.pem"), "--tls_key=" + Path("server.key")},
                "--tls_cert", "a missing certificate file");
  ExpectRefused({"--tls_cert=" + Path("garbage.pem"), "--tls_key=" + Path("server.key")},
                "--tls_cert", "a certificate file that is not PEM");
  ExpectRefused({"--tls_cert=" + Path("server.pem"), "--tls_key=" + Path("garbage.pem")},
                "--tls_key", "a key file that is not PEM (used to say 'address in use?')");
  ExpectRefused({"--tls_cert=" + Path("server.pem"), "--tls_key=" + Path("other.key")}, "--tls_key",
                "a key of another certificate");
  ExpectRefused({"--tls_cert=" + Path("fifo.pem"), "--tls_key=" + Path("server.key")}, "--tls_cert",
                "a FIFO (must not hang)");
  ExpectRefused({"--tls_cert=" + Path("server.pem"), "--tls_key=" + Path("server.key"),
                 "--tls_client_ca=" + Path("garbage.pem")},
                "--tls_client_ca", "a client CA that is not PEM");
}

TEST_F(TlsFlags, GoodFilesStart) {
  testing::ServerProcess server;
  EXPECT_TRUE(server.Start(POSENC_SERVER_BINARY,
                           {"--tls_cert=" + Path("server.pem"), "--tls_key=" + Path("server.key"),
                            "--tls_client_ca=" + Path("other.pem")}))
      << server.log_text();
}

}  // namespace
}  // namespace posenc
