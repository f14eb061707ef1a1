#include "kserve/service.h"

#include <algorithm>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/utf8.h"
#include "kserve/log_settings.h"
#include "kserve/models.h"
#include "kserve/trace_settings.h"
#include "posenc/status_macros.h"
#include "rpc/logging.h"
#include "rpc/messages.h"
#include "spdlog/spdlog.h"

#ifndef POSENC_VERSION
#define POSENC_VERSION "dev"
#endif

namespace posenc::server {
namespace {

using inference::ModelReadyRequest;

// How long unregistering waits for the requests using a region.
absl::Time UnregisterDeadline(const MethodCall& call) {
  return std::min(call.deadline, absl::Now() + absl::Seconds(30));
}

bool ServerReadyNow(const Engine& engine) { return !engine.draining() && engine.Ready().ok(); }

absl::Status NoSuchRepository(const std::string& name) {
  return absl::NotFoundError(
      absl::StrCat("no repository \"", Utf8Prefix(name, 64),
                   "\"; posenc has one (repository_name \"\"): built-in models and --model_dir"));
}

}  // namespace

KServeService::KServeService(Engine* engine, kserve::ModelRepositoryOptions models)
    : engine_(engine), models_(kserve::ModelRegistry(std::move(models))) {
  ReloadModels().IgnoreError();  // nothing runs beside the first
}

absl::Status KServeService::ReloadModels(absl::string_view load) {
  POSENC_RETURN_IF_ERROR(models_.Reload([this] { return engine_->draining(); }, load));
  std::shared_ptr<const kserve::ModelSet> set = models_.Snapshot();
  if (set->dir().empty()) return absl::OkStatus();
  spdlog::info("model_dir '{}': {} models loaded, {} skipped", set->dir(),
               set->models().size() - kserve::BuiltInModels().size(), set->skipped().size());
  for (const kserve::SkippedModel& m : set->skipped()) spdlog::warn("model skipped: {}", m.reason);
  return absl::OkStatus();
}

std::vector<Method> KServeService::Methods() {
  std::vector<Method> methods = InferMethods();
  for (Method& m : ControlMethods()) methods.push_back(std::move(m));
  return methods;
}

std::vector<Method> KServeService::ControlMethods() {
  using namespace inference;  // NOLINT: the protocol's message names, many
  std::vector<Method> m;
  m.push_back(ControlMethod<ServerLiveRequest, ServerLiveResponse>(
      kKServeService, "ServerLive",
      [](MethodCall&, const ServerLiveRequest&, ServerLiveResponse* resp) {
        resp->set_live(true);
        return absl::OkStatus();
      }));
  m.push_back(ControlMethod<ServerReadyRequest, ServerReadyResponse>(
      kKServeService, "ServerReady",
      [this](MethodCall&, const ServerReadyRequest&, ServerReadyResponse* resp) {
        resp->set_ready(ServerReadyNow(*engine_));
        return absl::OkStatus();
      }));
  m.push_back(ControlMethod<ModelReadyRequest, ModelReadyResponse>(
      kKServeService, "ModelReady",
      [this](MethodCall&, const ModelReadyRequest& req, ModelReadyResponse* resp) -> absl::Status {
        std::shared_ptr<const kserve::ModelSet> set = models_.Snapshot();
        absl::StatusOr<std::shared_ptr<const kserve::Model>> model =
            set->Find(req.name(), req.version());
        // A model whose file did not load is known but not ready (as Triton
        // answers for an UNAVAILABLE model); RepositoryIndex gives the reason.
        if (absl::IsNotFound(model.status()) && set->FindSkipped(req.name()) != nullptr) {
          resp->set_ready(false);
          return absl::OkStatus();
        }
        if (!model.ok()) return model.status();
        resp->set_ready(ServerReadyNow(*engine_));
        return absl::OkStatus();
      }));
  m.push_back(ControlMethod<ServerMetadataRequest, ServerMetadataResponse>(
      kKServeService, "ServerMetadata",
      [this](MethodCall&, const ServerMetadataRequest&, ServerMetadataResponse* resp) {
        resp->set_name("posenc");
        resp->set_version(POSENC_VERSION);
        for (const char* e :
             {"model_configuration", "model_repository", "model_repository(unload_dependents)",
              "statistics", "parameters", "logging", "trace"}) {
          resp->add_extensions(e);
        }
        if (shared_memory().enabled()) resp->add_extensions("system_shared_memory");
        if (shared_memory().cuda_enabled()) resp->add_extensions("cuda_shared_memory");
        return absl::OkStatus();
      }));
  m.push_back(ControlMethod<ModelMetadataRequest, ModelMetadataResponse>(
      kKServeService, "ModelMetadata",
      [this](MethodCall&, const ModelMetadataRequest& req,
             ModelMetadataResponse* resp) -> absl::Status {
        POSENC_ASSIGN_OR_RETURN(auto model, models_.Snapshot()->Find(req.name(), req.version()));
        *resp = kserve::MetadataOf(*model);
        return absl::OkStatus();
      }));
  m.push_back(ControlMethod<ModelConfigRequest, ModelConfigResponse>(
      kKServeService, "ModelConfig",
      [this](MethodCall&, const ModelConfigRequest& req,
             ModelConfigResponse* resp) -> absl::Status {
        POSENC_ASSIGN_OR_RETURN(auto model, models_.Snapshot()->Find(req.name(), req.version()));
        *resp->mutable_config() = kserve::ConfigOf(*model);
        return absl::OkStatus();
      }));
  m.push_back(ControlMethod<ModelStatisticsRequest, ModelStatisticsResponse>(
      kKServeService, "ModelStatistics",
      [this](MethodCall&, const ModelStatisticsRequest& req,
             ModelStatisticsResponse* resp) -> absl::Status {
        std::shared_ptr<const kserve::ModelSet> set = models_.Snapshot();
        if (!req.name().empty())
          POSENC_RETURN_IF_ERROR(set->Find(req.name(), req.version()).status());
        std::vector<std::string> names;
        for (const auto& model : set->models()) names.push_back(model->name);
        statistics_.Fill(req.name(), names, resp);
        return absl::OkStatus();
      }));
  m.push_back(ControlMethod<RepositoryIndexRequest, RepositoryIndexResponse>(
      kKServeService, "RepositoryIndex",
      [this](MethodCall&, const RepositoryIndexRequest& req,
             RepositoryIndexResponse* resp) -> absl::Status {
        if (!req.repository_name().empty()) return NoSuchRepository(req.repository_name());
        std::shared_ptr<const kserve::ModelSet> set = models_.Snapshot();
        for (const auto& model : set->models()) {
          RepositoryIndexResponse::ModelIndex* i = resp->add_models();
          i->set_name(model->name);
          i->set_version(kserve::kModelVersion);
          i->set_state("READY");
        }
        if (req.ready()) return absl::OkStatus();  // only the ready ones
        for (const kserve::SkippedModel& skipped : set->skipped()) {
          RepositoryIndexResponse::ModelIndex* i = resp->add_models();
          i->set_name(skipped.name);
          i->set_state("UNAVAILABLE");
          i->set_reason(skipped.reason);
        }
        return absl::OkStatus();
      }));
  // Rescans --model_dir: file I/O, so on the executor. OK when the named
  // model is ready afterwards.
  m.push_back(ControlMethod<RepositoryModelLoadRequest, RepositoryModelLoadResponse>(
      kKServeService, "RepositoryModelLoad",
      [this](MethodCall&, const RepositoryModelLoadRequest& req,
             RepositoryModelLoadResponse*) -> absl::Status {
        if (!req.repository_name().empty()) return NoSuchRepository(req.repository_name());
        if (!req.parameters().empty()) {
          return absl::InvalidArgumentError(
              absl::StrCat("parameter \"", Utf8Prefix(req.parameters().begin()->first, 64),
                           "\": posenc loads models only from the files of --model_dir (no "
                           "config or file overrides)"));
        }
        // Refused while two reloads are under way; abandoned by a drain, it
        // answers from the models as they stand, as before.
        if (absl::Status s = ReloadModels(req.model_name());
            s.code() == absl::StatusCode::kResourceExhausted) {
          return s;
        }
        std::shared_ptr<const kserve::ModelSet> set = models_.Snapshot();
        if (const kserve::SkippedModel* skipped = set->FindSkipped(req.model_name());
            skipped != nullptr) {
          return absl::InvalidArgumentError(absl::StrCat("model ", Utf8Prefix(req.model_name(), 64),
                                                         " did not load: ", skipped->reason));
        }
        return set->Find(req.model_name(), "").status();
      },
      Method::Kind::kControlIo));
  // Takes a --model_dir model out of service until RepositoryModelLoad
  // names it; a model that is not loaded: nothing, as Triton.
  m.push_back(ControlMethod<RepositoryModelUnloadRequest, RepositoryModelUnloadResponse>(
      kKServeService, "RepositoryModelUnload",
      [this](MethodCall& call, const RepositoryModelUnloadRequest& req,
             RepositoryModelUnloadResponse*) -> absl::Status {
        if (!req.repository_name().empty()) return NoSuchRepository(req.repository_name());
        for (const auto& [name, value] : req.parameters()) {
          if (name != "unload_dependents" ||
              value.parameter_choice_case() != ModelRepositoryParameter::kBoolParam) {
            return absl::InvalidArgumentError(
                absl::StrCat("parameter \"", Utf8Prefix(name, 64),
                             "\": unload takes unload_dependents (a bool_param) alone"));
          }
        }
        if (req.model_name().empty()) {
          return absl::InvalidArgumentError("model_name: give the model to unload");
        }
        POSENC_ASSIGN_OR_RETURN(const bool unloaded, models_.Unload(req.model_name()));
        if (unloaded) {
          LogWithFields(
              spdlog::level::info,
              absl::StrCat("model ", Utf8Prefix(req.model_name(), 64), " unloaded by ",
                           CleanRequestId(call.peer)),
              {{"request_id", call.caller.request_id}, {"trace_id", call.caller.trace_id}});
        }
        return absl::OkStatus();
      }));
  m.push_back(ControlMethod<TraceSettingRequest, TraceSettingResponse>(
      kKServeService, "TraceSetting",
      [](MethodCall& call, const TraceSettingRequest& req,
         TraceSettingResponse* resp) -> absl::Status {
        POSENC_ASSIGN_OR_RETURN(
            TraceConfig config,
            kserve::UpdateTraceSettings(req.settings(), req.model_name(), call.peer, call.caller));
        kserve::DescribeTraceConfig(config, resp);
        return absl::OkStatus();
      }));
  m.push_back(ControlMethod<LogSettingsRequest, LogSettingsResponse>(
      kKServeService, "LogSettings",
      [](MethodCall& call, const LogSettingsRequest& req,
         LogSettingsResponse* resp) -> absl::Status {
        POSENC_ASSIGN_OR_RETURN(kserve::LogState state,
                                kserve::UpdateLogSettings(req.settings(), call.peer, call.caller));
        kserve::DescribeLogState(state, resp);
        return absl::OkStatus();
      }));
  m.push_back(ControlMethod<SystemSharedMemoryStatusRequest, SystemSharedMemoryStatusResponse>(
      kKServeService, "SystemSharedMemoryStatus",
      [this](MethodCall&, const SystemSharedMemoryStatusRequest& req,
             SystemSharedMemoryStatusResponse* resp) -> absl::Status {
        POSENC_ASSIGN_OR_RETURN(auto regions, shared_memory().Status(req.name()));
        for (const auto& r : regions) {
          auto& status = (*resp->mutable_regions())[r->name()];
          status.set_name(r->name());
          status.set_key(r->key());
          status.set_offset(static_cast<uint64_t>(r->offset()));
          status.set_byte_size(static_cast<uint64_t>(r->byte_size()));
        }
        return absl::OkStatus();
      }));
  m.push_back(ControlMethod<SystemSharedMemoryRegisterRequest, SystemSharedMemoryRegisterResponse>(
      kKServeService, "SystemSharedMemoryRegister",
      [this](MethodCall& call, const SystemSharedMemoryRegisterRequest& req,
             SystemSharedMemoryRegisterResponse*) {
        return shared_memory().Register(req.name(), req.key(), req.offset(), req.byte_size(),
                                        call.peer);
      },
      // It opens and maps the object, and with a GPU pins its pages
      // (cudaHostRegister, slow for large regions): on the executor.
      Method::Kind::kControlIo));
  // Waits until no request uses the region (up to the call's deadline, or
  // 30 s): on the executor, never on gRPC's threads.
  m.push_back(
      ControlMethod<SystemSharedMemoryUnregisterRequest, SystemSharedMemoryUnregisterResponse>(
          kKServeService, "SystemSharedMemoryUnregister",
          [this](MethodCall& call, const SystemSharedMemoryUnregisterRequest& req,
                 SystemSharedMemoryUnregisterResponse*) {
            return shared_memory().Unregister(req.name(), UnregisterDeadline(call));
          },
          Method::Kind::kControlIo));
  m.push_back(ControlMethod<CudaSharedMemoryStatusRequest, CudaSharedMemoryStatusResponse>(
      kKServeService, "CudaSharedMemoryStatus",
      [this](MethodCall&, const CudaSharedMemoryStatusRequest& req,
             CudaSharedMemoryStatusResponse* resp) -> absl::Status {
        POSENC_ASSIGN_OR_RETURN(auto regions,
                                shared_memory().Status(req.name(), MemoryKind::kCuda));
        for (const auto& r : regions) {
          auto& status = (*resp->mutable_regions())[r->name()];
          status.set_name(r->name());
          status.set_device_id(static_cast<uint64_t>(r->device_id()));
          status.set_byte_size(static_cast<uint64_t>(r->byte_size()));
        }
        return absl::OkStatus();
      }));
  // Opening a handle maps device memory: on the executor.
  m.push_back(ControlMethod<CudaSharedMemoryRegisterRequest, CudaSharedMemoryRegisterResponse>(
      kKServeService, "CudaSharedMemoryRegister",
      [this](MethodCall& call, const CudaSharedMemoryRegisterRequest& req,
             CudaSharedMemoryRegisterResponse*) {
        return shared_memory().RegisterCuda(req.name(), req.raw_handle(), req.device_id(),
                                            req.byte_size(), call.peer);
      },
      Method::Kind::kControlIo));
  m.push_back(ControlMethod<CudaSharedMemoryUnregisterRequest, CudaSharedMemoryUnregisterResponse>(
      kKServeService, "CudaSharedMemoryUnregister",
      [this](MethodCall& call, const CudaSharedMemoryUnregisterRequest& req,
             CudaSharedMemoryUnregisterResponse*) {
        return shared_memory().Unregister(req.name(), UnregisterDeadline(call), MemoryKind::kCuda);
      },
      Method::Kind::kControlIo));
  return m;
}

}  // namespace posenc::server
