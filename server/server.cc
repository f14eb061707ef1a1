#include "server.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "posenc/status_macros.h"

namespace posenc::server {

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options) {
  std::unique_ptr<Server> s(new Server());
  EngineOptions engine_options = options.engine;
  engine_options.max_message_bytes = options.max_message_bytes;
  POSENC_ASSIGN_OR_RETURN(s->engine_, Engine::Create(engine_options));
  s->service_ = std::make_unique<PositionalEncodingService>(s->engine_.get());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen_address, grpc::InsecureServerCredentials(), &s->port_);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  if (options.max_connection_age_ms > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, options.max_connection_age_ms);
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS, 30000);
  }
  builder.RegisterService(s->service_.get());
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("could not listen on ", options.listen_address, " (address in use?)"));
  }
  grpc::HealthCheckServiceInterface* health = s->server_->GetHealthCheckService();
  health->SetServingStatus(kLivenessService, true);
  health->SetServingStatus(kReadinessService, true);
  health->SetServingStatus(true);
  return s;
}

void Server::Shutdown(absl::Duration deadline) {
  if (shut_down_) return;
  shut_down_ = true;
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  health->SetServingStatus(kReadinessService, false);
  health->SetServingStatus("", false);
  engine_->StartDraining();
  server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(deadline));
}

Server::~Server() {
  if (server_ != nullptr) {
    Shutdown(absl::ZeroDuration());
    server_->Wait();
  }
}

}  // namespace posenc::server
