#include "posenc/client.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "call_outcome.h"
#include "device_memory.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "pending_calls.h"
#include "posenc/host_copy.h"
#include "posenc/status_macros.h"
#include "posenc/wire/enums.h"
#include "posenc/wire/requests.h"
#include "posenc/wire/tensors.h"
#include "shared_memory.h"

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

bool SameDesc(const v1::TensorDesc& desc, const MutableTensor& t) {
  return desc.dtype() == wire::ToProto(t.dtype) &&
         std::equal(desc.shape().begin(), desc.shape().end(), t.shape.begin(), t.shape.end());
}

std::string DescString(const v1::TensorDesc& desc) {
  return absl::StrCat(v1::DataType_Name(desc.dtype()), " ",
                      ShapeString(std::vector<int64_t>(desc.shape().begin(), desc.shape().end())));
}

// Copies a response tensor back into the caller's buffer, checking that the
// server returned what was sent: the same dtype and shape (equal byte
// counts alone would take bfloat16 for float16), and its bytes.
absl::Status CopyBack(absl::string_view field, const v1::TensorDesc& desc, const std::string& data,
                      MutableTensor& out) {
  if (data.size() != out.nbytes || !SameDesc(desc, out)) {
    return absl::InternalError(absl::StrCat("server returned ", field, " of ", data.size(),
                                            " bytes, ", DescString(desc), "; expected ", out.nbytes,
                                            " bytes, ", v1::DataType_Name(wire::ToProto(out.dtype)),
                                            " ", ShapeString(out.shape)));
  }
  if (!data.empty()) std::memcpy(out.data, data.data(), data.size());
  return absl::OkStatus();
}

// A tensor computed in place (in a shared-memory region or registered
// device memory): the answer describes it as sent and carries none of its
// bytes. An answer that carries them, or describes another tensor, is not
// one the client can trust the region's bytes for (it would hand back the
// caller's own input, or an earlier call's result, as the answer).
absl::Status CheckInPlace(absl::string_view field, const v1::TensorDesc& desc,
                          const std::string& data, const MutableTensor& t) {
  if (data.empty() && SameDesc(desc, t)) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("the server's answer is malformed: ", field,
                   " was sent to be computed in place (", v1::DataType_Name(wire::ToProto(t.dtype)),
                   " ", ShapeString(t.shape), ") but the answer describes ", DescString(desc),
                   " and carries ", data.size(), " bytes of it"));
}

}  // namespace

void SetTensor(const TensorView& t, v1::TensorDesc* desc, std::string* data) {
  wire::SetTensor(t, desc, data);
}

void SetTensor(const TensorView& t, v1::Tensor* tensor) { wire::SetTensor(t, tensor); }

namespace {

// Request builders: options, small tensors and descriptors; the large
// tensors' bytes go in by PutBytes (the socket) or a Placement (shared
// memory).
v1::RopeRequest RopeRequestOf(const RopeOptions& options, const RopeTensors& t,
                              const CallOptions& call) {
  v1::RopeRequest r;
  wire::SetRopeOptions(options, &r);
  *r.mutable_query() = wire::DescOf(t.query.dtype, t.query.shape);
  if (t.key.present()) *r.mutable_key() = wire::DescOf(t.key.dtype, t.key.shape);
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
  *r.mutable_x() = wire::DescOf(t.x.dtype, t.x.shape);
  if (t.positions.position_ids.present()) {
    wire::SetTensor(t.positions.position_ids, r.mutable_position_ids());
  }
  if (t.positions.offsets.present()) wire::SetTensor(t.positions.offsets, r.mutable_offsets());
  if (t.cu_seqlens.present()) wire::SetTensor(t.cu_seqlens, r.mutable_cu_seqlens());
  r.set_backend(wire::ToProto(call.backend));
  r.set_request_id(call.request_id);
  return r;
}

void PutBytes(const MutableTensor& t, std::string* data) {
  AssignHostBytes(data, static_cast<const char*>(t.data), t.nbytes);
}

// Tensors of one call laid out in a leased region, back to back, each at a
// 64-byte boundary.
class Placement {
 public:
  explicit Placement(client_internal::Lease& lease) : lease_(lease) {}
  static int64_t Aligned(int64_t bytes) { return (bytes + 63) / 64 * 64; }
  // Room for `bytes` (an output); fills `slice`.
  char* Reserve(int64_t bytes, v1::SharedMemorySlice* slice) {
    slice->set_region(lease_.region().name());
    slice->set_offset(static_cast<uint64_t>(next_));
    slice->set_byte_size(static_cast<uint64_t>(bytes));
    char* at = lease_.region().data() + next_;
    next_ += Aligned(bytes);
    return at;
  }
  // Copies `t` in; fills `slice`.
  void Put(const MutableTensor& t, v1::SharedMemorySlice* slice) {
    char* at = Reserve(static_cast<int64_t>(t.nbytes), slice);
    CopyHostBytes(at, t.data, t.nbytes);
  }
  const char* At(const v1::SharedMemorySlice& slice) const {
    return lease_.region().data() + slice.offset();
  }
  // Copies a slice's bytes (the server's result) back into `t`.
  void Get(const v1::SharedMemorySlice& slice, MutableTensor& t) const {
    CopyHostBytes(t.data, At(slice), t.nbytes);
  }

 private:
  client_internal::Lease& lease_;
  int64_t next_ = 0;
};

// Whether a call failed for its shared-memory region rather than its
// tensors (the server restarted without our registration, or lost the
// region): then the same call goes over the socket.
bool RegionFailed(const absl::Status& s) {
  return (s.code() == absl::StatusCode::kNotFound ||
          s.code() == absl::StatusCode::kFailedPrecondition) &&
         absl::StrContains(s.message(), "shared memory");
}

// After a call on a region failed with `s`: the region goes back to the
// pool only when the server finished with the call. One the server lost
// (RegionFailed) is useless; after a failure of unknown outcome the server
// may still be computing into it, and the next call to take it would have
// its tensors overwritten. Either is dropped and unregistered.
void LeaveRegion(std::optional<client_internal::Lease>& lease, const absl::Status& s) {
  if (lease && (RegionFailed(s) || client_internal::OutcomeUnknown(s.code()))) lease->Discard();
}

// A tensor the server built, of the dtype and rank the request asked for:
// a float16 answer to a bfloat16 request has the right byte count and
// would read as garbage.
absl::StatusOr<ServerTensor> TensorOf(absl::string_view field, const v1::TensorDesc& desc,
                                      std::string* data, const std::string& backend,
                                      DType want_dtype, size_t want_rank) {
  ServerTensor out;
  absl::StatusOr<MutableTensor> checked = wire::MutableOf(field, desc, data);
  if (!checked.ok()) {
    return absl::InternalError(
        absl::StrCat("the server's answer is malformed: ", checked.status().message()));
  }
  if (checked->dtype != want_dtype || checked->shape.size() != want_rank) {
    return absl::InternalError(absl::StrCat(
        "the server's answer is malformed: its ", field, " is ", DescString(desc), ", not the ",
        want_rank, "-D ", v1::DataType_Name(wire::ToProto(want_dtype)), " tensor asked for"));
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
  if (options.max_reconnect_backoff <= absl::ZeroDuration() ||
      options.max_reconnect_backoff > absl::Hours(24)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ClientOptions.max_reconnect_backoff must lie in (0, 24h]; got ",
                     absl::FormatDuration(options.max_reconnect_backoff)));
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
  // At least a millisecond: gRPC takes milliseconds, and 0 is no cap at all.
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
              static_cast<int>(
                  std::max<int64_t>(1, absl::ToInt64Milliseconds(options.max_reconnect_backoff))));
  if (!options.tls_server_name.empty()) {
    args.SetSslTargetNameOverride(options.tls_server_name);
  }
  c->channel_ = grpc::CreateCustomChannel(options.target, creds, args);
  c->stub_ = v1::PositionalEncoding::NewStub(c->channel_);
  c->shm_ = std::make_unique<client_internal::SharedMemoryPool>(
      c->stub_.get(), options.shared_memory != SharedMemoryUse::kOff,
      absl::StartsWith(options.target, "unix:"), c->pending_);
  c->device_ = std::make_unique<client_internal::DeviceRegions>(c->stub_.get());
  return c;
}

absl::Status Client::RegisterDeviceMemory(const DeviceAllocation& allocation,
                                          const CallOptions& call) {
  grpc::ClientContext ctx;
  Prepare(&ctx, call);
  return device_->Register(allocation, &ctx);
}

absl::Status Client::UnregisterDeviceMemory(const void* base, const CallOptions& call) {
  grpc::ClientContext ctx;
  Prepare(&ctx, call);
  return device_->Unregister(base, &ctx);
}

bool Client::UsesSharedMemory() const {
  return options_.shared_memory != SharedMemoryUse::kOff && !shm_->disabled();
}

void Client::Prepare(grpc::ClientContext* ctx, const CallOptions& call) const {
  const absl::Duration t =
      call.timeout > absl::ZeroDuration() ? call.timeout : options_.default_timeout;
  ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(t));
  if (!call.request_id.empty()) ctx->AddMetadata("x-request-id", call.request_id);
  if (!call.traceparent.empty()) ctx->AddMetadata("traceparent", call.traceparent);
  // An id of this call's own, the same on each attempt gRPC makes of it: a
  // server that already started an in-place call (shared or device memory)
  // refuses a retry of it (ABORTED) rather than compute on its result
  // (docs/shared-memory.md). A random nonce tells processes apart; the pid,
  // read each time, tells a forked child (which copies the nonce and the
  // count) from its parent and siblings.
  static const uint64_t nonce =
      (uint64_t{std::random_device{}()} << 32) ^ uint64_t { std::random_device{}() };
  static std::atomic<uint64_t> calls{0};
  ctx->AddMetadata("posenc-call-id",
                   absl::StrFormat("%016x-%d-%d", nonce, ::getpid(), calls.fetch_add(1)));
}

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
  std::optional<client_internal::Lease> lease;  // the call's region, if any
  std::optional<Placement> place;
};

}  // namespace

Client::~Client() {
  if (pending_ != nullptr) pending_->WaitForNone();
}

namespace {

// kRequire and no region: why, with the pool's code (RESOURCE_EXHAUSTED while
// the server refuses regions for want of room, else FAILED_PRECONDITION).
absl::Status NoRegionError(const client_internal::SharedMemoryPool& pool) {
  const absl::Status why = pool.WhyNot();
  return absl::Status(why.code(),
                      absl::StrCat("ClientOptions.shared_memory is kRequire but ", why.message()));
}

}  // namespace

// Shared memory for a call of `bytes` (each tensor aligned): a region, or
// nullopt for the socket; kRequire turns "none" into an error.
#define POSENC_TAKE_REGION(lease, bytes)                               \
  std::optional<client_internal::Lease> lease = shm_->Take(bytes);     \
  if (!lease && options_.shared_memory == SharedMemoryUse::kRequire) { \
    return NoRegionError(*shm_);                                       \
  }

namespace {

int64_t RopeBytes(const RopeTensors& t) {
  return Placement::Aligned(t.query.nbytes) + Placement::Aligned(t.key.nbytes);
}

// Puts a RoPE call's tensors in the region (or, without one, in the message).
void PlaceRope(const RopeTensors& t, std::optional<Placement>& place, v1::RopeRequest* r) {
  if (place) {
    place->Put(t.query, r->mutable_query_shm());
    if (t.key.present()) place->Put(t.key, r->mutable_key_shm());
  } else {
    PutBytes(t.query, r->mutable_query_data());
    if (t.key.present()) PutBytes(t.key, r->mutable_key_data());
  }
}

// Rotated in registered device memory: nothing comes back to copy.
absl::Status RopeInPlace(const v1::RopeResponse& resp, const MutableTensor& query,
                         const MutableTensor& key) {
  POSENC_RETURN_IF_ERROR(CheckInPlace("query", resp.query(), resp.query_data(), query));
  if (key.present()) {
    POSENC_RETURN_IF_ERROR(CheckInPlace("key", resp.key(), resp.key_data(), key));
  }
  return absl::OkStatus();
}

// The rotated tensors back into the caller's buffers.
absl::Status RopeBack(const v1::RopeRequest& req, const v1::RopeResponse& resp,
                      const std::optional<Placement>& place, MutableTensor query,
                      MutableTensor key) {
  if (place) {
    POSENC_RETURN_IF_ERROR(CheckInPlace("query", resp.query(), resp.query_data(), query));
    if (key.present()) {
      POSENC_RETURN_IF_ERROR(CheckInPlace("key", resp.key(), resp.key_data(), key));
    }
    place->Get(req.query_shm(), query);
    if (key.present()) place->Get(req.key_shm(), key);
    return absl::OkStatus();
  }
  POSENC_RETURN_IF_ERROR(CopyBack("query", resp.query(), resp.query_data(), query));
  if (key.present()) POSENC_RETURN_IF_ERROR(CopyBack("key", resp.key(), resp.key_data(), key));
  return absl::OkStatus();
}

void PlaceAbsolute(const AbsoluteTensors& t, std::optional<Placement>& place,
                   v1::AbsoluteEncodingRequest* r) {
  if (place) {
    place->Put(t.x, r->mutable_x_shm());
  } else {
    PutBytes(t.x, r->mutable_x_data());
  }
}

absl::Status AbsoluteBack(const v1::AbsoluteEncodingRequest& req,
                          const v1::AbsoluteEncodingResponse& resp,
                          const std::optional<Placement>& place, MutableTensor x) {
  if (place) {
    POSENC_RETURN_IF_ERROR(CheckInPlace("y", resp.y(), resp.y_data(), x));
    place->Get(req.x_shm(), x);
    return absl::OkStatus();
  }
  return CopyBack("y", resp.y(), resp.y_data(), x);
}

}  // namespace

std::future<absl::Status> Client::ApplyRopeAsync(const RopeOptions& options, const RopeTensors& t,
                                                 const CallOptions& call) {
  auto state = std::make_shared<AsyncCall<v1::RopeRequest, v1::RopeResponse>>(pending_);
  std::future<absl::Status> f = state->done.get_future();
  state->request = RopeRequestOf(options, t, call);
  auto on_device = device_->Find({{"query", &t.query}, {"key", &t.key}});
  if (!on_device.ok() || on_device->has_value()) {
    if (!on_device.ok()) {
      state->done.set_value(on_device.status());
      return f;
    }
    // In place in the caller's device memory: nothing comes back to copy.
    *state->request.mutable_query_shm() = (**on_device)[0];
    if (t.key.present()) *state->request.mutable_key_shm() = (**on_device)[1];
    Prepare(&state->ctx, call);
    MutableTensor query = t.query, key = t.key;
    stub_->async()->ApplyRope(&state->ctx, &state->request, &state->response,
                              [state, query, key](grpc::Status s) {
                                absl::Status st = FromGrpc(s);
                                if (st.ok()) st = RopeInPlace(state->response, query, key);
                                state->done.set_value(st);
                              });
    return f;
  }
  state->lease = shm_->Take(RopeBytes(t));
  if (!state->lease && options_.shared_memory == SharedMemoryUse::kRequire) {
    state->done.set_value(NoRegionError(*shm_));
    return f;
  }
  if (state->lease) state->place.emplace(*state->lease);
  PlaceRope(t, state->place, &state->request);
  Prepare(&state->ctx, call);
  MutableTensor query = t.query, key = t.key;
  stub_->async()->ApplyRope(
      &state->ctx, &state->request, &state->response,
      [this, state, options, t, call, query, key](grpc::Status s) {
        absl::Status st = FromGrpc(s);
        if (st.ok()) {
          state->done.set_value(
              RopeBack(state->request, state->response, state->place, query, key));
          return;
        }
        LeaveRegion(state->lease, st);
        if (state->lease && RegionFailed(st) &&
            options_.shared_memory != SharedMemoryUse::kRequire) {
          // The region failed, not the tensors: the same call on the socket
          // completes this one (the pool now declines regions).
          shm_->Disable(st);
          auto again = std::make_shared<AsyncCall<v1::RopeRequest, v1::RopeResponse>>(pending_);
          again->request = RopeRequestOf(options, t, call);
          PlaceRope(t, again->place, &again->request);
          Prepare(&again->ctx, call);
          again->done = std::move(state->done);
          stub_->async()->ApplyRope(
              &again->ctx, &again->request, &again->response, [again, query, key](grpc::Status s2) {
                absl::Status st2 = FromGrpc(s2);
                if (st2.ok()) {
                  st2 = RopeBack(again->request, again->response, again->place, query, key);
                }
                again->done.set_value(st2);
              });
          return;
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
  POSENC_ASSIGN_OR_RETURN(auto on_device, device_->Find({{"query", &t.query}, {"key", &t.key}}));
  if (on_device) {
    v1::RopeRequest req = RopeRequestOf(options, t, call);
    *req.mutable_query_shm() = (*on_device)[0];
    if (t.key.present()) *req.mutable_key_shm() = (*on_device)[1];
    grpc::ClientContext ctx;
    Prepare(&ctx, call);
    v1::RopeResponse resp;
    POSENC_RETURN_IF_ERROR(FromGrpc(stub_->ApplyRope(&ctx, req, &resp)));
    return RopeInPlace(resp, t.query, t.key);  // the results are in place
  }
  POSENC_TAKE_REGION(lease, RopeBytes(t));
  for (;;) {
    std::optional<Placement> place;
    if (lease) place.emplace(*lease);
    v1::RopeRequest req = RopeRequestOf(options, t, call);
    PlaceRope(t, place, &req);
    grpc::ClientContext ctx;
    Prepare(&ctx, call);
    v1::RopeResponse resp;
    absl::Status st = FromGrpc(stub_->ApplyRope(&ctx, req, &resp));
    if (st.ok()) return RopeBack(req, resp, place, t.query, t.key);
    LeaveRegion(lease, st);
    // A region the server lost: the call again on the socket, unless required.
    if (!lease || !RegionFailed(st) || options_.shared_memory == SharedMemoryUse::kRequire)
      return st;
    shm_->Disable(st);
    lease.reset();
  }
}

std::future<absl::Status> Client::AddAbsoluteEncodingAsync(const AbsoluteOptions& options,
                                                           const AbsoluteTensors& t,
                                                           const CallOptions& call) {
  auto state =
      std::make_shared<AsyncCall<v1::AbsoluteEncodingRequest, v1::AbsoluteEncodingResponse>>(
          pending_);
  std::future<absl::Status> f = state->done.get_future();
  state->request = AbsoluteRequestOf(options, t, call);
  auto on_device = device_->Find({{"x", &t.x}});
  if (!on_device.ok() || on_device->has_value()) {
    if (!on_device.ok()) {
      state->done.set_value(on_device.status());
      return f;
    }
    *state->request.mutable_x_shm() = (**on_device)[0];
    Prepare(&state->ctx, call);
    MutableTensor x = t.x;
    stub_->async()->AddAbsoluteEncoding(
        &state->ctx, &state->request, &state->response, [state, x](grpc::Status s) {
          absl::Status st = FromGrpc(s);
          if (st.ok()) st = CheckInPlace("y", state->response.y(), state->response.y_data(), x);
          state->done.set_value(st);
        });
    return f;
  }
  state->lease = shm_->Take(Placement::Aligned(t.x.nbytes));
  if (!state->lease && options_.shared_memory == SharedMemoryUse::kRequire) {
    state->done.set_value(NoRegionError(*shm_));
    return f;
  }
  if (state->lease) state->place.emplace(*state->lease);
  PlaceAbsolute(t, state->place, &state->request);
  Prepare(&state->ctx, call);
  MutableTensor x = t.x;
  stub_->async()->AddAbsoluteEncoding(
      &state->ctx, &state->request, &state->response,
      [this, state, options, t, call, x](grpc::Status s) {
        absl::Status st = FromGrpc(s);
        if (st.ok()) {
          state->done.set_value(AbsoluteBack(state->request, state->response, state->place, x));
          return;
        }
        LeaveRegion(state->lease, st);
        if (state->lease && RegionFailed(st) &&
            options_.shared_memory != SharedMemoryUse::kRequire) {
          shm_->Disable(st);
          auto again = std::make_shared<
              AsyncCall<v1::AbsoluteEncodingRequest, v1::AbsoluteEncodingResponse>>(pending_);
          again->request = AbsoluteRequestOf(options, t, call);
          PlaceAbsolute(t, again->place, &again->request);
          Prepare(&again->ctx, call);
          again->done = std::move(state->done);
          stub_->async()->AddAbsoluteEncoding(
              &again->ctx, &again->request, &again->response, [again, x](grpc::Status s2) {
                absl::Status st2 = FromGrpc(s2);
                if (st2.ok()) st2 = AbsoluteBack(again->request, again->response, again->place, x);
                again->done.set_value(st2);
              });
          return;
        }
        state->done.set_value(st);
      });
  return f;
}

absl::Status Client::AddAbsoluteEncoding(const AbsoluteOptions& options, const AbsoluteTensors& t,
                                         const CallOptions& call) {
  POSENC_ASSIGN_OR_RETURN(auto on_device, device_->Find({{"x", &t.x}}));
  if (on_device) {
    v1::AbsoluteEncodingRequest req = AbsoluteRequestOf(options, t, call);
    *req.mutable_x_shm() = (*on_device)[0];
    grpc::ClientContext ctx;
    Prepare(&ctx, call);
    v1::AbsoluteEncodingResponse resp;
    POSENC_RETURN_IF_ERROR(FromGrpc(stub_->AddAbsoluteEncoding(&ctx, req, &resp)));
    return CheckInPlace("y", resp.y(), resp.y_data(), t.x);
  }
  POSENC_TAKE_REGION(lease, Placement::Aligned(t.x.nbytes));
  for (;;) {
    std::optional<Placement> place;
    if (lease) place.emplace(*lease);
    v1::AbsoluteEncodingRequest req = AbsoluteRequestOf(options, t, call);
    PlaceAbsolute(t, place, &req);
    grpc::ClientContext ctx;
    Prepare(&ctx, call);
    v1::AbsoluteEncodingResponse resp;
    absl::Status st = FromGrpc(stub_->AddAbsoluteEncoding(&ctx, req, &resp));
    if (st.ok()) return AbsoluteBack(req, resp, place, t.x);
    LeaveRegion(lease, st);
    // A region the server lost: the call again on the socket, unless required.
    if (!lease || !RegionFailed(st) || options_.shared_memory == SharedMemoryUse::kRequire)
      return st;
    shm_->Disable(st);
    lease.reset();
  }
}

absl::Status Client::ApplyAttentionBias(const BiasOptions& options, MutableTensor logits,
                                        std::vector<double>* slopes, const CallOptions& call) {
  POSENC_ASSIGN_OR_RETURN(auto on_device, device_->Find({{"logits", &logits}}));
  if (on_device) {
    v1::AttentionBiasRequest req;
    wire::SetBiasOptions(options, &req);
    *req.mutable_logits() = wire::DescOf(logits.dtype, logits.shape);
    *req.mutable_logits_shm() = (*on_device)[0];
    req.set_backend(wire::ToProto(call.backend));
    grpc::ClientContext ctx;
    Prepare(&ctx, call);
    v1::AttentionBiasResponse resp;
    absl::Status st = FromGrpc(stub_->AttentionBias(&ctx, req, &resp));
    if (st.ok()) st = CheckInPlace("bias", resp.bias(), resp.bias_data(), logits);
    if (st.ok() && slopes != nullptr) slopes->assign(resp.slopes().begin(), resp.slopes().end());
    return st;
  }
  POSENC_TAKE_REGION(lease, Placement::Aligned(logits.nbytes));
  for (;;) {
    std::optional<Placement> place;
    if (lease) place.emplace(*lease);
    v1::AttentionBiasRequest req;
    wire::SetBiasOptions(options, &req);
    *req.mutable_logits() = wire::DescOf(logits.dtype, logits.shape);
    if (place) {
      place->Put(logits, req.mutable_logits_shm());
    } else {
      PutBytes(logits, req.mutable_logits_data());
    }
    req.set_backend(wire::ToProto(call.backend));
    grpc::ClientContext ctx;
    Prepare(&ctx, call);
    v1::AttentionBiasResponse resp;
    absl::Status st = FromGrpc(stub_->AttentionBias(&ctx, req, &resp));
    if (st.ok()) {
      if (place) {
        st = CheckInPlace("bias", resp.bias(), resp.bias_data(), logits);
        if (st.ok()) place->Get(req.logits_shm(), logits);
      } else {
        st = CopyBack("bias", resp.bias(), resp.bias_data(), logits);
      }
      if (st.ok() && slopes != nullptr) slopes->assign(resp.slopes().begin(), resp.slopes().end());
      return st;
    }
    LeaveRegion(lease, st);
    // A region the server lost: the call again on the socket, unless required.
    if (!lease || !RegionFailed(st) || options_.shared_memory == SharedMemoryUse::kRequire)
      return st;
    shm_->Disable(st);
    lease.reset();
  }
}

namespace {

// The bytes of the bias the options build, when they say it without the
// server's help (every dimension given, or a batch the padding tensors
// imply); 0 otherwise.
int64_t BuiltBiasBytes(const BiasOptions& o) {
  int64_t batch = o.batch;
  if (batch == 0) {
    batch = o.k_lens.present()     ? o.k_lens.shape.empty() ? 0 : o.k_lens.shape[0]
                : o.k_starts.present() ? o.k_starts.shape.empty() ? 0 : o.k_starts.shape[0]
                                       : 1;
  }
  int64_t n = static_cast<int64_t>(SizeOf(o.dtype));
  for (int64_t d : {batch, o.num_heads, o.q_len, o.k_len}) {
    if (d <= 0 || __builtin_mul_overflow(n, d, &n)) return 0;
  }
  return n;
}

// A built tensor out of the region, as the socket would have returned it.
// The answer must describe a tensor of `dtype` filling the slice exactly
// and carry none of its bytes (`data`): a region is reused, so bytes the
// server did not write there are an earlier call's.
absl::StatusOr<ServerTensor> TensorFromSlice(absl::string_view field, const v1::TensorDesc& desc,
                                             const std::string& data, DType dtype, size_t rank,
                                             const Placement& place,
                                             const v1::SharedMemorySlice& slice,
                                             const std::string& backend) {
  int64_t bytes = desc.dtype() == wire::ToProto(dtype) ? static_cast<int64_t>(SizeOf(dtype)) : -1;
  for (int64_t d : desc.shape()) {
    if (bytes < 0 || d < 0 || __builtin_mul_overflow(bytes, d, &bytes)) bytes = -1;
  }
  if (!data.empty() || bytes != static_cast<int64_t>(slice.byte_size())) {
    return absl::InternalError(absl::StrCat(
        "the server's answer is malformed: its ", field, " (", DescString(desc), ", ", data.size(),
        " bytes in the answer) is not the ", v1::DataType_Name(wire::ToProto(dtype)), " tensor of ",
        slice.byte_size(), " bytes it was to build in shared memory"));
  }
  std::string copy(place.At(slice), static_cast<size_t>(bytes));
  return TensorOf(field, desc, &copy, backend, dtype, rank);
}

// kRequire, and a built tensor whose size the options do not tell.
absl::Status SizeUnknownError(absl::string_view what) {
  return absl::FailedPreconditionError(
      absl::StrCat("ClientOptions.shared_memory is kRequire but the size of this ", what,
                   " is not known before the server builds it (give every dimension), so it "
                   "cannot be placed in shared memory"));
}

}  // namespace

absl::StatusOr<ServerTensor> Client::AttentionBias(const BiasOptions& options,
                                                   const CallOptions& call) {
  const int64_t bytes = BuiltBiasBytes(options);
  const bool required = options_.shared_memory == SharedMemoryUse::kRequire;
  if (required && bytes == 0) return SizeUnknownError("bias");
  std::optional<client_internal::Lease> lease;
  if (bytes > 0) lease = shm_->Take(bytes);
  if (required && !lease) return NoRegionError(*shm_);
  for (;;) {
    std::optional<Placement> place;
    if (lease) place.emplace(*lease);
    v1::AttentionBiasRequest req;
    wire::SetBiasOptions(options, &req);
    req.set_backend(wire::ToProto(call.backend));
    if (place) place->Reserve(bytes, req.mutable_bias_shm());
    grpc::ClientContext ctx;
    Prepare(&ctx, call);
    v1::AttentionBiasResponse resp;
    absl::Status st = FromGrpc(stub_->AttentionBias(&ctx, req, &resp));
    if (st.ok()) {
      absl::StatusOr<ServerTensor> out =
          place ? TensorFromSlice("bias", resp.bias(), resp.bias_data(), options.dtype, 4, *place,
                                  req.bias_shm(), resp.backend())
                : TensorOf("bias", resp.bias(), resp.mutable_bias_data(), resp.backend(),
                           options.dtype, 4);
      if (out.ok()) out->slopes.assign(resp.slopes().begin(), resp.slopes().end());
      return out;
    }
    LeaveRegion(lease, st);
    // A region the server lost: the call again on the socket, unless required.
    if (!lease || !RegionFailed(st) || required) return st;
    shm_->Disable(st);
    lease.reset();
  }
}

absl::StatusOr<ServerTensor> Client::EncodingTable(const AbsoluteOptions& options, int64_t dim,
                                                   int64_t count, const TensorView& positions,
                                                   DType dtype, const CallOptions& call) {
  // Its size is known unless a learned table's own dim or rows decide it.
  const int64_t rows =
      positions.present() ? (positions.shape.empty() ? 0 : positions.shape[0]) : count;
  int64_t bytes = static_cast<int64_t>(SizeOf(dtype));
  if (dim <= 0 || rows <= 0 || __builtin_mul_overflow(bytes, dim, &bytes) ||
      __builtin_mul_overflow(bytes, rows, &bytes)) {
    bytes = 0;
  }
  const bool required = options_.shared_memory == SharedMemoryUse::kRequire;
  if (required && bytes == 0) return SizeUnknownError("table");
  std::optional<client_internal::Lease> lease;
  if (bytes > 0) lease = shm_->Take(bytes);
  if (required && !lease) return NoRegionError(*shm_);
  for (;;) {
    std::optional<Placement> place;
    if (lease) place.emplace(*lease);
    v1::EncodingTableRequest req;
    wire::SetAbsoluteOptions(options, &req);
    req.set_dim(dim);
    req.set_count(count);
    if (positions.present()) wire::SetTensor(positions, req.mutable_positions());
    req.set_dtype(wire::ToProto(dtype));
    req.set_backend(wire::ToProto(call.backend));
    if (place) place->Reserve(bytes, req.mutable_table_shm());
    grpc::ClientContext ctx;
    Prepare(&ctx, call);
    v1::EncodingTableResponse resp;
    absl::Status st = FromGrpc(stub_->GetEncodingTable(&ctx, req, &resp));
    if (st.ok()) {
      return place ? TensorFromSlice("table", resp.table(), resp.table_data(), dtype, 2, *place,
                                     req.table_shm(), resp.backend())
                   : TensorOf("table", resp.table(), resp.mutable_table_data(), resp.backend(),
                              dtype, 2);
    }
    LeaveRegion(lease, st);
    // A region the server lost: the call again on the socket, unless required.
    if (!lease || !RegionFailed(st) || required) return st;
    shm_->Disable(st);
    lease.reset();
  }
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
