#include "posenc/wire/tensors.h"

#include "absl/strings/str_cat.h"
#include "posenc/status_macros.h"
#include "posenc/wire/enums.h"

namespace posenc::wire {

absl::StatusOr<TensorView> ViewOf(absl::string_view field, bool has, const v1::Tensor& t) {
  TensorView v;
  if (!has) return v;
  POSENC_ASSIGN_OR_RETURN(v.dtype, FromProto(absl::StrCat(field, ".dtype"), t.dtype()));
  v.shape.assign(t.shape().begin(), t.shape().end());
  v.data = t.data().data();
  v.nbytes = t.data().size();
  POSENC_RETURN_IF_ERROR(ValidateTensorBytes(field, v.dtype, v.shape, v.nbytes));
  return v;
}

absl::StatusOr<MutableTensor> MutableOf(absl::string_view field, const v1::TensorDesc& desc,
                                        std::string* data) {
  return MutableOf(field, desc, data->data(), data->size());
}

absl::StatusOr<MutableTensor> MutableOf(absl::string_view field, const v1::TensorDesc& desc,
                                        void* data, size_t bytes) {
  MutableTensor t;
  POSENC_ASSIGN_OR_RETURN(t.dtype, FromProto(absl::StrCat(field, ".dtype"), desc.dtype()));
  t.shape.assign(desc.shape().begin(), desc.shape().end());
  t.data = data;
  t.nbytes = bytes;
  POSENC_RETURN_IF_ERROR(ValidateTensorBytes(field, t.dtype, t.shape, t.nbytes));
  return t;
}

v1::TensorDesc DescOf(DType dtype, absl::Span<const int64_t> shape) {
  v1::TensorDesc d;
  d.set_dtype(ToProto(dtype));
  for (int64_t s : shape) d.add_shape(s);
  return d;
}

void SetTensor(const TensorView& t, v1::TensorDesc* desc, std::string* data) {
  *desc = DescOf(t.dtype, t.shape);
  data->assign(static_cast<const char*>(t.data), t.nbytes);
}

void SetTensor(const TensorView& t, v1::Tensor* tensor) {
  tensor->set_dtype(ToProto(t.dtype));
  tensor->clear_shape();
  for (int64_t s : t.shape) tensor->add_shape(s);
  tensor->set_data(static_cast<const char*>(t.data), t.nbytes);
}

}  // namespace posenc::wire
