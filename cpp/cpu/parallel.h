// A fork-join loop for the CPU kernels. Inside an XLA custom call the work
// goes to XLA's own intra-op thread pool: threads we started ourselves would
// compete with that pool's (otherwise idle, spinning) workers for the cores.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
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
// `min_items` items (a task hand-off costs a few microseconds). With a
// runner, up to kChunksPerWorker chunks per worker, claimed one at a time,
// so that a worker slowed by other work (a shared machine) leaves its share
// to the others; without one it starts a std::thread per chunk (standalone
// use, tests).
constexpr int64_t kChunksPerWorker = 4;

template <typename Fn>
void parallel_for(const TaskRunner* runner, int64_t n, int64_t min_items, Fn fn) {
  const int64_t workers = runner ? runner->num_threads() + 1  // + the calling thread
                                 : std::max(1u, std::thread::hardware_concurrency());
  const int64_t chunks = std::clamp<int64_t>(n / std::max<int64_t>(min_items, 1), 1,
                                             runner ? kChunksPerWorker * workers : workers);
  if (chunks <= 1) {
    fn(int64_t{0}, n);
    return;
  }
  const int64_t size = (n + chunks - 1) / chunks;
  auto range = [&](int64_t c) { return std::pair(c * size, std::min(n, (c + 1) * size)); };
  if (runner) {
    // The caller and the pool tasks claim chunks from one shared counter, so
    // the caller waits only for chunks a running task has claimed, never for
    // a task still queued: XLA's pool may be busy with calls like this one
    // (several virtual devices on few cores), each waiting on the others.
    // A task that starts after every chunk is claimed touches only the
    // shared counters, which outlive this call.
    struct Counters {
      std::atomic<int64_t> next{0}, done{0};
    };
    auto counters = std::make_shared<Counters>();
    // `range` and `fn` (this call's locals) are touched only after a
    // successful claim, which the caller waits for below.
    auto claim_and_run = [counters, chunks, &range, &fn] {
      for (int64_t c; (c = counters->next.fetch_add(1, std::memory_order_relaxed)) < chunks;) {
        const auto [b, e] = range(c);
        if (b < e) fn(b, e);
        counters->done.fetch_add(1, std::memory_order_release);
      }
    };
    for (int64_t t = 1; t < std::min(chunks, workers); ++t) runner->schedule(claim_and_run);
    claim_and_run();
    while (counters->done.load(std::memory_order_acquire) < chunks) std::this_thread::yield();
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
