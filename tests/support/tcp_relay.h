// A TCP relay on 127.0.0.1 between test clients and a server, which can
// freeze: it then stops moving bytes either way but keeps every socket
// open, as a peer does whose machine vanished (no FIN, no RST, nothing). Used
// by the keepalive tests, which need a caller that goes silent mid-call.
#ifndef POSENC_TESTS_SUPPORT_TCP_RELAY_H_
#define POSENC_TESTS_SUPPORT_TCP_RELAY_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace posenc::testing {

class TcpRelay {
 public:
  // Relays each connection made to port() to 127.0.0.1:target_port.
  explicit TcpRelay(int target_port) : target_port_(target_port) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        listen(listen_fd_, 16) != 0) {
      std::abort();
    }
    socklen_t len = sizeof addr;
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] { Accept(); });
  }
  TcpRelay(const TcpRelay&) = delete;
  TcpRelay& operator=(const TcpRelay&) = delete;

  // Closes every socket (the server then sees its peer close).
  ~TcpRelay() {
    stop_ = true;
    shutdown(listen_fd_, SHUT_RDWR);
    acceptor_.join();
    close(listen_fd_);
    std::lock_guard<std::mutex> lock(mu_);
    for (std::thread& t : pumps_) t.join();
    for (int fd : fds_) close(fd);
  }

  int port() const { return port_; }

  // From now on no byte moves either way; the sockets stay open.
  void Freeze() { frozen_ = true; }

 private:
  void Accept() {
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      const int client = accept(listen_fd_, nullptr, nullptr);
      if (client < 0) continue;
      const int server = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(static_cast<uint16_t>(target_port_));
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (connect(server, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
        close(client);
        close(server);
        continue;
      }
      std::lock_guard<std::mutex> lock(mu_);
      fds_.push_back(client);
      fds_.push_back(server);
      pumps_.emplace_back([this, client, server] { Pump(client, server); });
    }
  }

  // Moves bytes both ways until either side closes, the relay stops, or it
  // freezes (then it only waits, the sockets open, until the relay stops).
  void Pump(int a, int b) {
    char buf[1 << 16];
    while (!stop_) {
      if (frozen_) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        continue;
      }
      pollfd p[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
      if (poll(p, 2, 20) <= 0) continue;
      for (int i = 0; i < 2; ++i) {
        if ((p[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
        if (frozen_) break;
        const ssize_t n = read(p[i].fd, buf, sizeof buf);
        if (n <= 0) return Close(a, b);
        const int to = i == 0 ? b : a;
        for (ssize_t sent = 0; sent < n;) {
          // MSG_NOSIGNAL: a peer gone while bytes are relayed must not
          // raise SIGPIPE in the test binary.
          const ssize_t w = send(to, buf + sent, static_cast<size_t>(n - sent), MSG_NOSIGNAL);
          if (w <= 0) return Close(a, b);
          sent += w;
        }
      }
    }
  }

  // Both sides see the connection end (the fds close with the relay).
  static void Close(int a, int b) {
    shutdown(a, SHUT_RDWR);
    shutdown(b, SHUT_RDWR);
  }

  const int target_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<bool> frozen_{false};
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<std::thread> pumps_;
  std::vector<int> fds_;
};

}  // namespace posenc::testing

#endif  // POSENC_TESTS_SUPPORT_TCP_RELAY_H_
