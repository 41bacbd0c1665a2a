// A minimal fork-join loop for the CPU kernels. XLA's CPU client runs custom
// calls on its own thread; spreading one large call over the cores is ours to do.
#pragma once
#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace jaxcraft {

// Calls fn(begin, end) on disjoint chunks covering [0, n). Spawns threads only
// when each gets at least `min_items` items: thread start costs ~10-50 us.
template <typename Fn>
void parallel_for(int64_t n, int64_t min_items, Fn fn) {
  const int64_t hw = std::max(1u, std::thread::hardware_concurrency());
  const int64_t threads = std::clamp<int64_t>(n / std::max<int64_t>(min_items, 1), 1, hw);
  if (threads <= 1) {
    fn(int64_t{0}, n);
    return;
  }
  const int64_t chunk = (n + threads - 1) / threads;
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  for (int64_t t = 1; t < threads; ++t) {
    const int64_t begin = t * chunk, end = std::min(n, begin + chunk);
    if (begin < end) pool.emplace_back(fn, begin, end);
  }
  fn(int64_t{0}, std::min(n, chunk));
  for (auto& th : pool) th.join();
}

}  // namespace jaxcraft
