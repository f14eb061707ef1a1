// ModelInfer and ModelStreamInfer as Methods of the call lifecycle
// (rpc/call.h): parsed once into a message the call owns, run by infer.h on
// the engine, answered with the raw outputs handed to gRPC without a copy.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "engine/no_throw.h"
#include "engine/utf8.h"
#include "kserve/service.h"
#include "posenc/status_macros.h"
#include "rpc/large_fields.h"
#include "rpc/messages.h"

namespace posenc::server {
namespace {

using Clock = std::chrono::steady_clock;
using inference::ModelInferRequest;
using inference::ModelInferResponse;
using inference::ModelStreamInferResponse;

int64_t NanosSince(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t).count();
}

// Serialises an answer, handing its raw outputs to gRPC without a copy
// (the answer is left without them). Empty ones (an output in shared
// memory, or of no elements) go as empty entries, keeping the others'
// places: serialised whole instead, an answer mixing them with outputs in
// the answer was copied twice (into the string, then into gRPC's slice),
// holding three times its tensors where admission counted one.
absl::Status SerializeInferResponse(ModelInferResponse& resp, grpc::ByteBuffer* out) {
  std::vector<std::string> contents;
  contents.reserve(resp.raw_output_contents_size());
  for (std::string& raw : *resp.mutable_raw_output_contents()) contents.push_back(std::move(raw));
  resp.clear_raw_output_contents();
  std::string head;
  if (!resp.SerializeToString(&head)) return absl::InternalError("could not serialise the answer");
  std::vector<LargeField> large;
  for (std::string& c : contents)
    large.push_back({6, &c, /*repeated=*/true});  // raw_output_contents
  *out = BufferWithLargeFields(head, large);
  return absl::OkStatus();
}

// The stream answer's parameter that says no more answers to its request
// follow.
constexpr char kFinalResponse[] = "triton_final_response";

}  // namespace

std::vector<Method> KServeService::InferMethods() {
  // One request: parsed, run on the model as of now (a reload meanwhile
  // does not change this call's), statistics recorded, answer serialised.
  auto infer = [this](MethodCall& call, grpc::ByteBuffer* in,
                      ModelInferResponse* resp) -> absl::Status {
    ModelInferRequest req;
    POSENC_RETURN_IF_ERROR(ParseAdmitted(call, in, &req));
    call.facts->message_id = Utf8Prefix(req.id(), kMaxEchoedBytes);
    call.facts->model_name = Utf8Prefix(req.model_name(), kMaxEchoedBytes);
    const Clock::time_point compute_start = Clock::now();
    POSENC_ASSIGN_OR_RETURN(std::shared_ptr<const kserve::Model> model,
                            models_.Snapshot()->Find(req.model_name(), req.model_version()));
    kserve::ShmTraffic shm;
    const absl::Status s = NoThrow([&] {
      return kserve::RunInfer(*engine_, *model, &req, resp, call.ctx, *call.admission,
                              &call.facts->backend, &shared_memory(), &shm);
    });
    call.facts->shared_memory_in = shm.in;
    call.facts->shared_memory_out = shm.out;
    const int64_t compute_ns = NanosSince(compute_start);
    const int64_t total_ns = NanosSince(call.arrived);
    statistics_.Record(model->name, s.ok(), total_ns, total_ns - compute_ns, compute_ns);
    return s;
  };

  Method unary;
  unary.service = kKServeService;
  unary.name = "ModelInfer";
  unary.kind = Method::Kind::kTensor;
  unary.request_type = ModelInferRequest::descriptor();
  unary.run = [infer](MethodCall& call, grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
    ModelInferResponse resp;
    POSENC_RETURN_IF_ERROR(infer(call, in, &resp));
    return SerializeInferResponse(resp, out);
  };

  // A stream's answer is a ModelStreamInferResponse whose infer_response
  // (field 2) is the unary answer, nested without a copy. Each request has
  // one answer, so each is its request's last: marked so as Triton marks
  // every stream answer (triton_final_response), which clients of
  // decoupled models wait for.
  Method stream;
  stream.service = kKServeService;
  stream.name = "ModelStreamInfer";
  stream.kind = Method::Kind::kTensorStream;
  stream.request_type = ModelInferRequest::descriptor();
  stream.run = [infer](MethodCall& call, grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
    ModelInferResponse resp;
    POSENC_RETURN_IF_ERROR(infer(call, in, &resp));
    (*resp.mutable_parameters())[kFinalResponse].set_bool_param(true);
    grpc::ByteBuffer inner;
    POSENC_RETURN_IF_ERROR(SerializeInferResponse(resp, &inner));
    *out = NestedMessage(2, inner);
    return absl::OkStatus();
  };
  // A failed request is answered with error_message and the stream goes on,
  // as Triton does; the answer names the model and id when they parsed.
  stream.error_answer = [](const absl::Status& s, const CallFacts& facts, grpc::ByteBuffer* out) {
    ModelStreamInferResponse answer;
    answer.set_error_message(ValidUtf8(s.message()));
    ModelInferResponse* r = answer.mutable_infer_response();
    r->set_model_name(facts.model_name);
    if (!facts.model_name.empty()) r->set_model_version(kserve::kModelVersion);
    r->set_id(facts.message_id);
    (*r->mutable_parameters())[kFinalResponse].set_bool_param(true);
    return SerializeMessage(answer, out);
  };
  return {std::move(unary), std::move(stream)};
}

}  // namespace posenc::server
