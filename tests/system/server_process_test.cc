// The real posenc-server binary in its own process, as Kubernetes runs it:
// health and reflection answer on its port, and SIGTERM exits 0.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "google/protobuf/descriptor.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "posenc/client.h"
#include "runner.h"
#include "workload.h"

namespace {

// Resident-set peak (VmHWM) of a process, in bytes.
int64_t PeakRss(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

// CPU seconds (user + system) a process has used.
double CpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), {});
  std::istringstream fields(stat.substr(stat.rfind(')') + 2));
  std::string f;
  long long utime = 0, stime = 0;
  for (int i = 3; fields >> f; ++i) {
    if (i == 14) utime = std::stoll(f);
    if (i == 15) {
      stime = std::stoll(f);
      break;
    }
  }
  return static_cast<double>(utime + stime) / sysconf(_SC_CLK_TCK);
}

class ServerProcess : public ::testing::Test {
 protected:
  // Extra server flags for a test, set before SetUp runs.
  virtual std::vector<std::string> ExtraFlags() const { return {}; }

  void SetUp() override {
    char pattern[] = "/tmp/posenc_port_XXXXXX";
    const int fd = mkstemp(pattern);
    close(fd);
    port_file_ = pattern;
    std::remove(port_file_.c_str());
    std::vector<std::string> args = {
        POSENC_SERVER_BINARY, "--listen=127.0.0.1:0", "--port_file=" + port_file_, "--threads=1",
        "--drain_seconds=5",  "--log_level=warn",     "--metrics_listen="};
    for (const std::string& f : ExtraFlags()) args.push_back(f);
    pid_ = fork();
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(POSENC_SERVER_BINARY, argv.data());
      _exit(127);
    }
    for (int i = 0; i < 200 && port_ == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      std::ifstream(port_file_) >> port_;
    }
    ASSERT_NE(port_, 0) << "server did not report a port";
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(port_),
                                   grpc::InsecureChannelCredentials());
  }
  // Waits up to `limit` for the server to exit; returns its wait status and
  // clears pid_ when it did.
  int WaitForExit(std::chrono::seconds limit) {
    int status = 0;
    const auto end = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < end) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return status;
  }

  void TearDown() override {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    std::remove(port_file_.c_str());
  }

  pid_t pid_ = -1;
  int port_ = 0;
  std::string port_file_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(ServerProcess, HealthReflectionAndGracefulExit) {
  auto health = grpc::health::v1::Health::NewStub(channel_);
  grpc::health::v1::HealthCheckRequest hreq;
  grpc::health::v1::HealthCheckResponse hresp;
  grpc::ClientContext hctx;
  hctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  ASSERT_TRUE(health->Check(&hctx, hreq, &hresp).ok());
  EXPECT_EQ(hresp.status(), grpc::health::v1::HealthCheckResponse::SERVING);

  namespace refl = grpc::reflection::v1alpha;
  auto reflection = refl::ServerReflection::NewStub(channel_);
  grpc::ClientContext rctx;
  auto stream = reflection->ServerReflectionInfo(&rctx);
  refl::ServerReflectionRequest list;
  list.set_list_services("*");
  ASSERT_TRUE(stream->Write(list));
  refl::ServerReflectionResponse resp;
  ASSERT_TRUE(stream->Read(&resp));
  std::vector<std::string> services;
  for (const auto& s : resp.list_services_response().service()) services.push_back(s.name());
  EXPECT_NE(std::find(services.begin(), services.end(), "posenc.v1.PositionalEncoding"),
            services.end());
  EXPECT_NE(std::find(services.begin(), services.end(), "grpc.health.v1.Health"), services.end());

  refl::ServerReflectionRequest symbol;
  symbol.set_file_containing_symbol("posenc.v1.RopeRequest");
  ASSERT_TRUE(stream->Write(symbol));
  ASSERT_TRUE(stream->Read(&resp));
  ASSERT_GE(resp.file_descriptor_response().file_descriptor_proto_size(), 1);
  google::protobuf::FileDescriptorProto file;
  ASSERT_TRUE(file.ParseFromString(resp.file_descriptor_response().file_descriptor_proto(0)));
  EXPECT_EQ(file.package(), "posenc.v1");

  // The listed health service must be describable too, or grpcurl (which
  // learns methods by reflection) cannot call it.
  symbol.set_file_containing_symbol("grpc.health.v1.Health");
  ASSERT_TRUE(stream->Write(symbol));
  ASSERT_TRUE(stream->Read(&resp));
  ASSERT_GE(resp.file_descriptor_response().file_descriptor_proto_size(), 1)
      << resp.error_response().error_message();
  bool described = false;
  for (const std::string& bytes : resp.file_descriptor_response().file_descriptor_proto()) {
    ASSERT_TRUE(file.ParseFromString(bytes));
    for (const auto& service : file.service()) {
      described |= file.package() == "grpc.health.v1" && service.name() == "Health";
    }
  }
  EXPECT_TRUE(described) << "reflection has no descriptor for grpc.health.v1.Health";
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());

  ASSERT_EQ(kill(pid_, SIGTERM), 0);
  const int status = WaitForExit(std::chrono::seconds(10));
  ASSERT_EQ(pid_, -1) << "server did not exit within 10 s of SIGTERM";
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// SIGTERM under load: calls the server accepted complete; calls arriving
// during the drain are refused with UNAVAILABLE (retryable elsewhere);
// nothing is cancelled or lost, and the process exits 0.
TEST_F(ServerProcess, LoadAcrossSigtermLosesNoAcceptedCall) {
  posenc::ClientOptions o;
  o.target = "127.0.0.1:" + std::to_string(port_);
  o.max_attempts = 2;
  o.initial_backoff = absl::Milliseconds(20);
  auto client = posenc::Client::Create(o);
  ASSERT_TRUE(client.ok());
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::map<absl::StatusCode, int> codes;
  std::map<absl::StatusCode, std::string> messages;
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      std::vector<float> q(256 * 8 * 128, 0.25f);
      while (!stop) {
        posenc::RopeTensors t;
        t.query = posenc::MutableTensor{
            posenc::DType::kFloat32, {1, 256, 8, 128}, q.data(), q.size() * 4};
        absl::Status s = (*client)->ApplyRope({}, t);
        std::lock_guard<std::mutex> lock(mu);
        ++codes[s.code()];
        messages[s.code()] = std::string(s.message());
        if (s.code() == absl::StatusCode::kUnavailable) return;  // drained: go elsewhere
      }
    });
  }
  // SIGTERM once calls are being answered (not after a fixed time, which a
  // loaded machine may spend connecting).
  const auto answered = [&] {
    std::lock_guard<std::mutex> lock(mu);
    return codes[absl::StatusCode::kOk];
  };
  for (const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
       answered() == 0 && std::chrono::steady_clock::now() < end;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(kill(pid_, SIGTERM), 0);
  const int status = WaitForExit(std::chrono::seconds(10));
  stop = true;
  for (auto& t : callers) t.join();
  ASSERT_EQ(pid_, -1) << "server did not exit within 10 s of SIGTERM";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_GT(codes[absl::StatusCode::kOk], 0);
  for (const auto& [code, n] : codes) {
    EXPECT_TRUE(code == absl::StatusCode::kOk || code == absl::StatusCode::kUnavailable)
        << n << " calls ended " << absl::StatusCodeToString(code) << ": " << messages[code];
  }
}

class OverloadedServer : public ServerProcess {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    return {"--max_inflight=2", "--max_request_bytes=33554432", "--max_inflight_bytes=134217728"};
  }
};

// Far more concurrency than the server admits: every call ends OK or
// RESOURCE_EXHAUSTED, the server keeps serving what it admitted, and its
// memory stays bounded. The requests are small and their work large (a 4M
// element sinusoidal table each), so 32 callers overrun --max_inflight=2 at
// once. A call gives its slot back when its answer is final, but the
// answer's bytes (16 MiB, and gRPC's copy) stay counted until it is sent,
// so answers still queued for slow readers are bounded by
// --max_inflight_bytes: 128 MiB of them plus the process must peak under
// 256 MiB.
TEST_F(OverloadedServer, OverloadGetsResourceExhaustedAndMemoryStaysBounded) {
  {
    auto probe = posenc::v1::PositionalEncoding::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(port_), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    posenc::v1::ServerInfo info;
    ASSERT_TRUE(probe->GetServerInfo(&ctx, posenc::v1::GetServerInfoRequest(), &info).ok());
    ASSERT_EQ(info.limits().max_inflight_requests(), 2);
  }
  posenc::v1::EncodingTableRequest req;
  req.mutable_sinusoidal()->set_base(10000);
  req.set_dim(2048);
  req.set_count(2048);
  std::mutex mu;
  std::map<grpc::StatusCode, int> codes;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  std::vector<std::thread> callers;
  for (int c = 0; c < 32; ++c) {
    callers.emplace_back([&, c] {
      // Each caller is its own client with its own connection (a distinct
      // channel argument stops gRPC from sharing one).
      grpc::ChannelArguments args;
      args.SetMaxReceiveMessageSize(-1);
      args.SetInt("posenc.test.caller", c);
      auto stub = posenc::v1::PositionalEncoding::NewStub(grpc::CreateCustomChannel(
          "127.0.0.1:" + std::to_string(port_), grpc::InsecureChannelCredentials(), args));
      while (std::chrono::steady_clock::now() < end) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
        // 32 connections opening at once can see a refused connect; wait for
        // the channel instead of failing fast, so only the server's answers
        // are counted.
        ctx.set_wait_for_ready(true);
        posenc::v1::EncodingTableResponse resp;
        const grpc::StatusCode code = stub->GetEncodingTable(&ctx, req, &resp).error_code();
        std::lock_guard<std::mutex> lock(mu);
        ++codes[code];
      }
    });
  }
  for (auto& t : callers) t.join();
  const int64_t peak = PeakRss(pid_);
  std::printf("overload: %d OK, %d RESOURCE_EXHAUSTED, server peak RSS %.1f MiB\n",
              codes[grpc::StatusCode::OK], codes[grpc::StatusCode::RESOURCE_EXHAUSTED],
              peak / 1048576.0);
  EXPECT_GT(codes[grpc::StatusCode::OK], 0) << "the server must keep serving what it admitted";
  EXPECT_GT(codes[grpc::StatusCode::RESOURCE_EXHAUSTED], 0)
      << "32 callers against --max_inflight=2";
  for (const auto& [code, n] : codes) {
    EXPECT_TRUE(code == grpc::StatusCode::OK || code == grpc::StatusCode::RESOURCE_EXHAUSTED)
        << n << " calls ended with code " << code;
  }
  EXPECT_GT(peak, 0);
#ifndef POSENC_UNDER_SANITIZER  // shadow memory and quarantine are not ours
  EXPECT_LT(peak, int64_t{256} << 20);
#endif
}

// A call whose deadline passes stops consuming CPU: ten calls, each cut off
// after 20 ms, must cost far less server CPU than ten complete ones.
class LargeAnswers : public ServerProcess {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    return {"--max_request_bytes=" + std::to_string(256 << 20)};
  }
};

TEST_F(LargeAnswers, DeadlineStopsTheWork) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);  // the full answer is 240 MiB
  auto channel = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port_),
                                           grpc::InsecureChannelCredentials(), args);
  auto stub = posenc::v1::PositionalEncoding::NewStub(channel);
  posenc::v1::EncodingTableRequest req;
  req.mutable_sinusoidal()->set_base(10000);
  req.set_dim(1024);
  req.set_count(60000);  // 61M sines and cosines: hundreds of ms on one thread
  auto call = [&](std::chrono::milliseconds deadline) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + deadline);
    posenc::v1::EncodingTableResponse resp;
    return stub->GetEncodingTable(&ctx, req, &resp).error_code();
  };
  const double before_full = CpuSeconds(pid_);
  ASSERT_EQ(call(std::chrono::milliseconds(60000)), grpc::StatusCode::OK);
  const double full = CpuSeconds(pid_) - before_full;
  const double before_cut = CpuSeconds(pid_);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(call(std::chrono::milliseconds(20)), grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let cut-off work end
  const double cut = CpuSeconds(pid_) - before_cut;
  std::printf("deadline: one full call %.3f CPU s; ten 20 ms calls %.3f CPU s\n", full, cut);
  EXPECT_GT(full, 0.1) << "the full call must be long enough to cut";
  EXPECT_LT(cut, 0.3 * 10 * full);
}

}  // namespace
