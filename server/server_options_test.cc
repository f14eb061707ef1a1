#include "server_options.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace posenc::server {
namespace {

TEST(ServerOptions, DefaultsAreValidAndDerivedLimitsFollowTheBudget) {
  ServerOptions o;
  ASSERT_TRUE(o.Validate().ok()) << o.Validate();
  EXPECT_EQ(o.engine.message_limit(), o.engine.max_request_tensor_bytes + kMessageSlackBytes);
  EXPECT_EQ(o.transport_memory_limit(), o.engine.max_inflight_bytes + 2 * o.engine.message_limit());
  o.engine.max_message_bytes = 8 << 20;
  o.max_memory_bytes = 100 << 20;
  EXPECT_EQ(o.engine.message_limit(), 8 << 20);
  EXPECT_EQ(o.transport_memory_limit(), 100 << 20);
}

TEST(ServerOptions, EachValueOutOfRangeIsRefusedNamingItsFlag) {
  struct Case {
    std::function<void(ServerOptions&)> set;
    std::string names;
  };
  const std::vector<Case> cases = {
      {[](ServerOptions& o) { o.log_level = "verbose"; }, "--log_level"},
      {[](ServerOptions& o) { o.log_format = "xml"; }, "--log_format"},
      {[](ServerOptions& o) { o.slow_call_ms = -1; }, "--slow_call_ms"},
      {[](ServerOptions& o) { o.drain_seconds = -1; }, "--drain_seconds"},
      {[](ServerOptions& o) { o.max_memory_bytes = -1; }, "--max_memory_bytes must be >= 0"},
      {[](ServerOptions& o) { o.max_memory_bytes = 1 << 20; }, "--max_memory_bytes"},
      {[](ServerOptions& o) { o.max_connection_age_ms = -5; }, "--max_connection_age_ms"},
      {[](ServerOptions& o) { o.keepalive_time_ms = -1; }, "--keepalive_time_ms must be >= 0"},
      {[](ServerOptions& o) { o.keepalive_timeout_ms = 0; }, "--keepalive_timeout_ms must be >= 1"},
      {[](ServerOptions& o) { o.engine.shared_memory.max_regions = -1; },
       "--max_shared_memory_regions"},
      {[](ServerOptions& o) { o.engine.shared_memory.max_regions_per_client = -1; },
       "--max_shared_memory_regions_per_client"},
      {[](ServerOptions& o) { o.engine.cpu_threads = -3; }, "--threads"},
      {[](ServerOptions& o) { o.engine.max_inflight_requests = 0; }, "--max_inflight"},
      {[](ServerOptions& o) { o.engine.max_inflight_bytes = 1000; }, "--max_inflight_bytes (1000)"},
      {[](ServerOptions& o) { o.engine.max_request_tensor_bytes = 0; }, "--max_request_bytes"},
      {[](ServerOptions& o) { o.engine.max_message_bytes = int64_t{1} << 31; },
       "--max_message_bytes"},
      {[](ServerOptions& o) { o.engine.default_backend = BackendChoice::kDefault; },
       "--default_backend"},
      {[](ServerOptions& o) { o.engine.admission_wait = absl::Milliseconds(-1); },
       "--admission_wait_ms"},
      {[](ServerOptions& o) { o.engine.cuda_device = -1; }, "--cuda_device"},
      {[](ServerOptions& o) {
         o.engine.cuda_devices = {0, -1};
       },
       "--cuda_devices must be >= 0"},
      {[](ServerOptions& o) {
         o.engine.cuda_devices = {0, 1, 0};
       },
       "--cuda_devices must be named once"},
      {[](ServerOptions& o) {
         o.engine.cuda_devices = {1, 2};
       },
       "--cuda_device must be one of --cuda_devices"},
  };
  for (const Case& c : cases) {
    ServerOptions o;
    c.set(o);
    const absl::Status s = o.Validate();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.names;
    EXPECT_NE(s.message().find(c.names), absl::string_view::npos) << s.message();
  }
}

}  // namespace
}  // namespace posenc::server
