#include "engine.h"

#include <algorithm>
#include <exception>
#include <functional>
#include <new>

#include "absl/strings/str_cat.h"
#include "posenc/limits.h"
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

// Bytes a response message with `payload` more bytes of tensor data than
// `without_payload` serialises to: a field tag and length prefix (at most 11
// bytes) per payload field on top.
int64_t MessageBytes(const google::protobuf::Message& without_payload, int64_t payload) {
  return static_cast<int64_t>(without_payload.ByteSizeLong()) + payload + 22;
}

// Runs an operation so that nothing escapes as an exception: allocation
// failure is RESOURCE_EXHAUSTED (the server keeps serving), anything else
// INTERNAL.
template <typename Fn>
absl::Status Guarded(Fn&& fn) {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        "the server could not allocate memory for this request; retry later or send less");
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("unexpected error: ", e.what()));
  } catch (...) {
    return absl::InternalError("unexpected error");
  }
}

// Sizes a result buffer in steps, so that a large answer stops growing when
// its caller leaves instead of zero-filling hundreds of MiB first.
absl::Status ResizeCancellable(std::string* out, int64_t bytes, const RunContext& ctx) {
  constexpr int64_t kStep = int64_t{16} << 20;
  out->clear();
  out->reserve(bytes);
  while (static_cast<int64_t>(out->size()) < bytes) {
    if (ctx.IsCancelled()) return absl::CancelledError("the call was cancelled");
    out->append(std::min<int64_t>(kStep, bytes - out->size()), '\0');
  }
  return absl::OkStatus();
}

}  // namespace

Engine::Engine(const EngineOptions& options)
    : options_(options),
      tables_([&] {
        TableRepositoryOptions t;
        t.dir = options.table_dir;
        t.allow_external_symlinks = options.table_dir_allow_external_symlinks;
        t.max_total_bytes = options.max_table_bytes;
        return t;
      }()),
      admission_(AdmissionOptions{options.max_inflight_requests, options.max_inflight_bytes,
                                  options.admission_wait}) {}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options) {
  if (options.max_inflight_requests <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_inflight must be > 0, got ", options.max_inflight_requests));
  }
  if (options.max_request_tensor_bytes <= 0 || options.max_message_bytes <= 0) {
    return absl::InvalidArgumentError("--max_request_bytes and --max_message_bytes must be > 0");
  }
  // The largest call holds its message twice: read and parsed, then the
  // answer and its serialised copy.
  if (options.max_inflight_bytes / 2 < options.max_message_bytes ||
      options.max_inflight_bytes / 2 < options.max_request_tensor_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_inflight_bytes (", options.max_inflight_bytes,
                     ") must be at least twice --max_message_bytes (", options.max_message_bytes,
                     ") and --max_request_bytes (", options.max_request_tensor_bytes,
                     "): a call holds its message twice, parsed and serialised"));
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
  POSENC_RETURN_IF_ERROR(CheckRequestSize(tensor_bytes));
  POSENC_ASSIGN_OR_RETURN(Admission a, admission_.Enter());
  POSENC_RETURN_IF_ERROR(a.TryGrow(tensor_bytes));
  return a;
}

absl::StatusOr<Backend*> Engine::Choose(v1::Backend requested, int64_t bytes) {
  if (requested == v1::BACKEND_UNSPECIFIED) requested = options_.default_backend;
  switch (requested) {
    case v1::BACKEND_CPU:
      return cpu_.get();
    case v1::BACKEND_CUDA: {
      if (cuda_ == nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat("backend CUDA was requested but this server has no GPU backend: ",
                         cuda_unavailable_reason_, ". Use backend AUTO or CPU."));
      }
      const absl::Status health = cuda_->health();
      if (!health.ok()) {
        return absl::FailedPreconditionError(
            absl::StrCat("backend CUDA was requested but the GPU has failed: ", health.message(),
                         ". Use backend AUTO or CPU."));
      }
      return cuda_.get();
    }
    case v1::BACKEND_AUTO:
    case v1::BACKEND_UNSPECIFIED:
      // A failed GPU (a sticky device error) is routed around.
      return (cuda_ != nullptr && bytes >= options_.auto_gpu_min_bytes && cuda_->health().ok())
                 ? cuda_.get()
                 : cpu_.get();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("backend has unknown value ", static_cast<int>(requested)));
  }
}

absl::Status Engine::RunWithFallback(v1::Backend requested, Backend** backend,
                                     const std::function<absl::Status(Backend*)>& run) {
  absl::Status s = run(*backend);
  if (requested == v1::BACKEND_UNSPECIFIED) requested = options_.default_backend;
  // Under AUTO the CPU serves what the GPU kernels do not cover
  // (UNIMPLEMENTED) or what a failing GPU could not do; the GPU path only
  // writes the caller's buffers once it has succeeded.
  const bool gpu_gave_up = s.code() == absl::StatusCode::kUnimplemented ||
                           ((*backend)->kind() == BackendKind::kCuda && !(*backend)->health().ok());
  if (!s.ok() && gpu_gave_up && requested == v1::BACKEND_AUTO &&
      (*backend)->kind() == BackendKind::kCuda) {
    *backend = cpu_.get();
    s = run(*backend);
  }
  return s;
}

absl::Status Engine::Ready() const {
  if (options_.default_backend == v1::BACKEND_CUDA && cuda_ != nullptr) return cuda_->health();
  return absl::OkStatus();
}

std::string Engine::BackendName(const Backend* b) const {
  return b->kind() == BackendKind::kCuda ? absl::StrCat("cuda:", options_.cuda_device) : "cpu";
}

absl::Status Engine::CheckRequestSize(int64_t tensor_bytes) const {
  if (tensor_bytes > options_.max_request_tensor_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("request carries ", tensor_bytes, " tensor bytes, over the server's limit of ",
                     options_.max_request_tensor_bytes, " (--max_request_bytes)"));
  }
  return absl::OkStatus();
}

absl::Status Engine::CheckAnswerSize(int64_t tensor_bytes, int64_t message_bytes,
                                     absl::string_view what) const {
  if (tensor_bytes > options_.max_request_tensor_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, " would be ", tensor_bytes, " bytes, over the server's limit of ",
                     options_.max_request_tensor_bytes, " bytes (--max_request_bytes)"));
  }
  if (message_bytes > options_.max_message_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the answer would be a ", message_bytes, "-byte message, over the transport's limit of ",
        options_.max_message_bytes, " bytes (--max_message_bytes); send less per call"));
  }
  return absl::OkStatus();
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
  return r.logits_data().size() + r.k_lens().data().size() + 8 * r.slopes_size();
}

absl::Status Engine::ApplyRope(v1::RopeRequest* req, v1::RopeResponse* resp,
                               const RunContext& ctx) {
  POSENC_ASSIGN_OR_RETURN(Admission admission, Admit(RequestBytes(*req)));
  return ApplyRopeAdmitted(req, resp, ctx, admission);
}
absl::Status Engine::AddAbsoluteEncoding(v1::AbsoluteEncodingRequest* req,
                                         v1::AbsoluteEncodingResponse* resp,
                                         const RunContext& ctx) {
  POSENC_ASSIGN_OR_RETURN(Admission admission, Admit(RequestBytes(*req)));
  return AddAbsoluteEncodingAdmitted(req, resp, ctx, admission);
}
absl::Status Engine::GetEncodingTable(const v1::EncodingTableRequest& req,
                                      v1::EncodingTableResponse* resp, const RunContext& ctx) {
  POSENC_ASSIGN_OR_RETURN(Admission admission, Admit(RequestBytes(req)));
  return GetEncodingTableAdmitted(req, resp, ctx, admission);
}
absl::Status Engine::AttentionBias(v1::AttentionBiasRequest* req, v1::AttentionBiasResponse* resp,
                                   const RunContext& ctx) {
  POSENC_ASSIGN_OR_RETURN(Admission admission, Admit(RequestBytes(*req)));
  return AttentionBiasAdmitted(req, resp, ctx, admission);
}

absl::Status Engine::ApplyRopeAdmitted(v1::RopeRequest* request, v1::RopeResponse* resp,
                                       const RunContext& ctx, Admission& admission) {
  return Guarded([&]() -> absl::Status {
    const v1::RopeRequest& req = *request;
    const int64_t bytes = RequestBytes(req);
    POSENC_RETURN_IF_ERROR(CheckRequestSize(bytes));
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
    POSENC_ASSIGN_OR_RETURN(t.positions.offsets,
                            ViewOf("offsets", req.has_offsets(), req.offsets()));
    POSENC_ASSIGN_OR_RETURN(t.cu_seqlens,
                            ViewOf("cu_seqlens", req.has_cu_seqlens(), req.cu_seqlens()));
    const int64_t tensor_bytes = t.query.nbytes + t.key.nbytes;
    // The request's buffers become the answer; the caller's admission holds
    // them and their serialised copy already. The plan is new.
    POSENC_ASSIGN_OR_RETURN(RopePlan plan, PlanRope(options, t, [&](const PlanCost& c) {
                              return admission.TryGrow(c.plan_bytes);
                            }));
    POSENC_ASSIGN_OR_RETURN(Backend * backend, Choose(req.backend(), bytes));
    *resp->mutable_query() = DescOf(t.query);
    if (has_key) *resp->mutable_key() = DescOf(t.key);
    resp->set_request_id(req.request_id());
    resp->set_backend("cuda:" + std::to_string(options_.cuda_device));  // the longer name
    POSENC_RETURN_IF_ERROR(CheckAnswerSize(tensor_bytes, resp->ByteSizeLong(), "the answer"));
    POSENC_RETURN_IF_ERROR(RunWithFallback(req.backend(), &backend, [&](Backend* b) {
      return b->ApplyRope(plan, t.query.data, has_key ? t.key.data : nullptr, ctx);
    }));
    resp->set_backend(BackendName(backend));
    return absl::OkStatus();
  });
}

absl::Status Engine::AddAbsoluteEncodingAdmitted(v1::AbsoluteEncodingRequest* request,
                                                 v1::AbsoluteEncodingResponse* resp,
                                                 const RunContext& ctx, Admission& admission) {
  return Guarded([&]() -> absl::Status {
    const v1::AbsoluteEncodingRequest& req = *request;
    const int64_t bytes = RequestBytes(req);
    POSENC_RETURN_IF_ERROR(CheckRequestSize(bytes));
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
    POSENC_ASSIGN_OR_RETURN(t.positions.offsets,
                            ViewOf("offsets", req.has_offsets(), req.offsets()));
    POSENC_ASSIGN_OR_RETURN(t.cu_seqlens,
                            ViewOf("cu_seqlens", req.has_cu_seqlens(), req.cu_seqlens()));
    const int64_t tensor_bytes = t.x.nbytes;
    POSENC_ASSIGN_OR_RETURN(AbsolutePlan plan, PlanAbsolute(o, t, [&](const PlanCost& c) {
                              return admission.TryGrow(c.plan_bytes);
                            }));
    POSENC_ASSIGN_OR_RETURN(Backend * backend, Choose(req.backend(), bytes));
    *resp->mutable_y() = DescOf(t.x);
    resp->set_request_id(req.request_id());
    resp->set_backend("cuda:" + std::to_string(options_.cuda_device));  // the longer name
    POSENC_RETURN_IF_ERROR(CheckAnswerSize(tensor_bytes, resp->ByteSizeLong(), "the answer"));
    POSENC_RETURN_IF_ERROR(RunWithFallback(req.backend(), &backend, [&](Backend* b) {
      return b->ApplyAbsolute(plan, t.x.data, ctx);
    }));
    resp->set_backend(BackendName(backend));
    return absl::OkStatus();
  });
}

absl::Status Engine::GetEncodingTableAdmitted(const v1::EncodingTableRequest& req,
                                              v1::EncodingTableResponse* resp,
                                              const RunContext& ctx, Admission& admission) {
  return Guarded([&]() -> absl::Status {
    POSENC_RETURN_IF_ERROR(CheckRequestSize(RequestBytes(req)));
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
    // The answer's size is known once shapes are valid: refused or admitted
    // before it is allocated.
    resp->mutable_table()->set_dtype(ToProto(dtype));
    resp->set_backend("cuda:" + std::to_string(options_.cuda_device));  // the longer name
    POSENC_ASSIGN_OR_RETURN(
        AbsolutePlan plan,
        PlanEncodingTable(o, dim, dtype, positions, count, [&](const PlanCost& c) -> absl::Status {
          POSENC_RETURN_IF_ERROR(CheckAnswerSize(
              c.output_bytes, MessageBytes(*resp, c.output_bytes + 40), "the table"));
          return admission.TryGrow(c.plan_bytes + c.output_bytes);
        }));
    const int64_t out_bytes = plan.num_tokens * dim * static_cast<int64_t>(SizeOf(dtype));
    POSENC_ASSIGN_OR_RETURN(Backend * backend, Choose(req.backend(), out_bytes));
    POSENC_RETURN_IF_ERROR(ResizeCancellable(resp->mutable_table_data(), out_bytes, ctx));
    POSENC_RETURN_IF_ERROR(RunWithFallback(req.backend(), &backend, [&](Backend* b) {
      return b->ApplyAbsolute(plan, resp->mutable_table_data()->data(), ctx);
    }));
    resp->mutable_table()->add_shape(plan.num_tokens);
    resp->mutable_table()->add_shape(dim);
    resp->set_backend(BackendName(backend));
    return absl::OkStatus();
  });
}

absl::Status Engine::AttentionBiasAdmitted(v1::AttentionBiasRequest* request,
                                           v1::AttentionBiasResponse* resp, const RunContext& ctx,
                                           Admission& admission) {
  return Guarded([&]() -> absl::Status {
    const v1::AttentionBiasRequest& req = *request;
    POSENC_RETURN_IF_ERROR(CheckRequestSize(RequestBytes(req)));
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
    resp->set_backend("cuda:" + std::to_string(options_.cuda_device));  // the longer name
    POSENC_ASSIGN_OR_RETURN(
        BiasPlan plan, PlanAttentionBias(o, logits.view(), [&](const PlanCost& c) -> absl::Status {
          // The answer: the bias (new, or the logits it was added to), its
          // shape and the slopes (one double each, packed).
          const int64_t tensor_bytes = has_logits ? logits.nbytes : c.output_bytes;
          const int64_t slopes_bytes =
              8 * std::max<int64_t>(o.num_heads, logits.rank() == 4 ? logits.shape[1] : 0);
          // (Logits already sit in the response; a new bias does not yet.)
          const int64_t payload = (has_logits ? 0 : tensor_bytes) + slopes_bytes + 60;
          POSENC_RETURN_IF_ERROR(
              CheckAnswerSize(tensor_bytes, MessageBytes(*resp, payload), "the bias"));
          return admission.TryGrow(c.plan_bytes + c.output_bytes);
        }));
    const int64_t out_bytes = plan.NumElements() * static_cast<int64_t>(SizeOf(plan.dtype));
    if (!has_logits) {
      POSENC_RETURN_IF_ERROR(ResizeCancellable(resp->mutable_bias_data(), out_bytes, ctx));
    }
    POSENC_ASSIGN_OR_RETURN(Backend * backend, Choose(req.backend(), out_bytes));
    POSENC_RETURN_IF_ERROR(RunWithFallback(req.backend(), &backend, [&](Backend* b) {
      return b->ApplyAttentionBias(plan, resp->mutable_bias_data()->data(), ctx);
    }));
    v1::TensorDesc* d = resp->mutable_bias();
    d->set_dtype(ToProto(plan.dtype));
    for (int64_t s : {plan.batch, plan.num_heads, plan.q_len, plan.k_len}) d->add_shape(s);
    for (double s : plan.slopes) resp->add_slopes(s);
    resp->set_backend(BackendName(backend));
    return absl::OkStatus();
  });
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
  // A drain abandons a reload in progress (the old tables stay).
  tables_.Reload([this] { return draining(); });
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
    const absl::Status health = b->health();
    if (!health.ok()) {
      bi->set_available(false);
      bi->set_unavailable_reason(std::string(health.message()));
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
  v1::Limits* limits = info.mutable_limits();
  limits->set_max_inflight_requests(options_.max_inflight_requests);
  limits->set_max_inflight_bytes(options_.max_inflight_bytes);
  limits->set_max_heads(kMaxHeads);
  limits->set_max_dim(kMaxDim);
  limits->set_max_sequences(kMaxSequences);
  limits->set_max_tokens(kMaxTokens);
  limits->set_max_axes(kMaxAxes);
  limits->set_max_abs_position(kMaxAbsPosition);
  limits->set_max_bias_elements(kMaxBiasElements);
  limits->set_max_table_rows(kMaxTableRows);
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
