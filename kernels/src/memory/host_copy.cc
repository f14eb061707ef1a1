#include "posenc/host_copy.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace posenc {
namespace {

// Where a destination 1-63 bytes past its source modulo a page makes
// `rep movsb` slow: measured slow at 1-31 on the Zen 3, the rest of a
// cache line kept as margin.
bool Aliased(const void* to, const void* from) {
  const uintptr_t d = (reinterpret_cast<uintptr_t>(to) - reinterpret_cast<uintptr_t>(from)) & 4095;
  return d != 0 && d < 64;
}

// The largest copy glibc may make with `rep movsb` on AMD CPUs: it stops
// at the L2 cache's size there (on Intel at its non-temporal threshold,
// larger). Above it the pieces only lose: 16 against 25 GB/s between
// cached buffers 1 MiB long on the Zen 3 (512 KiB of L2), the same from
// memory.
size_t RepMovsbLimit() {
  static const size_t limit = [] {
    const long l2 = ::sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l2 > 0 ? static_cast<size_t>(l2) : size_t{1} << 20;
  }();
  return limit;
}

// Whether copying n bytes from `from` to `to` takes the 2 KiB pieces.
bool InPieces(const void* to, const void* from, size_t n) {
  return n < RepMovsbLimit() && Aliased(to, from);
}

}  // namespace

void CopyHostBytes(void* to, const void* from, size_t n) {
  if (n == 0) return;
  if (!InPieces(to, from, n)) {
    std::memcpy(to, from, n);
    return;
  }
  // glibc copies pieces this small with its vector loop: 12-16 GB/s hot
  // and at memory speed cold when aliased, where `rep movsb` gave 1.6-2.9.
  constexpr size_t kPiece = 2048;
  auto* dst = static_cast<char*>(to);
  const auto* src = static_cast<const char*>(from);
  for (size_t at = 0; at < n; at += kPiece)
    std::memcpy(dst + at, src + at, std::min(kPiece, n - at));
}

void AssignHostBytes(std::string* to, const char* from, size_t n) {
  // Bytes already in the string's buffer: clear() and resize() below would
  // overwrite them before they are copied; assign handles that.
  const auto at = reinterpret_cast<uintptr_t>(from), own = reinterpret_cast<uintptr_t>(to->data());
  if (at >= own && at < own + to->capacity() + 1) {
    to->assign(from, n);
    return;
  }
  // Where the buffer will be is known once it is reserved; assign then
  // copies into it without moving it.
  to->clear();
  to->reserve(n);
  if (!InPieces(to->data(), from, n)) {
    to->assign(from, n);
    return;
  }
  to->resize(n);
  CopyHostBytes(to->data(), from, n);
}

bool HostBytesOverlap(const void* a, size_t an, const void* b, size_t bn) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return an > 0 && bn > 0 && x < y + bn && y < x + an;
}

}  // namespace posenc
