// Writes the seed corpus of request_fuzz: one valid request per feature
// (first byte: the method, as request_fuzz.cc numbers them). Run from the
// repository root: build/tests/make_request_corpus tests/fuzz/request_fuzz
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "posenc/v1/posenc.pb.h"

namespace {

namespace v1 = posenc::v1;

std::string Floats(int64_t n) {
  std::string s(n * 4, '\0');
  for (int64_t i = 0; i < n; ++i) {
    const float f = 0.001f * static_cast<float>(i % 997) - 0.5f;
    std::memcpy(s.data() + 4 * i, &f, 4);
  }
  return s;
}
template <typename T>
void Ints(v1::Tensor* t, v1::DataType dtype, std::vector<int64_t> shape, std::vector<T> v) {
  t->set_dtype(dtype);
  for (int64_t d : shape) t->add_shape(d);
  t->set_data(std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T)));
}
void Query(v1::RopeRequest* r, std::vector<int64_t> shape,
           v1::DataType dtype = v1::DATA_TYPE_FLOAT32) {
  int64_t n = 1;
  r->mutable_query()->set_dtype(dtype);
  for (int64_t d : shape) {
    r->mutable_query()->add_shape(d);
    n *= d;
  }
  r->set_query_data(dtype == v1::DATA_TYPE_FLOAT32 ? Floats(n) : std::string(n * 2, '\x3c'));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_request_corpus DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  auto write = [&](const std::string& name, int method, const google::protobuf::Message& m) {
    std::ofstream(dir + "/" + name, std::ios::binary)
        << static_cast<char>(method) << m.SerializeAsString();
  };
  {
    v1::RopeRequest r;
    Query(&r, {1, 3, 2, 8});
    write("rope_basic", 0, r);
    r.set_style(v1::ROPE_STYLE_GPTJ);
    r.set_rotary_dim(4);
    r.set_inverse(true);
    Ints<int32_t>(r.mutable_offsets(), v1::DATA_TYPE_INT32, {1}, {100000});
    write("rope_gptj_partial_offsets", 0, r);
  }
  {
    v1::RopeRequest r;
    Query(&r, {2, 2, 2, 8}, v1::DATA_TYPE_BFLOAT16);
    r.mutable_key()->set_dtype(v1::DATA_TYPE_BFLOAT16);
    for (int64_t d : {2, 1, 2, 8}) r.mutable_key()->add_shape(d);  // BHSD: 1 key head
    r.set_key_data(std::string(2 * 2 * 1 * 8 * 2, '\x3c'));
    r.set_layout(v1::ROPE_LAYOUT_BHSD);
    r.mutable_scaling()->set_type(v1::SCALING_TYPE_YARN);
    r.mutable_scaling()->set_factor(4);
    r.mutable_scaling()->set_original_max_position(32);
    write("rope_bf16_key_bhsd_yarn", 0, r);
  }
  {
    v1::RopeRequest r;
    Query(&r, {5, 2, 8});
    r.set_layout(v1::ROPE_LAYOUT_THD);
    Ints<int64_t>(r.mutable_cu_seqlens(), v1::DATA_TYPE_INT64, {3}, {0, 2, 5});
    r.mutable_scaling()->set_type(v1::SCALING_TYPE_DYNAMIC_NTK);
    r.mutable_scaling()->set_factor(2);
    r.mutable_scaling()->set_original_max_position(2);
    write("rope_thd_dynamic", 0, r);
  }
  {
    v1::RopeRequest r;
    Query(&r, {1, 2, 1, 12});
    r.set_axis_mode(v1::AXIS_MODE_MROPE);
    for (int s : {2, 2, 2}) r.add_sections(s);
    Ints<int64_t>(r.mutable_position_ids(), v1::DATA_TYPE_INT64, {1, 2, 3}, {0, 1, 2, 3, 4, 5});
    write("rope_mrope", 0, r);
    r.set_axis_mode(v1::AXIS_MODE_AXIAL);
    r.clear_sections();
    for (int d : {4, 4, 4}) r.add_axis_dims(d);
    write("rope_axial", 0, r);
  }
  {
    v1::RopeRequest r;
    Query(&r, {1, 2, 1, 8});
    v1::RopeScaling* s = r.mutable_scaling();
    s->set_type(v1::SCALING_TYPE_LONGROPE);
    s->set_factor(4);
    s->set_original_max_position(2);
    for (int i = 0; i < 4; ++i) {
      s->add_short_factor(1.0 + i);
      s->add_long_factor(2.0 + i);
    }
    write("rope_longrope", 0, r);
    s->Clear();
    s->set_type(v1::SCALING_TYPE_EXPLICIT);
    for (int i = 0; i < 4; ++i) s->add_inv_freq(0.5 / (i + 1));
    s->set_attention_factor(1.1);
    write("rope_explicit", 0, r);
    s->Clear();
    s->set_type(v1::SCALING_TYPE_LLAMA3);
    r.set_base(500000);
    write("rope_llama3", 0, r);
  }
  {
    v1::AbsoluteEncodingRequest r;
    r.mutable_x()->set_dtype(v1::DATA_TYPE_FLOAT32);
    for (int64_t d : {2, 3, 8}) r.mutable_x()->add_shape(d);
    r.set_x_data(Floats(48));
    r.mutable_sinusoidal()->set_base(100);
    r.set_x_scale(2.0);
    write("absolute_sinusoidal", 1, r);
    r.mutable_learned()->set_table_name("wpe/t");
    write("absolute_learned", 1, r);
    r.mutable_sinusoidal()->set_layout(v1::SINUSOIDAL_LAYOUT_CONCATENATED);
    r.mutable_x()->clear_shape();
    for (int64_t d : {6, 8}) r.mutable_x()->add_shape(d);
    Ints<int32_t>(r.mutable_cu_seqlens(), v1::DATA_TYPE_INT32, {3}, {0, 4, 6});
    write("absolute_packed_concatenated", 1, r);
  }
  {
    v1::EncodingTableRequest r;
    r.mutable_sinusoidal()->set_base(100);
    r.set_dim(4);
    r.set_count(4);
    write("table_seed003", 2, r);
    r.mutable_learned()->set_table_name("wpe/t");
    r.set_dim(0);
    r.set_count(0);
    r.set_dtype(v1::DATA_TYPE_BFLOAT16);
    Ints<int64_t>(r.mutable_positions(), v1::DATA_TYPE_INT64, {3}, {0, 5, 15});
    write("table_learned_positions", 2, r);
  }
  {
    v1::AttentionBiasRequest r;
    r.set_num_heads(3);
    r.set_q_len(4);
    r.set_k_len(6);
    r.set_causal(true);
    r.set_window(3);
    write("bias_alibi_window", 3, r);
    r.set_form(v1::BIAS_FORM_SYMMETRIC);
    r.set_causal(false);
    r.set_window(0);
    r.set_dtype(v1::DATA_TYPE_FLOAT16);
    Ints<int32_t>(r.mutable_k_lens(), v1::DATA_TYPE_INT32, {2}, {6, 3});
    r.set_batch(2);
    r.add_slopes(0.5);
    r.add_slopes(0.25);
    r.add_slopes(0.125);
    write("bias_symmetric_klens", 3, r);
    Ints<int64_t>(r.mutable_k_starts(), v1::DATA_TYPE_INT64, {2}, {2, 0});
    r.set_form(v1::BIAS_FORM_CAUSAL);
    r.set_causal(true);
    write("bias_left_padding", 3, r);
    v1::AttentionBiasRequest l;
    l.mutable_logits()->set_dtype(v1::DATA_TYPE_FLOAT32);
    for (int64_t d : {1, 2, 3, 3}) l.mutable_logits()->add_shape(d);
    l.set_logits_data(Floats(18));
    l.set_q_offset(-1);
    write("bias_logits", 3, l);
  }
  // Tensors in shared memory: request_fuzz registers region "f" (4 KiB).
  auto slice = [](v1::SharedMemorySlice* s, uint64_t offset, uint64_t bytes) {
    s->set_region("f");
    s->set_offset(offset);
    s->set_byte_size(bytes);
  };
  {
    v1::RopeRequest r;
    Query(&r, {1, 4, 2, 8});
    r.clear_query_data();
    slice(r.mutable_query_shm(), 0, 4 * 2 * 8 * 4);
    r.mutable_key()->set_dtype(v1::DATA_TYPE_FLOAT32);
    for (int64_t d : {1, 4, 1, 8}) r.mutable_key()->add_shape(d);
    slice(r.mutable_key_shm(), 1024, 4 * 1 * 8 * 4);
    write("rope_shm_query_key", 0, r);
    // The key on the query's second half: refused (ShmSlices::CheckApart).
    slice(r.mutable_key_shm(), 4 * 8 * 4, 4 * 1 * 8 * 4);
    write("rope_shm_query_key_overlapping", 0, r);
  }
  {
    v1::AbsoluteEncodingRequest r;
    r.mutable_x()->set_dtype(v1::DATA_TYPE_BFLOAT16);
    for (int64_t d : {2, 3, 8}) r.mutable_x()->add_shape(d);
    slice(r.mutable_x_shm(), 64, 48 * 2);
    r.mutable_sinusoidal()->set_base(100);
    write("absolute_shm", 1, r);
  }
  {
    v1::EncodingTableRequest r;
    r.mutable_sinusoidal()->set_base(100);
    r.set_dim(8);
    r.set_count(8);
    slice(r.mutable_table_shm(), 512, 8 * 8 * 4);
    write("table_shm", 2, r);
  }
  {
    v1::AttentionBiasRequest r;
    r.set_num_heads(2);
    r.set_q_len(3);
    r.set_k_len(5);
    r.set_causal(true);
    slice(r.mutable_bias_shm(), 0, 2 * 3 * 5 * 4);
    write("bias_shm", 3, r);
    v1::AttentionBiasRequest l;
    l.mutable_logits()->set_dtype(v1::DATA_TYPE_FLOAT32);
    for (int64_t d : {1, 2, 3, 3}) l.mutable_logits()->add_shape(d);
    slice(l.mutable_logits_shm(), 2048, 18 * 4);
    write("bias_logits_shm", 3, l);
  }
  // Tensors in CUDA shared memory: request_fuzz registers region "g" (4 KiB
  // of a stand-in device; the engine has no GPU to compute there).
  {
    v1::RopeRequest r;
    Query(&r, {1, 4, 2, 8});
    r.clear_query_data();
    slice(r.mutable_query_shm(), 0, 4 * 2 * 8 * 4);
    r.mutable_query_shm()->set_region("g");
    write("rope_cuda_shm", 0, r);
    v1::EncodingTableRequest t;
    t.mutable_sinusoidal()->set_base(100);
    t.set_dim(8);
    t.set_count(8);
    slice(t.mutable_table_shm(), 512, 8 * 8 * 4);
    t.mutable_table_shm()->set_region("g");
    write("table_cuda_shm", 2, t);
  }
  std::printf("request corpus written to %s\n", dir.c_str());
  return 0;
}
