#include "server_options.h"

#include "absl/strings/str_cat.h"
#include "posenc/status_macros.h"
#include "rpc/logging.h"

namespace posenc::server {
namespace {

absl::Status NotAtLeast(absl::string_view flag, int64_t value, int64_t least,
                        absl::string_view zero_means = "") {
  if (value >= least) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(flag, " must be >= ", least, zero_means, ", got ", value));
}

}  // namespace

int64_t ServerOptions::transport_memory_limit() const {
  if (max_memory_bytes > 0) return max_memory_bytes;
  const int64_t message = engine.message_limit();
  return engine.max_inflight_bytes > INT64_MAX - 2 * message
             ? INT64_MAX
             : engine.max_inflight_bytes + 2 * message;
}

absl::Status ServerOptions::Validate() const {
  if (listen_address.empty()) return absl::InvalidArgumentError("--listen must not be empty");
  POSENC_RETURN_IF_ERROR(ParseLogLevel(log_level).status());
  POSENC_RETURN_IF_ERROR(ParseLogFormat(log_format).status());
  POSENC_RETURN_IF_ERROR(
      NotAtLeast("--max_connection_age_ms", max_connection_age_ms, 0, " (0: never)"));
  POSENC_RETURN_IF_ERROR(
      NotAtLeast("--keepalive_time_ms", keepalive_time_ms, 0, " (0: gRPC's 2 hours)"));
  POSENC_RETURN_IF_ERROR(NotAtLeast("--keepalive_timeout_ms", keepalive_timeout_ms, 1));
  POSENC_RETURN_IF_ERROR(
      NotAtLeast("request_threads", request_threads, 0, " (0: every usable CPU)"));
  // gRPC would take a negative quota as no cap at all.
  POSENC_RETURN_IF_ERROR(NotAtLeast("--max_memory_bytes", max_memory_bytes, 0,
                                    " (0: --max_inflight_bytes + 2 x --max_message_bytes)"));
  POSENC_RETURN_IF_ERROR(NotAtLeast("--slow_call_ms", slow_call_ms, 0, " (0: never)"));
  POSENC_RETURN_IF_ERROR(NotAtLeast("--drain_seconds", drain_seconds, 0));
  POSENC_RETURN_IF_ERROR(
      NotAtLeast("--max_shared_memory_regions", engine.shared_memory.max_regions, 0));
  POSENC_RETURN_IF_ERROR(NotAtLeast("--max_shared_memory_regions_per_client",
                                    engine.shared_memory.max_regions_per_client, 0));
  POSENC_RETURN_IF_ERROR(
      NotAtLeast("--max_shared_memory_bytes", engine.shared_memory.max_total_bytes, 0));
  POSENC_RETURN_IF_ERROR(engine.Validate());
  if (max_memory_bytes > 0 && max_memory_bytes < 2 * engine.message_limit()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_memory_bytes (", max_memory_bytes,
                     ") must be 0 or at least twice --max_message_bytes (", engine.message_limit(),
                     "): the transport holds a message while it is read"));
  }
  return absl::OkStatus();
}

}  // namespace posenc::server
