// Rows of float32, bfloat16 or float16 elements to float32 scratch and back
// (round to nearest even), each a whole-row loop: the CPU kernels convert
// their rows through these. float16 runs through the F16C conversion
// instructions, eight elements at a time, where the CPU has them (the
// integer selects of common/cpu/host_float.h, which need ~10 operations per
// element, leave the float16 norms 1.4-2.8x slower than XLA's), and bfloat16
// as AVX2 shifts; the baseline otherwise.
#pragma once
#include <cstdint>
#include <type_traits>

#include "common/cpu/host_float.h"

namespace jaxcraft {
namespace cpu {

void load_row(const float* in, int64_t n, float* out);
void load_row(const bf16_t* in, int64_t n, float* out);
void load_row(const f16_t* in, int64_t n, float* out);

void store_row(const float* in, int64_t n, float* out);
void store_row(const float* in, int64_t n, bf16_t* out);
void store_row(const float* in, int64_t n, f16_t* out);

// out = in * multiplier (an accumulator's normalization or scale): float32
// directly, 16-bit through store_row a stack chunk at a time; `in` is left
// as it was.
template <typename Out>
void store_scaled_row(const float* in, float multiplier, int64_t n, Out* out) {
  if constexpr (std::is_same_v<Out, float>) {
    for (int64_t i = 0; i < n; ++i) out[i] = in[i] * multiplier;
  } else {
    constexpr int64_t kChunk = 256;
    float chunk[kChunk];
    for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
      const int64_t m = n - i0 < kChunk ? n - i0 : kChunk;
      for (int64_t i = 0; i < m; ++i) chunk[i] = in[i0 + i] * multiplier;
      store_row(chunk, m, out + i0);
    }
  }
}

// A read-only row as float32: float32 rows themselves, others converted
// into `scratch` (n floats).
template <typename T>
const float* float_row(const T* in, int64_t n, float* scratch) {
  if constexpr (std::is_same_v<T, float>) {
    return in;
  } else {
    load_row(in, n, scratch);
    return scratch;
  }
}

// Whether float16 rows convert through F16C here: yes on an x86-64 CPU with
// it, unless JAXCRAFT_CPU_PORTABLE=1 (cpu/isa_clones.h).
bool f16c_rows();

}  // namespace cpu
}  // namespace jaxcraft
