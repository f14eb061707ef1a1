#include "v1/tensor_methods.h"

#include <string>

#include "engine/utf8.h"
#include "posenc/status_macros.h"
#include "posenc/v1/posenc.pb.h"
#include "rpc/messages.h"
#include "v1/operations.h"

namespace posenc::server {
namespace {

// The large bytes fields of each message (rpc/large_fields.h), by number.
std::vector<LargeField> LargeFieldsOf(v1::RopeRequest* m) {
  return {{2, m->mutable_query_data()}, {4, m->mutable_key_data()}};
}
std::vector<LargeField> LargeFieldsOf(v1::AbsoluteEncodingRequest* m) {
  return {{2, m->mutable_x_data()}};
}
std::vector<LargeField> LargeFieldsOf(v1::EncodingTableRequest*) { return {}; }
std::vector<LargeField> LargeFieldsOf(v1::AttentionBiasRequest* m) {
  return {{13, m->mutable_logits_data()}};
}
std::vector<LargeField> LargeFieldsOf(v1::RopeResponse* m) {
  return {{2, m->mutable_query_data()}, {4, m->mutable_key_data()}};
}
std::vector<LargeField> LargeFieldsOf(v1::AbsoluteEncodingResponse* m) {
  return {{2, m->mutable_y_data()}};
}
std::vector<LargeField> LargeFieldsOf(v1::EncodingTableResponse* m) {
  return {{2, m->mutable_table_data()}};
}
std::vector<LargeField> LargeFieldsOf(v1::AttentionBiasResponse* m) {
  return {{2, m->mutable_bias_data()}};
}

// The request_id a message carries, where its type has one.
absl::string_view MessageRequestId(const v1::RopeRequest& m) { return m.request_id(); }
absl::string_view MessageRequestId(const v1::AbsoluteEncodingRequest& m) { return m.request_id(); }
absl::string_view MessageRequestId(const v1::EncodingTableRequest&) { return ""; }
absl::string_view MessageRequestId(const v1::AttentionBiasRequest&) { return ""; }

// Whether a request computes on a tensor in place in the caller's shared or
// device memory, where a second run would compute on the first's result.
// (Built outputs, a table or bias written to a slice, are the same each
// time.)
bool InPlace(const v1::RopeRequest& m) { return m.has_query_shm() || m.has_key_shm(); }
bool InPlace(const v1::AbsoluteEncodingRequest& m) { return m.has_x_shm(); }
bool InPlace(const v1::EncodingTableRequest&) { return false; }
bool InPlace(const v1::AttentionBiasRequest& m) { return m.has_logits_shm(); }

// Parse, run on the engine, serialise. The typed messages live only inside
// this function, so the request's and the answer's memory is back in a
// ByteBuffer (or gone) before the answer is written.
template <typename Request, typename Response,
          absl::Status (*Op)(Engine&, Request*, Response*, const RunContext&, Engine::Admission&,
                             const BeforeCompute&)>
Method Tensor(Engine* engine, const char* name, Method::Kind kind = Method::Kind::kTensor) {
  Method m;
  m.service = kPositionalEncodingService;
  m.name = name;
  m.kind = kind;
  m.request_type = Request::descriptor();
  m.run = [engine](MethodCall& call, grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
    Request req;
    POSENC_RETURN_IF_ERROR(ParseAdmitted(call, in, &req, LargeFieldsOf(&req)));
    call.facts->message_id = Utf8Prefix(MessageRequestId(req), kMaxEchoedBytes);
    // Claimed just before the first write in place: an attempt refused
    // before it (a drain, admission, the plan's or the staging's memory)
    // leaves the id free for gRPC's retry of it.
    BeforeCompute claim;
    if (InPlace(req) && !call.call_id.empty()) {
      claim = [engine, &call] { return engine->attempts().Claim(call.call_id); };
    }
    Response resp;
    POSENC_RETURN_IF_ERROR(Op(*engine, &req, &resp, call.ctx, *call.admission, claim));
    call.facts->backend = resp.backend();
    return SerializeMessage(resp, out, LargeFieldsOf(&resp));
  };
  return m;
}

// A StreamRope message that failed: its status in the answer, with the
// message's id (when it parsed), and the stream goes on.
absl::Status RopeErrorAnswer(const absl::Status& s, const CallFacts& facts, grpc::ByteBuffer* out) {
  v1::RopeResponse error;
  error.set_request_id(facts.message_id);
  error.set_error_code(static_cast<int>(s.code()));
  error.set_error_message(ValidUtf8(s.message()));
  return SerializeMessage(error, out);
}

// Requests of at most this many tensor bytes compute in tens of
// microseconds on one thread (the CPU backend splits no work under 2^20
// elements): on gRPC's thread, no hop to the executor and back.
constexpr uint64_t kLightBytes = uint64_t{1} << 20;

// RoPE and the absolute encoding work in place on their tensors, in the
// message (`data` fields) or in shared memory (`slices`): their work is
// bounded by those bytes. AttentionBias and GetEncodingTable may build
// outputs far larger than their requests, so they always hop. So does
// every call while the engine has a GPU: a small call may still run there
// (backend CUDA, a slice of a CUDA region, AUTO's threshold or cost model),
// and a GPU call waits for one of the backend's workers and its stream,
// which must never hold gRPC's own threads (health checks, every other
// call's I/O).
std::function<bool(const grpc::ByteBuffer&)> LightUnder(Engine* engine, std::vector<int> data,
                                                        std::vector<int> slices) {
  return [engine, data = std::move(data),
          slices = std::move(slices)](const grpc::ByteBuffer& request) {
    return engine->cuda() == nullptr && TensorBytesOf(request, data, slices) <= kLightBytes;
  };
}

}  // namespace

std::vector<Method> TensorMethods(Engine* engine) {
  Method stream = Tensor<v1::RopeRequest, v1::RopeResponse, &ApplyRope>(
      engine, "StreamRope", Method::Kind::kTensorStream);
  stream.error_answer = RopeErrorAnswer;
  Method rope = Tensor<v1::RopeRequest, v1::RopeResponse, &ApplyRope>(engine, "ApplyRope");
  rope.light = LightUnder(engine, {2, 4}, {20, 21});  // query_data, key_data; *_shm
  Method absolute =
      Tensor<v1::AbsoluteEncodingRequest, v1::AbsoluteEncodingResponse, &AddAbsoluteEncoding>(
          engine, "AddAbsoluteEncoding");
  absolute.light = LightUnder(engine, {2}, {11});  // x_data; x_shm
  return {
      std::move(rope),
      std::move(stream),
      std::move(absolute),
      Tensor<v1::EncodingTableRequest, v1::EncodingTableResponse, &GetEncodingTable>(
          engine, "GetEncodingTable"),
      Tensor<v1::AttentionBiasRequest, v1::AttentionBiasResponse, &AttentionBias>(engine,
                                                                                  "AttentionBias"),
  };
}

}  // namespace posenc::server
