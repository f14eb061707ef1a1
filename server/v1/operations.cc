#include "v1/operations.h"

#include <initializer_list>
#include <limits>

#include "absl/strings/str_cat.h"
#include "posenc/limits.h"
#include "posenc/status_macros.h"
#include "posenc/wire/enums.h"
#include "posenc/wire/requests.h"
#include "posenc/wire/tensors.h"
#include "v1/shm_slices.h"

#ifndef POSENC_VERSION
#define POSENC_VERSION "dev"
#endif

namespace posenc::server {
namespace {

// What an answer's message carries besides its tensor data: the fields set
// so far (ids, the longest backend name) less the `data_in` bytes of tensor
// data it already holds, plus the descriptor of each tensor and a tag and
// length prefix per field (generously: 96 bytes).
int64_t Overhead(const google::protobuf::Message& answer_so_far, size_t data_in = 0) {
  return static_cast<int64_t>(answer_so_far.ByteSizeLong() - data_in) + 96;
}

int64_t SaturatingSum(std::initializer_list<int64_t> parts) {
  int64_t sum = 0;
  for (int64_t p : parts) {
    if (__builtin_add_overflow(sum, p, &sum)) return std::numeric_limits<int64_t>::max();
  }
  return sum;
}

}  // namespace

// In the message or named in shared memory alike; a slice's byte_size may be
// anything a caller sends, so the sums saturate.
int64_t RequestBytes(const v1::RopeRequest& r) {
  return SaturatingSum(
      {static_cast<int64_t>(r.query_data().size() + r.key_data().size() +
                            r.position_ids().data().size() + r.offsets().data().size() +
                            r.cu_seqlens().data().size()),
       SliceBytes(r.query_shm()), SliceBytes(r.key_shm())});
}
int64_t RequestBytes(const v1::AbsoluteEncodingRequest& r) {
  return SaturatingSum(
      {static_cast<int64_t>(r.x_data().size() + r.position_ids().data().size() +
                            r.offsets().data().size() + r.cu_seqlens().data().size()),
       SliceBytes(r.x_shm())});
}
int64_t RequestBytes(const v1::EncodingTableRequest& r) { return r.positions().data().size(); }
int64_t RequestBytes(const v1::AttentionBiasRequest& r) {
  return SaturatingSum({static_cast<int64_t>(r.logits_data().size() + r.k_lens().data().size() +
                                             r.k_starts().data().size() + 8 * r.slopes_size()),
                        SliceBytes(r.logits_shm())});
}

absl::Status ApplyRope(Engine& engine, v1::RopeRequest* req, v1::RopeResponse* resp,
                       const RunContext& ctx, Engine::Admission& admission,
                       const BeforeCompute& before_compute) {
  POSENC_RETURN_IF_ERROR(engine.CheckRequestSize(RequestBytes(*req)));
  POSENC_ASSIGN_OR_RETURN(const RopeOptions options, wire::RopeOptionsOf(*req));
  POSENC_ASSIGN_OR_RETURN(const BackendChoice backend, wire::FromProto("backend", req->backend()));
  // Rotate inside the request's buffers, now owned by the response, or in
  // place in the caller's shared memory.
  ShmSlices shm(engine);
  RopeTensors t;
  if (req->has_query_shm()) {
    POSENC_ASSIGN_OR_RETURN(t.query,
                            shm.Input("query", req->query_shm(), req->query(), req->query_data()));
  } else {
    resp->mutable_query_data()->swap(*req->mutable_query_data());
    POSENC_ASSIGN_OR_RETURN(t.query,
                            wire::MutableOf("query", req->query(), resp->mutable_query_data()));
  }
  const bool has_key = req->has_key() || !req->key_data().empty() || req->has_key_shm();
  if (req->has_key_shm()) {
    POSENC_ASSIGN_OR_RETURN(t.key, shm.Input("key", req->key_shm(), req->key(), req->key_data()));
  } else if (has_key) {
    resp->mutable_key_data()->swap(*req->mutable_key_data());
    POSENC_ASSIGN_OR_RETURN(t.key, wire::MutableOf("key", req->key(), resp->mutable_key_data()));
  }
  POSENC_RETURN_IF_ERROR(shm.CheckApart());
  POSENC_ASSIGN_OR_RETURN(
      t.positions.position_ids,
      wire::ViewOf("position_ids", req->has_position_ids(), req->position_ids()));
  POSENC_ASSIGN_OR_RETURN(t.positions.offsets,
                          wire::ViewOf("offsets", req->has_offsets(), req->offsets()));
  POSENC_ASSIGN_OR_RETURN(t.cu_seqlens,
                          wire::ViewOf("cu_seqlens", req->has_cu_seqlens(), req->cu_seqlens()));
  resp->set_request_id(req->request_id());
  resp->set_backend(engine.LongestBackendName());
  CallEnv env{ctx, admission, backend,
              Overhead(*resp, resp->query_data().size() + resp->key_data().size())};
  env.before_compute = before_compute;
  env.tensors_in_answer = !req->has_query_shm() || (has_key && !req->has_key_shm());
  env.tensors_on_device = shm.on_device();
  env.device = shm.device();
  POSENC_ASSIGN_OR_RETURN(std::string served, engine.ApplyRope(options, t, env));
  POSENC_RETURN_IF_ERROR(shm.CheckIntact());
  *resp->mutable_query() = wire::DescOf(t.query.dtype, t.query.shape);
  if (has_key) *resp->mutable_key() = wire::DescOf(t.key.dtype, t.key.shape);
  resp->set_backend(served);
  return absl::OkStatus();
}

absl::Status ApplyRope(Engine& engine, v1::RopeRequest* req, v1::RopeResponse* resp,
                       const RunContext& ctx) {
  POSENC_ASSIGN_OR_RETURN(Engine::Admission admission, engine.Admit(RequestBytes(*req)));
  return ApplyRope(engine, req, resp, ctx, admission, {});
}

absl::Status AddAbsoluteEncoding(Engine& engine, v1::AbsoluteEncodingRequest* req,
                                 v1::AbsoluteEncodingResponse* resp, const RunContext& ctx,
                                 Engine::Admission& admission,
                                 const BeforeCompute& before_compute) {
  POSENC_RETURN_IF_ERROR(engine.CheckRequestSize(RequestBytes(*req)));
  POSENC_ASSIGN_OR_RETURN(AbsoluteOptions options, wire::AbsoluteOptionsOf(*req));
  POSENC_ASSIGN_OR_RETURN(const BackendChoice backend, wire::FromProto("backend", req->backend()));
  ShmSlices shm(engine);
  AbsoluteTensors t;
  if (req->has_x_shm()) {
    POSENC_ASSIGN_OR_RETURN(t.x, shm.Input("x", req->x_shm(), req->x(), req->x_data()));
  } else {
    resp->mutable_y_data()->swap(*req->mutable_x_data());
    POSENC_ASSIGN_OR_RETURN(t.x, wire::MutableOf("x", req->x(), resp->mutable_y_data()));
  }
  POSENC_ASSIGN_OR_RETURN(
      t.positions.position_ids,
      wire::ViewOf("position_ids", req->has_position_ids(), req->position_ids()));
  POSENC_ASSIGN_OR_RETURN(t.positions.offsets,
                          wire::ViewOf("offsets", req->has_offsets(), req->offsets()));
  POSENC_ASSIGN_OR_RETURN(t.cu_seqlens,
                          wire::ViewOf("cu_seqlens", req->has_cu_seqlens(), req->cu_seqlens()));
  resp->set_request_id(req->request_id());
  resp->set_backend(engine.LongestBackendName());
  CallEnv env{ctx, admission, backend, Overhead(*resp, resp->y_data().size())};
  env.before_compute = before_compute;
  env.tensors_in_answer = !req->has_x_shm();
  env.tensors_on_device = shm.on_device();
  env.device = shm.device();
  POSENC_ASSIGN_OR_RETURN(std::string served, engine.AddAbsolute(std::move(options), t, env));
  POSENC_RETURN_IF_ERROR(shm.CheckIntact());
  *resp->mutable_y() = wire::DescOf(t.x.dtype, t.x.shape);
  resp->set_backend(served);
  return absl::OkStatus();
}

absl::Status GetEncodingTable(Engine& engine, v1::EncodingTableRequest* req,
                              v1::EncodingTableResponse* resp, const RunContext& ctx,
                              Engine::Admission& admission, const BeforeCompute&) {
  POSENC_RETURN_IF_ERROR(engine.CheckRequestSize(RequestBytes(*req)));
  POSENC_ASSIGN_OR_RETURN(AbsoluteOptions options, wire::AbsoluteOptionsOf(*req));
  POSENC_ASSIGN_OR_RETURN(const BackendChoice backend, wire::FromProto("backend", req->backend()));
  DType dtype = DType::kFloat32;
  if (req->dtype() != v1::DATA_TYPE_UNSPECIFIED) {
    POSENC_ASSIGN_OR_RETURN(dtype, wire::FromProto("dtype", req->dtype()));
  }
  POSENC_ASSIGN_OR_RETURN(TensorView positions,
                          wire::ViewOf("positions", req->has_positions(), req->positions()));
  resp->set_backend(engine.LongestBackendName());
  ShmSlices shm(engine);
  OutputTarget out(resp->mutable_table_data());
  if (req->has_table_shm()) {
    POSENC_ASSIGN_OR_RETURN(out, shm.Output("table", req->table_shm()));
  }
  CallEnv env{ctx, admission, backend, Overhead(*resp)};
  env.tensors_in_answer = !req->has_table_shm();
  POSENC_ASSIGN_OR_RETURN(
      Produced table, engine.EncodingTable(std::move(options), req->dim(), req->count(), positions,
                                           dtype, out, env));
  POSENC_RETURN_IF_ERROR(shm.CheckIntact());
  *resp->mutable_table() = wire::DescOf(table.dtype, table.shape);
  resp->set_backend(table.backend);
  return absl::OkStatus();
}

absl::Status AttentionBias(Engine& engine, v1::AttentionBiasRequest* req,
                           v1::AttentionBiasResponse* resp, const RunContext& ctx,
                           Engine::Admission& admission, const BeforeCompute& before_compute) {
  POSENC_RETURN_IF_ERROR(engine.CheckRequestSize(RequestBytes(*req)));
  POSENC_ASSIGN_OR_RETURN(const BiasOptions options, wire::BiasOptionsOf(*req));
  POSENC_ASSIGN_OR_RETURN(const BackendChoice backend, wire::FromProto("backend", req->backend()));
  ShmSlices shm(engine);
  MutableTensor logits;
  const bool has_logits = req->has_logits() || !req->logits_data().empty() || req->has_logits_shm();
  if (req->has_logits_shm()) {
    POSENC_ASSIGN_OR_RETURN(
        logits, shm.Input("logits", req->logits_shm(), req->logits(), req->logits_data()));
  } else if (has_logits) {
    resp->mutable_bias_data()->swap(*req->mutable_logits_data());
    POSENC_ASSIGN_OR_RETURN(logits,
                            wire::MutableOf("logits", req->logits(), resp->mutable_bias_data()));
  }
  OutputTarget out(resp->mutable_bias_data());
  if (req->has_bias_shm()) {
    if (has_logits) {
      return absl::InvalidArgumentError(
          "bias_shm is where a bias built without logits goes; with logits the bias is added "
          "to them where they are (logits_shm for shared memory)");
    }
    POSENC_ASSIGN_OR_RETURN(out, shm.Output("bias", req->bias_shm()));
  }
  resp->set_backend(engine.LongestBackendName());
  CallEnv env{ctx, admission, backend, Overhead(*resp, resp->bias_data().size())};
  env.before_compute = before_compute;
  env.tensors_in_answer = !req->has_logits_shm() && !req->has_bias_shm();
  env.tensors_on_device = shm.on_device();
  env.device = shm.device();
  POSENC_ASSIGN_OR_RETURN(Produced bias, engine.AttentionBias(options, logits, out, env));
  POSENC_RETURN_IF_ERROR(shm.CheckIntact());
  *resp->mutable_bias() = wire::DescOf(bias.dtype, bias.shape);
  for (double s : bias.slopes) resp->add_slopes(s);
  resp->set_backend(bias.backend);
  return absl::OkStatus();
}

v1::ListTablesResponse ListTables(const Engine& engine) {
  v1::ListTablesResponse r;
  for (const TableEntry& e : engine.tables().List()) {
    v1::TableInfo* t = r.add_tables();
    t->set_name(e.table->name);
    t->set_rows(e.table->rows);
    t->set_dim(e.table->dim);
    t->set_source_dtype(wire::ToProto(e.table->source_dtype));
    t->set_file(e.file);
  }
  for (const std::string& s : engine.tables().skipped()) r.add_skipped(s);
  return r;
}

v1::ServerInfo GetServerInfo(const Engine& engine, int64_t transport_bytes) {
  const EngineOptions& options = engine.options();
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
  auto add = [&](const Backend* b, BackendChoice kind, const std::optional<CostModel>& cost) {
    v1::BackendInfo* bi = info.add_backends();
    if (cost) {
      bi->mutable_cost()->set_fixed_us(cost->fixed_us);
      bi->mutable_cost()->set_us_per_mib(cost->us_per_mib);
    }
    bi->set_kind(wire::ToProto(kind));
    bi->set_available(b != nullptr);
    if (b == nullptr) {
      bi->set_unavailable_reason(engine.cuda_unavailable_reason());
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
    bi->set_device_uuid(d.uuid);
  };
  info.set_shared_memory_enabled(engine.shared_memory().enabled());
  info.set_cuda_shared_memory_enabled(engine.shared_memory().cuda_enabled() &&
                                      engine.cuda() != nullptr && engine.cuda()->health().ok());
  if (engine.shared_memory().enabled()) {
    info.set_shared_memory_domain(engine.shared_memory().domain());
  }
  add(engine.cpu(), BackendChoice::kCpu, engine.cpu_cost());
  if (engine.gpus().empty()) {
    add(nullptr, BackendChoice::kCuda, std::nullopt);  // with the reason there is none
  }
  for (const Engine::Gpu& g : engine.gpus()) {
    add(g.backend.get(), BackendChoice::kCuda, engine.cuda_cost());
    info.mutable_backends(info.backends_size() - 1)->set_device_index(g.device);
  }
  info.set_default_backend(wire::ToProto(options.default_backend));
  v1::Limits* limits = info.mutable_limits();
  limits->set_max_message_bytes(options.message_limit());
  limits->set_max_request_tensor_bytes(options.max_request_tensor_bytes);
  limits->set_max_inflight_requests(options.max_inflight_requests);
  limits->set_max_inflight_bytes(options.max_inflight_bytes);
  limits->set_max_heads(kMaxHeads);
  limits->set_max_dim(kMaxDim);
  limits->set_max_sequences(kMaxSequences);
  limits->set_max_tokens(kMaxTokens);
  limits->set_max_axes(kMaxAxes);
  limits->set_max_abs_position(kMaxAbsPosition);
  limits->set_max_bias_elements(kMaxBiasElements);
  limits->set_max_table_rows(kMaxTableRows);
  limits->set_max_transport_bytes(transport_bytes);
  for (const char* op :
       {"ApplyRope", "StreamRope", "AddAbsoluteEncoding", "GetEncodingTable", "AttentionBias",
        "ListTables", "ReloadTables", "GetServerInfo", "RegisterSharedMemory",
        "UnregisterSharedMemory", "GetSharedMemoryStatus"}) {
    info.add_operations(op);
  }
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    info.add_dtypes(wire::ToProto(t));
  }
  return info;
}

}  // namespace posenc::server
