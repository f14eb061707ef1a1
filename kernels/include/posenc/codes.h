// The codes the CPU and CUDA kernels share: both use these enums and no
// other numbering. Plain enums with no dependencies, so device code includes
// them too. The wire (posenc.proto) has its own numbering; wire/ translates
// with checked switches, so nothing here is tied to it. Code that switches
// on one must reject values outside the enum (see Known*), never fall
// through silently.
#ifndef POSENC_CODES_H_
#define POSENC_CODES_H_

namespace posenc {

enum class DType : int {
  kFloat32 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kInt32 = 4,
  kInt64 = 5,
};

enum class RopeLayout : int { kBSHD = 1, kBHSD = 2, kTHD = 3 };

enum class RopeStyle : int {
  kNeox = 1,  // pairs i and i + R/2 (GPT-NeoX, LLaMA, HF rotate_half)
  kGptj = 2,  // pairs 2i and 2i + 1 (GPT-J, RoFormer)
};

enum class SinusoidalLayout : int {
  kInterleaved = 1,   // Vaswani: PE[p,2i]=sin, PE[p,2i+1]=cos, w_i = base^(-2i/d)
  kConcatenated = 2,  // fairseq/tensor2tensor: sin half then cos half,
                      // w_i = base^(-i/(d/2-1)); odd d ends in a zero channel
};

enum class BiasForm : int {
  kNone = 1,       // masks only
  kCausal = 2,     // -m * (i - j)
  kSymmetric = 3,  // -m * |i - j|
};

constexpr bool KnownLayout(RopeLayout l) {
  return l == RopeLayout::kBSHD || l == RopeLayout::kBHSD || l == RopeLayout::kTHD;
}
constexpr bool KnownStyle(RopeStyle s) { return s == RopeStyle::kNeox || s == RopeStyle::kGptj; }
constexpr bool KnownForm(BiasForm f) {
  return f == BiasForm::kNone || f == BiasForm::kCausal || f == BiasForm::kSymmetric;
}

}  // namespace posenc

#endif  // POSENC_CODES_H_
