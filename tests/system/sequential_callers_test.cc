// The real posenc-server at --max_inflight=1: a caller that waits for each
// answer before sending the next call holds at most one call at a time, so
// it must never be refused. Before a call's slot was given back at its
// answer (AdmissionControl::Ticket::ReleaseSlot), the slot stayed until gRPC
// ran the call's OnDone on its own threads, a moment after the caller had
// its answer, and a sequential caller was refused RESOURCE_EXHAUSTED as
// early as its second call.
#include <cstring>
#include <string>

#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "kserve/grpc_service.grpc.pb.h"
#include "posenc/v1/posenc.grpc.pb.h"
#include "server_process.h"

namespace posenc {
namespace {

constexpr int kCalls = 300;

v1::RopeRequest SmallRope(int i) {
  v1::RopeRequest r;
  r.set_request_id("seq-" + std::to_string(i));
  r.mutable_query()->set_dtype(v1::DATA_TYPE_FLOAT32);
  for (int64_t d : {1, 4, 2, 8}) r.mutable_query()->add_shape(d);
  r.set_query_data(std::string(4 * 2 * 8 * 4, '\0'));
  return r;
}

inference::ModelInferRequest SmallInfer() {
  inference::ModelInferRequest r;
  r.set_model_name("rope");
  auto* in = r.add_inputs();
  in->set_name("query");
  in->set_datatype("FP32");
  for (int64_t d : {1, 4, 2, 8}) in->add_shape(d);
  r.add_raw_input_contents(std::string(4 * 2 * 8 * 4, '\0'));
  return r;
}

class SequentialCallers : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(server_.Start(POSENC_SERVER_BINARY, {"--max_inflight=1", "--admission_wait_ms=0"}))
        << server_.log_text();
  }
  testing::ServerProcess server_;
};

TEST_F(SequentialCallers, UnaryCallsOneAfterAnotherAreNeverRefused) {
  auto stub = v1::PositionalEncoding::NewStub(server_.channel());
  int refused = 0;
  for (int i = 0; i < kCalls; ++i) {
    grpc::ClientContext ctx;
    v1::RopeResponse resp;
    const grpc::Status s = stub->ApplyRope(&ctx, SmallRope(i), &resp);
    if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) ++refused;
    ASSERT_TRUE(s.ok() || s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED)
        << "call " << i << ": " << s.error_message();
  }
  EXPECT_EQ(refused, 0) << "of " << kCalls << " sequential ApplyRope calls at --max_inflight=1";
}

TEST_F(SequentialCallers, KServeInferOneAfterAnotherIsNeverRefused) {
  auto stub = inference::GRPCInferenceService::NewStub(server_.channel());
  const inference::ModelInferRequest req = SmallInfer();
  int refused = 0;
  for (int i = 0; i < kCalls; ++i) {
    grpc::ClientContext ctx;
    inference::ModelInferResponse resp;
    const grpc::Status s = stub->ModelInfer(&ctx, req, &resp);
    if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) ++refused;
    ASSERT_TRUE(s.ok() || s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED)
        << "call " << i << ": " << s.error_message();
  }
  EXPECT_EQ(refused, 0) << "of " << kCalls << " sequential ModelInfer calls at --max_inflight=1";
}

// A stream holds its slot for its life; once its status is back, the next
// stream (or call) gets the slot.
TEST_F(SequentialCallers, StreamsOneAfterAnotherAreNeverRefused) {
  auto stub = v1::PositionalEncoding::NewStub(server_.channel());
  int refused = 0;
  for (int i = 0; i < kCalls / 3; ++i) {
    grpc::ClientContext ctx;
    auto stream = stub->StreamRope(&ctx);
    ASSERT_TRUE(stream->Write(SmallRope(i)));
    stream->WritesDone();
    v1::RopeResponse resp;
    const bool answered = stream->Read(&resp);
    const grpc::Status s = stream->Finish();
    if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++refused;
      continue;
    }
    ASSERT_TRUE(s.ok()) << "stream " << i << ": " << s.error_message();
    ASSERT_TRUE(answered);
    EXPECT_EQ(resp.error_code(), 0) << resp.error_message();
  }
  EXPECT_EQ(refused, 0) << "of " << kCalls / 3 << " sequential streams at --max_inflight=1";
}

}  // namespace
}  // namespace posenc
