// Element types the kernels understand; the FFI handlers map XLA's types here.
#pragma once
#include <cstdint>

namespace jaxcraft {

enum class DType : int32_t { kF32 = 0, kBF16 = 1, kF16 = 2 };

}  // namespace jaxcraft
