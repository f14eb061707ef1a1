// The service's work behind a plain C++ API: validates requests, chooses a
// backend, runs the kernels, fills responses. Knows protobuf messages but
// nothing of gRPC; errors are absl::Status with the SPEC §3 codes.
#ifndef POSENC_SERVER_ENGINE_H_
#define POSENC_SERVER_ENGINE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
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
  // Largest total of tensor bytes in one request (and in one response).
  int64_t max_request_tensor_bytes = int64_t{1} << 30;
  // Requests computing at once, and their tensor bytes; beyond either, new
  // requests get RESOURCE_EXHAUSTED and memory stays bounded.
  int max_inflight_requests = 64;
  int64_t max_inflight_bytes = int64_t{4} << 30;
  std::string table_dir;
  int64_t max_message_bytes = 0;  // the transport's limit, reported by GetServerInfo
};

class Engine {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& options);

  // Holds one in-flight slot and its bytes for its lifetime.
  class Admission {
   public:
    Admission(Engine* engine, int64_t bytes) : engine_(engine), bytes_(bytes) {}
    Admission(Admission&& o) noexcept : engine_(o.engine_), bytes_(o.bytes_) {
      o.engine_ = nullptr;
    }
    ~Admission() {
      if (engine_ == nullptr) return;
      engine_->inflight_.fetch_sub(1);
      engine_->inflight_bytes_.fetch_sub(bytes_);
    }

   private:
    Engine* engine_;
    int64_t bytes_;
  };
  // Admission control: UNAVAILABLE while draining, RESOURCE_EXHAUSTED over
  // --max_request_bytes, --max_inflight or --max_inflight_bytes.
  [[nodiscard]] absl::StatusOr<Admission> Admit(int64_t tensor_bytes);

  // Tensor bytes a request carries (what admission counts).
  static int64_t RequestBytes(const v1::RopeRequest& r);
  static int64_t RequestBytes(const v1::AbsoluteEncodingRequest& r);
  static int64_t RequestBytes(const v1::EncodingTableRequest& r);
  static int64_t RequestBytes(const v1::AttentionBiasRequest& r);

  // The operations, for a request already admitted (the service admits on
  // arrival, then computes on its executor).
  [[nodiscard]] absl::Status ApplyRopeAdmitted(v1::RopeRequest* req, v1::RopeResponse* resp,
                                               const RunContext& ctx);
  [[nodiscard]] absl::Status AddAbsoluteEncodingAdmitted(v1::AbsoluteEncodingRequest* req,
                                                         v1::AbsoluteEncodingResponse* resp,
                                                         const RunContext& ctx);
  [[nodiscard]] absl::Status GetEncodingTableAdmitted(const v1::EncodingTableRequest& req,
                                                      v1::EncodingTableResponse* resp,
                                                      const RunContext& ctx);
  [[nodiscard]] absl::Status AttentionBiasAdmitted(v1::AttentionBiasRequest* req,
                                                   v1::AttentionBiasResponse* resp,
                                                   const RunContext& ctx);

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
  void StartDraining() { draining_ = true; }
  // Every call notes its arrival, so a drain can wait for callers to go quiet.
  void NoteArrival() { last_arrival_ns_ = absl::GetCurrentTimeNanos(); }
  absl::Time last_arrival() const { return absl::FromUnixNanos(last_arrival_ns_.load()); }
  int inflight() const { return inflight_.load(); }
  int64_t inflight_bytes() const { return inflight_bytes_.load(); }
  const EngineOptions& options() const { return options_; }
  // Why there is no CUDA backend ("" when there is one).
  const std::string& cuda_unavailable_reason() const { return cuda_unavailable_reason_; }

 private:
  explicit Engine(const EngineOptions& options);

  [[nodiscard]] absl::StatusOr<Backend*> Choose(v1::Backend requested, int64_t bytes);
  std::string BackendName(const Backend* b) const;

  const EngineOptions options_;
  std::unique_ptr<Backend> cpu_;
  std::unique_ptr<Backend> cuda_;
  std::string cuda_unavailable_reason_;
  TableRepository tables_;
  std::atomic<int> inflight_{0};
  std::atomic<int64_t> inflight_bytes_{0};
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> last_arrival_ns_{0};
};

}  // namespace posenc::server

#endif  // POSENC_SERVER_ENGINE_H_
