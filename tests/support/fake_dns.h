// A DNS server the test controls, on a UDP port of 127.0.0.1: every A query,
// whatever the name, is answered with the current address list (TTL 0);
// other queries get an empty answer. Enough for gRPC's c-ares resolver with
// a target "dns://127.0.0.1:<port>/<name>:<grpc port>", so a test can change
// what a headless Service resolves to while clients run.
#ifndef POSENC_TESTS_FAKE_DNS_H_
#define POSENC_TESTS_FAKE_DNS_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace posenc::testing {

class FakeDns {
 public:
  FakeDns() {
    fd_ = socket(AF_INET, SOCK_DGRAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    socklen_t len = sizeof addr;
    if (bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
        getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port_ = ntohs(addr.sin_port);
    }
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeDns() {
    stop_ = true;
    thread_.join();
    close(fd_);
  }

  // The IPv4 addresses ("127.0.0.2") A queries answer from now on.
  void SetAddresses(const std::vector<std::string>& addresses) {
    std::lock_guard<std::mutex> lock(mu_);
    addresses_ = addresses;
  }
  int port() const { return port_; }
  int queries() const { return queries_; }

 private:
  void Serve() {
    uint8_t q[512];
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      sockaddr_in from{};
      socklen_t from_len = sizeof from;
      const ssize_t n =
          recvfrom(fd_, q, sizeof q, 0, reinterpret_cast<sockaddr*>(&from), &from_len);
      if (n < 12) continue;
      // The question: labels up to a zero byte, then type and class.
      size_t end = 12;
      while (end < static_cast<size_t>(n) && q[end] != 0) end += q[end] + 1;
      if (end + 5 > static_cast<size_t>(n)) continue;
      const int qtype = (q[end + 1] << 8) | q[end + 2];
      end += 5;
      std::vector<uint8_t> r(q, q + end);
      r[2] = 0x81;  // a response, recursion desired
      r[3] = 0x80;  // recursion available, NOERROR
      r[6] = r[7] = r[8] = r[9] = r[10] = r[11] = 0;
      std::vector<std::string> addresses;
      if (qtype == 1) {
        std::lock_guard<std::mutex> lock(mu_);
        addresses = addresses_;
      }
      for (const std::string& a : addresses) {
        uint8_t ip[4];
        if (inet_pton(AF_INET, a.c_str(), ip) != 1) continue;
        const uint8_t rr[] = {0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4, ip[0], ip[1], ip[2], ip[3]};
        r.insert(r.end(), rr, rr + sizeof rr);
        ++r[7];
      }
      ++queries_;
      sendto(fd_, r.data(), r.size(), 0, reinterpret_cast<sockaddr*>(&from), from_len);
    }
  }

  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> queries_{0};
  std::mutex mu_;
  std::vector<std::string> addresses_;
  std::thread thread_;
};

}  // namespace posenc::testing

#endif  // POSENC_TESTS_FAKE_DNS_H_
