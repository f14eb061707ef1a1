// Any bytes as a KServe LogSettingsRequest, through RequestedLogState from
// every level and format (kserve/log_settings.h). A finding is a crash, a
// sanitizer report, a status other than OK / INVALID_ARGUMENT, or an
// accepted request that is not idempotent (asked again from the state it
// gave, it must give that state) or whose state, described and given back
// by log_level and log_format, is not itself.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kserve/log_settings.h"

namespace {

void Fail(const char* what) {
  std::fprintf(stderr, "kserve_log_settings_fuzz: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace k = posenc::server::kserve;
  using posenc::server::LogFormat;
  inference::LogSettingsRequest req;
  if (!req.ParseFromArray(data, static_cast<int>(size))) return 0;
  for (int l = spdlog::level::trace; l <= spdlog::level::off; ++l) {
    for (LogFormat f : {LogFormat::kText, LogFormat::kJson}) {
      const k::LogState from{static_cast<spdlog::level::level_enum>(l), f};
      absl::StatusOr<k::LogState> to = k::RequestedLogState(req.settings(), from);
      if (!to.ok()) {
        if (to.status().code() != absl::StatusCode::kInvalidArgument) {
          Fail(to.status().ToString().c_str());
        }
        continue;
      }
      absl::StatusOr<k::LogState> again = k::RequestedLogState(req.settings(), *to);
      if (!again.ok() || *again != *to) Fail("not idempotent");
      inference::LogSettingsResponse described;
      k::DescribeLogState(*to, &described);
      k::LogSettingMap back;
      for (const char* name : {"log_level", "log_format"}) {
        if (!back[name].ParseFromString(described.settings().at(name).SerializeAsString())) {
          Fail("a described setting does not parse as a request's");
        }
      }
      absl::StatusOr<k::LogState> round = k::RequestedLogState(back, from);
      if (!round.ok() || *round != *to) Fail("described state does not give itself back");
    }
  }
  return 0;
}
