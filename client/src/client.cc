#include "posenc/client.h"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "posenc/status_macros.h"
#include "posenc/wire/enums.h"
#include "posenc/wire/requests.h"
#include "posenc/wire/tensors.h"

namespace posenc {
namespace {

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

// gRPC's built-in retry policy: retries of UNAVAILABLE (and, when asked,
// RESOURCE_EXHAUSTED) with exponential backoff and jitter, for every method
// of the service. Under round_robin a retry goes to the next address, so an
// overloaded replica's refusal lands on another one. The server refuses
// before reading a request, so a refused call never ran.
std::string ServiceConfig(const ClientOptions& o) {
  // The name is checked in Client::Create (it cannot break out of the JSON).
  const std::string health =
      o.health_check_service.empty()
          ? ""
          : absl::StrFormat(R"("healthCheckConfig":{"serviceName":"%s"},)", o.health_check_service);
  return absl::StrFormat(
      R"({%s"loadBalancingConfig":[{"%s":{}}],)"
      R"("methodConfig":[{"name":[{"service":"posenc.v1.PositionalEncoding"}],)"
      R"("retryPolicy":{"maxAttempts":%d,"initialBackoff":"%.3fs","maxBackoff":"%.3fs",)"
      R"("backoffMultiplier":2,"retryableStatusCodes":["UNAVAILABLE"%s]}}]})",
      health, o.load_balancing, std::clamp(o.max_attempts, 2, 5),
      absl::ToDoubleSeconds(o.initial_backoff), absl::ToDoubleSeconds(o.max_backoff),
      o.retry_resource_exhausted ? R"(,"RESOURCE_EXHAUSTED")" : "");
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
  wire::SetTensor(t, desc, data);
}

void SetTensor(const TensorView& t, v1::Tensor* tensor) { wire::SetTensor(t, tensor); }

namespace {

v1::RopeRequest RopeRequestOf(const RopeOptions& options, const RopeTensors& t,
                              const CallOptions& call) {
  v1::RopeRequest r;
  wire::SetRopeOptions(options, &r);
  wire::SetTensor(t.query.view(), r.mutable_query(), r.mutable_query_data());
  if (t.key.present()) wire::SetTensor(t.key.view(), r.mutable_key(), r.mutable_key_data());
  if (t.positions.position_ids.present()) {
    wire::SetTensor(t.positions.position_ids, r.mutable_position_ids());
  }
  if (t.positions.offsets.present()) wire::SetTensor(t.positions.offsets, r.mutable_offsets());
  if (t.cu_seqlens.present()) wire::SetTensor(t.cu_seqlens, r.mutable_cu_seqlens());
  r.set_backend(wire::ToProto(call.backend));
  r.set_request_id(call.request_id);
  return r;
}

v1::AbsoluteEncodingRequest AbsoluteRequestOf(const AbsoluteOptions& options,
                                              const AbsoluteTensors& t, const CallOptions& call) {
  v1::AbsoluteEncodingRequest r;
  wire::SetAbsoluteOptions(options, &r);
  wire::SetTensor(t.x.view(), r.mutable_x(), r.mutable_x_data());
  if (t.positions.position_ids.present()) {
    wire::SetTensor(t.positions.position_ids, r.mutable_position_ids());
  }
  if (t.positions.offsets.present()) wire::SetTensor(t.positions.offsets, r.mutable_offsets());
  if (t.cu_seqlens.present()) wire::SetTensor(t.cu_seqlens, r.mutable_cu_seqlens());
  r.set_backend(wire::ToProto(call.backend));
  r.set_request_id(call.request_id);
  return r;
}

absl::StatusOr<ServerTensor> TensorOf(absl::string_view field, const v1::TensorDesc& desc,
                                      std::string* data, const std::string& backend) {
  ServerTensor out;
  absl::StatusOr<MutableTensor> checked = wire::MutableOf(field, desc, data);
  if (!checked.ok()) {
    return absl::InternalError(
        absl::StrCat("the server's answer is malformed: ", checked.status().message()));
  }
  out.dtype = checked->dtype;
  out.shape = checked->shape;
  out.data.swap(*data);
  out.backend = backend;
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Create(const ClientOptions& options) {
  for (const char ch : options.health_check_service) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(ch)) && ch != '.' && ch != '_' &&
        ch != '-' && ch != '/') {
      return absl::InvalidArgumentError(absl::StrCat(
          "ClientOptions.health_check_service must be a gRPC service name (letters, digits, '.', "
          "'_', '-', '/') or empty; got '",
          absl::CHexEscape(options.health_check_service), "'"));
    }
  }
  if (options.min_time_between_resolutions < absl::ZeroDuration() ||
      options.min_time_between_resolutions > absl::Hours(24)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ClientOptions.min_time_between_resolutions must lie in [0, 24h]; got ",
                     absl::FormatDuration(options.min_time_between_resolutions)));
  }
  std::unique_ptr<Client> c(new Client());
  c->options_ = options;
  c->pending_ = std::make_shared<client_internal::PendingCalls>();
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
  args.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS,
              static_cast<int>(absl::ToInt64Milliseconds(options.min_time_between_resolutions)));
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
  if (!call.request_id.empty()) ctx->AddMetadata("x-request-id", call.request_id);
}

namespace client_internal {

// Asynchronous calls whose state gRPC still holds. The future of a call is
// set inside its callback, but gRPC destroys the callback (and with it the
// call's ClientContext) on its own thread afterwards: a caller that got its
// result and then destroyed the client raced that clean-up (an assertion
// "prior > 0" in gRPC's reference counting at shutdown, seen once in about
// 40 runs of EndToEnd.AsyncCallsAndStreamKeepOrderAndReportErrorsPerMessage).
// ~Client waits for the count to reach zero.
class PendingCalls {
 public:
  // Held by each call's state, released after its ClientContext is gone.
  class Token {
   public:
    explicit Token(std::shared_ptr<PendingCalls> p) : p_(std::move(p)) {
      std::lock_guard<std::mutex> l(p_->mu_);
      ++p_->count_;
    }
    ~Token() {
      std::lock_guard<std::mutex> l(p_->mu_);
      if (--p_->count_ == 0) p_->none_.notify_all();
    }
    Token(const Token&) = delete;
    Token& operator=(const Token&) = delete;

   private:
    std::shared_ptr<PendingCalls> p_;
  };

  void WaitForNone() {
    std::unique_lock<std::mutex> l(mu_);
    none_.wait(l, [this] { return count_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable none_;
  int count_ = 0;
};

}  // namespace client_internal

namespace {

// State of one asynchronous call; lives until gRPC destroys its callback.
// `token` is declared first so it is released last, after `ctx`.
template <typename Request, typename Response>
struct AsyncCall {
  explicit AsyncCall(std::shared_ptr<client_internal::PendingCalls> pending)
      : token(std::move(pending)) {}
  client_internal::PendingCalls::Token token;
  grpc::ClientContext ctx;
  Request request;
  Response response;
  std::promise<absl::Status> done;
};

}  // namespace

Client::~Client() {
  if (pending_ != nullptr) pending_->WaitForNone();
}

std::future<absl::Status> Client::ApplyRopeAsync(const RopeOptions& options, const RopeTensors& t,
                                                 const CallOptions& call) {
  auto state = std::make_shared<AsyncCall<v1::RopeRequest, v1::RopeResponse>>(pending_);
  state->request = RopeRequestOf(options, t, call);
  Prepare(&state->ctx, call);
  std::future<absl::Status> f = state->done.get_future();
  MutableTensor query = t.query, key = t.key;
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
absl::Status Client::ApplyRope(const RopeOptions& options, const RopeTensors& t,
                               const CallOptions& call) {
  const v1::RopeRequest req = RopeRequestOf(options, t, call);
  grpc::ClientContext ctx;
  Prepare(&ctx, call);
  v1::RopeResponse resp;
  absl::Status st = FromGrpc(stub_->ApplyRope(&ctx, req, &resp));
  MutableTensor query = t.query, key = t.key;
  if (st.ok()) st = CopyBack("query", resp.query(), resp.query_data(), query);
  if (st.ok() && key.present()) st = CopyBack("key", resp.key(), resp.key_data(), key);
  return st;
}

std::future<absl::Status> Client::AddAbsoluteEncodingAsync(const AbsoluteOptions& options,
                                                           const AbsoluteTensors& t,
                                                           const CallOptions& call) {
  auto state =
      std::make_shared<AsyncCall<v1::AbsoluteEncodingRequest, v1::AbsoluteEncodingResponse>>(
          pending_);
  state->request = AbsoluteRequestOf(options, t, call);
  Prepare(&state->ctx, call);
  std::future<absl::Status> f = state->done.get_future();
  MutableTensor x = t.x;
  stub_->async()->AddAbsoluteEncoding(
      &state->ctx, &state->request, &state->response, [state, x](grpc::Status s) mutable {
        absl::Status st = FromGrpc(s);
        if (st.ok()) st = CopyBack("y", state->response.y(), state->response.y_data(), x);
        state->done.set_value(st);
      });
  return f;
}

absl::Status Client::AddAbsoluteEncoding(const AbsoluteOptions& options, const AbsoluteTensors& t,
                                         const CallOptions& call) {
  const v1::AbsoluteEncodingRequest req = AbsoluteRequestOf(options, t, call);
  grpc::ClientContext ctx;
  Prepare(&ctx, call);
  v1::AbsoluteEncodingResponse resp;
  absl::Status st = FromGrpc(stub_->AddAbsoluteEncoding(&ctx, req, &resp));
  MutableTensor x = t.x;
  if (st.ok()) st = CopyBack("y", resp.y(), resp.y_data(), x);
  return st;
}

absl::Status Client::ApplyAttentionBias(const BiasOptions& options, MutableTensor logits,
                                        std::vector<double>* slopes, const CallOptions& call) {
  v1::AttentionBiasRequest req;
  wire::SetBiasOptions(options, &req);
  wire::SetTensor(logits.view(), req.mutable_logits(), req.mutable_logits_data());
  req.set_backend(wire::ToProto(call.backend));
  grpc::ClientContext ctx;
  Prepare(&ctx, call);
  v1::AttentionBiasResponse resp;
  absl::Status st = FromGrpc(stub_->AttentionBias(&ctx, req, &resp));
  if (st.ok()) st = CopyBack("bias", resp.bias(), resp.bias_data(), logits);
  if (st.ok() && slopes != nullptr) slopes->assign(resp.slopes().begin(), resp.slopes().end());
  return st;
}

absl::StatusOr<ServerTensor> Client::AttentionBias(const BiasOptions& options,
                                                   const CallOptions& call) {
  v1::AttentionBiasRequest req;
  wire::SetBiasOptions(options, &req);
  req.set_backend(wire::ToProto(call.backend));
  grpc::ClientContext ctx;
  Prepare(&ctx, call);
  v1::AttentionBiasResponse resp;
  POSENC_RETURN_IF_ERROR(FromGrpc(stub_->AttentionBias(&ctx, req, &resp)));
  absl::StatusOr<ServerTensor> out =
      TensorOf("bias", resp.bias(), resp.mutable_bias_data(), resp.backend());
  if (out.ok()) out->slopes.assign(resp.slopes().begin(), resp.slopes().end());
  return out;
}

absl::StatusOr<ServerTensor> Client::EncodingTable(const AbsoluteOptions& options, int64_t dim,
                                                   int64_t count, const TensorView& positions,
                                                   DType dtype, const CallOptions& call) {
  v1::EncodingTableRequest req;
  wire::SetAbsoluteOptions(options, &req);
  req.set_dim(dim);
  req.set_count(count);
  if (positions.present()) wire::SetTensor(positions, req.mutable_positions());
  req.set_dtype(wire::ToProto(dtype));
  req.set_backend(wire::ToProto(call.backend));
  grpc::ClientContext ctx;
  Prepare(&ctx, call);
  v1::EncodingTableResponse resp;
  POSENC_RETURN_IF_ERROR(FromGrpc(stub_->GetEncodingTable(&ctx, req, &resp)));
  return TensorOf("table", resp.table(), resp.mutable_table_data(), resp.backend());
}

#define POSENC_UNARY(Method, Request, Response, request_expr)           \
  grpc::ClientContext ctx;                                              \
  Prepare(&ctx, call);                                                  \
  Response resp;                                                        \
  absl::Status st = FromGrpc(stub_->Method(&ctx, request_expr, &resp)); \
  if (!st.ok()) return st;                                              \
  return resp

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
