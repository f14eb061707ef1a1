// Tensors on the wire (TensorDesc + bytes field, or an inline Tensor) and
// the kernel library's views of them. Views alias the message's bytes: no
// copy on the way in; SetTensor makes the one copy serialisation needs.
#ifndef POSENC_WIRE_TENSORS_H_
#define POSENC_WIRE_TENSORS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "posenc/tensor.h"
#include "posenc/v1/posenc.pb.h"

namespace posenc::wire {

// A view of an inline tensor; an absent view when `has` is false. The dtype
// must be set and the bytes must match the shape (errors name `field`).
[[nodiscard]] absl::StatusOr<TensorView> ViewOf(absl::string_view field, bool has,
                                                const v1::Tensor& t);

// A writable view over `data` as `desc` describes it.
[[nodiscard]] absl::StatusOr<MutableTensor> MutableOf(absl::string_view field,
                                                      const v1::TensorDesc& desc,
                                                      std::string* data);
// The same over `bytes` bytes at `data` (a shared-memory slice).
[[nodiscard]] absl::StatusOr<MutableTensor> MutableOf(absl::string_view field,
                                                      const v1::TensorDesc& desc, void* data,
                                                      size_t bytes);

v1::TensorDesc DescOf(DType dtype, absl::Span<const int64_t> shape);

// Fills a descriptor + bytes pair, or an inline tensor, from a view (one
// copy of the data).
void SetTensor(const TensorView& t, v1::TensorDesc* desc, std::string* data);
void SetTensor(const TensorView& t, v1::Tensor* tensor);

}  // namespace posenc::wire

#endif  // POSENC_WIRE_TENSORS_H_
