// Hopper (sm_90a) device primitives for the attention kernels: mbarriers,
// bulk tensor copies (TMA), warpgroup MMA (wgmma) and its shared-memory
// descriptors, register reallocation. Written as inline PTX because each is
// one instruction; the kernels only compile their bodies for sm_90a
// (JAXCRAFT_SM90A_ENABLED), so other targets see empty stubs.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "contract/dtype.h"
#include "kernels/attention/mma_sm80.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define JAXCRAFT_SM90A_ENABLED 1
#endif

namespace jaxcraft {
namespace attn {
namespace sm90 {

constexpr int kWarpgroupThreads = 128;  // wgmma is issued by 4 consecutive warps
constexpr int kWgmmaM = 64;             // rows of one wgmma (and of one warpgroup's tile)
constexpr int kWgmmaK = 16;             // reduction depth of one 16-bit wgmma

// Shared tiles are [column blocks of 64][rows][64] 16-bit elements in the
// 128-byte swizzle that TMA writes and wgmma reads: row r's 16-byte chunk c
// sits at chunk c ^ (r % 8). Each 8-row group is one 1024-byte swizzle atom,
// so every tile starts on a 1024-byte boundary.
constexpr int kSwizzleCols = 64;
constexpr int kSwizzleRowBytes = 128;
constexpr int kSwizzleAtomBytes = 1024;

// Byte offset of 16-byte chunk `chunk` (0..7) of row `row` inside a 64-column
// block of a swizzled tile: the one place the swizzle is spelled out.
__host__ __device__ constexpr uint32_t swizzled_offset(int row, int chunk) {
  return row * kSwizzleRowBytes + ((chunk ^ (row % 8)) * 16);
}

// Shared memory of RingBarriers<stages> (below).
__host__ __device__ constexpr int ring_barrier_bytes(int stages) { return 8 * (1 + 2 * stages); }

template <int kRows>
__host__ __device__ constexpr int col_block_bytes() {
  return kRows * kSwizzleRowBytes;
}

// True when the current device is compute capability 9.0 (the "a" features
// are not forward compatible) and `kernel` runs code compiled for it: sm_80
// PTX compiled by the driver (CUDA_FORCE_PTX_JIT=1, or a build without the
// sm_90a target) has binary version 90 too, but PTX version 80 and an empty
// stub for the kernel.
template <class Kernel>
bool kernel_runs_sm90a(Kernel kernel) {
  int device = 0, major = 0, minor = 0;
  cudaFuncAttributes attrs{};
  return cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
         cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess &&
         major == 9 && minor == 0 && cudaFuncGetAttributes(&attrs, kernel) == cudaSuccess &&
         attrs.binaryVersion == 90 && attrs.ptxVersion == 90;
}

#ifdef JAXCRAFT_SM90A_ENABLED

// Two floats from shared memory (8-byte aligned shared address).
__device__ __forceinline__ float2 ld_shared_f2(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr));
  return v;
}

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}

// Arrives once and adds `bytes` to the transaction count the phase waits for.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// `count` arrivals in one.
__device__ __forceinline__ void mbar_arrive(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// Blocks until the barrier's phase with the given parity has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// Makes mbarrier initialization visible to the async proxy (TMA) and the
// other threads of the cluster-of-one.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// The mbarriers of a kStages-deep producer/consumer ring plus one for the
// tiles loaded once (Q in the forward, K and V in the backward): 8 bytes each
// at `base`. Use i of the ring (0, 1, ...) is stage i % kStages, and waits
// for that stage's (i / kStages)-th phase.
template <int kStages>
struct RingBarriers {
  static constexpr int kBytes = ring_barrier_bytes(kStages);
  uint32_t base;
  __device__ uint32_t once() const { return base; }
  __device__ uint32_t full(int s) const { return base + 8 * (1 + s); }
  __device__ uint32_t empty(int s) const { return base + 8 * (1 + kStages + s); }
  static __device__ int stage(int use) { return use % kStages; }
  static __device__ uint32_t parity(int use) { return (use / kStages) & 1; }
  // One thread, before the CTA-wide barrier that publishes them.
  __device__ void init(int full_arrivals, int empty_arrivals) const {
    mbar_init(once(), 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full(s), full_arrivals);
      mbar_init(empty(s), empty_arrivals);
    }
    fence_barrier_init();
  }
  // Producer side: before use `use` refills its stage, wait until the
  // consumers released that stage's previous use.
  __device__ void wait_free(int use) const {
    if (use >= kStages) mbar_wait(empty(stage(use)), parity(use) ^ 1);
  }
  __device__ void wait_full(int use) const { mbar_wait(full(stage(use)), parity(use)); }
};

// The dynamic shared memory window rounded up to a swizzle atom (the
// kernels request kSwizzleAtomBytes of slack).
__device__ __forceinline__ uint32_t swizzle_aligned(const void* smem) {
  return (smem_u32(smem) + kSwizzleAtomBytes - 1) & ~uint32_t(kSwizzleAtomBytes - 1);
}

__device__ __forceinline__ void st_shared_b32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

// Orders this thread's generic-proxy shared-memory writes before later
// async-proxy (TMA store, wgmma) reads.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// 4-D tiled bulk copy global -> shared, completing on `bar`.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                            int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// L2 eviction priorities for bulk copies (every line a copy reads or writes
// gets it): evict-first for data touched once, so that it goes before data
// that other CTAs will read again.
__device__ __forceinline__ uint64_t l2_evict_first() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ uint64_t l2_evict_normal() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// tma_load_4d with an L2 eviction priority.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                            int c0, int c1, int c2, int c3, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%3, %4, %5, %6}], [%2], %7;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
      "l"(policy)
      : "memory");
}

// 4-D tiled bulk copy shared -> global; out-of-bounds parts of the box are
// not written.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, uint32_t src, int c0, int c1,
                                             int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::
          "l"(reinterpret_cast<uint64_t>(map)),
      "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// tma_store_4d with an L2 eviction priority.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, uint32_t src, int c0, int c1,
                                             int c2, int c3, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group.L2::cache_hint"
      " [%0, {%2, %3, %4, %5}], [%1], %6;\n" ::"l"(reinterpret_cast<uint64_t>(map)),
      "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "l"(policy)
      : "memory");
}

// 4-D tiled bulk reduction shared -> global: adds the float32 box at `src`
// into the tensor (bulk-group completion, as the stores).
__device__ __forceinline__ void tma_reduce_add_4d(const CUtensorMap* map, uint32_t src, int c0,
                                                  int c1, int c2, int c3) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group"
      " [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(reinterpret_cast<uint64_t>(map)),
      "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

__device__ __forceinline__ void tma_store_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Until every committed store has read its shared memory (which may then be
// overwritten); the global writes may still be in flight.
__device__ __forceinline__ void tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
__device__ __forceinline__ void tma_store_commit_and_wait() {
  tma_store_commit();
  tma_store_wait_read();
}

__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Barrier among `threads` threads (a multiple of 32) on hardware barrier `id`.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Arrive on hardware barrier `id` (counted with `threads`) without waiting.
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Two fp32 atomic adds to adjacent addresses in one instruction.
__device__ __forceinline__ void red_add_v2(float* addr, float x, float y) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(addr), "f"(x), "f"(y) : "memory");
}

template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving accesses of accumulator registers across a
// wgmma issue or wait: the hardware writes them asynchronously.
template <int kTiles>
__device__ __forceinline__ void fence_operands(float (&d)[kTiles][4]) {
#pragma unroll
  for (int j = 0; j < kTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
}
// Register A operands are read asynchronously too: a use after the wait
// keeps their registers from being reused while the wgmma runs.
template <int kTiles>
__device__ __forceinline__ void fence_operands(uint32_t (&a)[kTiles][4]) {
#pragma unroll
  for (int j = 0; j < kTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[j][e])::"memory");
}

// Shared-memory matrix descriptor of a 128-byte-swizzled operand. K-major
// (Q and K for S = Q K^T): consecutive 8-row groups 1024 bytes apart (the
// stride offset); the leading offset is unused. MN-major (V for O += P V,
// read transposed): 8-row groups along K 1024 bytes apart, 64-column blocks
// along N `block_bytes` apart (the leading offset).
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t leading_bytes) {
  constexpr uint64_t kSwizzle128 = 1;
  return (uint64_t((addr & 0x3FFFF) >> 4)) | (uint64_t(leading_bytes >> 4) << 16) |
         (uint64_t(kSwizzleAtomBytes >> 4) << 32) | (kSwizzle128 << 62);
}

// `desc` with its start address moved by `bytes` (a multiple of 16). One
// 32-bit add to the low word, where smem_desc(addr + bytes) repeats the mask,
// shift and or for every product of a tile (the uniform datapath's largest
// share at head dim 256); the 14-bit field cannot carry into the leading
// offset while the address stays below 256 KB (shared memory is 228 KB).
__device__ __forceinline__ uint64_t desc_plus(uint64_t desc, uint32_t bytes) {
  const uint32_t lo = uint32_t(desc) + (bytes >> 4), hi = uint32_t(desc >> 32);
  return (uint64_t(hi) << 32) | lo;
}

// d[N/8][4] += A(64 x 16, shared, K-major) * B(N x 16, shared, K-major)^T;
// accumulate = 0 overwrites d.
template <DType kDt, int kN>
__device__ void wgmma_ss(float (&d)[kN / 8][4], uint64_t a, uint64_t b, int accumulate);
// As wgmma_ss, with both operands MN-major (A stored [k][m], B stored [k][n]).
template <DType kDt, int kN>
__device__ void wgmma_ss_tt(float (&d)[kN / 8][4], uint64_t a, uint64_t b, int accumulate);
// As wgmma_ss, with B MN-major (stored [k][n]).
template <DType kDt, int kN>
__device__ void wgmma_ss_nt(float (&d)[kN / 8][4], uint64_t a, uint64_t b, int accumulate);
// d[N/8][4] += A(64 x 16, registers) * B(16 x N, shared, MN-major).
template <DType kDt, int kN>
__device__ void wgmma_rs(float (&d)[kN / 8][4], const uint32_t (&a)[4], uint64_t b);

#include "kernels/attention/sm90/wgmma_ops.inc"

#endif  // JAXCRAFT_SM90A_ENABLED

}  // namespace sm90
}  // namespace attn
}  // namespace jaxcraft
