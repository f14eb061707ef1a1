#include "v1/service.h"

#include "rpc/messages.h"
#include "spdlog/spdlog.h"
#include "v1/operations.h"
#include "v1/tensor_methods.h"

namespace posenc::server {
namespace {

template <typename Request, typename Response>
Method Control(const char* name, Method::Kind kind,
               std::function<absl::Status(MethodCall&, const Request&, Response*)> work) {
  Method m;
  m.service = kPositionalEncodingService;
  m.name = name;
  m.kind = kind;
  m.run = Answering<Request, Response>(std::move(work));
  return m;
}

}  // namespace

std::vector<Method> PositionalEncodingService::Methods() const {
  Engine* engine = engine_;
  std::vector<Method> methods = TensorMethods(engine);
  methods.push_back(Control<v1::ListTablesRequest, v1::ListTablesResponse>(
      "ListTables", Method::Kind::kControl,
      [engine](MethodCall&, const v1::ListTablesRequest&, v1::ListTablesResponse* resp) {
        *resp = server::ListTables(*engine);
        return absl::OkStatus();
      }));
  // Reads the table files: on the executor, never on gRPC's threads.
  methods.push_back(Control<v1::ReloadTablesRequest, v1::ListTablesResponse>(
      "ReloadTables", Method::Kind::kControlIo,
      [engine](MethodCall&, const v1::ReloadTablesRequest&, v1::ListTablesResponse* resp) {
        engine->ReloadTables();
        *resp = server::ListTables(*engine);
        spdlog::info("tables reloaded: {} loaded, {} skipped", resp->tables_size(),
                     resp->skipped_size());
        return absl::OkStatus();
      }));
  methods.push_back(Control<v1::GetServerInfoRequest, v1::ServerInfo>(
      "GetServerInfo", Method::Kind::kControl,
      [engine](MethodCall&, const v1::GetServerInfoRequest&, v1::ServerInfo* resp) {
        *resp = server::GetServerInfo(*engine);
        return absl::OkStatus();
      }));
  return methods;
}

}  // namespace posenc::server
