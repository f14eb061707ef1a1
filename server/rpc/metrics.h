// Prometheus metrics of the service, served on their own port so scraping
// never competes with the gRPC port.
#ifndef POSENC_SERVER_RPC_METRICS_H_
#define POSENC_SERVER_RPC_METRICS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace prometheus {
class Exposer;
class Registry;
}  // namespace prometheus

namespace posenc::server {

class Engine;

class Metrics {
 public:
  // Serves /metrics on `listen` ("0.0.0.0:8002"; port 0 picks one);
  // `memory_limit_bytes`: the memory the server may use (its cgroup's
  // limit, else the machine's: ServerOptions::memory_limit), 0 if unknown.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Metrics>> Start(
      const std::string& listen, const Engine* engine, int64_t memory_limit_bytes = 0);
  ~Metrics();

  // One finished call: method, gRPC status code name, seconds, request and
  // response bytes, and the backend that ran it ("" when none did).
  void RecordCall(const std::string& method, const std::string& code, double seconds,
                  double bytes_in, double bytes_out, const std::string& backend);
  int port() const { return port_; }

 private:
  struct Families;
  Metrics() = default;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::unique_ptr<Families> families_;
  int port_ = 0;
};

}  // namespace posenc::server

#endif  // POSENC_SERVER_RPC_METRICS_H_
