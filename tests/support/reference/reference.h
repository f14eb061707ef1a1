// The float64 reference of SPEC §5: the formulas of SPEC §2 written as
// directly as possible, independent of the kernel library's planning code, so
// tests compare two separate derivations.
#ifndef POSENC_TESTS_REFERENCE_H_
#define POSENC_TESTS_REFERENCE_H_

#include <cstdint>
#include <vector>

#include "posenc/absolute.h"
#include "posenc/attention_bias.h"
#include "posenc/rope.h"

namespace posenc::reference {

struct Frequencies {
  std::vector<double> inv_freq;  // [R/2]
  std::vector<int> axis;         // [R/2]
  double scale = 1.0;
};

// HF modeling_rope_utils semantics for a sequence of length L.
Frequencies RopeFrequencies(const RopeOptions& o, int64_t R, int64_t L);

// Rotates one head x[head_dim] in float64, positions per axis.
void RotateHead(const RopeOptions& o, const Frequencies& f, int64_t R,
                const std::vector<int64_t>& pos, double* x);

// Sinusoidal PE[pos] of width d.
std::vector<double> SinusoidalRow(SinusoidalLayout layout, double base, int64_t d, int64_t pos);

// The ALiBi paper's get_slopes, recursively as published.
std::vector<double> PaperAlibiSlopes(int64_t n);

// Bias element (b, h, i, j) in float64 (-inf when masked).
double Bias(const BiasPlan& p, int64_t b, int64_t h, int64_t i, int64_t j);

}  // namespace posenc::reference

#endif  // POSENC_TESTS_REFERENCE_H_
