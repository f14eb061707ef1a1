#include "rpc/call.h"

#include "absl/strings/str_cat.h"
#include "engine/no_throw.h"
#include "rpc/call_log.h"
#include "rpc/call_trace.h"
#include "rpc/decoded_size.h"
#include "rpc/logging.h"

namespace posenc::server {

absl::Status HoldWhileParsing(const Method& method, const grpc::ByteBuffer& request,
                              Engine::Admission& ticket) {
  const int64_t wire = static_cast<int64_t>(request.Length());
  const int64_t decoded = method.request_type != nullptr
                              ? DecodedBytesBound(*method.request_type, request)
                              : wire;  // as much again
  const int64_t held = BytesWhileParsing(wire, decoded);
  const absl::Status s = ticket.Resize(held);
  if (s.ok() || decoded <= wire) return s;
  return absl::ResourceExhaustedError(absl::StrCat(
      "the request's ", wire, " bytes parse into up to ", decoded,
      " bytes of objects (many small fields), more than the call can hold now: ", s.message()));
}

absl::Status RunMethod(const Method& method, grpc::ByteBuffer* request, grpc::ByteBuffer* answer,
                       MethodCall& call) {
  return NoThrow([&] { return method.run(call, request, answer); });
}

std::string CallRequestId(const std::string& metadata_id, const CallFacts& facts,
                          bool stream_message) {
  const bool message_first = stream_message && !facts.message_id.empty();
  return message_first || metadata_id.empty() ? CleanRequestId(facts.message_id) : metadata_id;
}

void FinishCall(Metrics* metrics, const CallOutcome& o) {
  const std::string& name = o.method->name;
  const CallIds ids{CallRequestId(o.caller.request_id, *o.facts, o.stream_message),
                    o.caller.trace_id};
  LogFailure(name, o.status, ids);
  // One clock reading for the call's end: its log lines and metrics agree.
  const auto end = std::chrono::steady_clock::now();
  LogIfSlow(name, o.status, o.start, end, ids, o.facts->stages);
  if (SampleCall()) LogTrace(name, o.status, o.start, end, ids, o.facts->stages);
  if (metrics == nullptr) return;
  const double seconds = std::chrono::duration<double>(end - o.start).count();
  const bool ok = o.status.ok();
  metrics->RecordCall(name, absl::StatusCodeToString(o.status.code()), seconds,
                      static_cast<double>(o.bytes_in + o.facts->shared_memory_in),
                      ok ? static_cast<double>(o.bytes_out + o.facts->shared_memory_out) : 0.0,
                      ok ? o.facts->backend : "");
}

bool StreamEnds(const absl::Status& s, const Engine& engine) {
  return s.code() == absl::StatusCode::kCancelled ||
         s.code() == absl::StatusCode::kDeadlineExceeded ||
         (s.code() == absl::StatusCode::kUnavailable && engine.draining());
}

}  // namespace posenc::server
