// Any bytes as a traceparent value, through TraceIdOf (rpc/trace_context.h).
// A finding is a crash, a sanitizer report, or a trace id that is not 32
// lowercase hex digits (not all zero) found at the value's offset 3.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "rpc/trace_context.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string value(reinterpret_cast<const char*>(data), size);
  const std::string id = posenc::server::TraceIdOf(value);
  if (id.empty()) return 0;
  bool nonzero = false;
  for (char c : id) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) std::abort();
    nonzero = nonzero || c != '0';
  }
  if (id.size() != 32 || !nonzero || value.compare(3, 32, id) != 0) {
    std::fprintf(stderr, "trace_context_fuzz: %s from %s\n", id.c_str(), value.c_str());
    std::abort();
  }
  return 0;
}
