// CPU kernels: each processes a contiguous range of the work a plan
// describes, so the backend can split it across threads. The per-element
// arithmetic is math/*.h, shared with the CUDA kernels. Internal.
#ifndef POSENC_KERNELS_CPU_CPU_KERNELS_H_
#define POSENC_KERNELS_CPU_CPU_KERNELS_H_

#include <cstdint>
#include <cstring>
#include <memory>

#include "posenc/absolute.h"
#include "posenc/attention_bias.h"
#include "posenc/rope.h"

// One binary serves old and new x86-64 CPUs: the hot loops are compiled three
// times and the loader picks the AVX-512 or AVX2 version where the CPU has
// it. Contraction into FMA is off for the whole library (CMake), so every
// clone computes exactly the operations the CUDA kernels do.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
// POSENC_CPU_BF16_WIDE: the loops written in x86 intrinsics are compiled
// in, each chosen at run time: the 512-bit bfloat16 ones, compiled by
// POSENC_BF16_WIDE_TARGET for CPUs with AVX-512 (CpuHasAvx512), which
// narrow by AVX-512 BF16's instruction where the CPU has it
// (CpuHasAvx512Bf16) and by integer rounding where not (bf16_wide.h's
// Narrowing: the latter's instantiations call no BF16 intrinsic, GCC
// emits none unasked, and the ctest narrowing_code checks the object
// code); and the AVX-512 and AVX2 ones below. Sanitizer
// builds keep them (their choice is a plain call, not an ifunc).
#define POSENC_CPU_BF16_WIDE 1
#ifndef POSENC_EMULATE_AVX512
#define POSENC_BF16_WIDE_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,bmi2")))
// Loops chosen at run time on CPUs with AVX-512 (CpuHasAvx512), BF16 or not.
#define POSENC_AVX512_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,bmi2")))
#else
// The emulated AVX-512 test build (x86_intrinsics.h): the same loops for
// AVX2 CPUs, their AVX-512 intrinsics in portable code.
#define POSENC_BF16_WIDE_TARGET __attribute__((target("avx2,fma,bmi2")))
#define POSENC_AVX512_TARGET __attribute__((target("avx2,fma,bmi2")))
#endif
// Loops in 256-bit registers chosen at run time where the 512-bit ones are
// not (CpuHasAvx2): AVX2 hosts, and AVX-512 ones without BF16 for the
// bfloat16 bias (bias_cpu.cc).
#define POSENC_AVX2_TARGET __attribute__((target("avx2,fma,bmi2")))
#endif

#if defined(POSENC_CPU_BF16_WIDE) && !defined(POSENC_NO_CLONES)
#define POSENC_CPU_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
// Sanitizer builds (POSENC_NO_CLONES): an ifunc's resolver runs before the
// sanitizer runtime has started.
#define POSENC_CPU_CLONES
#endif

#define POSENC_ALWAYS_INLINE inline __attribute__((always_inline))

namespace posenc::internal {

// n elements left uninitialised: for scratch lists sized for the worst case
// and rarely filled (a std::vector would zero them, and a large one gets
// fresh pages from the kernel, on every call).
template <typename T>
class UninitializedArray {
 public:
  explicit UninitializedArray(int64_t n) : data_(new T[static_cast<size_t>(n)]) {}
  T* data() { return data_.get(); }
  T& operator[](int64_t i) { return data_[i]; }

 private:
  std::unique_ptr<T[]> data_;
};

// Calls fix(i) for every nonzero byte of flag[0, n), reading eight bytes at a
// time: flags are sparse, and a byte-by-byte scan cost more than the work.
template <typename Fix>
POSENC_ALWAYS_INLINE void ForEachFlagged(const uint8_t* flag, int64_t n, Fix fix) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t word;
    std::memcpy(&word, flag + i, 8);
    while (word != 0) {
      const int byte = __builtin_ctzll(word) / 8;
      fix(i + byte);
      word &= ~(uint64_t{0xff} << (8 * byte));
    }
  }
  for (; i < n; ++i) {
    if (flag[i]) fix(i);
  }
}

// Whether the POSENC_AVX2_TARGET loops run here: compiled in (with the
// 512-bit ones), and the CPU has AVX2, FMA and BMI2, unless POSENC_NO_AVX2
// is set. Without them the portable 8-lane loops (vec.h) run, as on CPUs
// without AVX2; POSENC_NO_AVX2 turns off the 512-bit loops too, so that
// any machine can run those. Callers prefer the 512-bit loops where those
// run.
bool CpuHasAvx2();

// Whether the POSENC_AVX512_TARGET loops run here: CpuHasAvx2, and the CPU
// has AVX-512 F, BW, VL and DQ, unless POSENC_NO_AVX512 is set (for
// comparing with the other loops on one machine; it turns off the BF16
// ones too). In the emulated AVX-512 build, CpuHasAvx2 alone.
bool CpuHasAvx512();

// Whether the 512-bit bfloat16 loops narrow by AVX-512 BF16's
// VCVTNE2PS2BF16 here (bf16_wide.h's Narrowing::kInstruction; else by
// integer rounding): CpuHasAvx512 and AVX-512 BF16, unless
// POSENC_NO_AVX512BF16 is set. In the emulated AVX-512 build, CpuHasAvx512
// alone.
bool CpuHasAvx512Bf16();

// Whether this is an Intel CPU, whose prefetchers (on the one Xeon
// measured, bench/RESULTS.md 2026-11-30) leave the loops waiting unless
// they ask for lines into L2 further along the stream they write: RoPE's
// kFarAheadInRun, the sinusoidal add's kWideF32FarAhead and
// kWideRowsAheadIntel512. POSENC_CPU_VENDOR overrides the probe: "intel"
// for true, any other value for false.
bool CpuIsIntel();

// Whether the 512-bit bfloat16 NEOX RoPE loop tests its pairs in 16-bit
// lanes (rope_wide_exactness.h's PairTestBF16x32) rather than by
// PairsToRedo: on CPUs other than Intel's (CpuIsIntel). POSENC_LANE_TEST
// overrides that: "1" for true, any other value for false (A/B runs of
// the bench on either kind of CPU, and tests).
bool CpuTakesLaneTest();

// Runs fn(scratch) with the calling thread's Scratch for `plan`, kept from
// call to call: building one per call zeroed ~75-170 KiB, whose pages went
// back to the kernel when it was freed, so every call faulted them in again
// (50-70 us of a one-token sinusoidal call that otherwise takes a few).
// Scratch provides Serves(plan) (its buffers fit the plan), Restart(plan)
// (readies kept buffers for it) and Bytes(); one over 4 MiB is not kept.
template <typename Scratch, typename Plan, typename Fn>
void WithThreadScratch(const Plan& plan, Fn fn) {
  constexpr int64_t kKeptBytes = int64_t{4} << 20;
  thread_local std::unique_ptr<Scratch> kept;
  if (kept != nullptr && kept->Serves(plan)) {
    kept->Restart(plan);
  } else {
    kept = std::make_unique<Scratch>(plan);
  }
  fn(*kept);
  if (kept->Bytes() > kKeptBytes) kept.reset();
}

class RowTable;

// Rotates tokens [begin, end) of query and key in place, with the slot
// rotations `rotations` keeps. REQUIRES: rotations is null or
// RotationCache::For(plan)'s table (checked, cheaply: RotationCache::Serves;
// aborts otherwise). `origin`: the token whose rows query and key start
// with, for a block of tokens [origin, ...) copied to memory of its own
// (rope_through.h). In BHSD such a block is head-major, `block_tokens`
// tokens a head: head h's row of token t at (h * block_tokens + t -
// origin) * head_dim; block_tokens 0 (BHSD's whole tensors) needs origin
// 0. Token-major layouts ignore block_tokens.
void RopeTokensCpu(const RopePlan& plan, RowTable* rotations, void* query, void* key, int64_t begin,
                   int64_t end, int64_t origin = 0, int64_t block_tokens = 0);

// Whether AbsoluteTokensCpu reads kept anchor rows for plan at all: its
// fused pass does; the two-pass path (learned tables, float16, PE only, an
// x_scale of 0) computes whole PE rows and reads none.
bool ReadsAnchorRows(const AbsolutePlan& plan);
// Whether AbsoluteTokensCpu keeps plan's sinusoidal anchor rows in pairs
// (anchor_cache.h) on this CPU, rather than in halves.
bool AnchorRowsInPairs(const AbsolutePlan& plan);
// The floats of one such row: 2 or 4 a frequency.
int64_t AnchorRowFloats(const AbsolutePlan& plan);

// Rows of anchors 16 first, ..., 16 (first + count - 1) of the phase steps
// step[0, frequencies), in pairs or halves: what AbsoluteTokensCpu computes
// for those anchors, bit for bit (anchor_cache.h keeps them). Compiled per
// instruction set like the kernels, so that the call that first reaches an
// anchor pays about what computing it there would.
void FillAnchorRows(const uint64_t* step, int64_t frequencies, bool pairs, int64_t first,
                    int64_t count, float* rows);

// Writes y = x * x_scale + PE for tokens [begin, end), with the sinusoidal
// anchor rows `anchors` keeps. REQUIRES: anchors is null or
// AnchorCache::For(plan)'s table (checked, cheaply: AnchorCache::Serves;
// aborts otherwise). `origin`: the token whose row x starts with, for a
// block of tokens [origin, ...) copied to memory of its own
// (absolute_through.h).
void AbsoluteTokensCpu(const AbsolutePlan& plan, RowTable* anchors, void* x, int64_t begin,
                       int64_t end, int64_t origin = 0);

// Writes (or adds) the bias for rows [begin, end) of [batch * heads * q_len].
// `origin`: the row `out` starts with, for a block of rows [origin, ...)
// copied to memory of its own (bias_through.h).
void AttentionBiasRowsCpu(const BiasPlan& plan, void* out, int64_t begin, int64_t end,
                          int64_t origin = 0);

// The same for keys [k_begin, k_end) of row `row` only, `out` holding
// them (key k_begin first): a row too large for a block, in pieces
// (bias_through.h). Bit for bit the row's values. REQUIRES: 0 <= k_begin
// < k_end <= plan.k_len.
void AttentionBiasKeysCpu(const BiasPlan& plan, void* out, int64_t row, int64_t k_begin,
                          int64_t k_end);

// The keys of each row a bias loop computes: [first, first + count) of
// the row's k_len, `count` of them a row in its output.
struct KeyWindow {
  int64_t first, count;
};

}  // namespace posenc::internal

#endif  // POSENC_KERNELS_CPU_CPU_KERNELS_H_
