// Copies between host buffers that stay fast whatever the buffers'
// addresses. glibc's memcpy moves blocks of about 4 KiB to a few hundred
// KiB with `rep movsb` on CPUs with fast short `rep movsb` (FSRM), which on
// the AMD Zen 3 here ran 4-25 times slower when the destination lay 1-31
// bytes past the source modulo 4096: 1.6-2.9 GB/s against 30-50 GB/s
// between cached buffers, 2 against 8 GB/s from memory (others have seen
// the same on Zen 3 desktop parts). A page-aligned shared-memory slice
// copied into a fresh malloc'd buffer (16 bytes past a page) is exactly
// that case.
#ifndef POSENC_HOST_COPY_H_
#define POSENC_HOST_COPY_H_

#include <cstddef>
#include <string>

namespace posenc {

// memcpy(to, from, n), for buffers that do not overlap; in 2 KiB pieces
// (below glibc's `rep movsb` threshold) where the addresses alias as above
// and n is in `rep movsb`'s range (below the L2 cache's size).
void CopyHostBytes(void* to, const void* from, size_t n);

// to->assign(from, n), through CopyHostBytes (`from` may lie in *to).
void AssignHostBytes(std::string* to, const char* from, size_t n);

// Whether [a, a + an) and [b, b + bn) share a byte (empty ranges share
// none): what CopyHostBytes, and every "into other memory" path that reads
// its input after writing part of its output, must rule out.
bool HostBytesOverlap(const void* a, size_t an, const void* b, size_t bn);

}  // namespace posenc

#endif  // POSENC_HOST_COPY_H_
