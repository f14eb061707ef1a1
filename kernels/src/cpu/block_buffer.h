// The per-thread block buffer the CPU backend's "through" operations
// (rope_through.h, absolute_through.h, bias_through.h) copy a block of
// tokens (or bias rows) into, compute on while it is in L2, and copy out
// of.
#ifndef POSENC_KERNELS_CPU_BLOCK_BUFFER_H_
#define POSENC_KERNELS_CPU_BLOCK_BUFFER_H_

#include <cstdint>
#include <cstdlib>

namespace posenc::internal {

// Bytes a block holds: copied in, computed on and copied out while in L2
// (512 KiB a core on Zen 3, 1-2 MiB on the Xeons and Zen 5), with room for
// the kernels' tables and prefetches. 64-768 KiB blocks were within noise
// of each other for RoPE on the Zen 3.
inline constexpr int64_t kThroughBlockBytes = int64_t{192} << 10;

// A thread's block buffer, page-aligned. (Malloc'd, 16 bytes past a page,
// it put 1 MiB KServe calls at 0.9-1.2 ms of server CPU against 0.44-0.52:
// the copies into it from page-aligned slices hit glibc's slow `rep movsb`
// case, posenc/host_copy.h.)
class BlockBuffer {
 public:
  BlockBuffer() = default;
  BlockBuffer(const BlockBuffer&) = delete;
  BlockBuffer& operator=(const BlockBuffer&) = delete;
  ~BlockBuffer() { std::free(data_); }
  // At least `bytes`, kept for the next call.
  char* Reserve(int64_t bytes) {
    if (bytes > size_) {
      std::free(data_);
      size_ = (bytes + 4095) / 4096 * 4096;
      data_ = static_cast<char*>(std::aligned_alloc(4096, static_cast<size_t>(size_)));
      if (data_ == nullptr) std::abort();  // a few hundred KiB a thread
    }
    return data_;
  }

 private:
  char* data_ = nullptr;
  int64_t size_ = 0;
};

// This thread's block buffer, one for every through operation.
inline BlockBuffer& ThisThreadsBlockBuffer() {
  thread_local BlockBuffer buffer;
  return buffer;
}

}  // namespace posenc::internal

#endif  // POSENC_KERNELS_CPU_BLOCK_BUFFER_H_
