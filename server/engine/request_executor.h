// Runs admitted requests off gRPC's threads. Handlers only admit and enqueue,
// so every arriving request meets admission control at once instead of
// queueing invisibly inside gRPC while its threads compute.
#ifndef POSENC_SERVER_ENGINE_REQUEST_EXECUTOR_H_
#define POSENC_SERVER_ENGINE_REQUEST_EXECUTOR_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace posenc::server {

class RequestExecutor {
 public:
  explicit RequestExecutor(int threads);
  // Runs every task already submitted, then stops.
  ~RequestExecutor();
  RequestExecutor(const RequestExecutor&) = delete;
  RequestExecutor& operator=(const RequestExecutor&) = delete;

  // The queue is bounded by admission control, which runs before Submit.
  void Submit(std::function<void()> task);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace posenc::server

#endif  // POSENC_SERVER_ENGINE_REQUEST_EXECUTOR_H_
