// The service's work behind a plain C++ API in the kernel library's types:
// admits memory, resolves tables, plans, chooses a backend (falling back
// from a failed GPU), runs the kernels. Knows neither protobuf nor gRPC
// (operations.h adapts posenc.v1 messages to it through wire/); errors are
// absl::Status with the SPEC §3 codes.
#ifndef POSENC_SERVER_ENGINE_ENGINE_H_
#define POSENC_SERVER_ENGINE_ENGINE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/admission.h"
#include "engine/attempt_ledger.h"
#include "engine/backend_cost.h"
#include "engine/scratch_pool.h"
#include "engine/shared_memory_registry.h"
#include "engine/table_repository.h"
#include "posenc/backend.h"

namespace posenc::server {

// Room a message needs besides its tensor bytes (descriptors, ids, options):
// the default transport limit is the request limit plus this.
inline constexpr int64_t kMessageSlackBytes = int64_t{4} << 20;

// The engine's limits and settings; each default here is the one posenc-server
// documents (its flags take them from a default-constructed EngineOptions).
struct EngineOptions {
  BackendChoice default_backend = BackendChoice::kAuto;
  int cpu_threads = 0;  // 0: every hardware thread
  bool enable_cuda = true;
  // The primary GPU (--cuda_device): what AUTO's cost model is measured on
  // and the name a staged call reports when no other GPU is served.
  int cuda_device = 0;
  // Every GPU served (--cuda_devices): empty for every visible one. Staged
  // calls spread over them; a call on CUDA shared memory runs on the GPU
  // its region lives on.
  std::vector<int> cuda_devices;
  // AUTO sends requests of at least this many tensor bytes to the GPU.
  int64_t auto_gpu_min_bytes = int64_t{1} << 20;
  // With a GPU, measure both backends' served cost at start-up and let AUTO
  // send a request (of at least auto_gpu_min_bytes) to the GPU only where
  // that is predicted faster (backend_cost.h). --auto_by_measured_cost.
  bool auto_by_measured_cost = true;
  // Largest total of tensor bytes in one request, and in one response.
  int64_t max_request_tensor_bytes = int64_t{64} << 20;
  // Requests in flight (from arrival until the answer is final), and the
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
  // The transport's limit on one message (--max_message_bytes): answers
  // larger than this are refused before they are computed (the transport
  // would drop them). 0: max_request_tensor_bytes + kMessageSlackBytes.
  int64_t max_message_bytes = 0;

  // Shared-memory regions (shared_memory_registry.h), for both fronts.
  SharedMemoryOptions shared_memory;

  // Where the engine reports what no caller's status shows: a system
  // region the GPU would not pin, whose calls are then staged (slower, and
  // otherwise unexplained). Null: not reported. The server logs it as a
  // warning.
  std::function<void(absl::string_view)> warn;

  // max_message_bytes, or what 0 stands for.
  int64_t message_limit() const {
    return max_message_bytes > 0 ? max_message_bytes
                                 : max_request_tensor_bytes + kMessageSlackBytes;
  }
  // INVALID_ARGUMENT naming the flag of the first value out of range.
  [[nodiscard]] absl::Status Validate() const;
};

// What a call brings besides its operands.
struct CallEnv {
  const RunContext& ctx;
  // Already holds the request; grows by what the operation allocates (plans,
  // new outputs) before it is allocated.
  AdmissionControl::Ticket& admission;
  BackendChoice backend = BackendChoice::kDefault;
  // Bytes the answer's message carries besides its tensor data (descriptors,
  // ids, field tags): with the data, checked against --max_message_bytes
  // before any work, since the transport would drop a larger answer.
  int64_t message_overhead = 0;
  // False when the results stay in shared memory: the answer's message then
  // carries no tensor bytes (the request size limit still holds).
  bool tensors_in_answer = true;
  // The tensors worked on lie in CUDA shared memory: computed there by the
  // CUDA backend, never by the CPU (which cannot reach device memory) and
  // never copied aside.
  bool tensors_on_device = false;
  // Which GPU they are on (the region's device id).
  int device = 0;
  // RoPE only: where the rotated query and key go instead of in place
  // (null: in place). With tensors_on_device, another slice of CUDA shared
  // memory; else another slice of system shared memory, which receives
  // finished values only (Engine::RopeIntoHost).
  char* query_out = nullptr;
  char* key_out = nullptr;
  // Absolute encodings only: where y goes instead of in place over x (null:
  // in place): another slice of system shared memory, which receives
  // finished values only (Engine::IntoHost). Host tensors only.
  char* x_out = nullptr;
  // Attention biases added to logits only: where the logits with the bias
  // go instead of in place, as x_out.
  char* bias_out = nullptr;
  // Host inputs RoPE (or an absolute encoding, or a bias) copies before it
  // writes query_out / key_out (x_out, bias_out): whether
  // their memory is still the caller's (a truncated shared-memory object
  // reads as zeros, see GuardedMapping), so that a call whose inputs were
  // lost writes nothing there. Null: nothing to check.
  std::function<absl::Status()> inputs_intact;
  // Called once a call has passed every refusal that leaves the caller's
  // tensors as they were (plans, memory, staging), just before its first
  // write to a tensor computed in place: a posenc.v1 call in shared or
  // device memory claims its call id here (attempt_ledger.h), so gRPC's
  // retry of a call refused before this point runs. Null: nothing to do.
  std::function<absl::Status()> before_compute;
};

// Where a tensor an operation produces (a table, a built bias) goes: a
// string the engine sizes (the answer's bytes), or memory the caller
// provides (a shared-memory slice), which must hold the whole tensor.
struct OutputTarget {
  OutputTarget(std::string* s) : owned(s) {}  // NOLINT: a string is the usual target
  OutputTarget(char* memory, int64_t bytes) : external(memory), external_bytes(bytes) {}
  std::string* owned = nullptr;
  char* external = nullptr;
  int64_t external_bytes = 0;
};

// A new tensor an operation produced (a table or a bias).
struct Produced {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<double> slopes;  // the bias's per-head slopes
  std::string backend;
};

class Engine {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& options);
  // An engine on the given backends (`cuda` may be null, then with the
  // reason): what Create does once it has made them; tests pass their own.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Engine>> CreateWith(
      const EngineOptions& options, std::unique_ptr<Backend> cpu, std::unique_ptr<Backend> cuda,
      std::string cuda_unavailable_reason);
  // One CUDA backend per GPU served, the primary (options.cuda_device)
  // first; none without a GPU (then with the reason).
  struct Gpu {
    int device = 0;
    std::unique_ptr<Backend> backend;
  };
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Engine>> CreateWithGpus(
      const EngineOptions& options, std::unique_ptr<Backend> cpu, std::vector<Gpu> gpus,
      std::string cuda_unavailable_reason);

  // A call's claim on the in-flight budget (admission.h).
  using Admission = AdmissionControl::Ticket;
  // Admission for a request already in memory: a slot and its bytes now.
  // UNAVAILABLE while draining, RESOURCE_EXHAUSTED over --max_request_bytes,
  // --max_inflight or --max_inflight_bytes.
  [[nodiscard]] absl::StatusOr<Admission> Admit(int64_t tensor_bytes);
  AdmissionControl& admission() { return admission_; }
  // The request-size limit, in one place: RESOURCE_EXHAUSTED when the tensor
  // bytes a request carries (in its message, or in shared memory it names)
  // exceed --max_request_bytes. Each front checks it once, as soon as it
  // has parsed a request and before any tensor is read or planned.
  [[nodiscard]] absl::Status CheckRequestSize(int64_t tensor_bytes) const;

  // The operations, on an admitted call. Each returns the backend that ran
  // it ("cpu", "cuda:0"), refuses answers larger than the transport's limit
  // before computing them, and turns allocation failure into
  // RESOURCE_EXHAUSTED: nothing escapes as an exception.
  //
  // RoPE and the absolute encoding work in place on the caller's tensors.
  [[nodiscard]] absl::StatusOr<std::string> ApplyRope(const RopeOptions& options, RopeTensors& t,
                                                      const CallEnv& env);
  // `options.table_name` names the learned table (resolved here).
  [[nodiscard]] absl::StatusOr<std::string> AddAbsolute(AbsoluteOptions options, AbsoluteTensors& t,
                                                        const CallEnv& env);
  // PE rows for `positions` (or 0..count-1) into *out, sized here. dim and
  // count 0 for a learned table mean its own.
  [[nodiscard]] absl::StatusOr<Produced> EncodingTable(AbsoluteOptions options, int64_t dim,
                                                       int64_t count, const TensorView& positions,
                                                       DType dtype, OutputTarget out,
                                                       const CallEnv& env);
  // The bias added to `logits` in place when present, else built into *out.
  [[nodiscard]] absl::StatusOr<Produced> AttentionBias(const BiasOptions& options,
                                                       MutableTensor& logits, OutputTarget out,
                                                       const CallEnv& env);

  const TableRepository& tables() const { return tables_; }
  // The shared-memory regions callers registered; their bytes are admitted
  // against this engine's budget.
  SharedMemoryRegistry& shared_memory() { return shared_memory_; }
  const SharedMemoryRegistry& shared_memory() const { return shared_memory_; }
  // Reused buffers for work that cannot be done where a tensor lies
  // (scratch_pool.h); up to --max_request_bytes of them are kept idle.
  ScratchPool& scratch() { return scratch_; }
  // The in-place calls started, by their callers' ids: a retried attempt of
  // one is refused (attempt_ledger.h).
  AttemptLedger& attempts() { return attempts_; }
  // TableRepository::Reload: a drain abandons a reload in progress
  // (CANCELLED; the old tables stay), and a third reload while one runs and
  // one waits is RESOURCE_EXHAUSTED.
  [[nodiscard]] absl::Status ReloadTables();

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
  const Backend* cpu() const { return cpu_.get(); }
  const Backend* cuda() const { return primary(); }  // the primary GPU; null without one
  const std::vector<Gpu>& gpus() const { return gpus_; }
  // Why there is no CUDA backend ("" when there is one).
  const std::string& cuda_unavailable_reason() const { return cuda_unavailable_reason_; }
  // What AUTO routes by: each backend's measured served cost (empty without
  // a GPU to choose, with --auto_by_measured_cost=false, or when measuring
  // failed).
  const std::optional<CostModel>& cpu_cost() const { return cpu_cost_; }
  const std::optional<CostModel>& cuda_cost() const { return cuda_cost_; }
  // The longest name BackendName gives (answers are sized with it).
  std::string LongestBackendName() const;

 private:
  explicit Engine(const EngineOptions& options);

  [[nodiscard]] absl::StatusOr<Backend*> Choose(BackendChoice requested, int64_t bytes);
  // Host memory a call names: where it starts and its size.
  struct HostRange {
    const void* data;
    int64_t bytes;
  };
  // Whether every range of nonzero size lies in host memory `b` pinned.
  static bool PinnedOn(const Backend& b, absl::Span<const HostRange> tensors);
  // A backend chosen for a call on host tensors, and the bytes of its
  // staging charged to the call.
  struct Staged {
    Backend* backend = nullptr;
    int64_t charged = 0;
  };
  // Choose, then StageOn, for a call on host tensors (`tensors`, `bytes` in
  // all, moved in rows of `row_bytes`).
  [[nodiscard]] absl::StatusOr<Staged> ChooseStaged(const CallEnv& env, int64_t bytes,
                                                    int64_t row_bytes,
                                                    absl::Span<const HostRange> tensors);
  // For a backend `chosen`: a GPU's staging of the tensors it did not pin
  // (Backend::StagingBytes; none where it pinned them all) charged to the
  // call, or, under AUTO, the CPU when that does not fit. A GPU other than
  // the primary leaves a call whose tensors the primary pinned, and it did
  // not, to the primary (only the primary pins regions).
  [[nodiscard]] absl::StatusOr<Staged> StageOn(const CallEnv& env, Backend* chosen, int64_t bytes,
                                               int64_t row_bytes,
                                               absl::Span<const HostRange> tensors);
  // Gives a Staged's charge back: the call leaves the GPU for the CPU,
  // after the GPU gave up.
  void ReleaseStaging(const CallEnv& env, int64_t charged);
  // ApplyRope's work for host tensors whose results go to other host memory
  // (env.query_out / key_out): see engine.cc. Sets *served.
  [[nodiscard]] absl::Status RopeIntoHost(const RopePlan& plan, const RopeTensors& t,
                                          const CallEnv& env, std::string* served);
  // A call from host memory into other host memory (`tensors`: inputs and
  // outputs) on `gpu` (a GPU Choose picked), or the GPU StageOn moves it
  // to: its `through` operation there, its staging charged. True once the
  // GPU has served it (*served set); false when the call is left to the
  // CPU: under AUTO, a budget that holds no staging, or a GPU that gave up
  // (its charge given back, the outputs as they were).
  [[nodiscard]] absl::StatusOr<bool> ThroughGpu(
      const CallEnv& env, Backend* gpu, int64_t bytes, int64_t row_bytes,
      absl::Span<const HostRange> tensors, const std::function<absl::Status(Backend*)>& through,
      std::string* served);
  // A host input computed into other host memory (AddAbsolute's env.x_out,
  // AttentionBias's env.bias_out): `bytes` at `in`, the result to `out`.
  struct IntoHostCall {
    const void* in = nullptr;
    char* out = nullptr;
    int64_t bytes = 0;
    int64_t row_bytes = 0;  // of the rows a GPU stages (tokens, bias rows)
    // The backend's through operation.
    std::function<absl::Status(Backend* backend)> through;
    // The operation in place on a private copy of the input at `data`.
    std::function<absl::Status(Backend* backend, void* data)> in_place;
  };
  // Runs `call` (see engine.cc). Sets *served.
  [[nodiscard]] absl::Status IntoHost(const IntoHostCall& call, const CallEnv& env,
                                      std::string* served);
  // Runs `run` on *backend; under AUTO, retries on the CPU (updating
  // *backend) when the GPU does not cover the request or has failed,
  // giving the call's staging charge (`charged`, a Staged's) back first.
  [[nodiscard]] absl::Status RunWithFallback(const CallEnv& env, int64_t charged, Backend** backend,
                                             const std::function<absl::Status(Backend*)>& run);
  // Whether a call that failed with `s` on `backend` is retried on the CPU
  // (RunWithFallback's rule): under AUTO, a GPU that gave up.
  bool LeavesToTheCpu(BackendChoice requested, const Backend& backend, const absl::Status& s) const;
  // RESOURCE_EXHAUSTED when an answer's tensors exceed --max_request_bytes or
  // its message exceeds --max_message_bytes (the transport would drop it
  // after the work was done).
  [[nodiscard]] absl::Status CheckAnswerSize(int64_t tensor_bytes, int64_t message_bytes,
                                             absl::string_view what) const;
  std::string BackendName(const Backend* b) const;
  // The backend for a call whose tensors are in CUDA shared memory on
  // `device`: that GPU's, healthy, unless the caller asked for the CPU
  // (whatever --default_backend says: the tensors can only be computed on
  // where they are).
  [[nodiscard]] absl::StatusOr<Backend*> DeviceBackend(BackendChoice requested, int device) const;
  // The GPU for a staged call: the next healthy one in turn (the primary's
  // failure when none is).
  Backend* NextGpu() const;
  Backend* GpuOf(int device) const;
  // The primary GPU's backend (gpus_ puts it first), or null.
  Backend* primary() const { return gpus_.empty() ? nullptr : gpus_[0].backend.get(); }
  BackendChoice Resolve(BackendChoice requested) const {
    return requested == BackendChoice::kDefault ? options_.default_backend : requested;
  }
  // What a call that may run on a GPU holds beside its plan: the side
  // tables the GPU stages (PlanCost::device_side_bytes); none where only
  // the CPU can serve it.
  int64_t GpuSideBytes(const CallEnv& env, const PlanCost& c) const {
    return gpus_.empty() || Resolve(env.backend) == BackendChoice::kCpu ? 0 : c.device_side_bytes;
  }

  const EngineOptions options_;
  std::unique_ptr<Backend> cpu_;
  std::vector<Gpu> gpus_;
  mutable std::atomic<uint64_t> next_gpu_{0};
  std::string cuda_unavailable_reason_;
  std::optional<CostModel> cpu_cost_, cuda_cost_;
  TableRepository tables_;
  AdmissionControl admission_;
  SharedMemoryRegistry shared_memory_;     // after admission_, which it admits against
  ScratchPool scratch_;                    // likewise
  AdmissionControl::Ticket staging_held_;  // the GPUs' resident staging, likewise
  AttemptLedger attempts_;
};

}  // namespace posenc::server

#endif  // POSENC_SERVER_ENGINE_ENGINE_H_
