// Builds a request and a client against an installed posenc; no server is
// needed to prove the headers, the generated API and the libraries link.
// It links posenc::client alone (configured with CUDA hidden): the client
// must need neither the kernels' CPU code nor the CUDA toolkit.
#include <cstdio>

#include "posenc/client.h"
#include "posenc/wire/enums.h"
#include "posenc/wire/requests.h"
#include "posenc/wire/tensors.h"

int main() {
  auto client = posenc::Client::Create({.target = "127.0.0.1:1"});
  if (!client.ok()) return 1;
  posenc::RopeOptions o;
  o.style = posenc::wire::Parse<posenc::RopeStyle>("--style", "GPTJ").value();
  o.scaling.type = posenc::ScalingType::kYarn;
  o.scaling.factor = 4;
  posenc::v1::RopeRequest r;
  posenc::wire::SetRopeOptions(o, &r);
  std::vector<float> q(64, 0.5f);
  posenc::wire::SetTensor(
      posenc::TensorView{posenc::DType::kFloat32, {1, 1, 1, 64}, q.data(), q.size() * 4},
      r.mutable_query(), r.mutable_query_data());
  std::printf("consumer ok: %zu query bytes, style %s\n", r.query_data().size(),
              posenc::v1::RopeStyle_Name(r.style()).c_str());
  return r.query_data().size() == 256 && r.style() == posenc::v1::ROPE_STYLE_GPTJ ? 0 : 1;
}
