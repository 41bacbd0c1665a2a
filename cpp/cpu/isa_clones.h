// JAXCRAFT_CPU_CLONES: compile a function twice and pick one at load time,
// AVX2 + FMA (8 lanes, fused multiply-adds) where the CPU has them, the
// x86-64 baseline (SSE2, 4 lanes) otherwise. The package is built from
// source on machines it may not run on (a shared environment, a copied
// wheel), so the baseline stays the default; the clones need ifunc (GCC on
// x86-64 Linux). Apply it to plain functions that each do a whole loop: the
// choice costs an indirect call.
#pragma once
#include <cstdlib>
#include <cstring>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define JAXCRAFT_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define JAXCRAFT_CPU_CLONES
#endif

namespace jaxcraft {
namespace cpu {

// The paths chosen at run time (the tile products' AVX2 code,
// cpu/blocked.h; the F16C row conversions, cpu/row_convert.h) take their
// portable alternative when the environment variable JAXCRAFT_CPU_PORTABLE
// is 1 at their first use: the tests run the code of ARM and older x86-64
// CPUs that way on CPUs that have the extensions (tests/test_cpu_portable.py).
inline bool cpu_portable_forced() {
  const char* portable = std::getenv("JAXCRAFT_CPU_PORTABLE");
  return portable != nullptr && std::strcmp(portable, "1") == 0;
}

}  // namespace cpu
}  // namespace jaxcraft
