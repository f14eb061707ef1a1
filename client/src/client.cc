#include "posenc/client.h"

#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace posenc {
namespace {

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

// gRPC's built-in retry policy: transparent retries of UNAVAILABLE with
// exponential backoff, for every method of the service.
std::string ServiceConfig(const ClientOptions& o) {
  return absl::StrFormat(
      R"({"loadBalancingConfig":[{"%s":{}}],)"
      R"("methodConfig":[{"name":[{"service":"posenc.v1.PositionalEncoding"}],)"
      R"("retryPolicy":{"maxAttempts":%d,"initialBackoff":"%.3fs","maxBackoff":"%.3fs",)"
      R"("backoffMultiplier":2,"retryableStatusCodes":["UNAVAILABLE"]}}]})",
      o.load_balancing, std::clamp(o.max_attempts, 2, 5), absl::ToDoubleSeconds(o.initial_backoff),
      absl::ToDoubleSeconds(o.max_backoff));
}

// Copies a response tensor back into the caller's buffer, checking that the
// server returned what was sent.
absl::Status CopyBack(absl::string_view field, const v1::TensorDesc& desc, const std::string& data,
                      MutableTensor& out) {
  if (data.size() != out.nbytes ||
      !std::equal(desc.shape().begin(), desc.shape().end(), out.shape.begin(), out.shape.end())) {
    return absl::InternalError(
        absl::StrCat("server returned ", field, " of ", data.size(), " bytes, shape ",
                     ShapeString(std::vector<int64_t>(desc.shape().begin(), desc.shape().end())),
                     "; expected ", out.nbytes, " bytes, shape ", ShapeString(out.shape)));
  }
  if (!data.empty()) std::memcpy(out.data, data.data(), data.size());
  return absl::OkStatus();
}

}  // namespace

void SetTensor(const TensorView& t, v1::TensorDesc* desc, std::string* data) {
  desc->set_dtype(static_cast<v1::DataType>(static_cast<int>(t.dtype)));
  desc->clear_shape();
  for (int64_t s : t.shape) desc->add_shape(s);
  data->assign(static_cast<const char*>(t.data), t.nbytes);
}

void SetTensor(const TensorView& t, v1::Tensor* tensor) {
  tensor->set_dtype(static_cast<v1::DataType>(static_cast<int>(t.dtype)));
  tensor->clear_shape();
  for (int64_t s : t.shape) tensor->add_shape(s);
  tensor->set_data(static_cast<const char*>(t.data), t.nbytes);
}

absl::StatusOr<std::unique_ptr<Client>> Client::Create(const ClientOptions& options) {
  std::unique_ptr<Client> c(new Client());
  c->options_ = options;
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (options.use_tls) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.root_certs_pem;
    ssl.pem_cert_chain = options.client_cert_pem;
    ssl.pem_private_key = options.client_key_pem;
    creds = grpc::SslCredentials(ssl);
  } else {
    creds = grpc::InsecureChannelCredentials();
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  args.SetServiceConfigJSON(ServiceConfig(options));
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 1);
  // Retries buffer the request; allow it for tensor-sized messages.
  args.SetInt(GRPC_ARG_PER_RPC_RETRY_BUFFER_SIZE, options.max_message_bytes);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
  if (!options.tls_server_name.empty()) {
    args.SetSslTargetNameOverride(options.tls_server_name);
  }
  c->channel_ = grpc::CreateCustomChannel(options.target, creds, args);
  c->stub_ = v1::PositionalEncoding::NewStub(c->channel_);
  return c;
}

void Client::Prepare(grpc::ClientContext* ctx, const CallOptions& call) const {
  const absl::Duration t =
      call.timeout > absl::ZeroDuration() ? call.timeout : options_.default_timeout;
  ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(t));
}

namespace {

// State of one asynchronous call; lives until its callback runs.
template <typename Request, typename Response>
struct AsyncCall {
  grpc::ClientContext ctx;
  Request request;
  Response response;
  std::promise<absl::Status> done;
};

}  // namespace

std::future<absl::Status> Client::ApplyRopeAsync(const v1::RopeRequest& request,
                                                 MutableTensor query, MutableTensor key,
                                                 const CallOptions& call) {
  auto state = std::make_shared<AsyncCall<v1::RopeRequest, v1::RopeResponse>>();
  state->request = request;
  SetTensor(query.view(), state->request.mutable_query(), state->request.mutable_query_data());
  if (key.present())
    SetTensor(key.view(), state->request.mutable_key(), state->request.mutable_key_data());
  Prepare(&state->ctx, call);
  std::future<absl::Status> f = state->done.get_future();
  stub_->async()->ApplyRope(
      &state->ctx, &state->request, &state->response, [state, query, key](grpc::Status s) mutable {
        absl::Status st = FromGrpc(s);
        if (st.ok())
          st = CopyBack("query", state->response.query(), state->response.query_data(), query);
        if (st.ok() && key.present()) {
          st = CopyBack("key", state->response.key(), state->response.key_data(), key);
        }
        state->done.set_value(st);
      });
  return f;
}

// The synchronous calls block on gRPC's own synchronous path rather than
// waiting on the asynchronous one: no hop to a callback thread, and nothing
// of the call still running on a gRPC thread once they return (which raced
// with process exit: a double free inside gRPC's completion queue, seen
// under AddressSanitizer).
absl::Status Client::ApplyRope(const v1::RopeRequest& request, MutableTensor query,
                               MutableTensor key, const CallOptions& call) {
  v1::RopeRequest req = request;
  SetTensor(query.view(), req.mutable_query(), req.mutable_query_data());
  if (key.present()) SetTensor(key.view(), req.mutable_key(), req.mutable_key_data());
  grpc::ClientContext ctx;
  Prepare(&ctx, call);
  v1::RopeResponse resp;
  absl::Status st = FromGrpc(stub_->ApplyRope(&ctx, req, &resp));
  if (st.ok()) st = CopyBack("query", resp.query(), resp.query_data(), query);
  if (st.ok() && key.present()) st = CopyBack("key", resp.key(), resp.key_data(), key);
  return st;
}

std::future<absl::Status> Client::AddAbsoluteEncodingAsync(
    const v1::AbsoluteEncodingRequest& request, MutableTensor x, const CallOptions& call) {
  auto state =
      std::make_shared<AsyncCall<v1::AbsoluteEncodingRequest, v1::AbsoluteEncodingResponse>>();
  state->request = request;
  SetTensor(x.view(), state->request.mutable_x(), state->request.mutable_x_data());
  Prepare(&state->ctx, call);
  std::future<absl::Status> f = state->done.get_future();
  stub_->async()->AddAbsoluteEncoding(
      &state->ctx, &state->request, &state->response, [state, x](grpc::Status s) mutable {
        absl::Status st = FromGrpc(s);
        if (st.ok()) st = CopyBack("y", state->response.y(), state->response.y_data(), x);
        state->done.set_value(st);
      });
  return f;
}

absl::Status Client::AddAbsoluteEncoding(const v1::AbsoluteEncodingRequest& request,
                                         MutableTensor x, const CallOptions& call) {
  v1::AbsoluteEncodingRequest req = request;
  SetTensor(x.view(), req.mutable_x(), req.mutable_x_data());
  grpc::ClientContext ctx;
  Prepare(&ctx, call);
  v1::AbsoluteEncodingResponse resp;
  absl::Status st = FromGrpc(stub_->AddAbsoluteEncoding(&ctx, req, &resp));
  if (st.ok()) st = CopyBack("y", resp.y(), resp.y_data(), x);
  return st;
}

absl::Status Client::ApplyAttentionBias(const v1::AttentionBiasRequest& request,
                                        MutableTensor logits, std::vector<double>* slopes,
                                        const CallOptions& call) {
  v1::AttentionBiasRequest req = request;
  SetTensor(logits.view(), req.mutable_logits(), req.mutable_logits_data());
  grpc::ClientContext ctx;
  Prepare(&ctx, call);
  v1::AttentionBiasResponse resp;
  absl::Status st = FromGrpc(stub_->AttentionBias(&ctx, req, &resp));
  if (st.ok()) st = CopyBack("bias", resp.bias(), resp.bias_data(), logits);
  if (st.ok() && slopes != nullptr) slopes->assign(resp.slopes().begin(), resp.slopes().end());
  return st;
}

#define POSENC_UNARY(Method, Request, Response, request_expr)           \
  grpc::ClientContext ctx;                                              \
  Prepare(&ctx, call);                                                  \
  Response resp;                                                        \
  absl::Status st = FromGrpc(stub_->Method(&ctx, request_expr, &resp)); \
  if (!st.ok()) return st;                                              \
  return resp

absl::StatusOr<v1::AttentionBiasResponse> Client::AttentionBias(
    const v1::AttentionBiasRequest& request, const CallOptions& call) {
  POSENC_UNARY(AttentionBias, v1::AttentionBiasRequest, v1::AttentionBiasResponse, request);
}

absl::StatusOr<v1::EncodingTableResponse> Client::GetEncodingTable(
    const v1::EncodingTableRequest& request, const CallOptions& call) {
  POSENC_UNARY(GetEncodingTable, v1::EncodingTableRequest, v1::EncodingTableResponse, request);
}

absl::StatusOr<v1::ListTablesResponse> Client::ListTables(const CallOptions& call) {
  POSENC_UNARY(ListTables, v1::ListTablesRequest, v1::ListTablesResponse, v1::ListTablesRequest());
}

absl::StatusOr<v1::ListTablesResponse> Client::ReloadTables(const CallOptions& call) {
  POSENC_UNARY(ReloadTables, v1::ReloadTablesRequest, v1::ListTablesResponse,
               v1::ReloadTablesRequest());
}

absl::StatusOr<v1::ServerInfo> Client::GetServerInfo(const CallOptions& call) {
  POSENC_UNARY(GetServerInfo, v1::GetServerInfoRequest, v1::ServerInfo, v1::GetServerInfoRequest());
}

#undef POSENC_UNARY

namespace {

class RopeStreamImpl final : public Client::RopeStream {
 public:
  RopeStreamImpl(v1::PositionalEncoding::Stub& stub, std::unique_ptr<grpc::ClientContext> ctx)
      : ctx_(std::move(ctx)), stream_(stub.StreamRope(ctx_.get())) {}
  bool Write(const v1::RopeRequest& r) override { return stream_->Write(r); }
  bool Read(v1::RopeResponse* r) override { return stream_->Read(r); }
  absl::Status Finish() override {
    stream_->WritesDone();
    v1::RopeResponse drain;
    while (stream_->Read(&drain)) {
    }
    return FromGrpc(stream_->Finish());
  }

 private:
  std::unique_ptr<grpc::ClientContext> ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::RopeRequest, v1::RopeResponse>> stream_;
};

}  // namespace

std::unique_ptr<Client::RopeStream> Client::StreamRope(const CallOptions& call) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  Prepare(ctx.get(), call);
  return std::make_unique<RopeStreamImpl>(*stub_, std::move(ctx));
}

}  // namespace posenc
