#include "cpu/row_convert.h"

#include <algorithm>

#include "cpu/isa_clones.h"

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define JAXCRAFT_F16C 1
#endif

namespace jaxcraft {
namespace cpu {
namespace {

template <typename T>
[[gnu::always_inline]] inline void widen(const T* __restrict__ in, int64_t n, float* __restrict__ out) {
  for (int64_t c = 0; c < n; ++c) out[c] = to_float(in[c]);
}

template <typename T>
[[gnu::always_inline]] inline void narrow(const float* __restrict__ in, int64_t n, T* __restrict__ out) {
  for (int64_t c = 0; c < n; ++c) out[c] = from_float<T>(in[c]);
}

JAXCRAFT_CPU_CLONES void load_bf16(const bf16_t* in, int64_t n, float* out) { widen(in, n, out); }
JAXCRAFT_CPU_CLONES void store_bf16(const float* in, int64_t n, bf16_t* out) { narrow(in, n, out); }
JAXCRAFT_CPU_CLONES void load_f16_selects(const f16_t* in, int64_t n, float* out) { widen(in, n, out); }
JAXCRAFT_CPU_CLONES void store_f16_selects(const float* in, int64_t n, f16_t* out) {
  narrow(in, n, out);
}

#ifdef JAXCRAFT_F16C
__attribute__((target("avx,f16c"))) void load_f16c(const f16_t* in, int64_t n, float* out) {
  int64_t c = 0;
  for (; c + 8 <= n; c += 8)
    _mm256_storeu_ps(out + c, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + c))));
  for (; c < n; ++c) out[c] = _cvtsh_ss(in[c].bits);
}

__attribute__((target("avx,f16c"))) void store_f16c(const float* in, int64_t n, f16_t* out) {
  int64_t c = 0;
  for (; c + 8 <= n; c += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + c),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + c), _MM_FROUND_TO_NEAREST_INT));
  for (; c < n; ++c) out[c].bits = _cvtss_sh(in[c], _MM_FROUND_TO_NEAREST_INT);
}
#endif

}  // namespace

bool f16c_rows() {
#ifdef JAXCRAFT_F16C
  static const bool yes =
      !cpu_portable_forced() && __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  return yes;
#else
  return false;
#endif
}

void load_row(const float* in, int64_t n, float* out) { std::copy(in, in + n, out); }
void load_row(const bf16_t* in, int64_t n, float* out) { load_bf16(in, n, out); }
void load_row(const f16_t* in, int64_t n, float* out) {
#ifdef JAXCRAFT_F16C
  if (f16c_rows()) return load_f16c(in, n, out);
#endif
  load_f16_selects(in, n, out);
}

void store_row(const float* in, int64_t n, float* out) { std::copy(in, in + n, out); }
void store_row(const float* in, int64_t n, bf16_t* out) { store_bf16(in, n, out); }
void store_row(const float* in, int64_t n, f16_t* out) {
#ifdef JAXCRAFT_F16C
  if (f16c_rows()) return store_f16c(in, n, out);
#endif
  store_f16_selects(in, n, out);
}

}  // namespace cpu
}  // namespace jaxcraft
