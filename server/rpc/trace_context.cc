#include "rpc/trace_context.h"

namespace posenc::server {
namespace {

// version "-" trace-id "-" parent-id "-" flags: 2 + 1 + 32 + 1 + 16 + 1 + 2.
constexpr size_t kFieldsLength = 55;

bool LowerHex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

// Whether s[from, from + n) is n lowercase hex digits, and (if nonzero)
// not all of them '0'.
bool HexField(absl::string_view s, size_t from, size_t n, bool nonzero) {
  bool any = false;
  for (size_t i = from; i < from + n; ++i) {
    if (!LowerHex(s[i])) return false;
    any = any || s[i] != '0';
  }
  return any || !nonzero;
}

}  // namespace

std::string TraceIdOf(absl::string_view v) {
  if (v.size() < kFieldsLength) return "";
  if (!HexField(v, 0, 2, false) || v.substr(0, 2) == "ff") return "";
  if (v.substr(0, 2) == "00" ? v.size() != kFieldsLength
                             : v.size() > kFieldsLength && v[kFieldsLength] != '-') {
    return "";
  }
  if (v[2] != '-' || v[35] != '-' || v[52] != '-') return "";
  if (!HexField(v, 3, 32, true) || !HexField(v, 36, 16, true) || !HexField(v, 53, 2, false)) {
    return "";
  }
  return std::string(v.substr(3, 32));
}

}  // namespace posenc::server
