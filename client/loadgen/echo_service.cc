#include "echo_service.h"

#include <algorithm>
#include <initializer_list>

#include "absl/strings/str_cat.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"

namespace posenc::loadgen {
namespace {

// The callback API owns the request until Finish; moving its buffers out
// mirrors what posenc's engine does, so both move the same bytes.
template <typename T>
T* Mutable(const T* r) {
  return const_cast<T*>(r);
}

class EchoStream final : public grpc::ServerBidiReactor<v1::RopeRequest, v1::RopeResponse> {
 public:
  EchoStream() { StartRead(&request_); }
  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    response_.Clear();
    EchoRope(&request_, &response_);
    StartWrite(&response_);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "write failed"));
      return;
    }
    StartRead(&request_);
  }
  void OnDone() override { delete this; }

 private:
  v1::RopeRequest request_;
  v1::RopeResponse response_;
};

// Bytes of a built answer: dtype size times the dimensions, or an error
// when a dimension is negative or the total passes what a message can hold.
grpc::Status AnswerBytes(v1::DataType dtype, std::initializer_list<int64_t> dims, int64_t* bytes) {
  int64_t n = dtype == v1::DATA_TYPE_FLOAT32 || dtype == v1::DATA_TYPE_UNSPECIFIED ? 4 : 2;
  for (int64_t d : dims) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n) || n > (int64_t{1} << 30)) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "echo: answer too large");
    }
  }
  *bytes = n;
  return grpc::Status::OK;
}

}  // namespace

void EchoRope(v1::RopeRequest* req, v1::RopeResponse* resp) {
  *resp->mutable_query() = req->query();
  resp->mutable_query_data()->swap(*req->mutable_query_data());
  if (req->has_key()) {
    *resp->mutable_key() = req->key();
    resp->mutable_key_data()->swap(*req->mutable_key_data());
  }
  resp->set_request_id(req->request_id());
  resp->set_backend("echo");
}

grpc::ServerUnaryReactor* EchoService::ApplyRope(grpc::CallbackServerContext* ctx,
                                                 const v1::RopeRequest* req,
                                                 v1::RopeResponse* resp) {
  EchoRope(Mutable(req), resp);
  auto* r = ctx->DefaultReactor();
  r->Finish(grpc::Status::OK);
  return r;
}

grpc::ServerBidiReactor<v1::RopeRequest, v1::RopeResponse>* EchoService::StreamRope(
    grpc::CallbackServerContext*) {
  return new EchoStream();
}

grpc::ServerUnaryReactor* EchoService::AddAbsoluteEncoding(grpc::CallbackServerContext* ctx,
                                                           const v1::AbsoluteEncodingRequest* req,
                                                           v1::AbsoluteEncodingResponse* resp) {
  *resp->mutable_y() = req->x();
  resp->mutable_y_data()->swap(*Mutable(req)->mutable_x_data());
  resp->set_backend("echo");
  auto* r = ctx->DefaultReactor();
  r->Finish(grpc::Status::OK);
  return r;
}

grpc::ServerUnaryReactor* EchoService::GetEncodingTable(grpc::CallbackServerContext* ctx,
                                                        const v1::EncodingTableRequest* req,
                                                        v1::EncodingTableResponse* resp) {
  const int64_t rows = req->has_positions()
                           ? req->positions().data().size() /
                                 (req->positions().dtype() == v1::DATA_TYPE_INT32 ? 4 : 8)
                           : req->count();
  int64_t bytes = 0;
  grpc::Status s = AnswerBytes(req->dtype(), {rows, req->dim()}, &bytes);
  if (s.ok()) {
    resp->mutable_table()->set_dtype(req->dtype());
    resp->mutable_table()->add_shape(rows);
    resp->mutable_table()->add_shape(req->dim());
    resp->mutable_table_data()->assign(bytes, '\0');
    resp->set_backend("echo");
  }
  auto* r = ctx->DefaultReactor();
  r->Finish(s);
  return r;
}

grpc::ServerUnaryReactor* EchoService::AttentionBias(grpc::CallbackServerContext* ctx,
                                                     const v1::AttentionBiasRequest* req,
                                                     v1::AttentionBiasResponse* resp) {
  grpc::Status s;
  if (req->has_logits()) {
    *resp->mutable_bias() = req->logits();
    resp->mutable_bias_data()->swap(*Mutable(req)->mutable_logits_data());
  } else {
    int64_t bytes = 0;
    const int64_t batch = std::max<int64_t>(req->batch(), 1);
    s = AnswerBytes(req->dtype(), {batch, req->num_heads(), req->q_len(), req->k_len()}, &bytes);
    if (s.ok()) {
      resp->mutable_bias()->set_dtype(req->dtype());
      for (int64_t d : {batch, req->num_heads(), req->q_len(), req->k_len()}) {
        resp->mutable_bias()->add_shape(d);
      }
      resp->mutable_bias_data()->assign(bytes, '\0');
    }
  }
  resp->set_backend("echo");
  auto* r = ctx->DefaultReactor();
  r->Finish(s);
  return r;
}

absl::StatusOr<EchoServer> StartEchoServer(const std::string& address) {
  EchoServer e;
  e.service = std::make_unique<EchoService>();
  // The health service posenc-server runs, so the client's health checking
  // (ClientOptions::health_check_service) costs the baseline the same.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &e.port);
  builder.SetMaxReceiveMessageSize(1 << 30);
  builder.SetMaxSendMessageSize(1 << 30);
  builder.RegisterService(e.service.get());
  e.server = builder.BuildAndStart();
  if (e.server == nullptr || e.port == 0) {
    return absl::UnavailableError(absl::StrCat("echo server cannot listen on ", address));
  }
  e.server->GetHealthCheckService()->SetServingStatus("posenc.v1.PositionalEncoding", true);
  return e;
}

}  // namespace posenc::loadgen
