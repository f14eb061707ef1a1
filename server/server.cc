#include "server.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "grpc/health/v1/health.pb.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "posenc/status_macros.h"
#include "rpc/call_log.h"
#include "spdlog/spdlog.h"

namespace posenc::server {

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options) {
  POSENC_RETURN_IF_ERROR(options.Validate());
  EngineOptions engine_options = options.engine;
  if (!engine_options.warn) {
    engine_options.warn = [](absl::string_view m) { spdlog::warn("{}", std::string(m)); };
  }
  POSENC_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(engine_options));
  return StartWith(options, std::move(engine));
}

absl::StatusOr<std::unique_ptr<Server>> Server::StartWith(const ServerOptions& options,
                                                          std::unique_ptr<Engine> engine) {
  POSENC_RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<Server> s(new Server());
  SetSlowCallThreshold(absl::Milliseconds(options.slow_call_ms));
  s->engine_ = std::move(engine);
  const int64_t max_message_bytes = options.engine.message_limit();
  if (!options.metrics_listen.empty()) {
    POSENC_ASSIGN_OR_RETURN(
        s->metrics_,
        Metrics::Start(options.metrics_listen, s->engine_.get(),
                       options.memory_limit.has_value() ? options.memory_limit->bytes : 0));
  }
  const int request_threads =
      options.request_threads > 0 ? options.request_threads : std::max(2, UsableCpus());
  s->executor_ = std::make_unique<RequestExecutor>(request_threads);
  s->v1_ = std::make_unique<PositionalEncodingService>(s->engine_.get(),
                                                       options.transport_memory_limit());
  s->kserve_ = std::make_unique<KServeService>(s->engine_.get(), options.models);
  s->router_ = std::make_unique<CallRouter>(CallRouterOptions{
      s->engine_.get(), s->metrics_.get(), s->executor_.get(), max_message_bytes});
  s->router_->Add(s->v1_->Methods());
  s->router_->Add(s->kserve_->Methods());
  s->reflection_v1_ = std::make_unique<ReflectionV1Service>();

  grpc::EnableDefaultHealthCheckService(true);
  // gRPC's built-in health service carries no descriptor, so reflection
  // lists grpc.health.v1.Health but cannot describe it and grpcurl cannot
  // call it. Touching the generated descriptor registers it in the pool
  // reflection answers from (and keeps the linker from dropping it).
  (void)grpc::health::v1::HealthCheckRequest::descriptor();
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (!options.tls.cert_pem.empty()) {
    const bool mutual = !options.tls.client_ca_pem.empty();
    grpc::SslServerCredentialsOptions ssl(
        mutual ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
               : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
    ssl.pem_root_certs = options.tls.client_ca_pem;
    ssl.pem_key_cert_pairs.push_back({options.tls.key_pem, options.tls.cert_pem});
    creds = grpc::SslServerCredentials(ssl);
  }
  // One address or several, comma-separated: a TCP port and a Unix socket
  // (unix:/path) at once serve remote callers and same-pod ones.
  const std::vector<std::string> addresses = absl::StrSplit(options.listen_address, ',');
  std::vector<int> ports(addresses.size(), 0);
  for (size_t i = 0; i < addresses.size(); ++i) {
    builder.AddListeningPort(addresses[i], creds, &ports[i]);
  }
  // A second server on the same port must fail, not silently share its
  // traffic (gRPC sets SO_REUSEPORT by default).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  grpc::ResourceQuota quota("posenc");
  quota.Resize(static_cast<size_t>(options.transport_memory_limit()));
  builder.SetResourceQuota(quota);
  builder.SetMaxReceiveMessageSize(static_cast<int>(max_message_bytes));
  // No BDP probing: it grows every stream's flow-control window to several
  // MiB, so the bodies of calls still waiting for admission would be pulled
  // into memory anyway (measured: 16 waiting 48 MiB calls took the server to
  // 708 MiB). A call that reads still gets a window as large as its message.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  builder.SetMaxSendMessageSize(static_cast<int>(max_message_bytes));
  if (options.max_connection_age_ms > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, options.max_connection_age_ms);
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS, 30000);
  }
  // Pings to callers with a call open (gRPC sends none on a connection
  // without one: idle connections hold nothing). keepalive_test idles a
  // stream for ten pings before its caller goes silent, so pings that
  // stopped on an idle stream would show there.
  if (options.keepalive_time_ms > 0) {
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, options.keepalive_time_ms);
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, options.keepalive_timeout_ms);
  }
  // Both fronts are registered for reflection; the router serves every
  // method of both.
  builder.RegisterService(s->v1_.get());
  builder.RegisterService(s->kserve_.get());
  builder.RegisterService(s->reflection_v1_.get());
  builder.RegisterCallbackGenericService(s->router_.get());
  s->server_ = builder.BuildAndStart();
  // gRPC gives a Unix socket port 1; the port a caller dials is the first
  // TCP one, if any.
  for (size_t i = 0; i < addresses.size() && s->server_ != nullptr; ++i) {
    if (ports[i] == 0) s->server_.reset();
    if (s->port_ == 0 && !absl::StartsWith(addresses[i], "unix:")) s->port_ = ports[i];
  }
  if (s->server_ != nullptr && s->port_ == 0) s->port_ = ports[0];
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("could not listen on ", options.listen_address,
                                               ": the address is in use or not local"));
  }
  s->reflection_v1_->Attach(s->server_.get());
  grpc::HealthCheckServiceInterface* health = s->server_->GetHealthCheckService();
  health->SetServingStatus(kLivenessService, true);
  health->SetServingStatus(kReadinessService, true);
  health->SetServingStatus(true);
  Server* raw = s.get();
  s->watcher_ = std::thread([raw] { raw->WatchReadiness(); });
  return s;
}

void Server::WatchReadiness() {
  bool ready = true;
  std::unique_lock<std::mutex> lock(watch_mu_);
  while (!watch_stop_) {
    const absl::Status status = engine_->Ready();
    if (status.ok() != ready && !engine_->draining()) {
      ready = status.ok();
      grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
      health->SetServingStatus(kReadinessService, ready);
      health->SetServingStatus("", ready);
      if (ready) {
        spdlog::info("ready again");
      } else {
        spdlog::error("not ready: {}", std::string(status.message()));
      }
    }
    watch_cv_.wait_for(lock, std::chrono::milliseconds(500));
  }
}

void Server::StopWatchingReadiness() {
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    watch_stop_ = true;
  }
  watch_cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();
}

bool Server::Drain(absl::Duration deadline) {
  if (drain_end_ == absl::InfiniteFuture()) drain_end_ = absl::Now() + deadline;
  StopWatchingReadiness();
  // 1. Readiness off, and new work refused with UNAVAILABLE (retryable on
  //    another replica) while the transport still answers.
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  health->SetServingStatus(kReadinessService, false);
  health->SetServingStatus("", false);
  engine_->StartDraining();
  // 2. Accepted calls finish and their answers go out. Refused arrivals do
  //    not count: under steady traffic they never stop.
  constexpr absl::Duration kQuiet = absl::Milliseconds(300);
  while (absl::Now() < drain_end_ &&
         (busy_calls() > 0 || absl::Now() - engine_->last_admission() < kQuiet)) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  return busy_calls() == 0;
}

void Server::Shutdown(absl::Duration deadline) {
  if (shut_down_) return;
  shut_down_ = true;
  Drain(deadline);
  // 3. The transport. Calls still open get what is left of the deadline.
  server_->Shutdown(
      absl::ToChronoTime(std::max(drain_end_, absl::Now() + absl::Milliseconds(100))));
}

Server::~Server() {
  StopWatchingReadiness();
  if (server_ != nullptr) {
    Shutdown(absl::ZeroDuration());
    server_->Wait();
  }
  executor_.reset();  // runs what is queued, which finishes those calls
}

}  // namespace posenc::server
