#include "kserve/service.h"

#include <chrono>
#include <optional>

#include "absl/strings/str_cat.h"
#include "rpc/call_support.h"
#include "rpc/status.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "kserve/infer.h"
#include "kserve/models.h"
#include "posenc/status_macros.h"
#include "spdlog/spdlog.h"
#include "rpc/large_fields.h"

#ifndef POSENC_VERSION
#define POSENC_VERSION "dev"
#endif

namespace posenc::server {
namespace {

using Clock = std::chrono::steady_clock;
using inference::ModelInferRequest;
using inference::ModelInferResponse;
using inference::ModelStreamInferResponse;

int64_t NanosSince(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t).count();
}

// A small control-plane call, answered on the calling thread.
template <typename Response, typename Fn>
grpc::ServerUnaryReactor* Answer(const char* method, Metrics* metrics,
                                 grpc::CallbackServerContext* ctx, Response* resp, Fn fn) {
  const auto start = Clock::now();
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::Status s = CheckCallAlive(ctx);
  if (s.ok()) s = NoThrow(fn);
  LogFailure(method, s);
  RecordCall(metrics, method, s, start, 0, static_cast<int64_t>(resp->ByteSizeLong()), "");
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

bool ServerReadyNow(const Engine& engine) { return !engine.draining() && engine.Ready().ok(); }

// Serialises an answer, handing its raw outputs to gRPC without a copy
// (the answer is left without them). Empty outputs keep their place only
// through protobuf's own encoding, so an answer with one goes whole (as
// does one mixing outputs in shared memory, whose entries are empty, with
// outputs in the answer: a copy of the latter).
absl::Status SerializeAnswer(ModelInferResponse& resp, grpc::ByteBuffer* out) {
  bool all_nonempty = true;
  for (const std::string& raw : resp.raw_output_contents()) all_nonempty &= !raw.empty();
  std::vector<std::string> contents;
  if (all_nonempty) {
    for (std::string& raw : *resp.mutable_raw_output_contents()) contents.push_back(std::move(raw));
    resp.clear_raw_output_contents();
  }
  std::string head;
  if (!resp.SerializeToString(&head)) return absl::InternalError("could not serialise the answer");
  std::vector<LargeField> large;
  for (std::string& c : contents) large.push_back({6, &c});  // raw_output_contents
  *out = BufferWithLargeFields(head, large);
  return absl::OkStatus();
}

absl::Status ParseRequest(const grpc::ByteBuffer& in, ModelInferRequest* req) {
  grpc::ByteBuffer shared = in;  // shares the slices; nothing is copied
  grpc::ProtoBufferReader reader(&shared);
  if (!reader.status().ok() || !req->ParseFromZeroCopyStream(&reader)) {
    return absl::InvalidArgumentError("the request is not a valid inference.ModelInferRequest");
  }
  return absl::OkStatus();
}

// Runs a parsed request on an admitted call; records statistics.
absl::Status Infer(KServeService::Shared& shared, ModelInferRequest* req, ModelInferResponse* resp,
                   const RunContext& ctx, Engine::Admission& admission, Clock::time_point start,
                   std::string* backend, kserve::ShmTraffic* shm_bytes) {
  const auto compute_start = Clock::now();
  // The model as of now; a reload meanwhile does not change this call's.
  absl::StatusOr<std::shared_ptr<const kserve::Model>> model =
      shared.models.Snapshot()->Find(req->model_name(), req->model_version());
  absl::Status s = model.status();
  if (s.ok()) {
    s = NoThrow([&] {
      return kserve::RunInfer(*shared.engine, **model, req, resp, ctx, admission, backend,
                              &shared.shared_memory, shm_bytes);
    });
  }
  if (model.ok()) {
    const int64_t compute_ns = NanosSince(compute_start);
    shared.statistics.Record((*model)->name, s.ok(), NanosSince(start),
                             NanosSince(start) - compute_ns, compute_ns);
  }
  return s;
}

// ModelStreamInfer: requests answered in order on one call, which holds one
// admission slot for its life and reserves each request's bytes before
// running it. A failed request is answered with error_message and the
// stream goes on (as Triton does); cancellation, deadlines and a drain end
// it.
class StreamCall final
    : public grpc::ServerBidiReactor<ModelInferRequest, ModelStreamInferResponse> {
 public:
  StreamCall(KServeService::Shared& shared, grpc::CallbackServerContext* ctx)
      : shared_(shared), ctx_(ctx) {
    absl::StatusOr<Engine::Admission> ticket = shared_.engine->admission().Enter();
    if (!ticket.ok()) {
      LogFailure("ModelStreamInfer", ticket.status());
      Finish(ToGrpcStatus(ticket.status()));
      return;
    }
    ticket_.emplace(std::move(*ticket));
    StartRead(&request_);
  }

  void OnCancel() override {
    if (ticket_) ticket_->CancelWait(absl::CancelledError("the caller cancelled the call"));
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the caller half-closed (or left)
      End(grpc::Status::OK);
      return;
    }
    start_ = Clock::now();
    bytes_in_ = static_cast<int64_t>(request_.ByteSizeLong());
    shm_bytes_ = {};
    // The parsed request, and its answer's serialised copy.
    ticket_->Reserve(2 * bytes_in_, DeadlineOf(ctx_), [this](absl::Status s) {
      if (!s.ok()) {
        Answer(s);
        return;
      }
      busy_ = true;
      shared_.busy.fetch_add(1);
      s = NoThrow([this] {
        shared_.executor->Submit([this] { Run(); });
        return absl::OkStatus();
      });
      if (!s.ok()) Answer(s);
    });
  }

  void OnWriteDone(bool ok) override {
    NotBusy();
    answer_.Clear();
    request_.Clear();
    ticket_->Shrink(ticket_->bytes());
    if (!ok) {
      End(grpc::Status(grpc::StatusCode::CANCELLED, "stream write failed: the caller left"));
      return;
    }
    StartRead(&request_);
  }

  void OnDone() override {
    NotBusy();
    delete this;
  }

 private:
  void NotBusy() {
    if (busy_) shared_.busy.fetch_sub(1);
    busy_ = false;
  }

  // Finishes the stream, giving its slot back at once (see
  // AdmissionControl::Ticket::ReleaseSlot); its bytes go in OnDone.
  void End(const grpc::Status& status) {
    if (ticket_) ticket_->ReleaseSlot();
    Finish(status);
  }

  void Run() {
    backend_.clear();
    absl::Status s = CheckCallAlive(ctx_);
    if (s.ok()) {
      kserve::ShmTraffic shm;
      s = Infer(shared_, &request_, answer_.mutable_infer_response(), ContextOf(ctx_), *ticket_,
                start_, &backend_, &shm);
      shm_bytes_ = shm;
    }
    Answer(s);
  }

  void Answer(const absl::Status& s) {
    LogFailure("ModelStreamInfer", s);
    // Tensor bytes through shared memory count as the socket's would.
    RecordCall(shared_.metrics, "ModelStreamInfer", s, start_, bytes_in_ + shm_bytes_.in,
               static_cast<int64_t>(answer_.ByteSizeLong()) + shm_bytes_.out, backend_);
    if (!s.ok()) {
      if (s.code() == absl::StatusCode::kCancelled ||
          s.code() == absl::StatusCode::kDeadlineExceeded ||
          (s.code() == absl::StatusCode::kUnavailable && shared_.engine->draining())) {
        End(ToGrpcStatus(s));
        return;
      }
      answer_.Clear();
      answer_.set_error_message(std::string(s.message()));
      ModelInferResponse* r = answer_.mutable_infer_response();
      r->set_model_name(request_.model_name().substr(0, 256));
      r->set_id(request_.id().substr(0, 256));
    }
    StartWrite(&answer_);
  }

  KServeService::Shared& shared_;
  grpc::CallbackServerContext* ctx_;
  std::optional<Engine::Admission> ticket_;
  ModelInferRequest request_;
  ModelStreamInferResponse answer_;
  Clock::time_point start_ = Clock::now();
  int64_t bytes_in_ = 0;
  kserve::ShmTraffic shm_bytes_;
  std::string backend_;
  bool busy_ = false;  // from admission until the answer is written
};

// ModelInfer: admitted on arrival (a slot, then the request's bytes
// twice: the request gRPC holds and its parsed copy, whose buffers become
// the answer's), run on the executor, answered; the slot and bytes are
// released, and the call stops counting as busy, once the answer is sent.
class InferCall final : public grpc::ServerUnaryReactor {
 public:
  InferCall(KServeService* service, KServeService::Shared* shared, grpc::CallbackServerContext* ctx,
            const grpc::ByteBuffer* request, grpc::ByteBuffer* response)
      : service_(service),
        shared_(shared),
        ctx_(ctx),
        request_(request),
        response_(response),
        bytes_in_(static_cast<int64_t>(request->Length())) {
    absl::Status alive = CheckCallAlive(ctx_);
    absl::StatusOr<Engine::Admission> entered = alive.ok()
                                                    ? shared_->engine->admission().Enter()
                                                    : absl::StatusOr<Engine::Admission>(alive);
    if (!entered.ok()) {
      Complete(entered.status());
      return;
    }
    ticket_.emplace(std::move(*entered));
    ticket_->Reserve(2 * bytes_in_, DeadlineOf(ctx_), [this](absl::Status s) {
      if (!s.ok()) {
        Complete(s);
        return;
      }
      busy_ = true;
      shared_->busy.fetch_add(1);
      s = NoThrow([this] {
        shared_->executor->Submit([this] {
          absl::Status r = CheckCallAlive(ctx_);
          if (r.ok()) {
            r = service_->RunModelInfer(*request_, response_, ContextOf(ctx_), *ticket_, start_,
                                        &backend_, &shm_bytes_);
          }
          Complete(r);
        });
        return absl::OkStatus();
      });
      if (!s.ok()) Complete(s);
    });
  }

  void OnCancel() override {
    if (ticket_) ticket_->CancelWait(absl::CancelledError("the caller cancelled the call"));
  }

  void OnDone() override {
    if (busy_) shared_->busy.fetch_sub(1);
    delete this;  // releases the bytes (the slot went at Complete)
  }

 private:
  void Complete(const absl::Status& s) {
    LogFailure("ModelInfer", s);
    // Tensor bytes through shared memory count as the socket's would.
    RecordCall(shared_->metrics, "ModelInfer", s, start_, bytes_in_ + shm_bytes_.in,
               static_cast<int64_t>(response_->Length()) + shm_bytes_.out, backend_);
    if (ticket_) ticket_->ReleaseSlot();  // the answer is final; its bytes stay
    Finish(ToGrpcStatus(s));
  }

  KServeService* service_;
  KServeService::Shared* shared_;
  grpc::CallbackServerContext* ctx_;
  const grpc::ByteBuffer* request_;
  grpc::ByteBuffer* response_;
  const int64_t bytes_in_;
  const Clock::time_point start_ = Clock::now();
  std::optional<Engine::Admission> ticket_;
  std::string backend_;
  kserve::ShmTraffic shm_bytes_;
  bool busy_ = false;
};

}  // namespace

KServeService::KServeService(Engine* engine, Metrics* metrics, RequestExecutor* executor,
                             kserve::ModelRepositoryOptions models,
                             const SharedMemoryOptions& shared_memory)
    : shared_{engine,
              metrics,
              executor,
              {},
              kserve::ModelRegistry(std::move(models)),
              {0},
              SharedMemoryRegistry(shared_memory)} {
  ReloadModels();
}

void KServeService::ReloadModels() {
  if (!shared_.models.Reload([this] { return shared_.engine->draining(); })) return;
  std::shared_ptr<const kserve::ModelSet> set = shared_.models.Snapshot();
  if (set->dir().empty()) return;
  spdlog::info("model_dir '{}': {} models loaded, {} skipped", set->dir(),
               set->models().size() - kserve::BuiltInModels().size(), set->skipped().size());
  for (const kserve::SkippedModel& m : set->skipped()) spdlog::warn("model skipped: {}", m.reason);
}

grpc::ServerUnaryReactor* KServeService::ServerLive(grpc::CallbackServerContext* ctx,
                                                    const inference::ServerLiveRequest*,
                                                    inference::ServerLiveResponse* resp) {
  return Answer("ServerLive", shared_.metrics, ctx, resp, [&] {
    resp->set_live(true);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KServeService::ServerReady(grpc::CallbackServerContext* ctx,
                                                     const inference::ServerReadyRequest*,
                                                     inference::ServerReadyResponse* resp) {
  return Answer("ServerReady", shared_.metrics, ctx, resp, [&] {
    resp->set_ready(ServerReadyNow(*shared_.engine));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KServeService::ModelReady(grpc::CallbackServerContext* ctx,
                                                    const inference::ModelReadyRequest* req,
                                                    inference::ModelReadyResponse* resp) {
  return Answer("ModelReady", shared_.metrics, ctx, resp, [&]() -> absl::Status {
    std::shared_ptr<const kserve::ModelSet> set = shared_.models.Snapshot();
    absl::StatusOr<std::shared_ptr<const kserve::Model>> model =
        set->Find(req->name(), req->version());
    // A model whose file did not load is known but not ready (as Triton
    // answers for an UNAVAILABLE model); RepositoryIndex gives the reason.
    if (absl::IsNotFound(model.status()) && set->FindSkipped(req->name()) != nullptr) {
      resp->set_ready(false);
      return absl::OkStatus();
    }
    if (!model.ok()) return model.status();
    resp->set_ready(ServerReadyNow(*shared_.engine));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KServeService::ServerMetadata(grpc::CallbackServerContext* ctx,
                                                        const inference::ServerMetadataRequest*,
                                                        inference::ServerMetadataResponse* resp) {
  return Answer("ServerMetadata", shared_.metrics, ctx, resp, [&] {
    resp->set_name("posenc");
    resp->set_version(POSENC_VERSION);
    for (const char* e : {"model_configuration", "model_repository", "statistics", "parameters"}) {
      resp->add_extensions(e);
    }
    if (shared_.shared_memory.enabled()) resp->add_extensions("system_shared_memory");
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KServeService::ModelMetadata(grpc::CallbackServerContext* ctx,
                                                       const inference::ModelMetadataRequest* req,
                                                       inference::ModelMetadataResponse* resp) {
  return Answer("ModelMetadata", shared_.metrics, ctx, resp, [&]() -> absl::Status {
    absl::StatusOr<std::shared_ptr<const kserve::Model>> model =
        shared_.models.Snapshot()->Find(req->name(), req->version());
    if (!model.ok()) return model.status();
    *resp = kserve::MetadataOf(**model);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KServeService::ModelConfig(grpc::CallbackServerContext* ctx,
                                                     const inference::ModelConfigRequest* req,
                                                     inference::ModelConfigResponse* resp) {
  return Answer("ModelConfig", shared_.metrics, ctx, resp, [&]() -> absl::Status {
    absl::StatusOr<std::shared_ptr<const kserve::Model>> model =
        shared_.models.Snapshot()->Find(req->name(), req->version());
    if (!model.ok()) return model.status();
    *resp->mutable_config() = kserve::ConfigOf(**model);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KServeService::ModelStatistics(
    grpc::CallbackServerContext* ctx, const inference::ModelStatisticsRequest* req,
    inference::ModelStatisticsResponse* resp) {
  return Answer("ModelStatistics", shared_.metrics, ctx, resp, [&]() -> absl::Status {
    if (!req->name().empty()) {
      absl::StatusOr<std::shared_ptr<const kserve::Model>> model =
          shared_.models.Snapshot()->Find(req->name(), req->version());
      if (!model.ok()) return model.status();
    }
    std::vector<std::string> names;
    for (const auto& m : shared_.models.Snapshot()->models()) names.push_back(m->name);
    shared_.statistics.Fill(req->name(), names, resp);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KServeService::RepositoryIndex(
    grpc::CallbackServerContext* ctx, const inference::RepositoryIndexRequest* req,
    inference::RepositoryIndexResponse* resp) {
  return Answer("RepositoryIndex", shared_.metrics, ctx, resp, [&]() -> absl::Status {
    if (!req->repository_name().empty()) {
      return absl::NotFoundError(absl::StrCat(
          "no repository \"", absl::string_view(req->repository_name()).substr(0, 64),
          "\"; posenc has one (repository_name \"\"): built-in models and --model_dir"));
    }
    std::shared_ptr<const kserve::ModelSet> set = shared_.models.Snapshot();
    for (const auto& model : set->models()) {
      inference::RepositoryIndexResponse::ModelIndex* m = resp->add_models();
      m->set_name(model->name);
      m->set_version(kserve::kModelVersion);
      m->set_state("READY");
    }
    if (req->ready()) return absl::OkStatus();  // only the ready ones
    for (const kserve::SkippedModel& skipped : set->skipped()) {
      inference::RepositoryIndexResponse::ModelIndex* m = resp->add_models();
      m->set_name(skipped.name);
      m->set_state("UNAVAILABLE");
      m->set_reason(skipped.reason);
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KServeService::RepositoryModelLoad(
    grpc::CallbackServerContext* ctx, const inference::RepositoryModelLoadRequest* req,
    inference::RepositoryModelLoadResponse* resp) {
  const auto start = Clock::now();
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  auto finish = [this, reactor, start, resp](const absl::Status& s) {
    LogFailure("RepositoryModelLoad", s);
    RecordCall(shared_.metrics, "RepositoryModelLoad", s, start, 0,
               static_cast<int64_t>(resp->ByteSizeLong()), "");
    reactor->Finish(ToGrpcStatus(s));
  };
  absl::Status s = CheckCallAlive(ctx);
  if (s.ok() && !req->repository_name().empty()) {
    s = absl::NotFoundError(absl::StrCat(
        "no repository \"", absl::string_view(req->repository_name()).substr(0, 64), "\""));
  }
  if (s.ok() && !req->parameters().empty()) {
    s = absl::InvalidArgumentError(absl::StrCat(
        "parameter \"", absl::string_view(req->parameters().begin()->first).substr(0, 64),
        "\": posenc loads models only from the files of --model_dir (no config or file "
        "overrides)"));
  }
  if (!s.ok()) {
    finish(s);
    return reactor;
  }
  const std::string name = req->model_name();
  s = NoThrow([&] {
    shared_.executor->Submit([this, name, finish] {
      absl::Status r = NoThrow([&]() -> absl::Status {
        ReloadModels();
        std::shared_ptr<const kserve::ModelSet> set = shared_.models.Snapshot();
        if (const kserve::SkippedModel* skipped = set->FindSkipped(name); skipped != nullptr) {
          return absl::InvalidArgumentError(
              absl::StrCat("model ", name, " did not load: ", skipped->reason));
        }
        return set->Find(name, "").status();
      });
      finish(r);
    });
    return absl::OkStatus();
  });
  if (!s.ok()) finish(s);
  return reactor;
}

grpc::ServerUnaryReactor* KServeService::ModelInfer(grpc::CallbackServerContext* ctx,
                                                    const grpc::ByteBuffer* request,
                                                    grpc::ByteBuffer* response) {
  return new InferCall(this, &shared_, ctx, request, response);
}

grpc::ServerUnaryReactor* KServeService::SystemSharedMemoryStatus(
    grpc::CallbackServerContext* ctx, const inference::SystemSharedMemoryStatusRequest* req,
    inference::SystemSharedMemoryStatusResponse* resp) {
  return Answer("SystemSharedMemoryStatus", shared_.metrics, ctx, resp, [&]() -> absl::Status {
    POSENC_ASSIGN_OR_RETURN(auto regions, shared_.shared_memory.Status(req->name()));
    for (const auto& r : regions) {
      auto& status = (*resp->mutable_regions())[r->name()];
      status.set_name(r->name());
      status.set_key(r->key());
      status.set_offset(static_cast<uint64_t>(r->offset()));
      status.set_byte_size(static_cast<uint64_t>(r->byte_size()));
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KServeService::SystemSharedMemoryRegister(
    grpc::CallbackServerContext* ctx, const inference::SystemSharedMemoryRegisterRequest* req,
    inference::SystemSharedMemoryRegisterResponse* resp) {
  return Answer("SystemSharedMemoryRegister", shared_.metrics, ctx, resp, [&] {
    return shared_.shared_memory.Register(req->name(), req->key(), req->offset(), req->byte_size());
  });
}

grpc::ServerUnaryReactor* KServeService::SystemSharedMemoryUnregister(
    grpc::CallbackServerContext* ctx, const inference::SystemSharedMemoryUnregisterRequest* req,
    inference::SystemSharedMemoryUnregisterResponse* resp) {
  return Answer("SystemSharedMemoryUnregister", shared_.metrics, ctx, resp,
                [&] { return shared_.shared_memory.Unregister(req->name()); });
}

absl::Status KServeService::RunModelInfer(const grpc::ByteBuffer& request, grpc::ByteBuffer* answer,
                                          const RunContext& ctx, Engine::Admission& admission,
                                          Clock::time_point arrived, std::string* backend,
                                          kserve::ShmTraffic* shm_bytes) {
  return NoThrow([&] {
    ModelInferRequest req;
    POSENC_RETURN_IF_ERROR(ParseRequest(request, &req));
    ModelInferResponse resp;
    POSENC_RETURN_IF_ERROR(
        Infer(shared_, &req, &resp, ctx, admission, arrived, backend, shm_bytes));
    return SerializeAnswer(resp, answer);
  });
}

grpc::ServerBidiReactor<ModelInferRequest, ModelStreamInferResponse>*
KServeService::ModelStreamInfer(grpc::CallbackServerContext* ctx) {
  return new StreamCall(shared_, ctx);
}

}  // namespace posenc::server
