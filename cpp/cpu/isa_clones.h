// JAXCRAFT_CPU_CLONES: compile a function twice and pick one at load time,
// AVX2 + FMA (8 lanes, fused multiply-adds) where the CPU has them, the
// x86-64 baseline (SSE2, 4 lanes) otherwise. The package is built from
// source on machines it may not run on (a shared environment, a copied
// wheel), so the baseline stays the default; the clones need ifunc (GCC on
// x86-64 Linux). Apply it to plain functions that each do a whole loop: the
// choice costs an indirect call.
#pragma once

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define JAXCRAFT_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define JAXCRAFT_CPU_CLONES
#endif
