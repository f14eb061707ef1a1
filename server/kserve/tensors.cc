#include "kserve/tensors.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/utf8.h"
#include "posenc/status_macros.h"

namespace posenc::server::kserve {
namespace {

struct DatatypeName {
  DType dtype;
  const char* name;
};
constexpr DatatypeName kDatatypes[] = {
    {DType::kFloat32, "FP32"}, {DType::kFloat16, "FP16"}, {DType::kBFloat16, "BF16"},
    {DType::kInt32, "INT32"},  {DType::kInt64, "INT64"},
};

// Appends `values` as little-endian bytes (the hosts posenc runs on are
// little-endian, as the protocol's raw contents are).
template <typename T, typename Repeated>
std::string BytesOf(const Repeated& values) {
  std::string out(values.size() * sizeof(T), '\0');
  for (int i = 0; i < values.size(); ++i) {
    const T v = static_cast<T>(values.Get(i));
    std::memcpy(out.data() + i * sizeof(T), &v, sizeof(T));
  }
  return out;
}

// The typed contents of an input of type `dtype`, as bytes; an error naming
// the input when they are in a field that does not match its datatype.
absl::StatusOr<std::string> TypedContents(absl::string_view field, DType dtype,
                                          const inference::InferTensorContents& c) {
  const int used = (c.bool_contents_size() > 0) + (c.int_contents_size() > 0) +
                   (c.int64_contents_size() > 0) + (c.uint_contents_size() > 0) +
                   (c.uint64_contents_size() > 0) + (c.fp32_contents_size() > 0) +
                   (c.fp64_contents_size() > 0) + (c.bytes_contents_size() > 0);
  const int matching = dtype == DType::kFloat32 ? c.fp32_contents_size()
                       : dtype == DType::kInt32 ? c.int_contents_size()
                       : dtype == DType::kInt64 ? c.int64_contents_size()
                                                : 0;
  if (used > (matching > 0 ? 1 : 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input ", field,
        ": typed contents must be fp32_contents for FP32, int_contents for "
        "INT32 or int64_contents for INT64 (FP16 and BF16 only as raw_input_contents); the "
        "datatype is ",
        DatatypeOf(dtype)));
  }
  switch (dtype) {
    case DType::kFloat32:
      return BytesOf<float>(c.fp32_contents());
    case DType::kInt32:
      return BytesOf<int32_t>(c.int_contents());
    case DType::kInt64:
      return BytesOf<int64_t>(c.int64_contents());
    default:
      return std::string();
  }
}

}  // namespace

absl::StatusOr<DType> DTypeOf(absl::string_view field, absl::string_view datatype) {
  for (const DatatypeName& d : kDatatypes) {
    if (datatype == d.name) return d.dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": datatype must be one of FP32, FP16, BF16, INT32, INT64, got \"",
                   Utf8Prefix(datatype, 32), "\""));
}

const char* DatatypeOf(DType dtype) {
  for (const DatatypeName& d : kDatatypes) {
    if (d.dtype == dtype) return d.name;
  }
  return "INVALID";
}

int64_t TensorBytes(const inference::ModelInferRequest& req) {
  int64_t bytes = 0;
  for (const std::string& raw : req.raw_input_contents()) bytes += raw.size();
  for (const auto& in : req.inputs()) {
    const inference::InferTensorContents& c = in.contents();
    bytes += 4 * int64_t{c.fp32_contents_size()} + 4 * int64_t{c.int_contents_size()} +
             8 * int64_t{c.int64_contents_size()};
  }
  return bytes;
}

absl::Status Input::MakePrivate(absl::string_view field) {
  if (!shm) return absl::OkStatus();
  POSENC_RETURN_IF_ERROR(shm->region->Read(field, shm->offset, shm->byte_size, &data));
  shm.reset();
  return absl::OkStatus();
}

absl::Status Input::MakeScratch(absl::string_view field, ScratchPool& pool,
                                AdmissionControl::Ticket& call) {
  if (!shm || scratch) return absl::OkStatus();
  POSENC_ASSIGN_OR_RETURN(ScratchPool::Buffer lent, pool.Lend(shm->byte_size, call));
  POSENC_RETURN_IF_ERROR(shm->region->ReadInto(field, shm->offset, shm->byte_size, lent.data()));
  scratch = std::move(lent);
  return absl::OkStatus();
}

absl::StatusOr<ShmInputs> ShmInputsOf(const inference::ModelInferRequest& req,
                                      const SharedMemoryRegistry* registry, int64_t* bytes) {
  ShmInputs refs;
  *bytes = 0;
  for (int i = 0; i < req.inputs_size(); ++i) {
    const auto& in = req.inputs(i);
    const std::string field = absl::StrCat("input ", i, " (\"", Utf8Prefix(in.name(), 64), "\")");
    POSENC_ASSIGN_OR_RETURN(std::optional<ShmRef> ref,
                            ShmRefOf(field, in.parameters(), registry, /*only_shm=*/false));
    // Each lies within a region of at most 2^63-1 bytes; saturate the sum.
    if (ref) *bytes = ref->byte_size > INT64_MAX - *bytes ? INT64_MAX : *bytes + ref->byte_size;
    refs.push_back(std::move(ref));
  }
  return refs;
}

absl::StatusOr<std::vector<Input>> TakeInputs(inference::ModelInferRequest* req,
                                              const ShmInputs* shm) {
  const auto in_shm = [&](int i) { return shm != nullptr && (*shm)[i].has_value(); };
  if (shm != nullptr && static_cast<int>(shm->size()) != req->inputs_size()) {
    return absl::InternalError("shared memory references do not match the inputs");
  }
  int in_message = 0;
  for (int i = 0; i < req->inputs_size(); ++i) in_message += in_shm(i) ? 0 : 1;
  const bool raw = req->raw_input_contents_size() > 0;
  if (raw && req->raw_input_contents_size() != in_message) {
    return absl::InvalidArgumentError(absl::StrCat(
        "raw_input_contents must hold one entry per input not in shared memory (", in_message,
        " of ", req->inputs_size(), " inputs), got ", req->raw_input_contents_size()));
  }
  std::vector<Input> inputs;
  inputs.reserve(req->inputs_size());
  int raw_index = 0;
  for (int i = 0; i < req->inputs_size(); ++i) {
    inference::ModelInferRequest::InferInputTensor* in = req->mutable_inputs(i);
    const std::string field = absl::StrCat("input ", i, " (\"", Utf8Prefix(in->name(), 64), "\")");
    if (in->name().empty()) return absl::InvalidArgumentError(absl::StrCat(field, " has no name"));
    for (const Input& seen : inputs) {
      if (seen.name == in->name()) {
        return absl::InvalidArgumentError(absl::StrCat(field, " is given twice"));
      }
    }
    Input t;
    t.name = in->name();
    POSENC_ASSIGN_OR_RETURN(t.dtype, DTypeOf(field, in->datatype()));
    t.shape.assign(in->shape().begin(), in->shape().end());
    const bool has_typed = in->has_contents() && in->contents().ByteSizeLong() > 0;
    if (in_shm(i)) {
      if (has_typed) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, " has typed contents and a shared_memory_region"));
      }
      t.shm = (*shm)[i];
    } else if (raw) {
      if (has_typed) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, " has typed contents while the request uses raw_input_contents"));
      }
      t.data.swap(*req->mutable_raw_input_contents(raw_index++));
    } else {
      POSENC_ASSIGN_OR_RETURN(t.data, TypedContents(field, t.dtype, in->contents()));
      in->clear_contents();
    }
    POSENC_RETURN_IF_ERROR(ValidateTensorBytes(field, t.dtype, t.shape, t.size()));
    inputs.push_back(std::move(t));
  }
  return inputs;
}

}  // namespace posenc::server::kserve
