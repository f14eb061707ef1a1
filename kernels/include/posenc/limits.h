// Hard limits on what one request may ask for. Every request is checked
// against them before anything is allocated, so no shape, count or parameter
// can make planning or a kernel overflow, allocate without bound or run
// without end. Each limit sits far above what published models use (numbers
// in the comments) and low enough that products of limits stay exact in int64
// and double. GetServerInfo reports them; posenc.proto documents them. Never
// lower one without a major version: callers may depend on it.
#ifndef POSENC_LIMITS_H_
#define POSENC_LIMITS_H_

#include <cstdint>

namespace posenc {

// Heads of a query, key, or attention bias. Largest published: 128.
inline constexpr int64_t kMaxHeads = int64_t{1} << 16;
// head_dim, rotary_dim, and d of absolute encodings and tables. Published
// head dims are 64-256; model widths up to ~25k.
inline constexpr int64_t kMaxDim = int64_t{1} << 16;
// Sequences in one request (batch). Serving engines batch 256-1024.
inline constexpr int64_t kMaxSequences = int64_t{1} << 20;
// Tokens in one request (batch x seq, or THD's tokens), and positions an
// encoding table returns. 2^28 bf16 pairs already fill 1 GiB.
inline constexpr int64_t kMaxTokens = int64_t{1} << 28;
// Position axes (AXIAL / MROPE): images use 2, video 3.
inline constexpr int64_t kMaxAxes = 8;
// |position| and q_len / k_len: the angle reduction is exact while
// |position x frequency| <= 2^31 (see kernels/src/angle.h).
inline constexpr int64_t kMaxAbsPosition = int64_t{1} << 31;
// Elements of one attention bias [batch, heads, q_len, k_len].
inline constexpr int64_t kMaxBiasElements = int64_t{1} << 31;
// Rows of a learned table (positions it covers).
inline constexpr int64_t kMaxTableRows = int64_t{1} << 31;
// Elements of any tensor, even an empty one: the product of its nonzero
// dimensions. Keeps byte counts (x 8) exact in int64.
inline constexpr int64_t kMaxTensorElements = int64_t{1} << 60;

// Floating parameters. Ranges keep every derived frequency and scale finite
// and every output finite for finite inputs of reasonable size.
// RoPE and sinusoidal base theta: (1, 1e18]. Published: 100-5e8.
inline constexpr double kMaxBase = 1e18;
// Scaling factors (linear, dynamic NTK, YaRN, Llama 3, LongRoPE, their
// low/high frequency factors and per-slot short/long factors): (0, 1e6].
inline constexpr double kMaxScalingFactor = 1e6;
// YaRN beta_fast / beta_slow: [2^-20, 2^20]. Published: 32 and 1.
inline constexpr double kMinYarnBeta = 1.0 / (1 << 20);
inline constexpr double kMaxYarnBeta = 1 << 20;
// YaRN mscale / mscale_all_dim: [0, 1e3]. Published: 0.707-1.
inline constexpr double kMaxYarnMscale = 1e3;
// The attention scale s multiplying cos and sin, given or derived: (0, 1e3].
// Published: 1-1.4.
inline constexpr double kMaxAttentionScale = 1e3;
// |inverse frequency| of EXPLICIT scaling: <= 1e3 (published: <= 1).
inline constexpr double kMaxInvFreq = 1e3;
// |x_scale| of absolute encodings: <= 1e6 (sqrt(d) is at most 256).
inline constexpr double kMaxXScale = 1e6;
// |ALiBi slope|: <= 1e3 (the paper's slopes are at most 1/2).
inline constexpr double kMaxSlope = 1e3;

}  // namespace posenc

#endif  // POSENC_LIMITS_H_
