// The server's keepalive (--keepalive_time_ms, --keepalive_timeout_ms) over
// real sockets, through a relay that can go silent (tests/support/tcp_relay.h):
// a caller whose machine vanishes mid-stream sends no FIN, so without pings
// its stream holds an admission slot (--max_inflight) until TCP gives up,
// hours later; with them the server closes the connection and the slot is
// free again. A live caller's idle stream survives the pings.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "eventually.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "posenc/v1/posenc.grpc.pb.h"
#include "posenc/wire/requests.h"
#include "posenc/wire/tensors.h"
#include "server.h"
#include "tcp_relay.h"
#include "test_tensors.h"

namespace posenc {
namespace {

using Clock = std::chrono::steady_clock;
using testing::Eventually;

std::unique_ptr<server::Server> StartServer(int keepalive_time_ms, int keepalive_timeout_ms) {
  server::ServerOptions o;
  o.listen_address = "127.0.0.1:0";
  o.request_threads = 2;
  o.keepalive_time_ms = keepalive_time_ms;
  o.keepalive_timeout_ms = keepalive_timeout_ms;
  o.engine.cpu_threads = 1;
  o.engine.enable_cuda = false;
  auto s = server::Server::Start(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

// A channel of its own to 127.0.0.1:port that sends no keepalive pings of
// its own, so that only the server's pings are on the wire.
std::unique_ptr<v1::PositionalEncoding::Stub> StubTo(int port) {
  return v1::PositionalEncoding::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
}

v1::RopeRequest SmallRope(const std::string& id) {
  RopeOptions o;
  o.style = RopeStyle::kNeox;
  o.base = 10000;
  v1::RopeRequest r;
  wire::SetRopeOptions(o, &r);
  r.set_request_id(id);
  const testing::Bytes q = testing::RandomTensor(DType::kFloat32, 4 * 2 * 64);
  wire::SetTensor(TensorView{DType::kFloat32, {1, 4, 2, 64}, q.data(), q.size()}, r.mutable_query(),
                  r.mutable_query_data());
  return r;
}

// A stream through the relay, one message answered, so the call is admitted
// and idle: what a model server's open stream between requests looks like.
// An idle stream holds one slot (its read ahead gives its own back).
struct OpenStream {
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<v1::RopeRequest, v1::RopeResponse>> stream;
};
void Open(v1::PositionalEncoding::Stub& stub, server::Server& server, OpenStream* s) {
  s->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  s->stream = stub.StreamRope(&s->ctx);
  ASSERT_TRUE(s->stream->Write(SmallRope("first")));
  v1::RopeResponse resp;
  ASSERT_TRUE(s->stream->Read(&resp));
  EXPECT_EQ(resp.request_id(), "first");
  EXPECT_EQ(resp.error_code(), 0) << resp.error_message();
  auto& admission = server.engine().admission();
  ASSERT_TRUE(Eventually([&] { return admission.calls() == 1; }, std::chrono::seconds(2)))
      << admission.calls() << " slots held by an idle stream";
}

// Pings every 200 ms, a ping unanswered for 200 ms closes the connection.
// The stream is idle for 2 s first (ten pings: pings that stopped on an
// idle stream would show here), then its caller goes silent: its admission
// slot is free again within a second or two, not hours.
TEST(KeepAlive, ASilentCallersStreamIsReleased) {
  auto server = StartServer(200, 200);
  ASSERT_NE(server, nullptr);
  auto& admission = server->engine().admission();
  testing::TcpRelay relay(server->port());
  auto stub = StubTo(relay.port());
  OpenStream s;
  ASSERT_NO_FATAL_FAILURE(Open(*stub, *server, &s));
  std::this_thread::sleep_for(std::chrono::seconds(2));
  EXPECT_EQ(admission.calls(), 1) << "a live caller's idle stream was closed";
  relay.Freeze();
  const auto frozen = Clock::now();
  EXPECT_TRUE(Eventually([&] { return admission.calls() == 0; }, std::chrono::seconds(5)))
      << "the silent caller's stream still holds its slot";
  std::printf("released %.2f s after the caller went silent\n",
              std::chrono::duration<double>(Clock::now() - frozen).count());
  s.ctx.TryCancel();
}

// The same caller with --keepalive_time_ms=0 (gRPC's own 2 hours): its
// stream stays admitted while it is silent (the hazard the pings remove; 3 s
// here stand for hours).
TEST(KeepAlive, WithoutPingsASilentCallersStreamStaysAdmitted) {
  auto server = StartServer(0, 200);
  ASSERT_NE(server, nullptr);
  auto& admission = server->engine().admission();
  {
    testing::TcpRelay relay(server->port());
    auto stub = StubTo(relay.port());
    OpenStream s;
    ASSERT_NO_FATAL_FAILURE(Open(*stub, *server, &s));
    relay.Freeze();
    std::this_thread::sleep_for(std::chrono::seconds(3));
    EXPECT_EQ(admission.calls(), 1);
    s.ctx.TryCancel();
  }  // the relay closes its sockets: now the server sees the caller go
  EXPECT_TRUE(Eventually([&] { return admission.calls() == 0; }, std::chrono::seconds(5)));
}

// A live caller's stream, idle for 2 s of pings every 100 ms (twenty, each
// answered by the caller's gRPC), still answers its next message.
TEST(KeepAlive, ALiveCallersIdleStreamGoesOn) {
  auto server = StartServer(100, 1000);
  ASSERT_NE(server, nullptr);
  testing::TcpRelay relay(server->port());
  auto stub = StubTo(relay.port());
  OpenStream s;
  ASSERT_NO_FATAL_FAILURE(Open(*stub, *server, &s));
  std::this_thread::sleep_for(std::chrono::seconds(2));
  ASSERT_TRUE(s.stream->Write(SmallRope("after-idle")));
  v1::RopeResponse resp;
  ASSERT_TRUE(s.stream->Read(&resp));
  EXPECT_EQ(resp.request_id(), "after-idle");
  EXPECT_EQ(resp.error_code(), 0) << resp.error_message();
  s.stream->WritesDone();
  const grpc::Status st = s.stream->Finish();
  EXPECT_TRUE(st.ok()) << st.error_message();
}

}  // namespace
}  // namespace posenc
