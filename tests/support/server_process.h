// The real posenc-server binary in its own process, as Kubernetes runs it:
// started with flags, found through its --port_file, watched through /proc.
// Shared by the process-level tests (lifecycle, hostile input, memory).
#ifndef POSENC_TESTS_SERVER_PROCESS_H_
#define POSENC_TESTS_SERVER_PROCESS_H_

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "grpcpp/create_channel.h"

namespace posenc::testing {

// An HTTP/1.0 GET on 127.0.0.1 (a server's /metrics); the whole answer, or
// "" if nothing listens.
inline std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) out.append(buf, n);
  close(fd);
  return out;
}

// A status line of /proc/<pid>/status ("VmHWM", "VmRSS"), in bytes; -1 if gone.
inline int64_t ProcStatusBytes(pid_t pid, const std::string& key) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1)) * 1024;
  }
  return -1;
}
// Resident-set peak (VmHWM) of a process, in bytes.
inline int64_t PeakRss(pid_t pid) { return ProcStatusBytes(pid, "VmHWM"); }

// CPU seconds (user + system) a process has used.
inline double CpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), {});
  std::istringstream fields(stat.substr(stat.rfind(')') + 2));
  std::string f;
  long long utime = 0, stime = 0;
  for (int i = 3; fields >> f; ++i) {
    if (i == 14) utime = std::stoll(f);
    if (i == 15) {
      stime = std::stoll(f);
      break;
    }
  }
  return static_cast<double>(utime + stime) / sysconf(_SC_CLK_TCK);
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

class ServerProcess {
 public:
  // When set, the server joins this cgroup (its cgroup.procs file) before
  // it starts, so that the cgroup's limits are the server's own.
  std::string cgroup_procs;

  // Starts `binary` with the base flags (loopback, port file, quiet log, no
  // metrics) and `flags` after them (later flags win); its stdout and stderr
  // go to a file (log_text()). Returns false if it exits or reports no port
  // within 10 s. POSENC_TEST_SERVER_BINARY, when set, replaces `binary` (to
  // run the suites against another build, e.g. a bundle or an older commit).
  bool Start(std::string binary, const std::vector<std::string>& flags) {
    if (const char* b = std::getenv("POSENC_TEST_SERVER_BINARY"); b != nullptr && *b != 0) {
      binary = b;
    }
    char dir[] = "/tmp/posenc_proc_XXXXXX";
    dir_ = mkdtemp(dir);
    port_file_ = dir_ + "/port";
    log_file_ = dir_ + "/log";
    std::vector<std::string> args = {binary,
                                     "--listen=127.0.0.1:0",
                                     "--port_file=" + port_file_,
                                     "--threads=1",
                                     "--drain_seconds=5",
                                     "--log_level=warn",
                                     "--metrics_listen="};
    args.insert(args.end(), flags.begin(), flags.end());
    std::fflush(nullptr);  // the child must not inherit (and repeat) unwritten output
    pid_ = fork();
    if (pid_ == 0) {
      if (std::freopen(log_file_.c_str(), "w", stdout) == nullptr ||
          dup2(fileno(stdout), fileno(stderr)) < 0) {
        _exit(126);
      }
      if (!cgroup_procs.empty()) {  // "0" moves the writer itself
        const int fd = open(cgroup_procs.c_str(), O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write(fd, "0", 1) != 1) {
          std::fprintf(stderr, "cannot join the cgroup of %s\n", cgroup_procs.c_str());
          _exit(125);
        }
        close(fd);
      }
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(binary.c_str(), argv.data());
      _exit(127);
    }
    for (int i = 0; i < 200 && port_ == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      std::ifstream(port_file_) >> port_;
      if (port_ == 0 && Exited(std::chrono::seconds(0))) return false;
    }
    if (port_ == 0) return false;
    channel_ = NewChannel();
    return true;
  }

  // A new connection to the server (distinct channel arguments keep gRPC
  // from sharing one), with no message size limit.
  std::shared_ptr<grpc::Channel> NewChannel(int id = 0) const {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    args.SetInt("posenc.test.connection", id);
    return grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port_),
                                     grpc::InsecureChannelCredentials(), args);
  }

  // True once the process has exited within `limit`; its wait status is
  // then in exit_status().
  bool Exited(std::chrono::milliseconds limit) {
    if (pid_ <= 0) return true;
    const auto end = std::chrono::steady_clock::now() + limit;
    do {
      if (waitpid(pid_, &status_, WNOHANG) == pid_) {
        pid_ = -1;
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } while (std::chrono::steady_clock::now() < end);
    return false;
  }
  bool Alive() { return !Exited(std::chrono::milliseconds(0)); }

  // The exit code if it exited normally, else -1 (killed by a signal).
  int exit_code() const { return WIFEXITED(status_) ? WEXITSTATUS(status_) : -1; }
  int term_signal() const { return WIFSIGNALED(status_) ? WTERMSIG(status_) : 0; }
  std::string log_text() const { return ReadFile(log_file_); }
  pid_t pid() const { return pid_; }
  int port() const { return port_; }
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

  ~ServerProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);  // a clean exit lets profilers flush
      if (!Exited(std::chrono::seconds(10))) {
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
      }
    }
    if (!dir_.empty()) std::system(("rm -rf " + dir_).c_str());
  }

 private:
  pid_t pid_ = -1;
  int status_ = 0;
  int port_ = 0;
  std::string dir_, port_file_, log_file_;
  std::shared_ptr<grpc::Channel> channel_;
};

// The /metrics port of a server started with --metrics_listen=127.0.0.1:0
// (and a log level that keeps info lines), which names it only in its
// start-up log; 0 if the log names none within 5 s.
inline int MetricsPortFromLog(const ServerProcess& server) {
  const std::regex line(R"(metrics on port (\d+))");
  for (int i = 0; i < 250; ++i) {
    std::smatch m;
    const std::string log = server.log_text();
    if (std::regex_search(log, m, line)) return std::stoi(m[1]);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return 0;
}

// The value of the sample `name` (with its labels as the exposition writes
// them, e.g. posenc_requests_total{code="OK",method="StreamRope"}) from
// /metrics on `port`: 0 if there is no such sample yet, -1 if /metrics is
// unreadable.
inline double MetricValue(int port, const std::string& name) {
  const std::string text = HttpGet(port, "/metrics");
  if (text.find("200 OK") == std::string::npos) return -1;
  const std::string at = "\n" + name + " ";
  const size_t i = text.find(at);
  if (i == std::string::npos) return 0;
  return std::strtod(text.c_str() + i + at.size(), nullptr);
}

}  // namespace posenc::testing

#endif  // POSENC_TESTS_SERVER_PROCESS_H_
