// posenc-bench-hf-config: what an hf_config costs the server per request.
// For each real family's config from tests/conformance/hf/hf_fixtures.json: a cold
// ResolveHfRope (protobuf's JSON parse and the family rules), RopeOptionsOf
// on a request carrying the config (the server's path, through the
// resolved-config cache, so every call after the first is a hit), and
// RopeOptionsOf on the same request with the options sent as fields.
// Median of repeated runs, one thread, no sockets.
//
// Usage: posenc-bench-hf-config [hf_fixtures.json]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "posenc/v1/posenc.pb.h"
#include "posenc/wire/hf_config.h"
#include "posenc/wire/requests.h"

namespace {

using Clock = std::chrono::steady_clock;

// Median microseconds per call of `f` over 15 runs of `n` calls.
template <typename F>
double MicrosPerCall(F f, int n) {
  std::vector<double> runs;
  for (int r = 0; r < 15; ++r) {
    const auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) {
      absl::Status s = f();
      if (!s.ok()) {
        std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
        std::exit(1);
      }
    }
    runs.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / n);
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::ifstream in(argc > 1 ? argv[1] : POSENC_HF_FIXTURES);
  std::stringstream ss;
  ss << in.rdbuf();
  const nlohmann::json fixtures = nlohmann::json::parse(ss.str());
  std::printf(
      "| config | JSON bytes | ResolveHfRope, cold (us) | RopeOptionsOf with hf_config, cached "
      "(us) | RopeOptionsOf, options as fields (us) |\n");
  std::printf("| --- | --- | --- | --- | --- |\n");
  for (const auto& c : fixtures.at("configs")) {
    const std::string config = c.at("config");
    posenc::v1::RopeRequest with_config;
    with_config.set_hf_config(config);
    auto hf = posenc::wire::ResolveHfRope(config);
    if (!hf.ok()) return 1;
    posenc::v1::RopeRequest as_fields;
    posenc::wire::SetRopeOptions(hf->options, &as_fields);
    auto options_of = [](const posenc::v1::RopeRequest& r) {
      return [&r] { return posenc::wire::RopeOptionsOf(r).status(); };
    };
    const double cold =
        MicrosPerCall([&] { return posenc::wire::ResolveHfRope(config).status(); }, 500);
    std::printf("| %s | %zu | %.2f | %.2f | %.2f |\n", c.at("name").get<std::string>().c_str(),
                config.size(), cold, MicrosPerCall(options_of(with_config), 20000),
                MicrosPerCall(options_of(as_fields), 20000));
  }
  return 0;
}
