// Any bytes as a KServe model repository file (kserve/model_file.h): files
// come from a volume replicas share. A finding is a crash, a sanitizer
// report, a status other than OK / INVALID_ARGUMENT, or a loaded model that
// breaks what the registry relies on: a fixed parameter the readers do not
// take (an embedded hf_config resolves into fixed parameters, so this
// checks that round trip too), a parameter its hf_config determines that a
// request could still give, or tensors that are not its operation's
// built-in model's (less only the optional ones its "inputs" leaves out).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "kserve/infer.h"
#include "kserve/model_file.h"
#include "kserve/parameters.h"

namespace {

void Fail(const char* what) {
  std::fprintf(stderr, "kserve_model_file_fuzz: %s\n", what);
  std::abort();
}

// Whether `mine` are tensors of `all` (same names and datatypes), in
// their order, leaving out none that `all` requires.
bool InOrderWithEveryRequired(const std::vector<posenc::server::kserve::TensorSpec>& mine,
                              const std::vector<posenc::server::kserve::TensorSpec>& all) {
  size_t j = 0;
  for (const auto& t : mine) {
    for (; j < all.size() && std::string_view(all[j].name) != t.name; ++j) {
      if (!all[j].optional) return false;
    }
    if (j == all.size() || std::string_view(all[j].datatype) != t.datatype) return false;
    ++j;
  }
  for (; j < all.size(); ++j) {
    if (!all[j].optional) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace k = posenc::server::kserve;
  const std::string json(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<k::Model> m = k::ParseModelFile("fuzz-model", json);
  if (!m.ok()) {
    const absl::StatusCode c = m.status().code();
    if (c != absl::StatusCode::kInvalidArgument) {
      Fail(m.status().ToString().c_str());
    }
    return 0;
  }
  // Its tensors are its operation's, in that order: every required one,
  // optional ones only where its "inputs" kept them; RoPE's key_out with
  // key.
  const k::Model& base = k::BuiltInModel(m->kind);
  if (!InOrderWithEveryRequired(m->inputs, base.inputs) ||
      !InOrderWithEveryRequired(m->outputs, base.outputs)) {
    Fail("a loaded model's tensors are not its operation's");
  }
  if (m->kind == k::ModelKind::kRope &&
      (k::FindInput(*m, "key") != nullptr) != (k::FindOutput(*m, "key_out") != nullptr)) {
    Fail("a rope model with key but no key_out, or key_out but no key");
  }
  // A request giving nothing reads exactly the fixed parameters; giving one
  // of them again is refused.
  k::Parameters request, merged;
  absl::StatusOr<const k::Parameters*> p = k::ParametersFor(*m, request, &merged);
  if (!p.ok() || (*p)->size() != m->fixed.size()) Fail("fixed parameters not merged");
  if (m->kind == k::ModelKind::kRope) {
    // The fixed parameters read as a request's would (hf_config's included).
    k::ParameterReader reader(**p);
    posenc::RopeOptions o;
    posenc::BackendChoice backend = posenc::BackendChoice::kDefault;
    if (!k::ReadRopeOptions(reader, &o, &backend, m->head_dim).ok() ||
        !reader.Finish(m->name).ok()) {
      Fail("a loaded rope model's fixed parameters are refused by the readers");
    }
  }
  for (const std::string& name : m->determined_by_hf_config) {
    k::Parameters one;
    one[name].set_double_param(1);
    if (k::ParametersFor(*m, one, &merged).ok()) Fail("a request gave what hf_config determines");
  }
  if (!m->fixed.empty()) {
    request[m->fixed.begin()->first] = m->fixed.begin()->second;
    if (k::ParametersFor(*m, request, &merged).ok()) Fail("a fixed parameter was overridden");
  }
  (void)k::ConfigOf(*m);
  (void)k::MetadataOf(*m);
  return 0;
}
