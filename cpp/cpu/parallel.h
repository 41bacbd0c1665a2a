// A fork-join loop for the CPU kernels. Inside an XLA custom call the work
// goes to XLA's own intra-op thread pool: threads we started ourselves would
// compete with that pool's (otherwise idle, spinning) workers for the cores.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace jaxcraft {

// Where parallel chunks run. Kernel code sees only this interface; the FFI
// handlers adapt XLA's thread pool to it.
class TaskRunner {
 public:
  virtual ~TaskRunner() = default;
  virtual int64_t num_threads() const = 0;
  virtual void schedule(std::function<void()> task) const = 0;
};

// Calls fn(begin, end) on disjoint chunks covering [0, n), each of at least
// `min_items` items (a task hand-off costs a few microseconds). Without a
// runner it starts std::threads (standalone use, tests).
template <typename Fn>
void parallel_for(const TaskRunner* runner, int64_t n, int64_t min_items, Fn fn) {
  const int64_t workers = runner ? runner->num_threads() + 1  // + the calling thread
                                 : std::max(1u, std::thread::hardware_concurrency());
  const int64_t chunks = std::clamp<int64_t>(n / std::max<int64_t>(min_items, 1), 1, workers);
  if (chunks <= 1) {
    fn(int64_t{0}, n);
    return;
  }
  const int64_t size = (n + chunks - 1) / chunks;
  auto range = [&](int64_t c) { return std::pair(c * size, std::min(n, (c + 1) * size)); };
  if (runner) {
    std::atomic<int64_t> pending{chunks - 1};
    for (int64_t c = 1; c < chunks; ++c) {
      runner->schedule([&, c] {
        const auto [b, e] = range(c);
        if (b < e) fn(b, e);
        pending.fetch_sub(1, std::memory_order_release);
      });
    }
    const auto [b, e] = range(0);
    fn(b, e);
    while (pending.load(std::memory_order_acquire) > 0) std::this_thread::yield();
    return;
  }
  std::vector<std::thread> pool;
  for (int64_t c = 1; c < chunks; ++c) {
    const auto [b, e] = range(c);
    if (b < e) pool.emplace_back(fn, b, e);
  }
  const auto [b, e] = range(0);
  fn(b, e);
  for (auto& t : pool) t.join();
}

}  // namespace jaxcraft
