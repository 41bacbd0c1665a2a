// Division by a runtime-invariant divisor as a multiply-high and two shifts
// (Granlund & Montgomery, "Division by invariant integers using
// multiplication", 1994, fig. 4.1), where a hardware integer division costs
// ~20 instructions (a 64-bit one a branchy subroutine): the decode kernels
// split key positions into (page, row in page) for every key row they load,
// and the persistent Hopper attention forward decodes a work item at every
// item. Host-computable, device-usable.
#pragma once
#include <cstdint>

#ifdef __CUDACC__
#define JAXCRAFT_HD __host__ __device__ __forceinline__
#else
#define JAXCRAFT_HD inline
#endif

namespace jaxcraft {

struct FastDivmod {
  uint32_t divisor = 1;
  uint32_t multiplier = 1;
  uint32_t shift1 = 0;  // min(l, 1)
  uint32_t shift2 = 0;  // max(l - 1, 0), l = ceil(log2(divisor))

  // divisor in [1, 2^31].
  static FastDivmod make(uint32_t d) {
    FastDivmod f;
    f.divisor = d;
    uint32_t l = 0;
    while ((uint64_t{1} << l) < d) ++l;
    f.multiplier = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << l) - d)) / d + 1);
    f.shift1 = l < 1 ? l : 1;
    f.shift2 = l > 1 ? l - 1 : 0;
    return f;
  }

  // n / divisor for any 32-bit n.
  JAXCRAFT_HD uint32_t div(uint32_t n) const {
#ifdef __CUDA_ARCH__
    const uint32_t t = __umulhi(n, multiplier);
#else
    const uint32_t t = static_cast<uint32_t>((uint64_t{n} * multiplier) >> 32);
#endif
    return (t + ((n - t) >> shift1)) >> shift2;
  }

  JAXCRAFT_HD void divmod(uint32_t n, uint32_t& quotient, uint32_t& remainder) const {
    quotient = div(n);
    remainder = n - quotient * divisor;
  }
};

}  // namespace jaxcraft

#undef JAXCRAFT_HD
