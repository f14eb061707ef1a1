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
#include <string>
#include <thread>

#include "google/protobuf/descriptor.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "posenc/client.h"

namespace {

class ServerProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/posenc_port_XXXXXX";
    const int fd = mkstemp(pattern);
    close(fd);
    port_file_ = pattern;
    std::remove(port_file_.c_str());
    pid_ = fork();
    if (pid_ == 0) {
      const std::string port_flag = "--port_file=" + port_file_;
      execl(POSENC_SERVER_BINARY, POSENC_SERVER_BINARY, "--listen=127.0.0.1:0", port_flag.c_str(),
            "--threads=1", "--drain_seconds=5", "--log_level=warn",
            "--metrics_listen=", static_cast<char*>(nullptr));
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
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());

  ASSERT_EQ(kill(pid_, SIGTERM), 0);
  int status = 0;
  for (int i = 0; i < 200; ++i) {
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
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
        absl::Status s = (*client)->ApplyRope(
            posenc::v1::RopeRequest(),
            posenc::MutableTensor{
                posenc::DType::kFloat32, {1, 256, 8, 128}, q.data(), q.size() * 4},
            {});
        std::lock_guard<std::mutex> lock(mu);
        ++codes[s.code()];
        messages[s.code()] = std::string(s.message());
        if (s.code() == absl::StatusCode::kUnavailable) return;  // drained: go elsewhere
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  ASSERT_EQ(kill(pid_, SIGTERM), 0);
  int status = 0;
  for (int i = 0; i < 200; ++i) {
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
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

}  // namespace
