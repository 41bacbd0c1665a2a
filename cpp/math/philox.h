// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// SC'11) and the attention dropout keep-mask built on it. Host and device
// code share this one definition, and jaxcraft/ops/attention_dropout.py restates it in
// jax.numpy, so the CPU kernel, the CUDA kernels and the reference draw the
// same mask bit for bit.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define JAXCRAFT_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define JAXCRAFT_HOST_DEVICE inline
#endif

namespace jaxcraft {

struct Philox4 {
  uint32_t x[4];
};

JAXCRAFT_HOST_DEVICE void mul_hi_lo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  *lo = static_cast<uint32_t>(p);
}

// Ten rounds of Philox4x32 on counter c under key (k0, k1).
JAXCRAFT_HOST_DEVICE Philox4 philox4x32_10(Philox4 c, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mul_hi_lo(0xD2511F53u, c.x[0], &hi0, &lo0);
    mul_hi_lo(0xCD9E8D57u, c.x[2], &hi1, &lo1);
    c = Philox4{{hi1 ^ c.x[1] ^ k0, lo1, hi0 ^ c.x[3] ^ k1, lo0}};
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c;
}

// Dropout draws one Philox block per 4 consecutive keys: counter (j / 4, i,
// n, b) gives the words for keys 4 (j / 4) .. + 3 of row i, head n, batch b
// (b = n = 0 when the mask is broadcast). A probability is kept when its
// word is >= the threshold floor(rate * 2^32).
JAXCRAFT_HOST_DEVICE uint32_t dropout_threshold(float rate) {
  const double t = static_cast<double>(rate) * 4294967296.0;
  return t >= 4294967295.0 ? 0xFFFFFFFFu : static_cast<uint32_t>(t);
}

JAXCRAFT_HOST_DEVICE Philox4 dropout_block(const uint32_t key[2], uint32_t b, uint32_t n,
                                           uint32_t i, uint32_t j4) {
  return philox4x32_10(Philox4{{j4, i, n, b}}, key[0], key[1]);
}

JAXCRAFT_HOST_DEVICE bool dropout_keep(const uint32_t key[2], uint32_t threshold, uint32_t b,
                                       uint32_t n, uint32_t i, uint32_t j) {
  return dropout_block(key, b, n, i, j >> 2).x[j & 3] >= threshold;
}

}  // namespace jaxcraft
