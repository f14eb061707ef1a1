// Builds a request and a client against an installed posenc; no server is
// needed to prove the headers, the generated API and the libraries link.
#include <cstdio>

#include "posenc/attention_bias.h"
#include "posenc/client.h"

int main() {
  auto client = posenc::Client::Create({.target = "127.0.0.1:1"});
  if (!client.ok()) return 1;
  posenc::v1::RopeRequest r;
  r.mutable_scaling()->set_type(posenc::v1::SCALING_TYPE_YARN);
  std::vector<float> q(64, 0.5f);
  posenc::SetTensor(
      posenc::TensorView{posenc::DType::kFloat32, {1, 1, 1, 64}, q.data(), q.size() * 4},
      r.mutable_query(), r.mutable_query_data());
  std::printf("consumer ok: %zu query bytes, %zu slopes for 12 heads\n", r.query_data().size(),
              posenc::AlibiSlopes(12).size());
  return r.query_data().size() == 256 ? 0 : 1;
}
