// Whether a launch can move its buffers as 16-byte vectors (one LDG.128 /
// STG.128 each): rows made of whole vectors, every buffer 16-byte aligned.
// Launchers fall back to element-wise kernels otherwise.
#pragma once
#include <cstdint>
#include <initializer_list>

namespace jaxcraft {

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Every non-null pointer 16-byte aligned.
inline bool all_aligned16(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (p && !aligned16(p)) return false;
  return true;
}

// Rows of `cols` elements of T split into whole 16-byte vectors, and every
// non-null buffer aligned.
template <typename T>
bool can_vectorize(int64_t cols, std::initializer_list<const void*> ptrs) {
  return cols % int64_t(16 / sizeof(T)) == 0 && all_aligned16(ptrs);
}

}  // namespace jaxcraft
