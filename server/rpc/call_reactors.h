// The two reactors of the call lifecycle (call.h), for CallRouter: one for
// unary calls of every kind, one for streams.
#ifndef POSENC_SERVER_RPC_CALL_REACTORS_H_
#define POSENC_SERVER_RPC_CALL_REACTORS_H_

#include <atomic>

#include "grpcpp/generic/async_generic_service.h"
#include "rpc/call.h"
#include "rpc/call_router.h"

namespace posenc::server {

grpc::ServerGenericBidiReactor* NewUnaryCall(const Method& method, RouterState& state,
                                             grpc::GenericCallbackServerContext* ctx);
grpc::ServerGenericBidiReactor* NewStreamCall(const Method& method, RouterState& state,
                                              grpc::GenericCallbackServerContext* ctx);

// What a tensor call reserves before it reads: the largest message it may
// receive, twice. A request of R bytes is held twice while it is parsed
// (the bytes read, and the parsed message), then once: answers reuse its
// buffers or are new outputs the engine reserves, and go out without a
// copy. Reserving the worst case up front means a call never grows (and
// waits) while holding memory, which could deadlock two calls.
inline int64_t ReadReservation(const CallRouterOptions& o) { return 2 * o.max_message_bytes; }

// Counts a call as busy while it lives: its request is read and its answer
// not yet sent.
class BusyMark {
 public:
  explicit BusyMark(std::atomic<int>* busy) : busy_(busy) { busy_->fetch_add(1); }
  ~BusyMark() { busy_->fetch_sub(1); }
  BusyMark(const BusyMark&) = delete;
  BusyMark& operator=(const BusyMark&) = delete;

 private:
  std::atomic<int>* busy_;
};

}  // namespace posenc::server

#endif  // POSENC_SERVER_RPC_CALL_REACTORS_H_
