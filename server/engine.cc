#include "engine.h"

#include "absl/strings/str_cat.h"
#include "posenc/status_macros.h"
#include "proto_convert.h"

#ifndef POSENC_VERSION
#define POSENC_VERSION "dev"
#endif

namespace posenc::server {
namespace {

v1::TensorDesc DescOf(const MutableTensor& t) {
  v1::TensorDesc d;
  d.set_dtype(ToProto(t.dtype));
  for (int64_t s : t.shape) d.add_shape(s);
  return d;
}

absl::StatusOr<int64_t> CheckedBytes(int64_t elements, DType dtype, int64_t limit,
                                     absl::string_view what) {
  const double bytes = static_cast<double>(elements) * SizeOf(dtype);
  if (bytes > static_cast<double>(limit)) {
    return absl::ResourceExhaustedError(absl::StrCat(what, " would be ", bytes,
                                                     " bytes, over the server's limit of ", limit,
                                                     " bytes (--max_request_bytes)"));
  }
  return static_cast<int64_t>(bytes);
}

}  // namespace

Engine::Engine(const EngineOptions& options) : options_(options), tables_(options.table_dir) {}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options) {
  if (options.max_inflight_requests <= 0) {
    return absl::InvalidArgumentError("max_inflight_requests must be > 0");
  }
  if (options.max_inflight_bytes < options.max_request_tensor_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_inflight_bytes (", options.max_inflight_bytes,
        ") must be at least max_request_bytes (", options.max_request_tensor_bytes, ")"));
  }
  std::unique_ptr<Engine> e(new Engine(options));
  e->cpu_ = CreateCpuBackend(options.cpu_threads);
  if (options.enable_cuda) {
    auto cuda = CreateCudaBackend(options.cuda_device);
    if (cuda.ok()) {
      e->cuda_ = std::move(*cuda);
    } else {
      e->cuda_unavailable_reason_ = std::string(cuda.status().message());
    }
  } else {
    e->cuda_unavailable_reason_ = "disabled by --enable_cuda=false";
  }
  if (options.default_backend == v1::BACKEND_CUDA && e->cuda_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("--default_backend=cuda but no CUDA backend: ", e->cuda_unavailable_reason_));
  }
  e->tables_.Reload();
  return e;
}

absl::StatusOr<Engine::Admission> Engine::Admit(int64_t tensor_bytes) {
  if (draining_) return absl::UnavailableError("server is draining; retry on another replica");
  if (tensor_bytes > options_.max_request_tensor_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("request carries ", tensor_bytes, " tensor bytes, over the server's limit of ",
                     options_.max_request_tensor_bytes, " (--max_request_bytes)"));
  }
  if (inflight_.fetch_add(1) >= options_.max_inflight_requests) {
    inflight_.fetch_sub(1);
    return absl::ResourceExhaustedError(
        absl::StrCat("server is saturated: ", options_.max_inflight_requests,
                     " requests in flight (--max_inflight); retry with backoff"));
  }
  if (inflight_bytes_.fetch_add(tensor_bytes) + tensor_bytes > options_.max_inflight_bytes) {
    inflight_bytes_.fetch_sub(tensor_bytes);
    inflight_.fetch_sub(1);
    return absl::ResourceExhaustedError(
        absl::StrCat("server is saturated: ", options_.max_inflight_bytes,
                     " tensor bytes in flight (--max_inflight_bytes); retry with backoff"));
  }
  return Admission(this, tensor_bytes);
}

absl::StatusOr<Backend*> Engine::Choose(v1::Backend requested, int64_t bytes) {
  if (requested == v1::BACKEND_UNSPECIFIED) requested = options_.default_backend;
  switch (requested) {
    case v1::BACKEND_CPU:
      return cpu_.get();
    case v1::BACKEND_CUDA:
      if (cuda_ == nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat("backend CUDA was requested but this server has no GPU backend: ",
                         cuda_unavailable_reason_, ". Use backend AUTO or CPU."));
      }
      return cuda_.get();
    case v1::BACKEND_AUTO:
    case v1::BACKEND_UNSPECIFIED:
      return (cuda_ != nullptr && bytes >= options_.auto_gpu_min_bytes) ? cuda_.get() : cpu_.get();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("backend has unknown value ", static_cast<int>(requested)));
  }
}

std::string Engine::BackendName(const Backend* b) const {
  return b->kind() == BackendKind::kCuda ? absl::StrCat("cuda:", options_.cuda_device) : "cpu";
}

int64_t Engine::RequestBytes(const v1::RopeRequest& r) {
  return r.query_data().size() + r.key_data().size() + r.position_ids().data().size() +
         r.offsets().data().size() + r.cu_seqlens().data().size();
}
int64_t Engine::RequestBytes(const v1::AbsoluteEncodingRequest& r) {
  return r.x_data().size() + r.position_ids().data().size() + r.offsets().data().size() +
         r.cu_seqlens().data().size();
}
int64_t Engine::RequestBytes(const v1::EncodingTableRequest& r) {
  return r.positions().data().size();
}
int64_t Engine::RequestBytes(const v1::AttentionBiasRequest& r) {
  return r.logits_data().size() + r.k_lens().data().size();
}

absl::Status Engine::ApplyRope(v1::RopeRequest* req, v1::RopeResponse* resp,
                               const RunContext& ctx) {
  POSENC_ASSIGN_OR_RETURN(Admission admission, Admit(RequestBytes(*req)));
  return ApplyRopeAdmitted(req, resp, ctx);
}
absl::Status Engine::AddAbsoluteEncoding(v1::AbsoluteEncodingRequest* req,
                                         v1::AbsoluteEncodingResponse* resp,
                                         const RunContext& ctx) {
  POSENC_ASSIGN_OR_RETURN(Admission admission, Admit(RequestBytes(*req)));
  return AddAbsoluteEncodingAdmitted(req, resp, ctx);
}
absl::Status Engine::GetEncodingTable(const v1::EncodingTableRequest& req,
                                      v1::EncodingTableResponse* resp, const RunContext& ctx) {
  POSENC_ASSIGN_OR_RETURN(Admission admission, Admit(RequestBytes(req)));
  return GetEncodingTableAdmitted(req, resp, ctx);
}
absl::Status Engine::AttentionBias(v1::AttentionBiasRequest* req, v1::AttentionBiasResponse* resp,
                                   const RunContext& ctx) {
  POSENC_ASSIGN_OR_RETURN(Admission admission, Admit(RequestBytes(*req)));
  return AttentionBiasAdmitted(req, resp, ctx);
}

absl::Status Engine::ApplyRopeAdmitted(v1::RopeRequest* request, v1::RopeResponse* resp,
                                       const RunContext& ctx) {
  const v1::RopeRequest& req = *request;
  const int64_t bytes = RequestBytes(req);
  POSENC_ASSIGN_OR_RETURN(RopeOptions options, RopeOptionsOf(req));

  // Rotate inside the request's buffers, now owned by the response.
  resp->mutable_query_data()->swap(*request->mutable_query_data());
  RopeTensors t;
  POSENC_ASSIGN_OR_RETURN(t.query, MutableOf("query", req.query(), resp->mutable_query_data()));
  const bool has_key = req.has_key() || !req.key_data().empty();
  if (has_key) {
    resp->mutable_key_data()->swap(*request->mutable_key_data());
    POSENC_ASSIGN_OR_RETURN(t.key, MutableOf("key", req.key(), resp->mutable_key_data()));
  }
  POSENC_ASSIGN_OR_RETURN(t.positions.position_ids,
                          ViewOf("position_ids", req.has_position_ids(), req.position_ids()));
  POSENC_ASSIGN_OR_RETURN(t.positions.offsets, ViewOf("offsets", req.has_offsets(), req.offsets()));
  POSENC_ASSIGN_OR_RETURN(t.cu_seqlens,
                          ViewOf("cu_seqlens", req.has_cu_seqlens(), req.cu_seqlens()));
  POSENC_ASSIGN_OR_RETURN(RopePlan plan, PlanRope(options, t));
  POSENC_ASSIGN_OR_RETURN(Backend * backend, Choose(req.backend(), bytes));
  POSENC_RETURN_IF_ERROR(
      backend->ApplyRope(plan, t.query.data, has_key ? t.key.data : nullptr, ctx));
  *resp->mutable_query() = DescOf(t.query);
  if (has_key) *resp->mutable_key() = DescOf(t.key);
  resp->set_request_id(req.request_id());
  resp->set_backend(BackendName(backend));
  return absl::OkStatus();
}

absl::Status Engine::AddAbsoluteEncodingAdmitted(v1::AbsoluteEncodingRequest* request,
                                                 v1::AbsoluteEncodingResponse* resp,
                                                 const RunContext& ctx) {
  const v1::AbsoluteEncodingRequest& req = *request;
  const int64_t bytes = RequestBytes(req);
  AbsoluteOptions o;
  switch (req.encoding_case()) {
    case v1::AbsoluteEncodingRequest::kSinusoidal: {
      POSENC_ASSIGN_OR_RETURN(o.sinusoidal_layout, SinusoidalLayoutOf(req.sinusoidal().layout()));
      o.base = req.sinusoidal().has_base() ? req.sinusoidal().base() : 10000.0;
      break;
    }
    case v1::AbsoluteEncodingRequest::kLearned: {
      o.kind = AbsoluteOptions::Kind::kLearned;
      POSENC_ASSIGN_OR_RETURN(o.table, tables_.Find(req.learned().table_name()));
      break;
    }
    default:
      return absl::InvalidArgumentError("encoding must be set: sinusoidal or learned");
  }
  o.x_scale = req.has_x_scale() ? req.x_scale() : 1.0;
  resp->mutable_y_data()->swap(*request->mutable_x_data());
  AbsoluteTensors t;
  POSENC_ASSIGN_OR_RETURN(t.x, MutableOf("x", req.x(), resp->mutable_y_data()));
  POSENC_ASSIGN_OR_RETURN(t.positions.position_ids,
                          ViewOf("position_ids", req.has_position_ids(), req.position_ids()));
  POSENC_ASSIGN_OR_RETURN(t.positions.offsets, ViewOf("offsets", req.has_offsets(), req.offsets()));
  POSENC_ASSIGN_OR_RETURN(t.cu_seqlens,
                          ViewOf("cu_seqlens", req.has_cu_seqlens(), req.cu_seqlens()));
  POSENC_ASSIGN_OR_RETURN(AbsolutePlan plan, PlanAbsolute(o, t));
  POSENC_ASSIGN_OR_RETURN(Backend * backend, Choose(req.backend(), bytes));
  POSENC_RETURN_IF_ERROR(backend->ApplyAbsolute(plan, t.x.data, ctx));
  *resp->mutable_y() = DescOf(t.x);
  resp->set_request_id(req.request_id());
  resp->set_backend(BackendName(backend));
  return absl::OkStatus();
}

absl::Status Engine::GetEncodingTableAdmitted(const v1::EncodingTableRequest& req,
                                              v1::EncodingTableResponse* resp,
                                              const RunContext& ctx) {
  AbsoluteOptions o;
  int64_t dim = req.dim();
  int64_t count = req.count();
  switch (req.encoding_case()) {
    case v1::EncodingTableRequest::kSinusoidal: {
      POSENC_ASSIGN_OR_RETURN(o.sinusoidal_layout, SinusoidalLayoutOf(req.sinusoidal().layout()));
      o.base = req.sinusoidal().has_base() ? req.sinusoidal().base() : 10000.0;
      if (dim <= 0) return absl::InvalidArgumentError(absl::StrCat("dim must be > 0, got ", dim));
      break;
    }
    case v1::EncodingTableRequest::kLearned: {
      o.kind = AbsoluteOptions::Kind::kLearned;
      POSENC_ASSIGN_OR_RETURN(o.table, tables_.Find(req.learned().table_name()));
      if (dim == 0) dim = o.table->dim;
      if (count == 0 && !req.has_positions()) count = o.table->rows;
      break;
    }
    default:
      return absl::InvalidArgumentError("encoding must be set: sinusoidal or learned");
  }
  DType dtype = DType::kFloat32;
  if (req.dtype() != v1::DATA_TYPE_UNSPECIFIED) {
    POSENC_ASSIGN_OR_RETURN(dtype, FromProto("dtype", req.dtype()));
  }
  POSENC_ASSIGN_OR_RETURN(TensorView positions,
                          ViewOf("positions", req.has_positions(), req.positions()));
  POSENC_ASSIGN_OR_RETURN(AbsolutePlan plan, PlanEncodingTable(o, dim, dtype, positions, count));
  POSENC_ASSIGN_OR_RETURN(
      int64_t out_bytes,
      CheckedBytes(plan.num_tokens * dim, dtype, options_.max_request_tensor_bytes, "the table"));
  POSENC_ASSIGN_OR_RETURN(Backend * backend, Choose(req.backend(), out_bytes));
  std::string* out = resp->mutable_table_data();
  out->resize(out_bytes);
  POSENC_RETURN_IF_ERROR(backend->ApplyAbsolute(plan, out->data(), ctx));
  resp->mutable_table()->set_dtype(ToProto(dtype));
  resp->mutable_table()->add_shape(plan.num_tokens);
  resp->mutable_table()->add_shape(dim);
  resp->set_backend(BackendName(backend));
  return absl::OkStatus();
}

absl::Status Engine::AttentionBiasAdmitted(v1::AttentionBiasRequest* request,
                                           v1::AttentionBiasResponse* resp, const RunContext& ctx) {
  const v1::AttentionBiasRequest& req = *request;
  BiasOptions o;
  POSENC_ASSIGN_OR_RETURN(o.form, BiasFormOf(req.form()));
  o.slopes.assign(req.slopes().begin(), req.slopes().end());
  o.batch = req.batch();
  o.num_heads = req.num_heads();
  o.q_len = req.q_len();
  o.k_len = req.k_len();
  if (req.has_q_offset()) o.q_offset = req.q_offset();
  o.causal = req.causal();
  o.window = req.window();
  POSENC_ASSIGN_OR_RETURN(o.k_lens, ViewOf("k_lens", req.has_k_lens(), req.k_lens()));
  if (req.dtype() != v1::DATA_TYPE_UNSPECIFIED) {
    POSENC_ASSIGN_OR_RETURN(o.dtype, FromProto("dtype", req.dtype()));
  }
  const bool has_logits = req.has_logits() || !req.logits_data().empty();
  MutableTensor logits;
  if (has_logits) {
    resp->mutable_bias_data()->swap(*request->mutable_logits_data());
    POSENC_ASSIGN_OR_RETURN(logits, MutableOf("logits", req.logits(), resp->mutable_bias_data()));
  }
  POSENC_ASSIGN_OR_RETURN(BiasPlan plan, PlanAttentionBias(o, logits.view()));
  POSENC_ASSIGN_OR_RETURN(
      int64_t out_bytes,
      CheckedBytes(plan.NumElements(), plan.dtype, options_.max_request_tensor_bytes, "the bias"));
  if (!has_logits) resp->mutable_bias_data()->resize(out_bytes);
  POSENC_ASSIGN_OR_RETURN(Backend * backend, Choose(req.backend(), out_bytes));
  POSENC_RETURN_IF_ERROR(backend->ApplyAttentionBias(plan, resp->mutable_bias_data()->data(), ctx));
  v1::TensorDesc* d = resp->mutable_bias();
  d->set_dtype(ToProto(plan.dtype));
  for (int64_t s : {plan.batch, plan.num_heads, plan.q_len, plan.k_len}) d->add_shape(s);
  for (double s : plan.slopes) resp->add_slopes(s);
  resp->set_backend(BackendName(backend));
  return absl::OkStatus();
}

v1::ListTablesResponse Engine::ListTables() const {
  v1::ListTablesResponse r;
  for (const TableEntry& e : tables_.List()) {
    v1::TableInfo* t = r.add_tables();
    t->set_name(e.table->name);
    t->set_rows(e.table->rows);
    t->set_dim(e.table->dim);
    t->set_source_dtype(ToProto(e.table->source_dtype));
    t->set_file(e.file);
  }
  for (const std::string& s : tables_.skipped()) r.add_skipped(s);
  return r;
}

v1::ListTablesResponse Engine::ReloadTables() {
  tables_.Reload();
  return ListTables();
}

v1::ServerInfo Engine::GetServerInfo() const {
  v1::ServerInfo info;
  info.set_version(POSENC_VERSION);
  info.set_built_with_cuda(BuiltWithCuda());
  info.set_build(absl::StrCat("compiler ", __VERSION__,
#ifdef NDEBUG
                              ", release"
#else
                              ", debug"
#endif
                              ));
  auto add = [&](const Backend* b, v1::Backend kind) {
    v1::BackendInfo* bi = info.add_backends();
    bi->set_kind(kind);
    bi->set_available(b != nullptr);
    if (b == nullptr) {
      bi->set_unavailable_reason(cuda_unavailable_reason_);
      return;
    }
    const DeviceInfo d = b->device();
    bi->set_device_name(d.name);
    bi->set_memory_bytes(d.memory_bytes);
    bi->set_compute_capability(d.compute_capability);
    bi->set_threads(d.threads);
  };
  add(cpu_.get(), v1::BACKEND_CPU);
  add(cuda_.get(), v1::BACKEND_CUDA);
  info.set_default_backend(options_.default_backend);
  info.mutable_limits()->set_max_message_bytes(options_.max_message_bytes);
  info.mutable_limits()->set_max_request_tensor_bytes(options_.max_request_tensor_bytes);
  info.mutable_limits()->set_max_inflight_requests(options_.max_inflight_requests);
  for (const char* op : {"ApplyRope", "StreamRope", "AddAbsoluteEncoding", "GetEncodingTable",
                         "AttentionBias", "ListTables", "ReloadTables", "GetServerInfo"}) {
    info.add_operations(op);
  }
  for (v1::DataType t : {v1::DATA_TYPE_FLOAT32, v1::DATA_TYPE_FLOAT16, v1::DATA_TYPE_BFLOAT16}) {
    info.add_dtypes(t);
  }
  return info;
}

}  // namespace posenc::server
