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
      [engine](MethodCall&, const v1::ReloadTablesRequest&, v1::ListTablesResponse* resp) {
        engine->ReloadTables();
        *resp = server::ListTables(*engine);
        spdlog::info("tables reloaded: {} loaded, {} skipped", resp->tables_size(),
                     resp->skipped_size());
        return absl::OkStatus();
      },
      Method::Kind::kControlIo));
  methods.push_back(ControlMethod<v1::GetServerInfoRequest, v1::ServerInfo>(
      kPositionalEncodingService, "GetServerInfo",
      [engine](MethodCall&, const v1::GetServerInfoRequest&, v1::ServerInfo* resp) {
        *resp = server::GetServerInfo(*engine);
        return absl::OkStatus();
      }));
  // Shared memory, the registry KServe's SystemSharedMemory* methods use too.
  const auto status_of = [engine](absl::string_view name,
                                  v1::SharedMemoryStatus* resp) -> absl::Status {
    POSENC_ASSIGN_OR_RETURN(auto regions, engine->shared_memory().Status(name));
    for (const auto& r : regions) {
      v1::SharedMemoryRegion* out = resp->add_regions();
      out->set_name(r->name());
      out->set_key(r->key());
      out->set_offset(static_cast<uint64_t>(r->offset()));
      out->set_byte_size(static_cast<uint64_t>(r->byte_size()));
    }
    return absl::OkStatus();
  };
  methods.push_back(ControlMethod<v1::RegisterSharedMemoryRequest, v1::SharedMemoryStatus>(
      kPositionalEncodingService, "RegisterSharedMemory",
      [engine, status_of](MethodCall& call, const v1::RegisterSharedMemoryRequest& req,
                          v1::SharedMemoryStatus* resp) -> absl::Status {
        POSENC_RETURN_IF_ERROR(engine->shared_memory().Register(req.name(), req.key(), req.offset(),
                                                                req.byte_size(), call.peer));
        return status_of(req.name(), resp);
      }));
  // Waits until no request uses the region (up to the call's deadline, or
  // 30 s): on the executor, never on gRPC's threads.
  methods.push_back(ControlMethod<v1::UnregisterSharedMemoryRequest, v1::SharedMemoryStatus>(
      kPositionalEncodingService, "UnregisterSharedMemory",
      [engine](MethodCall& call, const v1::UnregisterSharedMemoryRequest& req,
               v1::SharedMemoryStatus*) {
        return engine->shared_memory().Unregister(
            req.name(), std::min(call.deadline, absl::Now() + absl::Seconds(30)));
      },
      Method::Kind::kControlIo));
  methods.push_back(ControlMethod<v1::SharedMemoryStatusRequest, v1::SharedMemoryStatus>(
      kPositionalEncodingService, "GetSharedMemoryStatus",
      [status_of](MethodCall&, const v1::SharedMemoryStatusRequest& req,
                  v1::SharedMemoryStatus* resp) { return status_of(req.name(), resp); }));
  return methods;
}

}  // namespace posenc::server
