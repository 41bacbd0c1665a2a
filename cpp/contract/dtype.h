// Element types the kernels understand; the FFI handlers map XLA's types here.
#pragma once
#include <cstdint>

namespace jaxcraft {

enum class DType : int32_t { kF32 = 0, kBF16 = 1, kF16 = 2 };

// fn(T{}) for the storage type T that `dtype` names: float, or the caller's
// 16-bit types BF16 and F16 (CUDA's or the CPU's); the argument only carries
// its type (`decltype(x)` in a generic lambda). A value outside the enum
// returns `otherwise` (nothing for a void fn).
template <typename BF16, typename F16, typename Fn, typename... Otherwise>
auto dispatch_dtype(DType dtype, Fn&& fn, Otherwise... otherwise) {
  switch (dtype) {
    case DType::kF32: return fn(float{});
    case DType::kBF16: return fn(BF16{});
    case DType::kF16: return fn(F16{});
  }
  return decltype(fn(float{}))(otherwise...);
}

}  // namespace jaxcraft
