// Everything a posenc server is started with, each default in one place
// (posenc-server's flags take theirs from a default-constructed
// ServerOptions), and the one Validate() every value goes through, whether
// it came from a flag, the environment or code.
#ifndef POSENC_SERVER_SERVER_OPTIONS_H_
#define POSENC_SERVER_SERVER_OPTIONS_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "engine/engine.h"
#include "engine/memory_limit.h"
#include "kserve/model_registry.h"
#include "rpc/tls_files.h"

namespace posenc::server {

struct ServerOptions {
  // Where to serve: "host:port" (port 0 picks a free one), "unix:/path", or
  // several of these comma-separated (a TCP port and a Unix socket at once).
  std::string listen_address = "0.0.0.0:50051";
  // Close connections after this long so clients re-resolve DNS; 0 = never.
  int max_connection_age_ms = 0;
  // While a connection has a call open, ping the caller after this long
  // without hearing from it, and close the connection when a ping goes
  // unanswered for keepalive_timeout_ms: a caller whose machine vanished
  // sends no FIN, and its open stream would hold an admission slot until
  // TCP gives up (hours). 0: gRPC's own default, a ping every 2 hours.
  int keepalive_time_ms = 60000;
  int keepalive_timeout_ms = 20000;
  TlsOptions tls;
  // Threads that compute admitted requests (0: every usable CPU, at least
  // 2); each request's kernels also use the CPU backend's pool.
  int request_threads = 0;
  // Memory gRPC's transport may hold (its ResourceQuota); 0: the budget
  // (transport_memory_limit()). gRPC (1.51) receives a message whole before
  // it checks --max_message_bytes (grpc/grpc#43012), on any method and
  // before admission sees the call, so only this bounds an oversized one.
  int64_t max_memory_bytes = 0;
  // Prometheus /metrics address ("" = none; port 0 picks one).
  std::string metrics_listen;
  // Calls slower than this from arrival to answer are logged; 0 = never.
  int slow_call_ms = 1000;
  // How long calls in flight may take to finish once a drain starts.
  int drain_seconds = 20;
  std::string log_level = "info";
  std::string log_format = "text";
  // The KServe v2 model repository (kserve/model_registry.h): one JSON file
  // per model; empty: built-in models only.
  kserve::ModelRepositoryOptions models;
  EngineOptions engine;
  // The memory the process may use (its cgroup's limit, else the
  // machine's), as read at start-up (ReadMemoryLimit): --max_inflight_bytes=0
  // sizes the budget under it, and a budget whose peak would pass it is
  // warned about.
  std::optional<MemoryLimit> memory_limit;

  // max_memory_bytes, or what 0 stands for: the budget of calls in flight
  // plus one largest message twice over (one arriving past the limit, one
  // being refused), so that admitted work never meets the quota.
  int64_t transport_memory_limit() const;

  // What learned tables may hold: --max_table_bytes where a --table_dir is
  // served, else nothing.
  int64_t table_memory_bytes() const {
    return engine.table_dir.empty() ? 0 : engine.max_table_bytes;
  }

  // OK, or INVALID_ARGUMENT naming the flag of the first value out of range
  // and what it must be.
  [[nodiscard]] absl::Status Validate() const;
};

}  // namespace posenc::server

#endif  // POSENC_SERVER_SERVER_OPTIONS_H_
