#include "v1/service.h"

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
  return methods;
}

}  // namespace posenc::server
