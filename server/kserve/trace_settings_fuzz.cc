// Any bytes as a KServe TraceSettingRequest, through RequestedTraceConfig
// from a few settings (kserve/trace_settings.h). A finding is a crash, a
// sanitizer report, a status other than OK / INVALID_ARGUMENT, a setting
// out of its range, or an accepted request that is not idempotent (asked
// again from the setting it gave, it must give that setting) or whose
// setting, described and given back, is not itself.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kserve/trace_settings.h"

namespace {

void Fail(const char* what) {
  std::fprintf(stderr, "kserve_trace_settings_fuzz: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace k = posenc::server::kserve;
  using posenc::server::TraceConfig;
  inference::TraceSettingRequest req;
  if (!req.ParseFromArray(data, static_cast<int>(size))) return 0;
  for (const TraceConfig& from :
       {TraceConfig{}, TraceConfig{true, 1, 0}, TraceConfig{true, 7, 3}}) {
    absl::StatusOr<TraceConfig> to = k::RequestedTraceConfig(req.settings(), from);
    if (!to.ok()) {
      if (to.status().code() != absl::StatusCode::kInvalidArgument) {
        Fail(to.status().ToString().c_str());
      }
      continue;
    }
    if (to->rate < 1 || to->count < -1) Fail("a setting out of range");
    absl::StatusOr<TraceConfig> again = k::RequestedTraceConfig(req.settings(), *to);
    if (!again.ok() || *again != *to) Fail("not idempotent");
    inference::TraceSettingResponse described;
    k::DescribeTraceConfig(*to, &described);
    k::TraceSettingMap back;
    for (const auto& entry : described.settings()) {
      back[entry.first].mutable_value()->CopyFrom(entry.second.value());
    }
    absl::StatusOr<TraceConfig> round = k::RequestedTraceConfig(back, from);
    if (!round.ok() || *round != *to) Fail("described setting does not give itself back");
  }
  return 0;
}
