#include "kserve/infer.h"

#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/utf8.h"
#include "kserve/parameters.h"
#include "kserve/tensors.h"
#include "posenc/host_copy.h"
#include "posenc/limits.h"
#include "posenc/status_macros.h"

namespace posenc::server::kserve {
namespace {

// What an answer carries besides tensor data: names, datatypes, shapes,
// ids and field tags (generously).
int64_t Overhead(const inference::ModelInferRequest& req) {
  return 1024 + static_cast<int64_t>(req.id().size() + req.model_name().size());
}

absl::Status NoSuchInput(const Model& model, absl::string_view name) {
  std::vector<std::string> names;
  for (const TensorSpec& t : model.inputs) names.push_back(t.name);
  return absl::InvalidArgumentError(absl::StrCat("model ", model.name, " has no input \"",
                                                 Utf8Prefix(name, 64), "\"; its inputs are ",
                                                 absl::StrJoin(names, ", ")));
}

// The request's inputs by name, checked against the model's.
class InputSet {
 public:
  static absl::StatusOr<InputSet> Of(const Model& model, std::vector<Input> inputs) {
    for (const Input& in : inputs) {
      if (FindInput(model, in.name) == nullptr) return NoSuchInput(model, in.name);
    }
    for (const TensorSpec& t : model.inputs) {
      bool given = false;
      for (const Input& in : inputs) given = given || in.name == t.name;
      if (!t.optional && !given) {
        return absl::InvalidArgumentError(
            absl::StrCat("model ", model.name, " needs the input \"", t.name, "\""));
      }
    }
    return InputSet(std::move(inputs));
  }

  Input* Find(absl::string_view name) {
    for (Input& in : inputs_) {
      if (in.name == name) return &in;
    }
    return nullptr;
  }
  TensorView View(absl::string_view name) {
    Input* in = Find(name);
    return in == nullptr ? TensorView() : in->view();
  }
  MutableTensor Mutable(absl::string_view name) {
    Input* in = Find(name);
    return in == nullptr ? MutableTensor() : in->mutable_view();
  }
  std::vector<Input>& all() { return inputs_; }

 private:
  explicit InputSet(std::vector<Input> inputs) : inputs_(std::move(inputs)) {}
  std::vector<Input> inputs_;
};

// The outputs the caller asked for (all the model gives when none), and
// where each goes: the answer's raw contents, or a shared-memory region.
class OutputSet {
 public:
  static absl::StatusOr<OutputSet> Of(const Model& model, const inference::ModelInferRequest& req,
                                      const SharedMemoryRegistry* registry) {
    OutputSet s;
    for (const auto& out : req.outputs()) {
      const std::string field =
          absl::StrCat("requested output \"", Utf8Prefix(out.name(), 64), "\"");
      if (FindOutput(model, out.name()) == nullptr) {
        std::vector<std::string> names;
        for (const TensorSpec& t : model.outputs) names.push_back(t.name);
        return absl::InvalidArgumentError(absl::StrCat(
            field, ": model ", model.name, " has outputs ", absl::StrJoin(names, ", ")));
      }
      POSENC_ASSIGN_OR_RETURN(std::optional<ShmRef> ref,
                              ShmRefOf(field, out.parameters(), registry, /*only_shm=*/true));
      s.wanted_.push_back({out.name(), std::move(ref)});
    }
    return s;
  }
  bool Wants(absl::string_view name) const { return wanted_.empty() || Find(name) != nullptr; }

  // INVALID_ARGUMENT when the output `name` goes to a slice too small for
  // `size` bytes. Each operation checks all its outputs before any work
  // (Add checks again): a refused call leaves the caller's memory as it
  // was, also where one output's slice fits and would be written before
  // another's was found too small.
  absl::Status CheckFits(absl::string_view name, int64_t size) const {
    const ShmRef* ref = ShmOf(name);
    if (ref == nullptr || size <= ref->byte_size) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("requested output \"", name, "\" has ", size,
                                                   " bytes; its shared_memory_byte_size is ",
                                                   ref->byte_size));
  }

  // INVALID_ARGUMENT when the outputs `a` and `b`, of `a_size` and `b_size`
  // bytes, go to slices that share bytes (of one region, or of one object
  // registered twice): both are written, so one result would land over the
  // other. posenc.v1 refuses the same (ShmSlices::CheckApart).
  // REQUIRES: CheckFits(a, a_size) and CheckFits(b, b_size) are OK.
  absl::Status CheckApart(absl::string_view a, int64_t a_size, absl::string_view b,
                          int64_t b_size) const {
    const ShmRef* ra = ShmOf(a);
    const ShmRef* rb = ShmOf(b);
    if (ra == nullptr || rb == nullptr ||
        !ra->region->SharesBytes(ra->offset, a_size, *rb->region, rb->offset, b_size)) {
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "requested outputs \"", a, "\" (", a_size, " bytes at offset ", ra->offset,
        " of shared memory region ", Utf8Prefix(ra->region->name(), 64), ") and \"", b, "\" (",
        b_size, " bytes at offset ", rb->offset, " of region ", Utf8Prefix(rb->region->name(), 64),
        ") share bytes: each output needs a slice of its own"));
  }

  // The slice the output `name` goes to, or null (the answer, or not wanted).
  const ShmRef* ShmOf(absl::string_view name) const {
    const Wanted* w = Find(name);
    return w != nullptr && w->shm.has_value() ? &*w->shm : nullptr;
  }
  // The output `name` reaches its slice without Add: computed there, or
  // written there by the engine (see Place).
  void MarkInPlace(absl::string_view name) {
    for (Wanted& w : wanted_) w.in_place = w.in_place || w.name == name;
  }
  // Whether every output the caller asked for goes to shared memory.
  bool AllInSharedMemory() const {
    if (wanted_.empty()) return false;
    for (const Wanted& w : wanted_) {
      if (!w.shm.has_value()) return false;
    }
    return true;
  }
  // FAILED_PRECONDITION when the caller truncated an output's region while
  // the call wrote it (see GuardedMapping).
  absl::Status CheckIntact() const {
    for (const Wanted& w : wanted_) {
      if (w.shm.has_value()) {
        POSENC_RETURN_IF_ERROR(
            w.shm->region->CheckIntact(absl::StrCat("requested output \"", w.name, "\"")));
      }
    }
    return absl::OkStatus();
  }

  // Adds an output: its raw contents move into the answer, or its bytes go
  // to the shared-memory slice the caller named (which must hold them),
  // unless they are there already (MarkInPlace).
  // `computed`, when given, holds the result instead of `data` (a scratch
  // buffer; see Place).
  absl::Status Add(absl::string_view name, const char* datatype, const std::vector<int64_t>& shape,
                   std::string* data, inference::ModelInferResponse* resp, int64_t size,
                   const char* computed = nullptr) {
    const Wanted* w = Find(name);
    if (w == nullptr || !w->shm.has_value()) {
      if (computed != nullptr) AssignHostBytes(data, computed, static_cast<size_t>(size));
      inference::ModelInferResponse::InferOutputTensor* out = resp->add_outputs();
      Describe(name, datatype, shape, out);
      resp->add_raw_output_contents()->swap(*data);
      return absl::OkStatus();
    }
    const ShmRef& ref = *w->shm;
    const std::string field = absl::StrCat("requested output \"", name, "\"");
    POSENC_RETURN_IF_ERROR(CheckFits(name, size));
    if (!w->in_place) {
      POSENC_RETURN_IF_ERROR(ref.region->Write(
          field, ref.offset,
          computed != nullptr ? absl::string_view(computed, static_cast<size_t>(size)) : *data));
    }
    shm_bytes_ += size;
    inference::ModelInferResponse::InferOutputTensor* out = resp->add_outputs();
    Describe(name, datatype, shape, out);
    auto& p = *out->mutable_parameters();
    p[kShmRegion].set_string_param(ref.region->name());
    p[kShmByteSize].set_int64_param(size);
    p[kShmOffset].set_int64_param(ref.offset);
    // An empty entry keeps raw_output_contents one per output: clients pair
    // them by position (tritonclient's C++ reads entry i for output i
    // unchecked, as Triton always sends one).
    resp->add_raw_output_contents();
    return absl::OkStatus();
  }

  // The input `t`, computed on, as the output `name`.
  absl::Status AddComputed(absl::string_view name, Input& t, inference::ModelInferResponse* resp) {
    return Add(name, DatatypeOf(t.dtype), t.shape, &t.data, resp, t.size(),
               t.scratch ? t.scratch.data() : nullptr);
  }

  int64_t shm_bytes() const { return shm_bytes_; }

 private:
  struct Wanted {
    std::string name;
    std::optional<ShmRef> shm;
    bool in_place = false;  // in its slice once the work is done (MarkInPlace)
  };
  const Wanted* Find(absl::string_view name) const {
    for (const Wanted& w : wanted_) {
      if (w.name == name) return &w;
    }
    return nullptr;
  }
  static void Describe(absl::string_view name, const char* datatype,
                       const std::vector<int64_t>& shape,
                       inference::ModelInferResponse::InferOutputTensor* out) {
    out->set_name(std::string(name));
    out->set_datatype(datatype);
    for (int64_t d : shape) out->add_shape(d);
  }

  std::vector<Wanted> wanted_;
  int64_t shm_bytes_ = 0;
};

// A model fixing head_dim rotates only tensors of that head size.
absl::Status CheckHeadDim(const Model& model, InputSet& in) {
  if (model.head_dim == 0) return absl::OkStatus();
  for (const char* name : {"query", "key"}) {
    const Input* t = in.Find(name);
    if (t != nullptr && (t->shape.empty() || t->shape.back() != model.head_dim)) {
      return absl::InvalidArgumentError(
          absl::StrCat("input \"", name, "\": model ", model.name, " has head_dim ", model.head_dim,
                       " (the last dimension), got shape [", absl::StrJoin(t->shape, ", "), "]"));
    }
  }
  return absl::OkStatus();
}

// Where an input the operation works on in place (query, key, x, logits)
// is computed, given where its output (`output`) goes:
//  - in the message: in its own bytes (the output moves into the answer, or
//    is copied to the output's slice);
//  - in shared memory, output to the same slice: in place there (in CUDA
//    shared memory: on the device, by the CUDA backend, with no copy);
//  - RoPE, output to another slice of the same kind (system, or CUDA
//    shared memory on the same GPU): from one into the other by the engine
//    (Engine::ApplyRope's query_out / key_out): on a GPU in its device
//    buffer (system shared memory goes up and comes down straight where
//    the GPU pinned it, else through its staging), on the CPU block by
//    block, or, where the CPU's slices overlap, in the engine's scratch
//    buffers;
//  - an absolute encoding or a bias added to logits, from system shared
//    memory into another slice of it: likewise by the engine
//    (Engine::AddAbsolute's x_out, Engine::AttentionBias's bias_out);
//  - otherwise in shared memory, output to another slice (slices of
//    different kinds): in a scratch buffer (reused
//    across calls, so no fresh pages), the result then copied there;
//  - in shared memory, output to the answer (or not asked for): a private
//    copy, admitted first, that moves into the answer.
// (Copies out of CUDA shared memory and results into it are device copies:
// such calls compute in host memory, like socket calls.)
// Never in place in another slice: concurrent calls may name the same
// output slice (perf_analyzer gives all its concurrent requests one output
// region per output), and Triton only ever writes finished values there,
// so a reader sees one call's result or another's. Copying the input there
// and rotating it in place would let one call rotate what another had
// already rotated, and show a reader raw input meanwhile.
// Which slice-to-slice calls the engine makes itself (see above).
enum class EngineInto {
  kNone,
  kSameKind,    // RoPE: system to system, CUDA to CUDA on one GPU
  kSystemOnly,  // absolute encodings and biases added to logits: system to system
};

// With `aside`, a tensor in shared memory is computed in a scratch buffer
// whatever its output (see TensorsMeet).
absl::Status Place(Input* t, absl::string_view output, OutputSet& want, Engine& engine,
                   Engine::Admission& admission, EngineInto into = EngineInto::kNone,
                   bool aside = false) {
  if (t == nullptr || !t->shm.has_value()) return absl::OkStatus();
  const std::string field = absl::StrCat("input \"", t->name, "\"");
  const ShmRef* out = want.ShmOf(output);
  if (out == nullptr) {
    POSENC_RETURN_IF_ERROR(admission.TryGrow(t->size()));
    return t->MakePrivate(field);
  }
  const ShmRef& in = *t->shm;
  // REQUIRES: the output's slice holds the tensor (each Run* checks every
  // output with OutputSet::CheckFits before it places any tensor).
  if (!aside && out->region == in.region && out->offset == in.offset) {
    want.MarkInPlace(output);
    return absl::OkStatus();
  }
  // From one slice into another: the engine works aside and writes
  // finished results only (in a GPU's device buffer, block by block on the
  // CPU, or in a scratch buffer where the CPU's slices overlap).
  const bool same_kind =
      in.region->on_device()
          ? out->region->on_device() && out->region->device_id() == in.region->device_id()
          : !out->region->on_device();
  const bool system = !in.region->on_device() && !out->region->on_device();
  // Two registrations of one object map it at two addresses: slices that
  // share bytes there look apart to the engine, which would then read
  // input it had already overwritten. Such a call works in a scratch
  // buffer, every input read before a result goes out.
  const bool aliased =
      in.region != out->region &&
      in.region->SharesBytes(in.offset, t->size(), *out->region, out->offset, t->size());
  if (!aliased && !aside &&
      ((into == EngineInto::kSameKind && same_kind) ||
       (into == EngineInto::kSystemOnly && system))) {
    t->out = out->region->At(out->offset);
    want.MarkInPlace(output);
    return absl::OkStatus();
  }
  return t->MakeScratch(field, engine.scratch(), admission);
}

// Whether RoPE's query or key, computed in shared memory, would write its
// result (in place, or into its output slice) on bytes of the other's
// input there. Slices are compared as bytes of the object (SharesBytes):
// two registrations of one object put the same bytes at two addresses, and
// the engine, which compares addresses, would then write one tensor's
// result over the other's input before reading it; and no engine path
// takes two tensors in place on the same bytes. Such a call makes both
// tensors aside (Place's `aside`): every input is read as the caller wrote
// it before any result goes out, and the results are written in the order
// of the outputs once every kernel is done. (Outputs that share bytes with
// each other are refused before: OutputSet::CheckApart.)
bool TensorsMeet(const Input* a, const ShmRef* a_out, const Input* b, const ShmRef* b_out) {
  const auto writes_on = [](const Input* t, const ShmRef* out, const Input* other) {
    return t != nullptr && t->shm.has_value() && out != nullptr && other != nullptr &&
           other->shm.has_value() &&
           out->region->SharesBytes(out->offset, t->size(), *other->shm->region, other->shm->offset,
                                    other->size());
  };
  return writes_on(a, a_out, b) || writes_on(b, b_out, a);
}

// FAILED_PRECONDITION when the caller truncated the region of an input in
// shared memory (see GuardedMapping): what was read there is void.
absl::Status InputsIntact(InputSet& in) {
  for (Input& i : in.all()) {
    if (i.shm.has_value()) {
      POSENC_RETURN_IF_ERROR(i.shm->region->CheckIntact(absl::StrCat("input \"", i.name, "\"")));
    }
  }
  return absl::OkStatus();
}

// Whether `t` is computed in place in CUDA shared memory (see Place).
bool OnDevice(const Input* t) {
  return t != nullptr && t->shm.has_value() && !t->scratch && t->shm->region->on_device();
}

// The GPU the tensors computed on the device live on (the first such
// one's: a call with tensors on two GPUs fails in the backend of the first,
// which finds the other outside its memory).
int DeviceOf(std::initializer_list<const Input*> tensors) {
  for (const Input* t : tensors) {
    if (OnDevice(t)) return t->shm->region->device_id();
  }
  return 0;
}

absl::Status RunRope(Engine& engine, const Model& model, ParameterReader& params, InputSet& in,
                     OutputSet& want, const CallEnv& env_in, inference::ModelInferResponse* resp,
                     std::string* backend_out) {
  RopeOptions options;
  CallEnv env = env_in;
  const Input* query = in.Find("query");
  POSENC_RETURN_IF_ERROR(
      ReadRopeOptions(params, &options, &env.backend,
                      query != nullptr && !query->shape.empty() ? query->shape.back() : 0));
  POSENC_RETURN_IF_ERROR(params.Finish(model.name));
  POSENC_RETURN_IF_ERROR(CheckHeadDim(model, in));
  // Every output's slice before any is written, and before TensorsMeet
  // compares slices of the inputs' sizes.
  for (const char* input : {"query", "key"}) {
    if (const Input* t = in.Find(input); t != nullptr) {
      POSENC_RETURN_IF_ERROR(want.CheckFits(absl::StrCat(input, "_out"), t->size()));
    }
  }
  if (const Input* q = in.Find("query"), *k = in.Find("key"); q != nullptr && k != nullptr) {
    POSENC_RETURN_IF_ERROR(want.CheckApart("query_out", q->size(), "key_out", k->size()));
  }
  const bool aside =
      TensorsMeet(in.Find("query"), want.ShmOf("query_out"), in.Find("key"), want.ShmOf("key_out"));
  POSENC_RETURN_IF_ERROR(Place(in.Find("query"), "query_out", want, engine, env.admission,
                               EngineInto::kSameKind, aside));
  POSENC_RETURN_IF_ERROR(
      Place(in.Find("key"), "key_out", want, engine, env.admission, EngineInto::kSameKind, aside));
  env.tensors_on_device = OnDevice(in.Find("query")) || OnDevice(in.Find("key"));
  env.device = DeviceOf({in.Find("query"), in.Find("key")});
  if (const Input* q = in.Find("query"); q != nullptr) env.query_out = q->out;
  if (const Input* k = in.Find("key"); k != nullptr) env.key_out = k->out;
  // Inputs the engine copies before it writes another slice: a region
  // truncated meanwhile reads as zeros, which must not reach that slice.
  env.inputs_intact = [&in] { return InputsIntact(in); };
  RopeTensors t;
  t.query = in.Mutable("query");
  t.key = in.Mutable("key");
  t.positions.position_ids = in.View("position_ids");
  t.positions.offsets = in.View("offsets");
  t.cu_seqlens = in.View("cu_seqlens");
  POSENC_ASSIGN_OR_RETURN(*backend_out, engine.ApplyRope(options, t, env));
  if (want.Wants("query_out")) {
    Input* q = in.Find("query");
    POSENC_RETURN_IF_ERROR(want.AddComputed("query_out", *q, resp));
  }
  if (Input* k = in.Find("key"); k != nullptr && want.Wants("key_out")) {
    POSENC_RETURN_IF_ERROR(want.AddComputed("key_out", *k, resp));
  }
  return absl::OkStatus();
}

absl::Status RunAbsolute(Engine& engine, const Model& model, ParameterReader& params, InputSet& in,
                         OutputSet& want, const CallEnv& env_in,
                         inference::ModelInferResponse* resp, std::string* backend_out) {
  AbsoluteOptions options;
  CallEnv env = env_in;
  POSENC_RETURN_IF_ERROR(
      ReadAbsoluteOptions(params, model.kind == ModelKind::kLearned, &options, &env.backend));
  POSENC_RETURN_IF_ERROR(params.Finish(model.name));
  if (const Input* x = in.Find("x"); x != nullptr) {
    POSENC_RETURN_IF_ERROR(want.CheckFits("y", x->size()));
  }
  POSENC_RETURN_IF_ERROR(
      Place(in.Find("x"), "y", want, engine, env.admission, EngineInto::kSystemOnly));
  env.tensors_on_device = OnDevice(in.Find("x"));
  env.device = DeviceOf({in.Find("x")});
  if (const Input* x = in.Find("x"); x != nullptr) env.x_out = x->out;
  // As RoPE's: a region truncated while x is read must not reach y's slice.
  env.inputs_intact = [&in] { return InputsIntact(in); };
  AbsoluteTensors t;
  t.x = in.Mutable("x");
  t.positions.position_ids = in.View("position_ids");
  t.positions.offsets = in.View("offsets");
  t.cu_seqlens = in.View("cu_seqlens");
  POSENC_ASSIGN_OR_RETURN(*backend_out, engine.AddAbsolute(std::move(options), t, env));
  Input* x = in.Find("x");
  return want.AddComputed("y", *x, resp);
}

absl::Status RunBias(Engine& engine, const Model& model, ParameterReader& params, InputSet& in,
                     OutputSet& want, const CallEnv& env_in, inference::ModelInferResponse* resp,
                     std::string* backend_out) {
  BiasOptions options;
  CallEnv env = env_in;
  POSENC_RETURN_IF_ERROR(ReadBiasOptions(params, &options, &env.backend));
  POSENC_RETURN_IF_ERROR(params.Finish(model.name));
  options.k_lens = in.View("k_lens");
  options.k_starts = in.View("k_starts");
  Input* l = in.Find("logits");
  // Both outputs' slices before the bias is written (added to logits in
  // place, or built into its slice): the slopes are one FP64 per head, the
  // heads the logits' dimension 1, else num_heads (the plan refuses any
  // other count before it writes).
  if (l != nullptr) POSENC_RETURN_IF_ERROR(want.CheckFits("bias", l->size()));
  if (want.ShmOf("slopes") != nullptr) {
    const int64_t heads =
        l != nullptr ? (l->shape.size() == 4 ? l->shape[1] : 0) : options.num_heads;
    if (heads > 0 && heads <= kMaxHeads) {
      const int64_t slopes_bytes = heads * int64_t{sizeof(double)};
      POSENC_RETURN_IF_ERROR(want.CheckFits("slopes", slopes_bytes));
      // The bias goes to the logits' bytes, or, built, to its whole slice.
      const ShmRef* bias = want.ShmOf("bias");
      const int64_t bias_bytes = l != nullptr ? l->size() : bias != nullptr ? bias->byte_size : 0;
      POSENC_RETURN_IF_ERROR(want.CheckApart("bias", bias_bytes, "slopes", slopes_bytes));
    }
  }
  POSENC_RETURN_IF_ERROR(Place(l, "bias", want, engine, env.admission, EngineInto::kSystemOnly));
  env.tensors_on_device = OnDevice(l);
  env.device = DeviceOf({l});
  if (l != nullptr) env.bias_out = l->out;
  // As RoPE's: a region truncated while the logits are read must not reach
  // the bias's slice.
  env.inputs_intact = [&in] { return InputsIntact(in); };
  MutableTensor logits = in.Mutable("logits");
  // A bias built (no logits) into a slice of system shared memory is
  // written there directly; one for CUDA shared memory is built here and
  // copied there.
  std::string built;
  const ShmRef* bias_slice = l == nullptr ? want.ShmOf("bias") : nullptr;
  if (bias_slice != nullptr && bias_slice->region->on_device()) bias_slice = nullptr;
  const OutputTarget target =
      bias_slice != nullptr
          ? OutputTarget(bias_slice->region->At(bias_slice->offset), bias_slice->byte_size)
          : OutputTarget(&built);
  if (bias_slice != nullptr) want.MarkInPlace("bias");
  POSENC_ASSIGN_OR_RETURN(Produced bias, engine.AttentionBias(options, logits, target, env));
  *backend_out = bias.backend;
  if (want.Wants("bias")) {
    int64_t bias_bytes = static_cast<int64_t>(SizeOf(bias.dtype));
    for (int64_t d : bias.shape) bias_bytes *= d;  // planned, so no overflow
    POSENC_RETURN_IF_ERROR(want.Add("bias", DatatypeOf(bias.dtype), bias.shape,
                                    l != nullptr ? &l->data : &built, resp, bias_bytes,
                                    l != nullptr && l->scratch ? l->scratch.data() : nullptr));
  }
  if (want.Wants("slopes")) {
    std::string slopes(bias.slopes.size() * sizeof(double), '\0');
    if (!slopes.empty()) std::memcpy(slopes.data(), bias.slopes.data(), slopes.size());
    POSENC_RETURN_IF_ERROR(want.Add("slopes", "FP64", {static_cast<int64_t>(bias.slopes.size())},
                                    &slopes, resp, static_cast<int64_t>(slopes.size())));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunInfer(Engine& engine, const Model& model, inference::ModelInferRequest* req,
                      inference::ModelInferResponse* resp, const RunContext& ctx,
                      Engine::Admission& admission, std::string* backend,
                      const SharedMemoryRegistry* shm, ShmTraffic* traffic) {
  // More entries than the model declares can only be unknown or repeated
  // names, refused below; but each entry is worked on before that (and
  // names are compared pairwise), so millions of tiny ones would hold a
  // thread for minutes. Refused first, naming an unknown one where there is
  // one (a pass of the model's few names over each).
  if (req->inputs_size() > static_cast<int>(model.inputs.size())) {
    for (const auto& in : req->inputs()) {
      if (FindInput(model, in.name()) == nullptr) return NoSuchInput(model, in.name());
    }
    return absl::InvalidArgumentError(
        absl::StrCat("model ", model.name, " has ", model.inputs.size(),
                     " inputs, the request names ", req->inputs_size(), ": one is given twice"));
  }
  if (req->outputs_size() > static_cast<int>(model.outputs.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", model.name, " has ", model.outputs.size(),
                     " outputs, the request asks for ", req->outputs_size()));
  }
  int64_t shm_in = 0;
  POSENC_ASSIGN_OR_RETURN(ShmInputs shm_inputs, ShmInputsOf(*req, shm, &shm_in));
  const int64_t message_bytes = TensorBytes(*req);
  POSENC_RETURN_IF_ERROR(engine.CheckRequestSize(
      shm_in > INT64_MAX - message_bytes ? INT64_MAX : message_bytes + shm_in));
  POSENC_ASSIGN_OR_RETURN(OutputSet want, OutputSet::Of(model, *req, shm));
  POSENC_ASSIGN_OR_RETURN(std::vector<Input> inputs, TakeInputs(req, &shm_inputs));
  shm_inputs.clear();  // the regions stay held by the inputs and by `want`
  POSENC_ASSIGN_OR_RETURN(InputSet in, InputSet::Of(model, std::move(inputs)));
  // Integer inputs (positions, lengths) steer memory accesses once
  // validated: a private copy, admitted first, so the caller cannot change
  // them in between. The tensors worked on stay in place (Place).
  for (Input& i : in.all()) {
    if (i.shm.has_value() && (i.dtype == DType::kInt32 || i.dtype == DType::kInt64)) {
      POSENC_RETURN_IF_ERROR(admission.TryGrow(i.size()));
      POSENC_RETURN_IF_ERROR(i.MakePrivate(absl::StrCat("input \"", i.name, "\"")));
    }
  }
  // Before ParametersFor copies them beside a model file's.
  POSENC_RETURN_IF_ERROR(CheckParameterCount(req->parameters()));
  Parameters merged;
  POSENC_ASSIGN_OR_RETURN(const Parameters* given,
                          ParametersFor(model, req->parameters(), &merged));
  ParameterReader params(*given);
  CallEnv env{ctx, admission, BackendChoice::kDefault, Overhead(*req)};
  env.tensors_in_answer = !want.AllInSharedMemory();
  resp->set_model_name(model.name);
  resp->set_model_version(kModelVersion);
  resp->set_id(req->id());
  absl::Status s = absl::InternalError("unknown model kind");
  switch (model.kind) {
    case ModelKind::kRope:
      s = RunRope(engine, model, params, in, want, env, resp, backend);
      break;
    case ModelKind::kSinusoidal:
    case ModelKind::kLearned:
      s = RunAbsolute(engine, model, params, in, want, env, resp, backend);
      break;
    case ModelKind::kAttentionBias:
      s = RunBias(engine, model, params, in, want, env, resp, backend);
      break;
  }
  // What the call read or wrote in a region the caller truncated meanwhile
  // is void (GuardedMapping): the call fails, whatever it computed.
  if (s.ok()) {
    s.Update(InputsIntact(in));
    s.Update(want.CheckIntact());
  }
  if (traffic != nullptr) {
    traffic->in = shm_in;
    traffic->out = want.shm_bytes();
  }
  return s;
}

}  // namespace posenc::server::kserve
