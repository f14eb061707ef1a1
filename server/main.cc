// posenc-server: flags, logging, then RunServer. Every flag can also be set
// from the environment as POSENC_<FLAG_IN_CAPITALS>; the command line wins.
#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <optional>
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
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "engine/memory_limit.h"
#include "posenc/backend.h"
#include "posenc/status_macros.h"
#include "posenc/wire/enums.h"
#include "rpc/logging.h"
#include "rpc/tls_files.h"
#include "server.h"
#include "server_options.h"
#include "spdlog/spdlog.h"
#include "v1/operations.h"

namespace {
// Every flag's default: the options' own (server_options.h, engine.h), but
// --metrics_listen's, which serves metrics on 0.0.0.0:8002 where the
// options (embedded servers, tests) serve none.
const posenc::server::ServerOptions kDefaults;
}  // namespace

ABSL_FLAG(std::string, listen, kDefaults.listen_address,
          "Address to serve gRPC on: host:port (port 0: any free port), unix:/path (same-node "
          "callers, e.g. a model server in the same pod), or both, comma-separated.");
ABSL_FLAG(int, threads, kDefaults.engine.cpu_threads,
          "CPU backend worker threads; 0 = the CPUs this process may use (affinity, cgroup "
          "quota).");
ABSL_FLAG(int64_t, max_request_bytes, kDefaults.engine.max_request_tensor_bytes,
          "Largest total of tensor bytes in one request or answer; more is RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, max_message_bytes, kDefaults.engine.max_message_bytes,
          "Largest gRPC message received or sent; 0 = --max_request_bytes + 4 MiB (room for "
          "the small fields). Each call reserves this much of --max_inflight_bytes before it "
          "reads its request.");
ABSL_FLAG(int, max_inflight, kDefaults.engine.max_inflight_requests,
          "Requests in flight (from arrival until the answer is final); more get "
          "RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, max_inflight_bytes, 0,
          "Memory requests in flight may hold (requests, answers and their serialised copies, "
          "plans); at least 2 x --max_message_bytes. Calls wait for it, then get "
          "RESOURCE_EXHAUSTED. 0 = 4 GiB, or less under a memory limit (a container's cgroup "
          "limit, else the machine's memory): that limit less 96 MiB, 2 x --max_message_bytes "
          "and, with a --table_dir, --max_table_bytes.");
ABSL_FLAG(int, admission_wait_ms,
          static_cast<int>(absl::ToInt64Milliseconds(kDefaults.engine.admission_wait)),
          "How long a call may wait for --max_inflight_bytes before RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, max_memory_bytes, kDefaults.max_memory_bytes,
          "Memory gRPC's transport may hold (its ResourceQuota); 0 = --max_inflight_bytes + 2 x "
          "--max_message_bytes. gRPC receives a message whole before it checks "
          "--max_message_bytes, so this is what bounds an oversized one.");
ABSL_FLAG(std::string, table_dir, "", "Directory of .safetensors learned tables (empty: none).");
ABSL_FLAG(std::string, model_dir, "",
          "Directory of KServe v2 model files, one <name>.json per model (empty: built-in models "
          "only); RepositoryModelLoad rescans it.");
ABSL_FLAG(bool, table_dir_allow_external_symlinks, false,
          "Follow symlinks in --table_dir whose targets lie outside it.");
ABSL_FLAG(int64_t, max_table_bytes, kDefaults.engine.max_table_bytes,
          "float32 bytes of all learned tables loaded together; files beyond are skipped.");
ABSL_FLAG(std::string, default_backend, "auto",
          "Backend for requests that name none: auto, cpu or cuda.");
ABSL_FLAG(bool, enable_cuda, kDefaults.engine.enable_cuda,
          "Use the GPU when this build has CUDA and a device is visible.");
ABSL_FLAG(int, cuda_device, kDefaults.engine.cuda_device,
          "The primary CUDA device ordinal: AUTO's cost model is measured on it, and system "
          "shared-memory regions are pinned for it.");
ABSL_FLAG(std::string, cuda_devices, "all",
          "The GPUs served: 'all' (every visible one) or ordinals, comma-separated, "
          "--cuda_device among them. Staged calls spread over them; a call on CUDA shared "
          "memory runs on the GPU its region lives on.");
ABSL_FLAG(int64_t, auto_gpu_min_bytes, kDefaults.engine.auto_gpu_min_bytes,
          "AUTO sends requests of at least this many tensor bytes to the GPU.");
ABSL_FLAG(bool, auto_by_measured_cost, kDefaults.engine.auto_by_measured_cost,
          "With a GPU, time both backends' served path at start-up and let backend AUTO send a "
          "request (of at least --auto_gpu_min_bytes) to the GPU only where it is predicted "
          "faster; false: by --auto_gpu_min_bytes alone.");
ABSL_FLAG(int, drain_seconds, kDefaults.drain_seconds,
          "On SIGTERM, how long calls in flight may take to finish.");
ABSL_FLAG(int, max_connection_age_ms, kDefaults.max_connection_age_ms,
          "Close client connections after this long so they re-resolve DNS (0: never).");
ABSL_FLAG(int, keepalive_time_ms, kDefaults.keepalive_time_ms,
          "While a connection has a call open, ping the caller after this long without hearing "
          "from it (0: gRPC's default, 2 hours), so that a caller whose machine vanished does "
          "not hold its calls' slots until TCP gives up.");
ABSL_FLAG(int, keepalive_timeout_ms, kDefaults.keepalive_timeout_ms,
          "Close a connection whose caller has not answered a ping within this long.");
ABSL_FLAG(std::string, log_level, kDefaults.log_level,
          "trace, debug, info, warn, error, critical or off (KServe LogSettings changes it while "
          "serving).");
ABSL_FLAG(std::string, log_format, kDefaults.log_format,
          "text (one line per event for people) or json (one JSON object per line: time, level, "
          "message and fields such as method, code and request_id).");
ABSL_FLAG(int, slow_call_ms, kDefaults.slow_call_ms,
          "Log a warning for calls taking longer than this from arrival to answer (at most one "
          "line a second, with the call's request id); 0 = never.");
ABSL_FLAG(std::string, port_file, "", "If set, write the bound port here once serving.");
ABSL_FLAG(std::string, metrics_listen, "0.0.0.0:8002",
          "Prometheus /metrics address (empty: no metrics endpoint).");
ABSL_FLAG(bool, enable_system_shared_memory, kDefaults.engine.shared_memory.enabled,
          "Shared memory on both fronts (posenc.v1's *_shm fields, the KServe v2 system "
          "shared-memory extension): callers on this node (the same /dev/shm) register POSIX "
          "shared-memory objects and pass tensors in them, computed on in place. Off: those RPCs "
          "and fields are FAILED_PRECONDITION.");
ABSL_FLAG(bool, enable_cuda_shared_memory, kDefaults.engine.shared_memory.cuda_enabled,
          "CUDA shared memory on the KServe v2 front (Triton's cudasharedmemory extension): "
          "callers on this node and GPU register CUDA IPC handles of their device memory and "
          "pass tensors in it, computed on in place by the CUDA backend. Off, or without a GPU: "
          "those RPCs and references are FAILED_PRECONDITION, saying which.");
ABSL_FLAG(int, max_shared_memory_regions, kDefaults.engine.shared_memory.max_regions,
          "Shared-memory regions registered at once, by all clients (each holds a mapping).");
ABSL_FLAG(int, max_shared_memory_regions_per_client,
          kDefaults.engine.shared_memory.max_regions_per_client,
          "Shared-memory regions one client (one gRPC connection) may hold at once.");
ABSL_FLAG(int64_t, max_shared_memory_bytes, kDefaults.engine.shared_memory.max_total_bytes,
          "Sum of the registered shared-memory regions' sizes. Each region is also admitted "
          "against --max_inflight_bytes while registered, since the server touches its pages.");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain file; serves TLS when set.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key file for --tls_cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA file; when set, clients must present a certificate it signed (mutual TLS).");

namespace {

// The exit code of a drain that reached its deadline with calls still busy
// (a stalled caller, a kernel ignoring cancellation): the process exits
// anyway rather than hang past what the orchestrator allows.
constexpr int kForcedExitCode = 3;

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

// The memory limit and what the budget makes of it; a warning where
// the server's peak could pass it, since the kernel would then kill the
// process under load where it should refuse calls.
void LogMemoryLimit(const posenc::server::ServerOptions& o) {
  const posenc::server::EngineOptions& e = o.engine;
  const bool derived = absl::GetFlag(FLAGS_max_inflight_bytes) == 0;
  if (!o.memory_limit.has_value()) {
    spdlog::info("memory: no limit known; max_inflight_bytes={}{}", e.max_inflight_bytes,
                 derived ? " (the default)" : "");
    return;
  }
  const int64_t limit = o.memory_limit->bytes;
  const int64_t peak = posenc::server::PeakMemoryBytes(
      e.max_inflight_bytes, e.message_limit(), o.transport_memory_limit(), o.table_memory_bytes());
  spdlog::info("memory: limit {} MiB ({}); max_inflight_bytes={} ({}), peak {} MiB", limit >> 20,
               o.memory_limit->file, e.max_inflight_bytes,
               derived ? "sized under the limit" : "--max_inflight_bytes", peak >> 20);
  if (peak > limit) {
    spdlog::warn(
        "memory: the server may hold up to {} MiB (max_inflight_bytes {} MiB, two messages of "
        "{} MiB, tables {} MiB, {} MiB fixed), over the memory limit of {} MiB: under load the "
        "kernel may kill it where it should answer RESOURCE_EXHAUSTED. {}",
        peak >> 20, e.max_inflight_bytes >> 20, e.message_limit() >> 20,
        o.table_memory_bytes() >> 20, posenc::server::kFixedOverheadBytes >> 20, limit >> 20,
        derived ? "Raise the limit, or lower --max_request_bytes, --max_table_bytes or "
                  "--max_memory_bytes."
                : "Lower --max_inflight_bytes (0 sizes it under the limit), --max_memory_bytes, "
                  "--max_request_bytes or --max_table_bytes, or raise the limit.");
  }
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
      spdlog::info("backend {}: {} threads={} memory={}MiB cc={}{}",
                   posenc::v1::Backend_Name(b.kind()), b.device_name(), b.threads(),
                   b.memory_bytes() >> 20, b.compute_capability(),
                   b.has_cost() ? fmt::format("; served cost {:.1f} us + {:.1f} us/MiB (AUTO "
                                              "routes by it)",
                                              b.cost().fixed_us(), b.cost().us_per_mib())
                                : "");
    } else {
      spdlog::info("backend {}: unavailable ({}); serving from the CPU",
                   posenc::v1::Backend_Name(b.kind()), b.unavailable_reason());
    }
  }
  const posenc::server::EngineOptions& e = server.engine().options();
  spdlog::info(
      "limits: max_message_bytes={} max_request_bytes={} max_inflight={} max_inflight_bytes={} "
      "max_memory_bytes={} admission_wait_ms={} max_table_bytes={} drain_seconds={} "
      "default_backend={} auto_gpu_min_bytes={} cpu_threads={}",
      e.message_limit(), e.max_request_tensor_bytes, e.max_inflight_requests, e.max_inflight_bytes,
      o.transport_memory_limit(), absl::ToInt64Milliseconds(e.admission_wait), e.max_table_bytes,
      o.drain_seconds, posenc::wire::NameOf(e.default_backend), e.auto_gpu_min_bytes,
      server.engine().cpu()->device().threads);
  LogMemoryLimit(o);
  const auto tables = posenc::server::ListTables(server.engine());
  spdlog::info("table_dir '{}': {} tables loaded", o.engine.table_dir, tables.tables_size());
  for (const auto& s : tables.skipped()) spdlog::warn("table skipped: {}", s);
}

// The flags as ServerOptions, validated (ServerOptions::Validate: the same
// message whether a value came from a flag or the environment); the TLS
// files read and checked.
absl::StatusOr<posenc::server::ServerOptions> OptionsFromFlags() {
  posenc::server::ServerOptions o;
  o.listen_address = absl::GetFlag(FLAGS_listen);
  o.log_level = absl::GetFlag(FLAGS_log_level);
  o.log_format = absl::GetFlag(FLAGS_log_format);
  o.slow_call_ms = absl::GetFlag(FLAGS_slow_call_ms);
  o.drain_seconds = absl::GetFlag(FLAGS_drain_seconds);
  o.max_connection_age_ms = absl::GetFlag(FLAGS_max_connection_age_ms);
  o.keepalive_time_ms = absl::GetFlag(FLAGS_keepalive_time_ms);
  o.keepalive_timeout_ms = absl::GetFlag(FLAGS_keepalive_timeout_ms);
  o.max_memory_bytes = absl::GetFlag(FLAGS_max_memory_bytes);
  o.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  o.models.dir = absl::GetFlag(FLAGS_model_dir);
  o.engine.shared_memory.enabled = absl::GetFlag(FLAGS_enable_system_shared_memory);
  o.engine.shared_memory.cuda_enabled = absl::GetFlag(FLAGS_enable_cuda_shared_memory);
  o.engine.shared_memory.max_regions = absl::GetFlag(FLAGS_max_shared_memory_regions);
  o.engine.shared_memory.max_regions_per_client =
      absl::GetFlag(FLAGS_max_shared_memory_regions_per_client);
  o.engine.shared_memory.max_total_bytes = absl::GetFlag(FLAGS_max_shared_memory_bytes);
  posenc::server::EngineOptions& e = o.engine;
  e.cpu_threads = absl::GetFlag(FLAGS_threads);
  e.max_request_tensor_bytes = absl::GetFlag(FLAGS_max_request_bytes);
  e.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  e.max_inflight_requests = absl::GetFlag(FLAGS_max_inflight);
  e.admission_wait = absl::Milliseconds(absl::GetFlag(FLAGS_admission_wait_ms));
  e.table_dir = absl::GetFlag(FLAGS_table_dir);
  e.table_dir_allow_external_symlinks = absl::GetFlag(FLAGS_table_dir_allow_external_symlinks);
  e.max_table_bytes = absl::GetFlag(FLAGS_max_table_bytes);
  e.enable_cuda = absl::GetFlag(FLAGS_enable_cuda);
  e.cuda_device = absl::GetFlag(FLAGS_cuda_device);
  if (const std::string devices = absl::GetFlag(FLAGS_cuda_devices); devices != "all") {
    for (absl::string_view d : absl::StrSplit(devices, ',', absl::SkipWhitespace())) {
      int ordinal = 0;
      if (!absl::SimpleAtoi(d, &ordinal)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--cuda_devices must be 'all' or comma-separated ordinals, got '", devices, "'"));
      }
      e.cuda_devices.push_back(ordinal);
    }
  }
  e.auto_gpu_min_bytes = absl::GetFlag(FLAGS_auto_gpu_min_bytes);
  e.auto_by_measured_cost = absl::GetFlag(FLAGS_auto_by_measured_cost);
  POSENC_ASSIGN_OR_RETURN(e.default_backend,
                          posenc::wire::Parse<posenc::BackendChoice>(
                              "--default_backend", absl::GetFlag(FLAGS_default_backend)));
  // 0: sized under the cgroup's memory limit, once everything it leaves
  // room for (messages, tables) is known.
  o.memory_limit = posenc::server::ReadMemoryLimit();
  e.max_inflight_bytes = absl::GetFlag(FLAGS_max_inflight_bytes);
  if (e.max_inflight_bytes == 0) {
    e.max_inflight_bytes = posenc::server::InflightBytesUnder(
        o.memory_limit.has_value() ? std::optional<int64_t>(o.memory_limit->bytes) : std::nullopt,
        std::max(e.message_limit(), e.max_request_tensor_bytes), o.table_memory_bytes(),
        kDefaults.engine.max_inflight_bytes);
  }
  POSENC_RETURN_IF_ERROR(o.Validate());
  POSENC_ASSIGN_OR_RETURN(o.tls, posenc::server::LoadTlsFiles(
                                     {absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
                                      absl::GetFlag(FLAGS_tls_client_ca)}));
  return o;
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
  if (!ApplyEnvironment()) return 2;
  absl::ParseCommandLine(argc, argv);
  const absl::StatusOr<posenc::server::ServerOptions> options = OptionsFromFlags();
  if (!options.ok()) {
    std::fprintf(stderr, "posenc-server: %s\n", std::string(options.status().message()).c_str());
    return 2;
  }
  const posenc::server::ServerOptions& o = *options;
  spdlog::set_level(*posenc::server::ParseLogLevel(o.log_level));
  posenc::server::SetLogFormat(*posenc::server::ParseLogFormat(o.log_format));

  // Block SIGTERM/SIGINT in every thread; one thread waits for them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

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
      spdlog::default_logger()->flush();  // not shutdown(): see below
      std::_Exit(2);
    }
  }

  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    const int drain = o.drain_seconds;
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
    // Flushed, not shut down: gRPC's threads go on refusing arrivals (and
    // logging them) until _Exit, and spdlog::shutdown() destroyed the
    // logger under them: SIGSEGV in about a third of drains under steady
    // traffic on a fast machine (Lifecycle.DrainUnderSteadyTraffic...).
    spdlog::default_logger()->flush();
    std::fflush(nullptr);
    std::_Exit(drained ? 0 : kForcedExitCode);
  });
  (*server)->Wait();  // returns only if the transport is stopped elsewhere
  waiter.join();
  return 0;
}
