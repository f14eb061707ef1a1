// A running posenc gRPC server: the service, the KServe v2 front, standard
// health checking and server reflection (v1alpha and v1) on one port. Used
// by main and by end-to-end tests.
#ifndef POSENC_SERVER_SERVER_H_
#define POSENC_SERVER_SERVER_H_

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/engine.h"
#include "engine/request_executor.h"
#include "engine/shared_memory_registry.h"
#include "grpcpp/server.h"
#include "kserve/model_registry.h"
#include "kserve/service.h"
#include "rpc/call_router.h"
#include "rpc/metrics.h"
#include "rpc/reflection_v1.h"
#include "rpc/tls_files.h"
#include "server_options.h"
#include "v1/service.h"

namespace posenc::server {

// Health service names: liveness stays SERVING until exit; readiness (the
// overall "" and the API's own name) turns NOT_SERVING when draining starts.
inline constexpr char kLivenessService[] = "liveness";
inline constexpr char kReadinessService[] = "posenc.v1.PositionalEncoding";

class Server {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options);
  // On an engine made elsewhere (tests: one on the fake CUDA runtime);
  // options.engine is then not used to make one.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Server>> StartWith(
      const ServerOptions& options, std::unique_ptr<Engine> engine);
  ~Server();

  int port() const { return port_; }
  int metrics_port() const { return metrics_ == nullptr ? 0 : metrics_->port(); }
  Engine& engine() { return *engine_; }
  KServeService& kserve() { return *kserve_; }

  // Graceful drain: readiness turns NOT_SERVING and new calls (and calls
  // still waiting for admission) get UNAVAILABLE; returns once no accepted
  // call is computing or answering and none was admitted for a moment, or
  // at the deadline. Returns whether it drained before the deadline.
  bool Drain(absl::Duration deadline);
  // Drain, then stop the transport; calls still open when the deadline
  // passes (idle streams, stalled callers) are cancelled.
  void Shutdown(absl::Duration deadline);
  // Calls whose request has been read and whose answer is not yet sent.
  int busy_calls() const { return router_ == nullptr ? 0 : router_->busy(); }
  // The most messages one stream has had in flight at once.
  int stream_depth_peak() const { return router_ == nullptr ? 0 : router_->stream_depth_peak(); }
  void Wait() { server_->Wait(); }
  // The threads that compute admitted requests: a test can occupy them to
  // hold computations back while it watches what the calls do meanwhile.
  RequestExecutor& executor() { return *executor_; }

 private:
  Server() = default;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<RequestExecutor> executor_;
  std::unique_ptr<PositionalEncodingService> v1_;
  std::unique_ptr<KServeService> kserve_;
  std::unique_ptr<CallRouter> router_;
  std::unique_ptr<ReflectionV1Service> reflection_v1_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  bool shut_down_ = false;
  absl::Time drain_end_ = absl::InfiniteFuture();
  // Keeps readiness in step with the engine (a failed GPU that is the
  // configured default turns it NOT_SERVING) until a drain takes over.
  void WatchReadiness();
  void StopWatchingReadiness();
  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  bool watch_stop_ = false;
  std::thread watcher_;
};

}  // namespace posenc::server

#endif  // POSENC_SERVER_SERVER_H_
