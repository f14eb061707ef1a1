// posenc-server: flags, logging, then RunServer. Every flag can also be set
// from the environment as POSENC_<FLAG_IN_CAPITALS>; the command line wins.
#include <pthread.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "rpc/call_log.h"
#include "rpc/logging.h"
#include "v1/operations.h"
#include "posenc/backend.h"
#include "posenc/wire/enums.h"
#include "server.h"
#include "spdlog/spdlog.h"
#include "rpc/tls_files.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:50051",
          "Address to serve gRPC on (port 0: any free port).");
ABSL_FLAG(int, threads, 0,
          "CPU backend worker threads; 0 = the CPUs this process may use (affinity, cgroup "
          "quota).");
ABSL_FLAG(int64_t, max_request_bytes, int64_t{64} << 20,
          "Largest total of tensor bytes in one request or answer; more is RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, max_message_bytes, 0,
          "Largest gRPC message received or sent; 0 = --max_request_bytes + 4 MiB (room for "
          "the small fields). Each call reserves this much of --max_inflight_bytes before it "
          "reads its request.");
ABSL_FLAG(int, max_inflight, 64,
          "Requests in flight (from arrival until the answer is final); more get "
          "RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, max_inflight_bytes, int64_t{4} << 30,
          "Memory requests in flight may hold (requests, answers and their serialised copies, "
          "plans); at least 2 x --max_message_bytes. Calls wait for it, then get "
          "RESOURCE_EXHAUSTED.");
ABSL_FLAG(int, admission_wait_ms, 1000,
          "How long a call may wait for --max_inflight_bytes before RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, max_memory_bytes, 0,
          "Memory gRPC may use for calls in transit (ResourceQuota); 0 = no cap.");
ABSL_FLAG(std::string, table_dir, "", "Directory of .safetensors learned tables (empty: none).");
ABSL_FLAG(std::string, model_dir, "",
          "Directory of KServe v2 model files, one <name>.json per model (empty: built-in models "
          "only); RepositoryModelLoad rescans it.");
ABSL_FLAG(bool, table_dir_allow_external_symlinks, false,
          "Follow symlinks in --table_dir whose targets lie outside it.");
ABSL_FLAG(int64_t, max_table_bytes, int64_t{2} << 30,
          "float32 bytes of all learned tables loaded together; files beyond are skipped.");
ABSL_FLAG(std::string, default_backend, "auto",
          "Backend for requests that name none: auto, cpu or cuda.");
ABSL_FLAG(bool, enable_cuda, true, "Use the GPU when this build has CUDA and a device is visible.");
ABSL_FLAG(int, cuda_device, 0, "CUDA device ordinal.");
ABSL_FLAG(int64_t, auto_gpu_min_bytes, int64_t{1} << 20,
          "AUTO sends requests of at least this many tensor bytes to the GPU.");
ABSL_FLAG(int, drain_seconds, 20, "On SIGTERM, how long calls in flight may take to finish.");
ABSL_FLAG(int, max_connection_age_ms, 0,
          "Close client connections after this long so they re-resolve DNS (0: never).");
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error, critical or off.");
ABSL_FLAG(std::string, log_format, "text",
          "text (one line per event for people) or json (one JSON object per line: time, level, "
          "message and fields such as method, code and request_id).");
ABSL_FLAG(int, slow_call_ms, 1000,
          "Log a warning for calls taking longer than this from arrival to answer (at most one "
          "line a second, with the call's request id); 0 = never.");
ABSL_FLAG(std::string, port_file, "", "If set, write the bound port here once serving.");
ABSL_FLAG(std::string, metrics_listen, "0.0.0.0:8002",
          "Prometheus /metrics address (empty: no metrics endpoint).");
ABSL_FLAG(bool, enable_system_shared_memory, false,
          "Serve the KServe v2 system shared-memory extension: callers on this node (same IPC "
          "namespace, /dev/shm) register POSIX shared-memory objects and pass tensors in them. "
          "Off: its RPCs and tensor parameters are FAILED_PRECONDITION.");
ABSL_FLAG(int, max_shared_memory_regions, 64,
          "Shared-memory regions registered at once (each holds a file descriptor).");
ABSL_FLAG(int64_t, max_shared_memory_bytes, int64_t{64} << 30,
          "Sum of the registered shared-memory regions' sizes (nothing is mapped; this bounds "
          "what callers may point the server at).");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain file; serves TLS when set.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key file for --tls_cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA file; when set, clients must present a certificate it signed (mutual TLS).");

namespace {

// The exit code of a drain that reached its deadline with calls still busy
// (a stalled caller, a kernel ignoring cancellation): the process exits
// anyway rather than hang past what the orchestrator allows.
constexpr int kForcedExitCode = 3;

absl::StatusOr<spdlog::level::level_enum> ParseLogLevel(const std::string& name) {
  const std::string v = absl::AsciiStrToLower(name);
  if (v == "trace") return spdlog::level::trace;
  if (v == "debug") return spdlog::level::debug;
  if (v == "info") return spdlog::level::info;
  if (v == "warn" || v == "warning") return spdlog::level::warn;
  if (v == "error") return spdlog::level::err;
  if (v == "critical") return spdlog::level::critical;
  if (v == "off") return spdlog::level::off;
  return absl::InvalidArgumentError(absl::StrCat(
      "--log_level must be trace, debug, info, warn, error, critical or off, got '", name, "'"));
}

std::string VersionString() {
  return absl::StrCat("posenc-server ", POSENC_VERSION, "\n", posenc::BuildDescription(), "\n");
}

// POSENC_<NAME> environment variables set flag defaults.
// Every flag this file defines takes part, so a new flag cannot be
// forgotten.
bool ApplyEnvironment() {
  bool ok = true;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (!absl::EndsWith(flag->Filename(), "server/main.cc")) continue;
    const std::string var = absl::StrCat("POSENC_", absl::AsciiStrToUpper(name));
    const char* value = std::getenv(var.c_str());
    if (value == nullptr) continue;
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      std::fprintf(stderr, "posenc-server: bad %s=%s: %s\n", var.c_str(), value, error.c_str());
      ok = false;
    }
  }
  return ok;
}

void LogStartup(posenc::server::Server& server, const posenc::server::ServerOptions& o) {
  const posenc::v1::ServerInfo info = posenc::server::GetServerInfo(server.engine());
  spdlog::info("posenc-server {} listening on port {} ({}, {})", info.version(), server.port(),
               o.listen_address,
               o.tls.cert_pem.empty()        ? "plaintext"
               : o.tls.client_ca_pem.empty() ? "TLS"
                                             : "mutual TLS");
  if (server.metrics_port() != 0)
    spdlog::info("metrics on port {} (/metrics)", server.metrics_port());
  for (const auto& b : info.backends()) {
    if (b.available()) {
      spdlog::info("backend {}: {} threads={} memory={}MiB cc={}",
                   posenc::v1::Backend_Name(b.kind()), b.device_name(), b.threads(),
                   b.memory_bytes() >> 20, b.compute_capability());
    } else {
      spdlog::info("backend {}: unavailable ({}); serving from the CPU",
                   posenc::v1::Backend_Name(b.kind()), b.unavailable_reason());
    }
  }
  const posenc::server::EngineOptions& e = server.engine().options();
  spdlog::info(
      "limits: max_message_bytes={} max_request_bytes={} max_inflight={} max_inflight_bytes={} "
      "admission_wait_ms={} max_table_bytes={} drain_seconds={} default_backend={} "
      "auto_gpu_min_bytes={} cpu_threads={}",
      o.max_message_bytes, e.max_request_tensor_bytes, e.max_inflight_requests,
      e.max_inflight_bytes, absl::ToInt64Milliseconds(e.admission_wait), e.max_table_bytes,
      absl::GetFlag(FLAGS_drain_seconds), posenc::wire::NameOf(e.default_backend),
      e.auto_gpu_min_bytes, server.engine().cpu()->device().threads);
  const auto tables = posenc::server::ListTables(server.engine());
  spdlog::info("table_dir '{}': {} tables loaded", o.engine.table_dir, tables.tables_size());
  for (const auto& s : tables.skipped()) spdlog::warn("table skipped: {}", s);
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "posenc-server: positional encodings (RoPE, sinusoidal, learned, ALiBi) over gRPC.\n"
      "Every flag may also come from the environment as POSENC_<FLAG>.");
  absl::FlagsUsageConfig usage;
  // --help lists this file's flags (Abseil's default matches the binary's
  // name against file names, which finds none here).
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "server/main.cc");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  usage.version_string = [] { return VersionString(); };
  absl::SetFlagsUsageConfig(usage);
  // No fixed mmap threshold (it made every request over 1 MiB page-fault
  // its buffers in afresh: 562 minor faults per 1 MiB RoPE call). Memory is
  // bounded by admission instead: bytes in flight never exceed
  // --max_inflight_bytes, so the heap is reused, not grown, and
  // tests/memory_bound_test.cc checks the resident set against that budget.
  if (!ApplyEnvironment()) return 2;
  absl::ParseCommandLine(argc, argv);
  // spdlog reads an unknown level as "off", which would hide even a fatal
  // start-up error: refuse it instead.
  const auto level = ParseLogLevel(absl::GetFlag(FLAGS_log_level));
  if (!level.ok()) {
    std::fprintf(stderr, "posenc-server: %s\n", std::string(level.status().message()).c_str());
    return 2;
  }
  spdlog::set_level(*level);
  const auto format = posenc::server::ParseLogFormat(absl::GetFlag(FLAGS_log_format));
  if (!format.ok()) {
    std::fprintf(stderr, "posenc-server: %s\n", std::string(format.status().message()).c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_threads) < 0) {
    std::fprintf(stderr, "posenc-server: --threads must be >= 0 (0: every usable CPU), got %d\n",
                 absl::GetFlag(FLAGS_threads));
    return 2;
  }
  posenc::server::SetLogFormat(*format);
  if (absl::GetFlag(FLAGS_max_memory_bytes) < 0) {
    // gRPC would take a negative quota as no cap at all.
    std::fprintf(stderr, "posenc-server: --max_memory_bytes must be >= 0 (0: no cap), got %lld\n",
                 static_cast<long long>(absl::GetFlag(FLAGS_max_memory_bytes)));
    return 2;
  }
  if (absl::GetFlag(FLAGS_slow_call_ms) < 0) {
    std::fprintf(stderr, "posenc-server: --slow_call_ms must be >= 0 (0: never), got %d\n",
                 absl::GetFlag(FLAGS_slow_call_ms));
    return 2;
  }
  if (absl::GetFlag(FLAGS_max_shared_memory_regions) < 0 ||
      absl::GetFlag(FLAGS_max_shared_memory_bytes) < 0) {
    std::fprintf(stderr,
                 "posenc-server: --max_shared_memory_regions and --max_shared_memory_bytes must "
                 "be >= 0, got %d and %lld\n",
                 absl::GetFlag(FLAGS_max_shared_memory_regions),
                 static_cast<long long>(absl::GetFlag(FLAGS_max_shared_memory_bytes)));
    return 2;
  }
  posenc::server::SetSlowCallThreshold(absl::Milliseconds(absl::GetFlag(FLAGS_slow_call_ms)));

  // Block SIGTERM/SIGINT in every thread; one thread waits for them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  posenc::server::ServerOptions o;
  o.listen_address = absl::GetFlag(FLAGS_listen);
  o.engine.max_request_tensor_bytes = absl::GetFlag(FLAGS_max_request_bytes);
  o.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  if (o.max_message_bytes == 0) o.max_message_bytes = o.engine.max_request_tensor_bytes + (4 << 20);
  o.engine.admission_wait = absl::Milliseconds(absl::GetFlag(FLAGS_admission_wait_ms));
  o.max_connection_age_ms = absl::GetFlag(FLAGS_max_connection_age_ms);
  o.engine.cpu_threads = absl::GetFlag(FLAGS_threads);
  o.engine.max_inflight_requests = absl::GetFlag(FLAGS_max_inflight);
  o.engine.max_inflight_bytes = absl::GetFlag(FLAGS_max_inflight_bytes);
  o.max_memory_bytes = absl::GetFlag(FLAGS_max_memory_bytes);
  o.engine.table_dir = absl::GetFlag(FLAGS_table_dir);
  o.models.dir = absl::GetFlag(FLAGS_model_dir);
  o.shared_memory.enabled = absl::GetFlag(FLAGS_enable_system_shared_memory);
  o.shared_memory.max_regions = absl::GetFlag(FLAGS_max_shared_memory_regions);
  o.shared_memory.max_total_bytes = absl::GetFlag(FLAGS_max_shared_memory_bytes);
  o.engine.table_dir_allow_external_symlinks =
      absl::GetFlag(FLAGS_table_dir_allow_external_symlinks);
  o.engine.max_table_bytes = absl::GetFlag(FLAGS_max_table_bytes);
  o.engine.enable_cuda = absl::GetFlag(FLAGS_enable_cuda);
  o.engine.cuda_device = absl::GetFlag(FLAGS_cuda_device);
  o.engine.auto_gpu_min_bytes = absl::GetFlag(FLAGS_auto_gpu_min_bytes);
  auto backend = posenc::wire::Parse<posenc::BackendChoice>("--default_backend",
                                                            absl::GetFlag(FLAGS_default_backend));
  if (backend.ok() && *backend == posenc::BackendChoice::kDefault) {
    backend =
        absl::InvalidArgumentError("--default_backend must be auto, cpu or cuda; got 'default'");
  }
  if (!backend.ok()) {
    spdlog::critical("{}", std::string(backend.status().message()));
    return 2;
  }
  o.engine.default_backend = *backend;

  o.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  auto tls =
      posenc::server::LoadTlsFiles({absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
                                    absl::GetFlag(FLAGS_tls_client_ca)});
  if (!tls.ok()) {
    spdlog::critical("cannot start: {}", std::string(tls.status().message()));
    return 2;
  }
  o.tls = *std::move(tls);
  auto server = posenc::server::Server::Start(o);
  if (!server.ok()) {
    spdlog::critical("cannot start: {}", server.status().ToString());
    return 1;
  }
  LogStartup(**server, o);
  if (const std::string port_file = absl::GetFlag(FLAGS_port_file); !port_file.empty()) {
    std::ofstream out(port_file);
    out << (*server)->port() << "\n";
    out.close();
    if (!out) {
      spdlog::critical("cannot write --port_file '{}'", port_file);
      spdlog::shutdown();
      std::_Exit(2);
    }
  }

  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    const int drain = absl::GetFlag(FLAGS_drain_seconds);
    spdlog::info("signal {}: draining ({} requests in flight, up to {}s)", sig,
                 (*server)->engine().inflight(), drain);
    // Drain, then end the process without stopping gRPC's transport first:
    // stopping it cancels calls that arrived in the last instant with
    // CANCELLED (not retryable), whereas a process that exits closes its
    // connections and every caller still knocking sees UNAVAILABLE, which
    // clients retry on another replica. Nothing accepted is lost: the drain
    // returns only once every accepted call's answer has gone out.
    const bool drained = (*server)->Drain(absl::Seconds(drain));
    spdlog::info("{}; stopped", drained ? "drained" : "drain deadline passed");
    spdlog::shutdown();
    std::fflush(nullptr);
    std::_Exit(drained ? 0 : kForcedExitCode);
  });
  (*server)->Wait();  // returns only if the transport is stopped elsewhere
  waiter.join();
  return 0;
}
