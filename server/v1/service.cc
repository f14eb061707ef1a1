#include "v1/service.h"

#include <algorithm>

#include "absl/time/clock.h"
#include "posenc/status_macros.h"
#include "rpc/messages.h"
#include "spdlog/spdlog.h"
#include "v1/operations.h"
#include "v1/tensor_methods.h"

namespace posenc::server {

std::vector<Method> PositionalEncodingService::Methods() const {
  Engine* engine = engine_;
  std::vector<Method> methods = TensorMethods(engine);
  methods.push_back(ControlMethod<v1::ListTablesRequest, v1::ListTablesResponse>(
      kPositionalEncodingService, "ListTables",
      [engine](MethodCall&, const v1::ListTablesRequest&, v1::ListTablesResponse* resp) {
        *resp = server::ListTables(*engine);
        return absl::OkStatus();
      }));
  // Reads the table files: on the executor, never on gRPC's threads.
  methods.push_back(ControlMethod<v1::ReloadTablesRequest, v1::ListTablesResponse>(
      kPositionalEncodingService, "ReloadTables",
      [engine](MethodCall&, const v1::ReloadTablesRequest&,
               v1::ListTablesResponse* resp) -> absl::Status {
        // Refused while two reloads are under way; abandoned by a drain,
        // it answers the tables as they stand, as before.
        if (absl::Status s = engine->ReloadTables();
            s.code() == absl::StatusCode::kResourceExhausted) {
          return s;
        }
        *resp = server::ListTables(*engine);
        spdlog::info("tables reloaded: {} loaded, {} skipped", resp->tables_size(),
                     resp->skipped_size());
        return absl::OkStatus();
      },
      Method::Kind::kControlIo));
  methods.push_back(ControlMethod<v1::GetServerInfoRequest, v1::ServerInfo>(
      kPositionalEncodingService, "GetServerInfo",
      [engine, transport = transport_bytes_](MethodCall&, const v1::GetServerInfoRequest&,
                                             v1::ServerInfo* resp) {
        *resp = server::GetServerInfo(*engine, transport);
        return absl::OkStatus();
      }));
  // Shared memory, the registry KServe's SystemSharedMemory* methods use too.
  const auto status_of = [engine](absl::string_view name,
                                  v1::SharedMemoryStatus* resp) -> absl::Status {
    SharedMemoryRegistry& registry = engine->shared_memory();
    // Both kinds, those served: a name of either kind is found.
    bool found = false;
    absl::Status first = absl::OkStatus();
    for (MemoryKind kind : {MemoryKind::kSystem, MemoryKind::kCuda}) {
      auto regions = registry.Status(name, kind);
      if (!regions.ok()) {
        if (first.ok()) first = regions.status();
        continue;
      }
      found = true;
      for (const auto& r : *regions) {
        v1::SharedMemoryRegion* out = resp->add_regions();
        out->set_name(r->name());
        out->set_key(r->key());
        out->set_offset(static_cast<uint64_t>(r->offset()));
        out->set_byte_size(static_cast<uint64_t>(r->byte_size()));
        out->set_cuda(r->on_device());
        if (r->on_device()) out->set_cuda_device(r->device_id());
      }
    }
    // Neither kind served (their errors say how to enable), or the name is
    // of neither (NOT_FOUND from the kind that is served).
    return found && (name.empty() || resp->regions_size() > 0) ? absl::OkStatus() : first;
  };
  methods.push_back(ControlMethod<v1::RegisterSharedMemoryRequest, v1::SharedMemoryStatus>(
      kPositionalEncodingService, "RegisterSharedMemory",
      [engine, status_of](MethodCall& call, const v1::RegisterSharedMemoryRequest& req,
                          v1::SharedMemoryStatus* resp) -> absl::Status {
        SharedMemoryRegistry& registry = engine->shared_memory();
        if (!req.cuda_handle().empty()) {
          if (!req.key().empty() || req.offset() != 0) {
            return absl::InvalidArgumentError(
                "a region is either a /dev/shm object (key, offset) or a CUDA allocation "
                "(cuda_handle), not both");
          }
          POSENC_RETURN_IF_ERROR(registry.RegisterCuda(
              req.name(), req.cuda_handle(), req.cuda_device(), req.byte_size(), call.peer));
        } else {
          POSENC_RETURN_IF_ERROR(
              registry.Register(req.name(), req.key(), req.offset(), req.byte_size(), call.peer));
        }
        return status_of(req.name(), resp);
      },
      // It opens and maps the object, and with a GPU pins its pages
      // (cudaHostRegister, slow for large regions): on the executor, never
      // on gRPC's threads.
      Method::Kind::kControlIo));
  // Waits until no request uses the region (up to the call's deadline, or
  // 30 s): on the executor, never on gRPC's threads.
  methods.push_back(ControlMethod<v1::UnregisterSharedMemoryRequest, v1::SharedMemoryStatus>(
      kPositionalEncodingService, "UnregisterSharedMemory",
      [engine](MethodCall& call, const v1::UnregisterSharedMemoryRequest& req,
               v1::SharedMemoryStatus*) -> absl::Status {
        SharedMemoryRegistry& registry = engine->shared_memory();
        const absl::Time deadline = std::min(call.deadline, absl::Now() + absl::Seconds(30));
        if (!registry.enabled() && !registry.cuda_enabled()) {
          return registry.Unregister(req.name(), deadline);  // says how to enable
        }
        for (MemoryKind kind : {MemoryKind::kSystem, MemoryKind::kCuda}) {
          if (kind == MemoryKind::kSystem ? !registry.enabled() : !registry.cuda_enabled()) {
            continue;
          }
          POSENC_RETURN_IF_ERROR(registry.Unregister(req.name(), deadline, kind));
        }
        return absl::OkStatus();
      },
      Method::Kind::kControlIo));
  methods.push_back(ControlMethod<v1::SharedMemoryStatusRequest, v1::SharedMemoryStatus>(
      kPositionalEncodingService, "GetSharedMemoryStatus",
      [status_of](MethodCall&, const v1::SharedMemoryStatusRequest& req,
                  v1::SharedMemoryStatus* resp) { return status_of(req.name(), resp); }));
  return methods;
}

}  // namespace posenc::server
