#include "rpc/call_router.h"

#include "absl/strings/str_cat.h"
#include "rpc/call_reactors.h"

namespace posenc::server {
namespace {

class Unimplemented final : public grpc::ServerGenericBidiReactor {
 public:
  explicit Unimplemented(const std::string& method) {
    Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                        absl::StrCat("method ", method, " is not served here")));
  }
  void OnDone() override { delete this; }
};

}  // namespace

CallRouter::CallRouter(const CallRouterOptions& options) { state_.options = options; }

void CallRouter::Add(std::vector<Method> methods) {
  for (Method& m : methods) {
    std::string path = m.path();
    methods_.insert_or_assign(std::move(path), std::move(m));
  }
}

const Method* CallRouter::Find(const std::string& path) const {
  const auto it = methods_.find(path);
  return it == methods_.end() ? nullptr : &it->second;
}

grpc::ServerGenericBidiReactor* CallRouter::CreateReactor(grpc::GenericCallbackServerContext* ctx) {
  const Method* m = Find(ctx->method());
  if (m == nullptr) return new Unimplemented(ctx->method());
  if (m->kind == Method::Kind::kTensorStream) return NewStreamCall(*m, state_, ctx);
  return NewUnaryCall(*m, state_, ctx);
}

}  // namespace posenc::server
