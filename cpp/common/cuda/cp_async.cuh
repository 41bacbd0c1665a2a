// sm_80+ asynchronous global -> shared copies (cp.async), shared by the
// kernels that stage tiles or rows in shared memory. A thread that waits for
// its own copies (cp_async_wait) sees them without a barrier; data copied by
// other threads needs a __syncthreads after the wait.
#pragma once
#include <cstdint>

namespace jaxcraft {

constexpr int kCpAsyncBytes = 16;  // the largest cp.async, bypassing L1 (.cg)

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes of which the first src_bytes (0..16) are read and the rest
// zero-filled (src may be any valid address when src_bytes is 0): tile edges
// become zero padding.
__device__ __forceinline__ void cp_async_zfill(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}

// src_ok = false: 16 zero bytes, nothing read.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool src_ok = true) {
  cp_async_zfill(dst, src, src_ok ? kCpAsyncBytes : 0);
}

// kBytes (4, 8 or 16) through L1 (.ca): copies narrower than 16 bytes.
template <int kBytes>
__device__ __forceinline__ void cp_async_ca(uint32_t dst, const void* src) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async sizes");
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(dst), "l"(src), "n"(kBytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most kPending of this thread's committed groups are in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// The same with a run-time count (wait_group takes an immediate): up to 3.
__device__ __forceinline__ void cp_async_wait(int pending) {
  switch (pending) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    default: cp_async_wait<3>(); break;
  }
}

}  // namespace jaxcraft
