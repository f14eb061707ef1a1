// The service's work behind a plain C++ API: validates requests, chooses a
// backend, runs the kernels, fills responses. Knows protobuf messages but
// nothing of gRPC; errors are absl::Status with the SPEC §3 codes.
#ifndef POSENC_SERVER_ENGINE_H_
#define POSENC_SERVER_ENGINE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "admission.h"
#include "posenc/backend.h"
#include "posenc/v1/posenc.pb.h"
#include "table_repository.h"

namespace posenc::server {

struct EngineOptions {
  v1::Backend default_backend = v1::BACKEND_AUTO;
  int cpu_threads = 0;  // 0: every hardware thread
  bool enable_cuda = true;
  int cuda_device = 0;
  // AUTO sends requests of at least this many tensor bytes to the GPU.
  int64_t auto_gpu_min_bytes = int64_t{1} << 20;
  // Largest total of tensor bytes in one request, and in one response.
  int64_t max_request_tensor_bytes = int64_t{64} << 20;
  // Requests in flight (from arrival until the answer is sent), and the
  // memory they hold: request and response tensors, gRPC's serialised copy
  // of the response, and plans. Beyond either, RESOURCE_EXHAUSTED. Must be
  // at least twice max_request_tensor_bytes, or the largest request could
  // never be admitted.
  int max_inflight_requests = 64;
  int64_t max_inflight_bytes = int64_t{4} << 30;
  // How long a call may wait for memory before RESOURCE_EXHAUSTED.
  absl::Duration admission_wait = absl::Seconds(1);
  std::string table_dir;
  // Table repository safeguards (table_repository.h).
  bool table_dir_allow_external_symlinks = false;
  int64_t max_table_bytes = int64_t{2} << 30;
  // The transport's limit on one message: answers larger than this are
  // refused before they are computed (the transport would drop them).
  int64_t max_message_bytes = (int64_t{64} << 20) + (4 << 20);
};

class Engine {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& options);

  // A call's claim on the in-flight budget (admission.h).
  using Admission = AdmissionControl::Ticket;
  // Admission for a request already in memory: a slot and its bytes now.
  // UNAVAILABLE while draining, RESOURCE_EXHAUSTED over --max_request_bytes,
  // --max_inflight or --max_inflight_bytes.
  [[nodiscard]] absl::StatusOr<Admission> Admit(int64_t tensor_bytes);
  AdmissionControl& admission() { return admission_; }

  // Tensor bytes a request carries (what admission counts).
  static int64_t RequestBytes(const v1::RopeRequest& r);
  static int64_t RequestBytes(const v1::AbsoluteEncodingRequest& r);
  static int64_t RequestBytes(const v1::EncodingTableRequest& r);
  static int64_t RequestBytes(const v1::AttentionBiasRequest& r);

  // The operations, for a request already admitted (the service admits on
  // arrival, then computes on its executor). `admission` must already hold
  // the request; each operation grows it by what it allocates (plans, new
  // outputs) before allocating it (answers are sent without a copy), refuses answers larger than
  // the transport's message limit before computing them, and turns
  // allocation failure into RESOURCE_EXHAUSTED: nothing escapes as an
  // exception.
  [[nodiscard]] absl::Status ApplyRopeAdmitted(v1::RopeRequest* req, v1::RopeResponse* resp,
                                               const RunContext& ctx, Admission& admission);
  [[nodiscard]] absl::Status AddAbsoluteEncodingAdmitted(v1::AbsoluteEncodingRequest* req,
                                                         v1::AbsoluteEncodingResponse* resp,
                                                         const RunContext& ctx,
                                                         Admission& admission);
  [[nodiscard]] absl::Status GetEncodingTableAdmitted(const v1::EncodingTableRequest& req,
                                                      v1::EncodingTableResponse* resp,
                                                      const RunContext& ctx, Admission& admission);
  [[nodiscard]] absl::Status AttentionBiasAdmitted(v1::AttentionBiasRequest* req,
                                                   v1::AttentionBiasResponse* resp,
                                                   const RunContext& ctx, Admission& admission);

  // Admit, then run. The tensor operations work inside the request's own
  // buffers and move them into the response, so a request's tensors are never
  // copied; `req` is left without them.
  [[nodiscard]] absl::Status ApplyRope(v1::RopeRequest* req, v1::RopeResponse* resp,
                                       const RunContext& ctx);
  [[nodiscard]] absl::Status AddAbsoluteEncoding(v1::AbsoluteEncodingRequest* req,
                                                 v1::AbsoluteEncodingResponse* resp,
                                                 const RunContext& ctx);
  [[nodiscard]] absl::Status GetEncodingTable(const v1::EncodingTableRequest& req,
                                              v1::EncodingTableResponse* resp,
                                              const RunContext& ctx);
  [[nodiscard]] absl::Status AttentionBias(v1::AttentionBiasRequest* req,
                                           v1::AttentionBiasResponse* resp, const RunContext& ctx);
  v1::ListTablesResponse ListTables() const;
  v1::ListTablesResponse ReloadTables();
  v1::ServerInfo GetServerInfo() const;

  // After this, new work is refused with UNAVAILABLE (graceful drain).
  void StartDraining() { admission_.StartDraining(); }
  bool draining() const { return admission_.draining(); }
  // When a request was last admitted: a drain waits for admitted work, not
  // for refused arrivals, which would otherwise extend it without end.
  absl::Time last_admission() const { return admission_.last_entry(); }
  int inflight() const { return admission_.calls(); }
  int64_t inflight_bytes() const { return admission_.bytes(); }
  const EngineOptions& options() const { return options_; }
  // OK while the server can serve its default backend; the CUDA backend's
  // failure when that default is CUDA and the GPU has failed (readiness
  // turns NOT_SERVING so Kubernetes routes elsewhere).
  absl::Status Ready() const;
  // Why there is no CUDA backend ("" when there is one).
  const std::string& cuda_unavailable_reason() const { return cuda_unavailable_reason_; }

 private:
  explicit Engine(const EngineOptions& options);

  [[nodiscard]] absl::StatusOr<Backend*> Choose(v1::Backend requested, int64_t bytes);
  // Runs `run` on *backend; under AUTO, retries on the CPU (updating
  // *backend) when the GPU does not cover the request or has failed.
  [[nodiscard]] absl::Status RunWithFallback(v1::Backend requested, Backend** backend,
                                             const std::function<absl::Status(Backend*)>& run);
  // RESOURCE_EXHAUSTED when an answer's tensors exceed --max_request_bytes or
  // its message exceeds --max_message_bytes (the transport would drop it
  // after the work was done).
  // RESOURCE_EXHAUSTED when a request's tensors exceed --max_request_bytes.
  [[nodiscard]] absl::Status CheckRequestSize(int64_t tensor_bytes) const;
  [[nodiscard]] absl::Status CheckAnswerSize(int64_t tensor_bytes, int64_t message_bytes,
                                             absl::string_view what) const;
  std::string BackendName(const Backend* b) const;

  const EngineOptions options_;
  std::unique_ptr<Backend> cpu_;
  std::unique_ptr<Backend> cuda_;
  std::string cuda_unavailable_reason_;
  TableRepository tables_;
  AdmissionControl admission_;
};

}  // namespace posenc::server

#endif  // POSENC_SERVER_ENGINE_H_
