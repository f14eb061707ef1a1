// Waiting in a test for something another thread or process brings about,
// with a bound, rather than sleeping a fixed time.
#ifndef POSENC_TESTS_SUPPORT_EVENTUALLY_H_
#define POSENC_TESTS_SUPPORT_EVENTUALLY_H_

#include <chrono>
#include <thread>

namespace posenc::testing {

// Polls `done` every 10 ms for up to `limit`; returns whether it came.
template <typename Fn>
bool Eventually(Fn done, std::chrono::milliseconds limit = std::chrono::milliseconds(5000)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

}  // namespace posenc::testing

#endif  // POSENC_TESTS_SUPPORT_EVENTUALLY_H_
