#include "engine/engine.h"

#include <algorithm>
#include <cstring>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/aligned_work.h"
#include "engine/backend_cost.h"
#include "engine/no_throw.h"
#include "posenc/host_copy.h"
#include "posenc/limits.h"
#include "posenc/status_macros.h"

namespace posenc::server {
namespace {

// Sizes a result buffer in steps, so that a large answer stops growing when
// its caller leaves instead of zero-filling hundreds of MiB first.
absl::Status ResizeCancellable(std::string* out, int64_t bytes, const RunContext& ctx);

// Where `bytes` of output are written: the owned string sized to them, or
// the caller's memory when it holds them.
// The answer's message bytes for `tensor_bytes` of results.
int64_t InAnswer(const CallEnv& env, int64_t tensor_bytes) {
  return (env.tensors_in_answer ? tensor_bytes : 0) + env.message_overhead;
}

absl::StatusOr<char*> Prepare(OutputTarget& target, int64_t bytes, const RunContext& ctx) {
  if (target.owned != nullptr) {
    POSENC_RETURN_IF_ERROR(ResizeCancellable(target.owned, bytes, ctx));
    return target.owned->data();
  }
  if (bytes > target.external_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("the output needs ", bytes,
                                                   " bytes; its shared-memory slice holds ",
                                                   target.external_bytes));
  }
  return target.external;
}

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
                                  options.admission_wait}),
      shared_memory_(options.shared_memory, &admission_, 2 * options.message_limit()),
      scratch_(&admission_, options.max_request_tensor_bytes) {}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options) {
  POSENC_RETURN_IF_ERROR(options.Validate());
  std::vector<Gpu> gpus;
  std::string why_not;
  if (options.enable_cuda) {
    auto primary = CreateCudaBackend(options.cuda_device);
    if (primary.ok()) {
      gpus.push_back({options.cuda_device, std::move(*primary)});
      // The others served: those named, or every one visible. One that
      // will not start is left out (the primary speaks for the server).
      std::vector<int> others = options.cuda_devices;
      if (others.empty()) {
        for (int d = 0; d < CudaDeviceCount(); ++d) others.push_back(d);
      }
      for (int d : others) {
        if (d == options.cuda_device) continue;
        if (auto b = CreateCudaBackend(d); b.ok()) gpus.push_back({d, std::move(*b)});
      }
    } else {
      why_not = std::string(primary.status().message());
    }
  } else {
    why_not = "disabled by --enable_cuda=false";
  }
  return CreateWithGpus(options, CreateCpuBackend(options.cpu_threads), std::move(gpus), why_not);
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::CreateWith(const EngineOptions& options,
                                                           std::unique_ptr<Backend> cpu,
                                                           std::unique_ptr<Backend> cuda,
                                                           std::string cuda_unavailable_reason) {
  std::vector<Gpu> gpus;
  if (cuda != nullptr) gpus.push_back({options.cuda_device, std::move(cuda)});
  return CreateWithGpus(options, std::move(cpu), std::move(gpus),
                        std::move(cuda_unavailable_reason));
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::CreateWithGpus(
    const EngineOptions& options, std::unique_ptr<Backend> cpu, std::vector<Gpu> gpus,
    std::string cuda_unavailable_reason) {
  POSENC_RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<Engine> e(new Engine(options));
  e->cpu_ = std::move(cpu);
  e->gpus_ = std::move(gpus);
  e->cuda_unavailable_reason_ = std::move(cuda_unavailable_reason);
  // The GPUs' staging kept between calls, held in the budget for good, and
  // still leaving what the largest call reserves before it is read (twice
  // the message limit): a budget that could not would start a server that
  // refuses every tensor call after --admission_wait.
  int64_t resident = 0;
  for (const Gpu& g : e->gpus_) resident += g.backend->ResidentHostBytes();
  e->staging_held_ = e->admission_.Holder();
  if (absl::Status s = e->staging_held_.TryGrow(resident, 2 * options.message_limit()); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_inflight_bytes (", options.max_inflight_bytes, ") cannot hold the ", resident,
        " bytes of pinned staging the GPUs keep and still leave twice --max_message_bytes (",
        2 * options.message_limit(), ") for a call; raise it or serve fewer GPUs"));
  }
  if (options.default_backend == BackendChoice::kCuda && e->primary() == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("--default_backend=cuda but no CUDA backend: ", e->cuda_unavailable_reason_));
  }
  if (e->primary() != nullptr) {
    // Regions become pinned memory for the primary GPU: calls on their
    // tensors there move bytes straight between region and device (best
    // effort: a region the device will not pin is staged as before, and so
    // are calls on the other GPUs).
    Backend* gpu = e->primary();
    e->shared_memory_.SetPinning(
        [gpu, device = options.cuda_device, warn = options.warn](absl::string_view name, char* p,
                                                                 int64_t n) {
          const absl::Status pinned = gpu->PinHostMemory(p, static_cast<size_t>(n));
          if (!pinned.ok() && warn) {
            warn(absl::StrCat(
                "shared memory region \"", name, "\" (", n,
                " bytes) is not pinned for cuda:", device,
                ", so its calls there are staged through pinned buffers: ", pinned.message()));
          }
          return pinned.ok();
        },
        [gpu](char* p) { gpu->UnpinHostMemory(p); });
    // CUDA regions are opened by the backend of their device, once.
    Engine* engine = e.get();
    e->shared_memory_.SetDeviceOpener(
        [engine](int device_id, absl::string_view handle,
                 int64_t bytes) -> absl::StatusOr<DeviceMemory> {
          Backend* on = engine->GpuOf(device_id);
          if (on == nullptr) {
            std::vector<std::string> served;
            for (const Gpu& g : engine->gpus_) served.push_back(absl::StrCat(g.device));
            return absl::InvalidArgumentError(
                absl::StrCat("device_id ", device_id,
                             " is not served here: this server computes on CUDA "
                             "device(s) ",
                             absl::StrJoin(served, ", "),
                             " (--cuda_device, --cuda_devices), and "
                             "its regions must live on one of them"));
          }
          POSENC_ASSIGN_OR_RETURN(void* p,
                                  on->OpenSharedDeviceMemory(handle, static_cast<size_t>(bytes)));
          DeviceMemory m;
          m.data = static_cast<char*>(p);
          m.device = device_id;
          m.close = [on](char* at) { on->CloseSharedDeviceMemory(at); };
          m.copy = [on](void* to, const void* from, size_t n) {
            return on->CopyMemory(to, from, n);
          };
          return m;
        },
        "");
  } else {
    e->shared_memory_.SetDeviceOpener(nullptr, absl::StrCat("this server has no GPU backend (",
                                                            e->cuda_unavailable_reason_, ")"));
  }
  // With a GPU to choose, AUTO routes by what each backend's served path
  // was measured to cost. A measurement that fails leaves the threshold.
  if (e->primary() != nullptr && options.auto_by_measured_cost) {
    auto cpu_cost = MeasureCost(*e->cpu_);
    auto cuda_cost = MeasureCost(*e->primary());  // the other GPUs taken to be alike
    if (cpu_cost.ok() && cuda_cost.ok()) {
      e->cpu_cost_ = *cpu_cost;
      e->cuda_cost_ = *cuda_cost;
    }
  }
  e->tables_.Reload().IgnoreError();  // nothing cancels it, nothing runs beside it
  return e;
}

absl::Status EngineOptions::Validate() const {
  const auto out_of_range = [](absl::string_view flag, auto value, absl::string_view expected) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " must be ", expected, ", got ", value));
  };
  if (cpu_threads < 0) return out_of_range("--threads", cpu_threads, ">= 0 (0: every usable CPU)");
  if (cuda_device < 0) return out_of_range("--cuda_device", cuda_device, ">= 0");
  for (size_t i = 0; i < cuda_devices.size(); ++i) {
    if (cuda_devices[i] < 0) return out_of_range("--cuda_devices", cuda_devices[i], ">= 0 each");
    for (size_t j = 0; j < i; ++j) {
      if (cuda_devices[j] == cuda_devices[i]) {
        return out_of_range("--cuda_devices", cuda_devices[i], "named once");
      }
    }
  }
  if (!cuda_devices.empty() &&
      std::find(cuda_devices.begin(), cuda_devices.end(), cuda_device) == cuda_devices.end()) {
    return out_of_range("--cuda_device", cuda_device, "one of --cuda_devices");
  }
  if (auto_gpu_min_bytes < 0)
    return out_of_range("--auto_gpu_min_bytes", auto_gpu_min_bytes, ">= 0");
  if (default_backend == BackendChoice::kDefault) {
    return absl::InvalidArgumentError("--default_backend must be auto, cpu or cuda; got 'default'");
  }
  if (max_request_tensor_bytes <= 0) {
    return out_of_range("--max_request_bytes", max_request_tensor_bytes, "> 0");
  }
  // gRPC takes its message limits as int.
  if (max_message_bytes < 0 || message_limit() > INT32_MAX) {
    return out_of_range("--max_message_bytes", message_limit(),
                        "in [1, 2^31 - 1] (gRPC's limit; 0: --max_request_bytes + 4 MiB)");
  }
  if (max_inflight_requests <= 0)
    return out_of_range("--max_inflight", max_inflight_requests, "> 0");
  // The largest call holds its message twice: read and parsed, then the
  // answer and its serialised copy.
  if (max_inflight_bytes / 2 < message_limit() ||
      max_inflight_bytes / 2 < max_request_tensor_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_inflight_bytes (", max_inflight_bytes,
                     ") must be at least twice --max_message_bytes (", message_limit(),
                     ") and --max_request_bytes (", max_request_tensor_bytes,
                     "): a call holds its message twice, parsed and serialised"));
  }
  if (admission_wait < absl::ZeroDuration()) {
    return out_of_range("--admission_wait_ms", absl::ToInt64Milliseconds(admission_wait), ">= 0");
  }
  if (max_table_bytes < 0) return out_of_range("--max_table_bytes", max_table_bytes, ">= 0");
  return absl::OkStatus();
}

absl::StatusOr<Engine::Admission> Engine::Admit(int64_t tensor_bytes) {
  POSENC_RETURN_IF_ERROR(CheckRequestSize(tensor_bytes));
  POSENC_ASSIGN_OR_RETURN(Admission a, admission_.Enter());
  POSENC_RETURN_IF_ERROR(a.TryGrow(tensor_bytes));
  return a;
}

absl::StatusOr<Backend*> Engine::Choose(BackendChoice requested, int64_t bytes) {
  switch (Resolve(requested)) {
    case BackendChoice::kCpu:
      return cpu_.get();
    case BackendChoice::kCuda: {
      if (primary() == nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat("backend CUDA was requested but this server has no GPU backend: ",
                         cuda_unavailable_reason_, ". Use backend AUTO or CPU."));
      }
      Backend* gpu = NextGpu();
      const absl::Status health = gpu->health();
      if (!health.ok()) {
        return absl::FailedPreconditionError(
            absl::StrCat("backend CUDA was requested but the GPU has failed: ", health.message(),
                         ". Use backend AUTO or CPU."));
      }
      return gpu;
    }
    case BackendChoice::kAuto:
    case BackendChoice::kDefault: {
      // A failed GPU (a sticky device error) is routed around. Measured:
      // the GPU where it is predicted faster; else by size alone.
      if (primary() == nullptr || bytes < options_.auto_gpu_min_bytes ||
          (cuda_cost_ && cuda_cost_->PredictUs(bytes) >= cpu_cost_->PredictUs(bytes))) {
        return cpu_.get();
      }
      Backend* gpu = NextGpu();
      return gpu->health().ok() ? gpu : cpu_.get();
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("backend has unknown value ", static_cast<int>(requested)));
  }
}

absl::StatusOr<Engine::Staged> Engine::ChooseStaged(const CallEnv& env, int64_t bytes,
                                                    int64_t row_bytes,
                                                    absl::Span<const HostRange> tensors) {
  POSENC_ASSIGN_OR_RETURN(Backend * backend, Choose(env.backend, bytes));
  return StageOn(env, backend, bytes, row_bytes, tensors);
}

bool Engine::PinnedOn(const Backend& b, absl::Span<const HostRange> tensors) {
  for (const HostRange& t : tensors) {
    if (t.bytes > 0 && !b.HostPinned(t.data, static_cast<size_t>(t.bytes))) return false;
  }
  return true;
}

absl::StatusOr<Engine::Staged> Engine::StageOn(const CallEnv& env, Backend* chosen, int64_t bytes,
                                               int64_t row_bytes,
                                               absl::Span<const HostRange> tensors) {
  if (chosen->kind() != BackendKind::kCuda) return Staged{chosen, 0};
  // Only the primary pins regions: a call sent to another GPU whose
  // tensors the primary pinned goes to the primary, which moves them with
  // no host copy.
  bool pinned = PinnedOn(*chosen, tensors);
  if (!pinned && chosen != primary() && primary()->health().ok() && PinnedOn(*primary(), tensors)) {
    chosen = primary();
    pinned = true;
  }
  // The GPU copies tensors it did not pin into its staging while the call
  // runs: those bytes join the call's. Under AUTO a budget too full for
  // them sends the call to the CPU, which needs none.
  const int64_t staging = pinned ? 0 : chosen->StagingBytes(bytes, row_bytes);
  absl::Status charged = env.admission.TryGrow(staging);
  if (charged.ok()) return Staged{chosen, staging};
  if (Resolve(env.backend) == BackendChoice::kCuda) return charged;
  return Staged{cpu_.get(), 0};
}

void Engine::ReleaseStaging(const CallEnv& env, int64_t charged) {
  if (charged > 0) env.admission.Shrink(charged);
}

Backend* Engine::GpuOf(int device) const {
  for (const Gpu& g : gpus_) {
    if (g.device == device) return g.backend.get();
  }
  return nullptr;
}

Backend* Engine::NextGpu() const {
  const size_t n = gpus_.size();
  const uint64_t start = next_gpu_.fetch_add(1, std::memory_order_relaxed);
  for (size_t i = 0; i < n; ++i) {
    Backend* b = gpus_[(start + i) % n].backend.get();
    if (b->health().ok()) return b;
  }
  return primary();
}

absl::StatusOr<Backend*> Engine::DeviceBackend(BackendChoice requested, int device) const {
  // Only a caller's own choice of the CPU is refused: a request that leaves
  // the backend to the server (even one defaulting to the CPU) can only be
  // served where its tensors are.
  if (requested == BackendChoice::kCpu) {
    return absl::InvalidArgumentError(
        "the tensors are in CUDA shared memory, which only the CUDA backend computes on; backend "
        "CPU was asked for (ask for AUTO or CUDA, or send the tensors in system shared memory or "
        "the message)");
  }
  if (primary() == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("the tensors are in CUDA shared memory but this server has no GPU backend: ",
                     cuda_unavailable_reason_));
  }
  Backend* gpu = GpuOf(device);
  if (gpu == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("the tensors are in CUDA shared memory on device ", device,
                     ", which this server does not compute on"));
  }
  POSENC_RETURN_IF_ERROR(gpu->health());
  return gpu;
}

namespace {

// The bytes of one of `rows` rows of `bytes` (all of them for none).
int64_t RowBytes(int64_t bytes, int64_t rows) { return rows > 0 ? bytes / rows : bytes; }

// Device tensors are computed where they are, so they must start at a
// multiple of their element size (host ones are copied aside instead).
absl::Status CheckDeviceAligned(const MutableTensor& t, absl::string_view what) {
  if (!t.present() || AlignedFor(t.data, t.dtype)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, " in CUDA shared memory must start at a multiple of its element size (",
                   SizeOf(t.dtype), " bytes); fix its shared_memory_offset"));
}

}  // namespace

absl::Status Engine::RunWithFallback(const CallEnv& env, int64_t charged, Backend** backend,
                                     const std::function<absl::Status(Backend*)>& run) {
  if (env.before_compute) POSENC_RETURN_IF_ERROR(env.before_compute());
  absl::Status s = run(*backend);
  if (!s.ok() && LeavesToTheCpu(env.backend, **backend, s)) {
    // The GPU's staging is done with: the CPU's retry needs none, and other
    // calls may use the budget it held.
    ReleaseStaging(env, charged);
    *backend = cpu_.get();
    s = run(*backend);
  }
  return s;
}

bool Engine::LeavesToTheCpu(BackendChoice requested, const Backend& backend,
                            const absl::Status& s) const {
  // Under AUTO the CPU serves what the GPU kernels do not cover
  // (UNIMPLEMENTED) or what a failing GPU could not do; the GPU path only
  // writes the caller's buffers once its kernels have succeeded. DATA_LOSS
  // says a copy failed after the results had begun to arrive: the buffers
  // are partly written, so nothing runs on them again.
  const bool gpu_gave_up = s.code() == absl::StatusCode::kUnimplemented ||
                           (!backend.health().ok() && s.code() != absl::StatusCode::kDataLoss);
  return gpu_gave_up && Resolve(requested) == BackendChoice::kAuto &&
         backend.kind() == BackendKind::kCuda;
}

absl::Status Engine::Ready() const {
  if (options_.default_backend != BackendChoice::kCuda || primary() == nullptr)
    return absl::OkStatus();
  // Ready while any GPU is.
  for (const Gpu& g : gpus_) {
    if (g.backend->health().ok()) return absl::OkStatus();
  }
  return primary()->health();
}

std::string Engine::BackendName(const Backend* b) const {
  for (const Gpu& g : gpus_) {
    if (g.backend.get() == b) return absl::StrCat("cuda:", g.device);
  }
  return b->kind() == BackendKind::kCuda ? absl::StrCat("cuda:", options_.cuda_device) : "cpu";
}

std::string Engine::LongestBackendName() const {
  int widest = options_.cuda_device;
  for (const Gpu& g : gpus_) widest = std::max(widest, g.device);
  return absl::StrCat("cuda:", widest);
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
  if (message_bytes > options_.message_limit()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the answer would be a ", message_bytes, "-byte message, over the transport's limit of ",
        options_.message_limit(), " bytes (--max_message_bytes); send less per call"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Engine::ApplyRope(const RopeOptions& options, RopeTensors& t,
                                              const CallEnv& env) {
  std::string served;
  POSENC_RETURN_IF_ERROR(NoThrow([&]() -> absl::Status {
    const int64_t tensor_bytes = t.query.nbytes + t.key.nbytes;
    // The caller's buffers become the answer; its admission holds them and
    // their serialised copy already. The plan is new.
    POSENC_ASSIGN_OR_RETURN(RopePlan plan, PlanRope(options, t, [&](const PlanCost& c) {
                              return env.admission.TryGrow(c.plan_bytes + GpuSideBytes(env, c));
                            }));
    POSENC_RETURN_IF_ERROR(
        CheckAnswerSize(tensor_bytes, InAnswer(env, tensor_bytes), "the answer"));
    const bool has_key = t.key.present();
    if (env.tensors_on_device) {
      POSENC_ASSIGN_OR_RETURN(Backend * gpu, DeviceBackend(env.backend, env.device));
      POSENC_RETURN_IF_ERROR(CheckDeviceAligned(t.query, "query"));
      POSENC_RETURN_IF_ERROR(CheckDeviceAligned(t.key, "key"));
      if (env.before_compute) POSENC_RETURN_IF_ERROR(env.before_compute());
      if (env.query_out != nullptr || env.key_out != nullptr) {
        // Into other slices: a tensor without one of its own stays in place.
        char* q_out = env.query_out != nullptr ? env.query_out : static_cast<char*>(t.query.data);
        char* k_out = !has_key                 ? nullptr
                      : env.key_out != nullptr ? env.key_out
                                               : static_cast<char*>(t.key.data);
        POSENC_RETURN_IF_ERROR(CheckDeviceAligned(
            MutableTensor{t.query.dtype, t.query.shape, q_out, t.query.nbytes}, "query_out"));
        if (has_key) {
          POSENC_RETURN_IF_ERROR(CheckDeviceAligned(
              MutableTensor{t.key.dtype, t.key.shape, k_out, t.key.nbytes}, "key_out"));
        }
        POSENC_RETURN_IF_ERROR(gpu->ApplyRopeInto(
            plan, t.query.data, has_key ? t.key.data : nullptr, q_out, k_out, env.ctx));
      } else {
        POSENC_RETURN_IF_ERROR(
            gpu->ApplyRope(plan, t.query.data, has_key ? t.key.data : nullptr, env.ctx));
      }
      served = BackendName(gpu);
      return absl::OkStatus();
    }
    if (env.query_out != nullptr || env.key_out != nullptr) {
      return RopeIntoHost(plan, t, env, &served);
    }
    AlignedWork aligned(env.admission);
    MutableTensor query = t.query, key = t.key;
    POSENC_RETURN_IF_ERROR(aligned.Align(query));
    POSENC_RETURN_IF_ERROR(aligned.Align(key));
    POSENC_ASSIGN_OR_RETURN(const Staged staged,
                            ChooseStaged(env, tensor_bytes, RowBytes(tensor_bytes, plan.num_tokens),
                                         {{query.data, static_cast<int64_t>(query.nbytes)},
                                          {key.data, static_cast<int64_t>(key.nbytes)}}));
    Backend* backend = staged.backend;
    POSENC_RETURN_IF_ERROR(RunWithFallback(env, staged.charged, &backend, [&](Backend* b) {
      return b->ApplyRope(plan, query.data, has_key ? key.data : nullptr, env.ctx);
    }));
    aligned.CopyBack();
    served = BackendName(backend);
    return absl::OkStatus();
  }));
  return served;
}

// Host tensors (system shared memory) whose results go to other host
// memory: the outputs may be read, or written by other calls, while this
// one runs (KServe clients share output slices between concurrent
// requests), so they must receive finished values only, and the inputs
// must stay as they were. Each backend has a through operation for this
// that needs no copy of the caller's aside: a GPU takes the inputs up and
// brings the results down into the outputs (straight from and to memory
// it pinned; else through its staging), the CPU goes block by block
// through its threads' own buffers. The CPU's needs every output apart
// from every input (blocks go out before later ones are read, and a
// tensor rotated in place would be left half rotated by a call that fails
// midway); otherwise it works on private copies (the engine's scratch
// buffers), which then go to the outputs.
absl::Status Engine::RopeIntoHost(const RopePlan& plan, const RopeTensors& t, const CallEnv& env,
                                  std::string* served) {
  const bool has_key = t.key.present();
  const int64_t tensor_bytes = t.query.nbytes + t.key.nbytes;
  char* q_in = static_cast<char*>(t.query.data);
  char* k_in = has_key ? static_cast<char*>(t.key.data) : nullptr;
  // A tensor without an output of its own is rotated in place.
  char* q_out = env.query_out != nullptr ? env.query_out : q_in;
  char* k_out = !has_key ? nullptr : env.key_out != nullptr ? env.key_out : k_in;
  // The CPU's way where outputs overlap inputs: a tensor with an output of
  // its own is rotated in a private copy (an engine scratch buffer), then
  // copied there; one rotated in place only needs to be aligned. The
  // copies are also the work memory of a through that needs any.
  struct Work {
    MutableTensor tensor;
    char* out;
    ScratchPool::Buffer copy;
    bool aside() const { return tensor.present() && out != tensor.data; }
  };
  Work q{t.query, q_out, {}}, k{t.key, k_out, {}};
  const auto lend = [&](Work& w) -> absl::Status {
    const auto bytes = static_cast<int64_t>(w.tensor.nbytes);
    POSENC_ASSIGN_OR_RETURN(w.copy, scratch_.Lend(std::max<int64_t>(1, bytes), env.admission));
    return absl::OkStatus();
  };
  // Work memory is lent only to a backend that needs it (a CPU whose
  // blocks cannot hold a token).
  const auto through = [&](Backend* b) -> absl::Status {
    if (b->RopeThroughNeedsWork(plan)) {
      POSENC_RETURN_IF_ERROR(lend(q));
      if (has_key) POSENC_RETURN_IF_ERROR(lend(k));
    }
    RopeThrough through;
    const auto set = [](const Work& w, const void** in, void** work, void** out) {
      *in = w.tensor.data;
      *work = w.copy ? w.copy.data() : nullptr;
      *out = w.out;
    };
    set(q, &through.query, &through.query_work, &through.query_out);
    if (has_key) set(k, &through.key, &through.key_work, &through.key_out);
    if (env.inputs_intact) through.before_write = env.inputs_intact;
    return b->ApplyRopeThrough(plan, through, env.ctx);
  };
  POSENC_ASSIGN_OR_RETURN(Backend * backend, Choose(env.backend, tensor_bytes));
  if (backend->kind() == BackendKind::kCuda) {
    const auto q_bytes = static_cast<int64_t>(t.query.nbytes);
    const auto k_bytes = static_cast<int64_t>(t.key.nbytes);
    POSENC_ASSIGN_OR_RETURN(
        const bool done,
        ThroughGpu(env, backend, tensor_bytes, RowBytes(tensor_bytes, plan.num_tokens),
                   {{q_in, q_bytes}, {k_in, k_bytes}, {q_out, q_bytes}, {k_out, k_bytes}}, through,
                   served));
    if (done) return absl::OkStatus();
    // Work memory lent to a GPU that gave up (one that asks for any).
    q.copy = {};
    k.copy = {};
  }
  // The CPU, through its blocks where every tensor has an output of its
  // own that overlaps no input.
  const auto apart = [](const void* a, size_t an, const void* b, size_t bn) {
    return !HostBytesOverlap(a, an, b, bn);
  };
  const bool through_fits =
      q.aside() && (!has_key || k.aside()) &&
      apart(q.out, t.query.nbytes, t.query.data, t.query.nbytes) &&
      (!has_key || (apart(k.out, t.key.nbytes, t.key.data, t.key.nbytes) &&
                    apart(q.out, t.query.nbytes, t.key.data, t.key.nbytes) &&
                    apart(k.out, t.key.nbytes, t.query.data, t.query.nbytes) &&
                    apart(q.out, t.query.nbytes, k.out, t.key.nbytes)));
  Backend* const cpu = cpu_.get();
  if (through_fits) {
    POSENC_RETURN_IF_ERROR(through(cpu));
    *served = BackendName(cpu);
    return absl::OkStatus();
  }
  // Otherwise every input is copied (or aligned) before anything is written.
  AlignedWork aligned(env.admission);
  for (Work* w : {&q, &k}) {
    if (w->aside()) {
      POSENC_RETURN_IF_ERROR(lend(*w));
    } else if (w->tensor.present()) {
      POSENC_RETURN_IF_ERROR(aligned.Align(w->tensor));
    }
  }
  for (Work* w : {&q, &k}) {
    if (!w->copy) continue;
    CopyHostBytes(w->copy.data(), w->tensor.data, w->tensor.nbytes);
    w->tensor.data = w->copy.data();
  }
  // The copies must be of the caller's bytes before anything is written.
  if (env.inputs_intact) POSENC_RETURN_IF_ERROR(env.inputs_intact());
  POSENC_RETURN_IF_ERROR(
      cpu->ApplyRope(plan, q.tensor.data, has_key ? k.tensor.data : nullptr, env.ctx));
  for (Work* w : {&q, &k}) {
    if (w->copy) CopyHostBytes(w->out, w->copy.data(), w->tensor.nbytes);
  }
  aligned.CopyBack();
  *served = BackendName(cpu);
  return absl::OkStatus();
}

absl::StatusOr<bool> Engine::ThroughGpu(const CallEnv& env, Backend* gpu, int64_t bytes,
                                        int64_t row_bytes, absl::Span<const HostRange> tensors,
                                        const std::function<absl::Status(Backend*)>& through,
                                        std::string* served) {
  POSENC_ASSIGN_OR_RETURN(const Staged staged, StageOn(env, gpu, bytes, row_bytes, tensors));
  gpu = staged.backend;
  if (gpu->kind() != BackendKind::kCuda) return false;  // AUTO, and no room for the staging
  const absl::Status s = through(gpu);
  if (s.ok()) {
    *served = BackendName(gpu);
    return true;
  }
  // A GPU that gave up left the outputs as they were, as RunWithFallback's.
  if (!LeavesToTheCpu(env.backend, *gpu, s)) return s;
  ReleaseStaging(env, staged.charged);
  return false;
}

absl::StatusOr<std::string> Engine::AddAbsolute(AbsoluteOptions o, AbsoluteTensors& t,
                                                const CallEnv& env) {
  std::string served;
  POSENC_RETURN_IF_ERROR(NoThrow([&]() -> absl::Status {
    const int64_t tensor_bytes = t.x.nbytes;
    if (o.kind == AbsoluteOptions::Kind::kLearned) {
      POSENC_ASSIGN_OR_RETURN(o.table, tables_.Find(o.table_name));
    }
    POSENC_ASSIGN_OR_RETURN(AbsolutePlan plan, PlanAbsolute(o, t, [&](const PlanCost& c) {
                              return env.admission.TryGrow(c.plan_bytes + GpuSideBytes(env, c));
                            }));
    POSENC_RETURN_IF_ERROR(
        CheckAnswerSize(tensor_bytes, InAnswer(env, tensor_bytes), "the answer"));
    if (env.tensors_on_device) {
      POSENC_ASSIGN_OR_RETURN(Backend * gpu, DeviceBackend(env.backend, env.device));
      POSENC_RETURN_IF_ERROR(CheckDeviceAligned(t.x, "x"));
      if (env.before_compute) POSENC_RETURN_IF_ERROR(env.before_compute());
      POSENC_RETURN_IF_ERROR(gpu->ApplyAbsolute(plan, t.x.data, env.ctx));
      served = BackendName(gpu);
      return absl::OkStatus();
    }
    if (env.x_out != nullptr && env.x_out != t.x.data) {
      IntoHostCall call;
      call.in = t.x.data;
      call.out = env.x_out;
      call.bytes = tensor_bytes;
      call.row_bytes = RowBytes(tensor_bytes, plan.num_tokens);
      call.through = [&](Backend* b) {
        AbsoluteThrough through;
        through.x = t.x.data;
        through.y = env.x_out;
        if (env.inputs_intact) through.before_write = env.inputs_intact;
        return b->ApplyAbsoluteThrough(plan, through, env.ctx);
      };
      call.in_place = [&](Backend* b, void* x) { return b->ApplyAbsolute(plan, x, env.ctx); };
      return IntoHost(call, env, &served);
    }
    AlignedWork aligned(env.admission);
    MutableTensor x = t.x;
    POSENC_RETURN_IF_ERROR(aligned.Align(x));
    POSENC_ASSIGN_OR_RETURN(const Staged staged,
                            ChooseStaged(env, tensor_bytes, RowBytes(tensor_bytes, plan.num_tokens),
                                         {{x.data, tensor_bytes}}));
    Backend* backend = staged.backend;
    POSENC_RETURN_IF_ERROR(RunWithFallback(env, staged.charged, &backend, [&](Backend* b) {
      return b->ApplyAbsolute(plan, x.data, env.ctx);
    }));
    aligned.CopyBack();
    served = BackendName(backend);
    return absl::OkStatus();
  }));
  return served;
}

// A host input whose result goes to other host memory that others may
// read meanwhile (another slice of system shared memory), as RopeIntoHost's
// outputs: the output receives finished values only and the input stays as
// it was. A GPU, or the CPU where the output overlaps no part of the input,
// takes its through operation (see RopeIntoHost). Otherwise (the CPU and an
// overlap) the input is copied into a scratch buffer, computed there and
// copied out.
absl::Status Engine::IntoHost(const IntoHostCall& call, const CallEnv& env, std::string* served) {
  const auto bytes = static_cast<size_t>(call.bytes);
  POSENC_ASSIGN_OR_RETURN(Backend * backend, Choose(env.backend, call.bytes));
  if (backend->kind() == BackendKind::kCuda) {
    POSENC_ASSIGN_OR_RETURN(
        const bool done,
        ThroughGpu(env, backend, call.bytes, call.row_bytes,
                   {{call.in, call.bytes}, {call.out, call.bytes}}, call.through, served));
    if (done) return absl::OkStatus();
  }
  Backend* const cpu = cpu_.get();
  if (!HostBytesOverlap(call.in, bytes, call.out, bytes)) {
    POSENC_RETURN_IF_ERROR(call.through(cpu));
    *served = BackendName(cpu);
    return absl::OkStatus();
  }
  POSENC_ASSIGN_OR_RETURN(ScratchPool::Buffer copy,
                          scratch_.Lend(std::max<int64_t>(1, call.bytes), env.admission));
  CopyHostBytes(copy.data(), call.in, bytes);
  // The copy must be of the caller's bytes before anything is written.
  if (env.inputs_intact) POSENC_RETURN_IF_ERROR(env.inputs_intact());
  POSENC_RETURN_IF_ERROR(call.in_place(cpu, copy.data()));
  CopyHostBytes(call.out, copy.data(), bytes);
  *served = BackendName(cpu);
  return absl::OkStatus();
}

absl::StatusOr<Produced> Engine::EncodingTable(AbsoluteOptions o, int64_t dim, int64_t count,
                                               const TensorView& positions, DType dtype,
                                               OutputTarget out, const CallEnv& env) {
  Produced produced;
  POSENC_RETURN_IF_ERROR(NoThrow([&]() -> absl::Status {
    if (o.kind == AbsoluteOptions::Kind::kLearned) {
      POSENC_ASSIGN_OR_RETURN(o.table, tables_.Find(o.table_name));
      if (dim == 0) dim = o.table->dim;
      if (count == 0 && !positions.present()) count = o.table->rows;
    } else if (dim <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("dim must be > 0, got ", dim));
    }
    // The answer's size is known once shapes are valid: refused or admitted
    // before it is allocated.
    POSENC_ASSIGN_OR_RETURN(
        AbsolutePlan plan,
        PlanEncodingTable(o, dim, dtype, positions, count, [&](const PlanCost& c) -> absl::Status {
          POSENC_RETURN_IF_ERROR(
              CheckAnswerSize(c.output_bytes, InAnswer(env, c.output_bytes), "the table"));
          return env.admission.TryGrow(c.plan_bytes + c.output_bytes + GpuSideBytes(env, c));
        }));
    const int64_t out_bytes = plan.num_tokens * dim * static_cast<int64_t>(SizeOf(dtype));
    POSENC_ASSIGN_OR_RETURN(char* const prepared, Prepare(out, out_bytes, env.ctx));
    AlignedWork aligned(env.admission);
    POSENC_ASSIGN_OR_RETURN(char* const target, aligned.Output(prepared, out_bytes, dtype));
    POSENC_ASSIGN_OR_RETURN(
        const Staged staged,
        ChooseStaged(env, out_bytes, RowBytes(out_bytes, plan.num_tokens), {{target, out_bytes}}));
    Backend* backend = staged.backend;
    POSENC_RETURN_IF_ERROR(RunWithFallback(env, staged.charged, &backend, [&](Backend* b) {
      return b->ApplyAbsolute(plan, target, env.ctx);
    }));
    aligned.CopyBack();
    produced.dtype = dtype;
    produced.shape = {plan.num_tokens, dim};
    produced.backend = BackendName(backend);
    return absl::OkStatus();
  }));
  return produced;
}

absl::StatusOr<Produced> Engine::AttentionBias(const BiasOptions& o, MutableTensor& logits,
                                               OutputTarget out, const CallEnv& env) {
  Produced produced;
  POSENC_RETURN_IF_ERROR(NoThrow([&]() -> absl::Status {
    const bool has_logits = logits.present();
    POSENC_ASSIGN_OR_RETURN(
        BiasPlan plan, PlanAttentionBias(o, logits.view(), [&](const PlanCost& c) -> absl::Status {
          // The answer: the bias (new, or the logits it was added to) and
          // the slopes (one double each, packed).
          const int64_t tensor_bytes =
              has_logits ? static_cast<int64_t>(logits.nbytes) : c.output_bytes;
          const int64_t slopes_bytes =
              8 * std::max<int64_t>(o.num_heads, logits.rank() == 4 ? logits.shape[1] : 0);
          POSENC_RETURN_IF_ERROR(CheckAnswerSize(
              tensor_bytes, InAnswer(env, tensor_bytes) + slopes_bytes, "the bias"));
          return env.admission.TryGrow(c.plan_bytes + c.output_bytes + GpuSideBytes(env, c));
        }));
    const int64_t out_bytes = plan.NumElements() * static_cast<int64_t>(SizeOf(plan.dtype));
    produced.dtype = plan.dtype;
    produced.shape = {plan.batch, plan.num_heads, plan.q_len, plan.k_len};
    produced.slopes = plan.slopes;
    if (env.tensors_on_device) {
      // Logits in CUDA shared memory (a bias built for such a slice is
      // built in host memory and copied there by the front).
      if (!has_logits) return absl::InternalError("a device bias without logits");
      POSENC_ASSIGN_OR_RETURN(Backend * gpu, DeviceBackend(env.backend, env.device));
      POSENC_RETURN_IF_ERROR(CheckDeviceAligned(logits, "logits"));
      if (env.before_compute) POSENC_RETURN_IF_ERROR(env.before_compute());
      POSENC_RETURN_IF_ERROR(gpu->ApplyAttentionBias(plan, logits.data, env.ctx));
      produced.backend = BackendName(gpu);
      return absl::OkStatus();
    }
    if (has_logits && env.bias_out != nullptr && env.bias_out != logits.data) {
      IntoHostCall call;
      call.in = logits.data;
      call.out = env.bias_out;
      call.bytes = static_cast<int64_t>(logits.nbytes);
      call.row_bytes = RowBytes(call.bytes, plan.batch * plan.num_heads * plan.q_len);
      call.through = [&](Backend* b) {
        BiasThrough through;
        through.logits = logits.data;
        through.out = env.bias_out;
        if (env.inputs_intact) through.before_write = env.inputs_intact;
        return b->ApplyAttentionBiasThrough(plan, through, env.ctx);
      };
      call.in_place = [&](Backend* b, void* data) {
        return b->ApplyAttentionBias(plan, data, env.ctx);
      };
      return IntoHost(call, env, &produced.backend);
    }
    AlignedWork aligned(env.admission);
    MutableTensor in_place = logits;
    void* target = nullptr;
    if (has_logits) {
      POSENC_RETURN_IF_ERROR(aligned.Align(in_place));
      target = in_place.data;
    } else {
      POSENC_ASSIGN_OR_RETURN(char* const prepared, Prepare(out, out_bytes, env.ctx));
      POSENC_ASSIGN_OR_RETURN(target, aligned.Output(prepared, out_bytes, plan.dtype));
    }
    POSENC_ASSIGN_OR_RETURN(
        const Staged staged,
        ChooseStaged(env, out_bytes, RowBytes(out_bytes, plan.batch * plan.num_heads * plan.q_len),
                     {{target, out_bytes}}));
    Backend* backend = staged.backend;
    POSENC_RETURN_IF_ERROR(RunWithFallback(env, staged.charged, &backend, [&](Backend* b) {
      return b->ApplyAttentionBias(plan, target, env.ctx);
    }));
    aligned.CopyBack();
    produced.backend = BackendName(backend);
    return absl::OkStatus();
  }));
  return produced;
}

absl::Status Engine::ReloadTables() {
  return tables_.Reload([this] { return draining(); });
}

}  // namespace posenc::server
