// TLS, mutual TLS and the Prometheus endpoint of a real server, with
// certificates this test generates (openssl) and a scrape over a socket.
#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "gtest/gtest.h"
#include "posenc/client.h"
#include "server.h"
#include "server_process.h"
#include "test_tensors.h"

namespace posenc {
namespace {

std::string Read(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class Certificates : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char pattern[] = "/tmp/posenc_tls_XXXXXX";
    dir_ = new std::string(mkdtemp(pattern));
    const std::string d = *dir_;
    const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    const std::string script =
        "set -e; cd " + d + "; " + "openssl req -x509 " + key +
        " -keyout ca.key -out ca.pem -days 2 -subj /CN=posenc-test-ca; " + "openssl req " + key +
        " -keyout server.key -out server.csr -subj /CN=localhost " +
        "-addext subjectAltName=DNS:localhost,IP:127.0.0.1; " +
        "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out "
        "server.pem " +
        "-days 2 -copy_extensions copy; " + "openssl req " + key +
        " -keyout client.key -out client.csr -subj /CN=posenc-client; " +
        "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem "
        "-days 2; " +
        "openssl req -x509 " + key + " -keyout other.key -out other.pem -days 2 -subj /CN=stranger";
    ASSERT_EQ(std::system(("bash -c '" + script + "' > " + d + "/openssl.log 2>&1").c_str()), 0)
        << Read(d + "/openssl.log");
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  static std::string Pem(const std::string& name) { return Read(*dir_ + "/" + name); }

  static std::unique_ptr<server::Server> StartServer(bool mutual) {
    server::ServerOptions o;
    o.listen_address = "127.0.0.1:0";
    o.metrics_listen = "127.0.0.1:0";
    o.engine.cpu_threads = 1;
    o.tls.cert_pem = Pem("server.pem");
    o.tls.key_pem = Pem("server.key");
    if (mutual) o.tls.client_ca_pem = Pem("ca.pem");
    auto s = server::Server::Start(o);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }

  static absl::Status Call(int port, ClientOptions o) {
    o.target = "localhost:" + std::to_string(port);
    o.max_attempts = 2;
    o.default_timeout = absl::Seconds(10);
    auto client = Client::Create(o);
    if (!client.ok()) return client.status();
    return (*client)->GetServerInfo().status();
  }

  static std::string* dir_;
};
std::string* Certificates::dir_ = nullptr;

TEST_F(Certificates, TlsServesOnlyTlsClientsThatTrustIt) {
  auto server = StartServer(false);
  ASSERT_NE(server, nullptr);
  ClientOptions tls;
  tls.use_tls = true;
  tls.root_certs_pem = Pem("ca.pem");
  EXPECT_TRUE(Call(server->port(), tls).ok());

  EXPECT_FALSE(Call(server->port(), ClientOptions{}).ok()) << "plaintext client must fail";
  ClientOptions wrong_ca = tls;
  wrong_ca.root_certs_pem = Pem("other.pem");
  EXPECT_FALSE(Call(server->port(), wrong_ca).ok())
      << "a client not trusting the server's CA must fail";
}

TEST_F(Certificates, MutualTlsRequiresAClientCertificateFromTheCa) {
  auto server = StartServer(true);
  ASSERT_NE(server, nullptr);
  ClientOptions o;
  o.use_tls = true;
  o.root_certs_pem = Pem("ca.pem");
  EXPECT_FALSE(Call(server->port(), o).ok()) << "no client certificate";
  ClientOptions stranger = o;
  stranger.client_cert_pem = Pem("other.pem");
  stranger.client_key_pem = Pem("other.key");
  EXPECT_FALSE(Call(server->port(), stranger).ok()) << "certificate from another CA";
  o.client_cert_pem = Pem("client.pem");
  o.client_key_pem = Pem("client.key");
  EXPECT_TRUE(Call(server->port(), o).ok());
}

double Sample(const std::string& text, const std::string& pattern) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex(pattern + R"(\s+([0-9.e+-]+))"))) return -1;
  return std::stod(m[1]);
}

TEST_F(Certificates, MetricsCountCallsByMethodCodeAndBackend) {
  auto server = StartServer(false);
  ASSERT_NE(server, nullptr);
  ClientOptions o;
  o.use_tls = true;
  o.root_certs_pem = Pem("ca.pem");
  o.target = "localhost:" + std::to_string(server->port());
  auto client = Client::Create(o);
  ASSERT_TRUE(client.ok());
  testing::Bytes q = testing::RandomTensor(DType::kFloat32, 2 * 8 * 4 * 64);
  for (int i = 0; i < 3; ++i) {
    RopeTensors t;
    t.query = testing::Mutable(DType::kFloat32, {2, 8, 4, 64}, q);
    ASSERT_TRUE((*client)->ApplyRope({}, t).ok());
  }
  RopeOptions bad;
  bad.rotary_dim = 3;
  RopeTensors t;
  t.query = testing::Mutable(DType::kFloat32, {2, 8, 4, 64}, q);
  EXPECT_FALSE((*client)->ApplyRope(bad, t).ok());

  // A call holds its slot until gRPC is done sending the reply, a moment
  // after the client has it: wait for in-flight to return to zero.
  std::string text;
  for (const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);;) {
    text = testing::HttpGet(server->metrics_port(), "/metrics");
    if (Sample(text, R"(posenc_inflight_requests)") == 0 ||
        std::chrono::steady_clock::now() > end) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_NE(text.find("200 OK"), std::string::npos) << text.substr(0, 200);
  EXPECT_EQ(Sample(text, R"(posenc_requests_total\{code="OK",method="ApplyRope"\})"), 3) << text;
  EXPECT_EQ(Sample(text, R"(posenc_requests_total\{code="INVALID_ARGUMENT",method="ApplyRope"\})"),
            1);
  EXPECT_EQ(Sample(text, R"(posenc_request_duration_seconds_count\{method="ApplyRope"\})"), 4);
  EXPECT_EQ(Sample(text, R"(posenc_backend_requests_total\{backend="cpu"\})"), 3);
  EXPECT_GE(Sample(text, R"(posenc_bytes_total\{direction="in",method="ApplyRope"\})"),
            4.0 * q.size());
  EXPECT_EQ(Sample(text, R"(posenc_inflight_requests)"), 0);
  // An in-process server with the default budget and no cgroup limit read.
  EXPECT_EQ(Sample(text, R"(posenc_inflight_bytes_limit)"),
            static_cast<double>(server::EngineOptions{}.max_inflight_bytes));
  const double held = Sample(text, R"(posenc_inflight_bytes)");
  EXPECT_GE(held, 0);
  EXPECT_LT(held, static_cast<double>(server::EngineOptions{}.max_inflight_bytes));
  EXPECT_EQ(text.find("posenc_memory_limit_bytes"), std::string::npos);
}

}  // namespace
}  // namespace posenc
