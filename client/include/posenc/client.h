// posenc client library: typed calls to a posenc server over caller-owned
// buffers.
//
// Ownership: tensors are passed as posenc::MutableTensor views; the library
// copies them into the request (serialisation needs that) and the results
// back into the same buffers. No other copies are made. For *Async calls the
// buffers must stay alive until the returned future is ready.
//
// Errors: every call returns absl::Status with the server's code and message
// (INVALID_ARGUMENT naming the field, RESOURCE_EXHAUSTED, ...). UNAVAILABLE
// is retried with exponential backoff (gRPC retry policy) before it reaches
// the caller.
#ifndef POSENC_CLIENT_H_
#define POSENC_CLIENT_H_

#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "posenc/tensor.h"
#include "posenc/v1/posenc.grpc.pb.h"

namespace posenc {

struct ClientOptions {
  // "host:port", or "dns:///name:port" to resolve every address of a name
  // (a Kubernetes headless Service) and balance round-robin across them.
  std::string target = "localhost:50051";
  std::string load_balancing = "round_robin";  // or "pick_first"
  absl::Duration default_timeout = absl::Seconds(30);
  // Retries of UNAVAILABLE: attempts in all (2..5) and backoff bounds.
  int max_attempts = 4;
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(2);
  int max_message_bytes = 1 << 30;
  // TLS: off unless use_tls. PEM contents, not paths. Client certificate and
  // key for mutual TLS when the server requires them.
  bool use_tls = false;
  std::string root_certs_pem;
  std::string client_cert_pem;
  std::string client_key_pem;
  std::string tls_server_name;  // overrides the name checked in the certificate
};

struct CallOptions {
  absl::Duration timeout = absl::ZeroDuration();  // zero: the client's default_timeout
};

class Client {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Client>> Create(const ClientOptions& options);

  // RoPE. `request` carries the options (layout, style, scaling, positions,
  // ...); its query/key fields are filled from the views. query (and key,
  // when present) are rotated in place.
  [[nodiscard]] absl::Status ApplyRope(const v1::RopeRequest& request, MutableTensor query,
                                       MutableTensor key, const CallOptions& call = {});
  std::future<absl::Status> ApplyRopeAsync(const v1::RopeRequest& request, MutableTensor query,
                                           MutableTensor key, const CallOptions& call = {});

  // y = x * x_scale + PE[pos], in place on x.
  [[nodiscard]] absl::Status AddAbsoluteEncoding(const v1::AbsoluteEncodingRequest& request,
                                                 MutableTensor x, const CallOptions& call = {});
  std::future<absl::Status> AddAbsoluteEncodingAsync(const v1::AbsoluteEncodingRequest& request,
                                                     MutableTensor x, const CallOptions& call = {});

  // Adds the bias to caller's logits [batch, heads, q_len, k_len] in place;
  // `slopes` (optional) receives the per-head slopes used.
  [[nodiscard]] absl::Status ApplyAttentionBias(const v1::AttentionBiasRequest& request,
                                                MutableTensor logits, std::vector<double>* slopes,
                                                const CallOptions& call = {});

  // Calls returning server-allocated tensors.
  [[nodiscard]] absl::StatusOr<v1::AttentionBiasResponse> AttentionBias(
      const v1::AttentionBiasRequest& request, const CallOptions& call = {});
  [[nodiscard]] absl::StatusOr<v1::EncodingTableResponse> GetEncodingTable(
      const v1::EncodingTableRequest& request, const CallOptions& call = {});
  [[nodiscard]] absl::StatusOr<v1::ListTablesResponse> ListTables(const CallOptions& call = {});
  [[nodiscard]] absl::StatusOr<v1::ListTablesResponse> ReloadTables(const CallOptions& call = {});
  [[nodiscard]] absl::StatusOr<v1::ServerInfo> GetServerInfo(const CallOptions& call = {});

  // A bidirectional RoPE stream: many batches in flight on one call.
  // Responses come in request order; a failed request's response carries
  // error_code/error_message and the stream goes on.
  class RopeStream {
   public:
    virtual ~RopeStream() = default;
    virtual bool Write(const v1::RopeRequest& request) = 0;
    virtual bool Read(v1::RopeResponse* response) = 0;
    // Half-closes and returns the call's final status.
    virtual absl::Status Finish() = 0;
  };
  std::unique_ptr<RopeStream> StreamRope(const CallOptions& call = {});

  // The generated stub, for anything the typed calls do not cover.
  v1::PositionalEncoding::Stub& stub() { return *stub_; }
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

 private:
  Client() = default;
  void Prepare(grpc::ClientContext* ctx, const CallOptions& call) const;

  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::PositionalEncoding::Stub> stub_;
};

// Fills a TensorDesc + bytes pair from a view (one copy of the data).
void SetTensor(const TensorView& t, v1::TensorDesc* desc, std::string* data);
// Fills an inline Tensor from a view.
void SetTensor(const TensorView& t, v1::Tensor* tensor);

}  // namespace posenc

#endif  // POSENC_CLIENT_H_
