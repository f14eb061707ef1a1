// Several real posenc-server processes behind one client target, as a
// Kubernetes headless Service puts them: each replica on its own fixed
// 127.0.0.1 port (so it can leave and come back at the address the client
// lists), with its /metrics endpoint; and calls through the balanced client
// that record which replica answered, how many attempts it took and how long.
#ifndef POSENC_TESTS_REPLICAS_H_
#define POSENC_TESTS_REPLICAS_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "grpcpp/client_context.h"
#include "posenc/client.h"
#include "server_process.h"

namespace posenc::testing {

// Whether `port` on `host` can be bound now (nobody listens on it).
inline bool PortIsFree(const std::string& host, int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
  const bool free = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  close(fd);
  return free;
}

// A port nobody listens on now, below the kernel's ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range). A replica keeps its port across
// restarts, and while it is down a port from that range can be handed to
// any outgoing connection, another test's client included: a restart then
// found its address in use (ScaleOut.RollingRestartUnderLoadLosesNoCall,
// once in a CI run). Ports below the range are only ever taken by a listener
// that names them. 0 if none is found.
inline int UnusedPort(const std::string& host = "127.0.0.1") {
  int ephemeral_low = 32768;
  if (std::FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d", &ephemeral_low) != 1) ephemeral_low = 32768;
    std::fclose(f);
  }
  constexpr int kLowest = 10000;
  if (ephemeral_low <= kLowest + 1000) return 0;
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> pick(kLowest, ephemeral_low - 1);
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int port = pick(rng);
    if (PortIsFree(host, port)) return port;
  }
  return 0;
}

// One replica. Start() the first time takes the port given (0: an
// UnusedPort) and keeps it, so a restart comes back at the same address.
class Replica {
 public:
  Replica(std::string binary, std::vector<std::string> flags, int port = 0,
          std::string host = "127.0.0.1")
      : binary_(std::move(binary)), flags_(std::move(flags)), host_(std::move(host)), port_(port) {}

  // Starts the process and waits until it serves gRPC and /metrics.
  bool Start() {
    if (port_ == 0) port_ = UnusedPort(host_);
    process_ = std::make_unique<ServerProcess>();
    std::vector<std::string> flags = {"--listen=" + host_ + ":" + std::to_string(port_),
                                      "--metrics_listen=127.0.0.1:0", "--log_level=info",
                                      "--enable_cuda=false"};
    flags.insert(flags.end(), flags_.begin(), flags_.end());
    if (!process_->Start(binary_, flags)) return false;
    port_ = process_->port();
    // The metrics port is only in the start-up log.
    const std::regex line(R"(metrics on port (\d+))");
    for (int i = 0; i < 250; ++i) {
      std::smatch m;
      const std::string log = process_->log_text();
      if (std::regex_search(log, m, line)) {
        metrics_port_ = std::stoi(m[1]);
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  // SIGTERM (a Deployment replacing the pod) and the exit code, or -1 if it
  // did not exit within `limit` or died of a signal. While it drains,
  // /metrics is read every few milliseconds: refused_while_draining() is
  // the last count of ApplyRope calls it answered UNAVAILABLE (each one an
  // attempt the client retried elsewhere or gave up on).
  int Terminate(std::chrono::milliseconds limit) {
    kill(process_->pid(), SIGTERM);
    const auto end = std::chrono::steady_clock::now() + limit;
    refused_while_draining_ = 0;
    while (!process_->Exited(std::chrono::milliseconds(10))) {
      if (std::chrono::steady_clock::now() > end) return -1;
      refused_while_draining_ =
          std::max(refused_while_draining_, Requests("ApplyRope", "UNAVAILABLE"));
    }
    return process_->exit_code();
  }
  double refused_while_draining() const { return refused_while_draining_; }

  // SIGKILL (a node failure); true once it is gone.
  bool Kill() {
    kill(process_->pid(), SIGKILL);
    return process_->Exited(std::chrono::seconds(10));
  }

  // posenc_requests_total{method, code} from /metrics; -1 if unreadable.
  double Requests(const std::string& method, const std::string& code) const {
    const std::string text = HttpGet(metrics_port_, "/metrics");
    std::smatch m;
    const std::regex sample("posenc_requests_total\\{code=\"" + code + "\",method=\"" + method +
                            "\"\\}\\s+([0-9.e+-]+)");
    if (text.find("200 OK") == std::string::npos) return -1;
    if (!std::regex_search(text, m, sample)) return 0;  // no such call yet
    return std::stod(m[1]);
  }

  int port() const { return port_; }
  std::string address() const { return host_ + ":" + std::to_string(port_); }
  ServerProcess& process() { return *process_; }

 private:
  std::string binary_;
  std::vector<std::string> flags_;
  std::string host_;
  int port_ = 0;
  int metrics_port_ = 0;
  double refused_while_draining_ = 0;
  std::unique_ptr<ServerProcess> process_;
};

// "ipv4:a:p,b:q,...": the static list a client balances over, as a DNS name
// with several A records would resolve.
inline std::string TargetOf(const std::vector<int>& ports) {
  std::string t = "ipv4:";
  for (size_t i = 0; i < ports.size(); ++i) {
    t += (i ? ",127.0.0.1:" : "127.0.0.1:") + std::to_string(ports[i]);
  }
  return t;
}

// One call as the caller saw it.
struct CallRecord {
  double start_s = 0;    // since the run's start
  double latency_s = 0;  // until the final status, retries included
  int code = 0;          // grpc::StatusCode
  int port = 0;          // the replica that answered last (0: none reached)
  std::string peer;      // and its address, "ipv4:127.0.0.2:50051"
  std::string message;   // the status message when not OK
  bool answer_matches = true;
};

// The port of a peer string "ipv4:127.0.0.1:50051"; 0 if none.
inline int PortOfPeer(const std::string& peer) {
  const size_t colon = peer.rfind(':');
  if (peer.empty() || colon == std::string::npos) return 0;
  return std::atoi(peer.c_str() + colon + 1);
}

// ApplyRope through the client's own channel (its balancing and retry
// policy), keeping what the typed call hides: the peer that answered. (How
// many attempts a call took is not visible to the caller in gRPC 1.51: the
// retry filter sends grpc-previous-rpc-attempts to servers only, so the
// tests count refused attempts at the servers.)
inline CallRecord CallRope(Client& client, const v1::RopeRequest& request,
                           v1::RopeResponse* response, std::chrono::steady_clock::time_point epoch,
                           std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  CallRecord r;
  const auto start = std::chrono::steady_clock::now();
  const grpc::Status s = client.stub().ApplyRope(&ctx, request, response);
  const auto end = std::chrono::steady_clock::now();
  r.start_s = std::chrono::duration<double>(start - epoch).count();
  r.latency_s = std::chrono::duration<double>(end - start).count();
  r.code = s.error_code();
  r.peer = ctx.peer();
  r.port = PortOfPeer(r.peer);
  if (!s.ok()) r.message = s.error_message();
  return r;
}

// The p-th quantile (0..1) of latencies, in seconds; 0 for none.
inline double Quantile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  return v[i];
}

}  // namespace posenc::testing

#endif  // POSENC_TESTS_REPLICAS_H_
