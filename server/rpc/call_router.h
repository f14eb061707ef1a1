// Every method of both fronts, served through gRPC's generic callback API:
// the router finds the Method for a call's path and gives the call to the
// unary or the stream reactor, which carry it through the lifecycle of
// call.h.
//
// Why generic, for every method: for a typed method gRPC reads and parses
// the whole request before the handler runs, so a burst of large requests
// sits in memory before admission can refuse any of it (16 callers of
// 48 MiB drove the server to 1.6 GiB against a 128 MiB budget), and a
// message that does not parse is answered by gRPC itself (UNIMPLEMENTED, or
// a silently ended stream). Here a tensor call first takes a slot and
// reserves the largest message it may read (--max_message_bytes); only
// then does it read, and its reservation becomes what it holds: the request
// and its parsed copy, later the answer (2 x the message), plus what the
// engine announces (plans, new outputs). Calls that cannot reserve wait with
// their bodies still behind HTTP/2 flow control. Wire behaviour is that of
// the protos' methods; the generated services are registered all-generic
// (generic_service.h) so reflection still describes them.
#ifndef POSENC_SERVER_RPC_CALL_ROUTER_H_
#define POSENC_SERVER_RPC_CALL_ROUTER_H_

#include <atomic>
#include <map>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/request_executor.h"
#include "grpcpp/generic/async_generic_service.h"
#include "rpc/call.h"
#include "rpc/metrics.h"

namespace posenc::server {

struct CallRouterOptions {
  Engine* engine = nullptr;
  Metrics* metrics = nullptr;  // may be null
  RequestExecutor* executor = nullptr;
  // The transport's receive limit: what a tensor call reserves before it
  // reads (twice: see ReadReservation).
  int64_t max_message_bytes = 0;
  // Messages in flight at once on one stream (read ahead while earlier ones
  // compute or are written).
  int stream_window = 4;
};

// What the router's reactors share.
struct RouterState {
  CallRouterOptions options;
  std::atomic<int> busy{0};  // calls read and not yet answered
  std::atomic<int> stream_depth_peak{0};
};

class CallRouter final : public grpc::CallbackGenericService {
 public:
  explicit CallRouter(const CallRouterOptions& options);

  // Serves `methods` (before the server starts).
  void Add(std::vector<Method> methods);
  // The method at `path` ("/posenc.v1.PositionalEncoding/ApplyRope"), or null.
  const Method* Find(const std::string& path) const;

  // Unknown methods (of any service) are UNIMPLEMENTED, as gRPC answers them.
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override;

  // Calls (and stream messages) whose request has been read and whose
  // answer is not yet sent: a drain waits for them, not for idle streams.
  int busy() const { return state_.busy.load(); }
  // The most messages one stream has had in flight at once.
  int stream_depth_peak() const { return state_.stream_depth_peak.load(); }

 private:
  RouterState state_;
  std::map<std::string, Method> methods_;
};

}  // namespace posenc::server

#endif  // POSENC_SERVER_RPC_CALL_ROUTER_H_
