// posenc client library: the kernel library's own options and tensor views,
// sent to a posenc server. The same RopeOptions, AbsoluteOptions and
// BiasOptions that plan a local kernel call describe a remote one; wire/
// translates them (posenc::wire), so the client needs neither the kernels'
// CPU code nor CUDA.
//
// Ownership: tensors are views of caller-owned buffers; the library copies
// them into the request (serialisation needs that) and the results back into
// the same buffers. No other copies are made. For *Async calls the buffers
// must stay alive until the returned future is ready.
//
// Errors: every call returns absl::Status with the server's code and message
// (INVALID_ARGUMENT naming the field, RESOURCE_EXHAUSTED, ...). UNAVAILABLE
// is retried with exponential backoff (gRPC retry policy) before it reaches
// the caller; so is RESOURCE_EXHAUSTED when ClientOptions asks for it.
#ifndef POSENC_CLIENT_H_
#define POSENC_CLIENT_H_

#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "posenc/absolute.h"
#include "posenc/attention_bias.h"
#include "posenc/backend.h"
#include "posenc/rope.h"
#include "posenc/tensor.h"
#include "posenc/v1/posenc.grpc.pb.h"

namespace posenc {

// Whether tensors travel through shared memory instead of the socket.
enum class SharedMemoryUse {
  // When the server shares this node and its /dev/shm (a `unix:` target, or
  // the shared-memory domain the server advertises equals this process's)
  // and serves shared memory; the socket otherwise, and from the first
  // failure of a region on (the server restarted, a replica elsewhere).
  kAuto,
  kOff,      // always the socket
  kRequire,  // as kAuto, but a call that cannot use it fails instead
};

struct ClientOptions {
  // "host:port", or "dns:///name:port" to resolve every address of a name
  // (a Kubernetes headless Service) and balance round-robin across them.
  std::string target = "localhost:50051";
  std::string load_balancing = "round_robin";  // or "pick_first"
  absl::Duration default_timeout = absl::Seconds(30);
  // Retries of UNAVAILABLE: attempts in all (2..5) and backoff bounds.
  int max_attempts = 4;
  // Also retry RESOURCE_EXHAUSTED (an overloaded replica; with round_robin
  // the retry goes to the next one), with the same attempts and backoff.
  // Off by default: a caller with its own queue may rather shed the work.
  bool retry_resource_exhausted = false;
  // gRPC client-side health checking: each replica's readiness is watched
  // (grpc.health.v1 Watch on this service name) and round_robin sends calls
  // only to replicas that are SERVING. A replica turns NOT_SERVING the
  // moment it starts draining, so a rollout stops receiving calls at once
  // instead of refusing them into retries. Empty: every connected replica.
  std::string health_check_service = "posenc.v1.PositionalEncoding";
  // When a connection closes (a replica gone, or the server's
  // --max_connection_age_ms), the client re-resolves a dns: target to find
  // new replicas, at most this often (gRPC's default, 30 s).
  absl::Duration min_time_between_resolutions = absl::Seconds(30);
  // The longest wait between attempts to reconnect to an address that
  // refused or dropped its connection (a replica restarting, a node being
  // drained). gRPC's own cap is 120 s, its waits growing 1.6-fold from 1 s:
  // a server back after a 30 s outage would wait for the attempt at about
  // 43 s, one back after two minutes up to two minutes more, its calls
  // failing UNAVAILABLE meanwhile. In (0, 24h].
  absl::Duration max_reconnect_backoff = absl::Seconds(5);
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
  // Tensors through a region this client owns, computed on in place by the
  // server (docs/shared-memory.md): results are bit for bit those of the
  // socket. The built tensors of AttentionBias and EncodingTable go through
  // it when their size is known from the options.
  SharedMemoryUse shared_memory = SharedMemoryUse::kAuto;
};

struct CallOptions {
  absl::Duration timeout = absl::ZeroDuration();    // zero: the client's default_timeout
  BackendChoice backend = BackendChoice::kDefault;  // where the server runs it
  // Sent as x-request-id (and in RoPE/absolute requests' request_id): the
  // server's log lines about the call carry it.
  std::string request_id;
  // The caller's W3C Trace Context ("00-<trace-id>-<parent-id>-<flags>"),
  // sent as traceparent: the server's log lines about the call carry its
  // trace id (one the specification does not let a receiver use is
  // ignored there). Empty: none sent.
  std::string traceparent;
};

// A tensor the server built (a table, a bias).
struct ServerTensor {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::string data;
  std::vector<double> slopes;  // a bias's per-head slopes
  std::string backend;         // which backend built it ("cpu", "cuda:0")
};

// Device memory of the caller's process that the server may compute on in
// place (CUDA shared memory: the server on this node, with the same GPU):
// an allocation's first byte, its size, the device as this process numbers
// it, and cudaIpcGetMemHandle's 64 bytes for it. The client does not link
// CUDA: a caller with device memory has the runtime to make the handle.
struct DeviceAllocation {
  const void* base = nullptr;
  size_t bytes = 0;
  int device = 0;
  std::string ipc_handle;
};

namespace client_internal {
class DeviceRegions;
class PendingCalls;
class SharedMemoryPool;
}  // namespace client_internal

class Client {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Client>> Create(const ClientOptions& options);
  // Waits until every asynchronous call has finished and gRPC has let go of
  // its state (each ends by its deadline), so no gRPC thread still works on
  // a call of this client after it is gone.
  ~Client();

  // RoPE in place on t.query (and t.key when present); positions from
  // t.positions and t.cu_seqlens.
  [[nodiscard]] absl::Status ApplyRope(const RopeOptions& options, const RopeTensors& t,
                                       const CallOptions& call = {});
  std::future<absl::Status> ApplyRopeAsync(const RopeOptions& options, const RopeTensors& t,
                                           const CallOptions& call = {});

  // y = x * x_scale + PE[pos], in place on t.x. A learned encoding names its
  // table by options.table_name.
  [[nodiscard]] absl::Status AddAbsoluteEncoding(const AbsoluteOptions& options,
                                                 const AbsoluteTensors& t,
                                                 const CallOptions& call = {});
  std::future<absl::Status> AddAbsoluteEncodingAsync(const AbsoluteOptions& options,
                                                     const AbsoluteTensors& t,
                                                     const CallOptions& call = {});

  // Adds the bias to the caller's logits [batch, heads, q_len, k_len] in
  // place; `slopes` (optional) receives the per-head slopes used. Padding
  // per sequence: options.k_lens (right) and options.k_starts (left, as
  // BLOOM's left-padded batches need; see posenc/attention_bias.h).
  [[nodiscard]] absl::Status ApplyAttentionBias(const BiasOptions& options, MutableTensor logits,
                                                std::vector<double>* slopes = nullptr,
                                                const CallOptions& call = {});

  // Tensors the server builds: the bias alone, and encoding-table rows for
  // `positions` (or 0..count-1; a learned table's own dim and rows when
  // dim / count are 0).
  [[nodiscard]] absl::StatusOr<ServerTensor> AttentionBias(const BiasOptions& options,
                                                           const CallOptions& call = {});
  [[nodiscard]] absl::StatusOr<ServerTensor> EncodingTable(const AbsoluteOptions& options,
                                                           int64_t dim, int64_t count,
                                                           const TensorView& positions = {},
                                                           DType dtype = DType::kFloat32,
                                                           const CallOptions& call = {});

  // Registers device memory with the server, once (RegisterSharedMemory
  // with its CUDA IPC handle). From then on, ApplyRope(Async),
  // AddAbsoluteEncoding(Async) and ApplyAttentionBias calls whose tensors
  // all lie inside registered allocations name them there instead of
  // sending bytes, and the server computes them in place on its GPU: when
  // the call returns, the results are in the caller's device memory. A call
  // with some tensors there and some in host memory is INVALID_ARGUMENT.
  // The server's errors otherwise (FAILED_PRECONDITION without a GPU or
  // --enable_cuda_shared_memory, INVALID_ARGUMENT for a handle that does not
  // open there). Unregistered when the client goes.
  [[nodiscard]] absl::Status RegisterDeviceMemory(const DeviceAllocation& allocation,
                                                  const CallOptions& call = {});
  [[nodiscard]] absl::Status UnregisterDeviceMemory(const void* base, const CallOptions& call = {});

  // The control plane, as the server's messages.
  [[nodiscard]] absl::StatusOr<v1::ListTablesResponse> ListTables(const CallOptions& call = {});
  [[nodiscard]] absl::StatusOr<v1::ListTablesResponse> ReloadTables(const CallOptions& call = {});
  [[nodiscard]] absl::StatusOr<v1::ServerInfo> GetServerInfo(const CallOptions& call = {});

  // A bidirectional RoPE stream of whole messages (wire::SetRopeOptions and
  // wire::SetTensor build them): many batches in flight on one call.
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
  // Whether tensors now go through shared memory (kAuto decides on the
  // first tensor call, and stops at the first failure of a region).
  bool UsesSharedMemory() const;

 private:
  Client() = default;
  void Prepare(grpc::ClientContext* ctx, const CallOptions& call) const;

  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::PositionalEncoding::Stub> stub_;
  std::shared_ptr<client_internal::PendingCalls> pending_;
  // After stub_: destroyed first, it unregisters its regions through it.
  std::unique_ptr<client_internal::SharedMemoryPool> shm_;
  std::unique_ptr<client_internal::DeviceRegions> device_;  // likewise
};

// Kept for callers of the earlier API: wire::SetTensor.
void SetTensor(const TensorView& t, v1::TensorDesc* desc, std::string* data);
void SetTensor(const TensorView& t, v1::Tensor* tensor);

}  // namespace posenc

#endif  // POSENC_CLIENT_H_
