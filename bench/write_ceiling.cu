// How fast a GPU writes a 1 GiB table (the embedding backward's table pass is
// mostly writes): cudaMemsetAsync, 16-byte store kernels in several layouts,
// TMA bulk stores of a zeroed shared buffer, and the table pass's own shape
// (one 8 KiB row per 256-thread block, a count read first, one row in eight
// copied from a 16k-row source: mixed among the zero rows, or phased, the
// copies first). Prints us and GB/s of bytes written (+ read).
// Build and run from the repository root:
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Icpp bench/write_ceiling.cu -o /tmp/wc
//   /tmp/wc
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "common/testing/standalone_timing.h"

using jaxcraft_test::mean_launch_ms;

namespace {

constexpr size_t kBytes = size_t(1) << 30;
constexpr int64_t kRowPacks = 512;  // 4096 bf16 = 8 KiB = 512 packs of 16 B
constexpr int64_t kRows = kBytes / 16 / kRowPacks;

// Grid-stride 16-byte stores, kUnroll per thread per step; kStreaming uses
// st.global.cs (evict-first).
template <int kUnroll, bool kStreaming>
__global__ void store_grid_stride(int4* p, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int4 z = make_int4(0, 0, 0, 0);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride * kUnroll) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t j = i + u * stride;
      if (j < n) {
        if constexpr (kStreaming) __stcs(p + j, z); else p[j] = z;
      }
    }
  }
}

// The table pass's shape: a 256-thread block per row, 2 packs per thread,
// rows grid-stride; kCount reads count[r] first (the pass's dependent load);
// kCopyEvery > 0 copies src row r / kCopyEvery into rows r % kCopyEvery == 0.
template <bool kCount, int kCopyEvery>
__global__ void __launch_bounds__(256) store_rows(int4* p, const int* count, const int4* src) {
  for (int64_t r = blockIdx.x; r < kRows; r += gridDim.x) {
    int n = 0;
    if constexpr (kCount) n = count[r];
    int4* row = p + r * kRowPacks;
    if constexpr (kCopyEvery > 0) {
      if (r % kCopyEvery == 0) {
        const int4* s = src + (r / kCopyEvery) * kRowPacks;
        const int4 a = s[threadIdx.x], b = s[threadIdx.x + 256];
        row[threadIdx.x] = a;
        row[threadIdx.x + 256] = b;
        continue;
      }
    }
    {
      const int4 z = make_int4(n, 0, 0, 0);
      row[threadIdx.x] = z;
      row[threadIdx.x + 256] = z;
    }
  }
}

// The same with kThreads threads per row (512 / kThreads packs each, every
// load of a copied row issued before its stores), 256 / kThreads rows per block.
template <int kThreads>
__global__ void __launch_bounds__(256) store_rows_narrow(int4* p, const int* count, const int4* src) {
  constexpr int kPer = kRowPacks / kThreads;
  const int lane = threadIdx.x % kThreads;
  for (int64_t r = int64_t(blockIdx.x) * (256 / kThreads) + threadIdx.x / kThreads; r < kRows;
       r += int64_t(gridDim.x) * (256 / kThreads)) {
    const int n = count[r];
    int4* row = p + r * kRowPacks;
    int4 v[kPer];
    if (r % 8 == 0) {
      const int4* s = src + (r / 8) * kRowPacks;
#pragma unroll
      for (int u = 0; u < kPer; ++u) v[u] = s[lane + u * kThreads];
    } else {
#pragma unroll
      for (int u = 0; u < kPer; ++u) v[u] = make_int4(n, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kPer; ++u) row[lane + u * kThreads] = v[u];
  }
}

// Phased: the copied rows (every eighth) and the zero rows in separate passes
// (kPhase 1: copies only, 2: zeros only), or in one launch whose first
// kRows / 8 block-rows copy and the rest write zeros (kPhase 0: copies first,
// 3: zeros first). One row per 256-thread block, 2 packs per thread.
template <int kPhase>
__global__ void __launch_bounds__(256) store_phased(int4* p, const int* count, const int4* src) {
  constexpr int64_t kCopies = kRows / 8, kZeros = kRows - kCopies;
  const int64_t total = kPhase == 1 ? kCopies : kPhase == 2 ? kZeros : kRows;
  for (int64_t b = blockIdx.x; b < total; b += gridDim.x) {
    bool copy;
    int64_t i;
    if (kPhase == 1) copy = true, i = b;
    else if (kPhase == 2) copy = false, i = b;
    else if (kPhase == 0) copy = b < kCopies, i = copy ? b : b - kCopies;
    else copy = b >= kZeros, i = copy ? b - kZeros : b;
    // i-th copied row is 8 i; i-th zero row is the i-th row not divisible by 8.
    const int64_t r = copy ? 8 * i : i / 7 * 8 + 1 + i % 7;
    int4* row = p + r * kRowPacks;
    if (copy) {
      const int4* s = src + i * kRowPacks;
      const int4 a = s[threadIdx.x], c = s[threadIdx.x + 256];
      row[threadIdx.x] = a;
      row[threadIdx.x + 256] = c;
    } else {
      const int4 z = make_int4(count[r], 0, 0, 0);
      row[threadIdx.x] = z;
      row[threadIdx.x + 256] = z;
    }
  }
}

// TMA bulk stores: each block zeroes kChunk bytes of shared memory once, then
// one thread issues one bulk copy per chunk of the table, grid-stride.
template <int kChunk>
__global__ void store_bulk(char* p, int64_t bytes) {
  extern __shared__ __align__(128) int4 zeros[];
  for (int i = threadIdx.x; i < kChunk / 16; i += blockDim.x) zeros[i] = make_int4(0, 0, 0, 0);
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  if (threadIdx.x != 0) return;
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(zeros));
  for (int64_t off = int64_t(blockIdx.x) * kChunk; off < bytes; off += int64_t(gridDim.x) * kChunk) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(p + off), "r"(s),
                 "n"(kChunk)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

int sms() {
  int d = 0, n = 0;
  CHECK(cudaGetDevice(&d));
  CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, d));
  return n;
}

// Times `launch` (kernel launches, or a runtime call returning cudaError_t)
// and prints us and GB/s over `bytes`; `fmt` is a printf format for the name.
template <class Launch, class... Args>
void timed(double bytes, Launch launch, const char* fmt, Args... args) {
  constexpr int kReps = 20;
  char name[96];
  if constexpr (sizeof...(Args) == 0) std::snprintf(name, sizeof name, "%s", fmt);
  else std::snprintf(name, sizeof name, fmt, args...);
  const float ms = mean_launch_ms([&] {
    launch();
    return cudaGetLastError();
  }, kReps);
  std::printf("%-52s %8.1f us %7.0f GB/s\n", name, ms * 1e3, bytes / ms / 1e6);
}

}  // namespace

int main() {
  const int n_sm = sms();
  void *a, *b, *src_bytes;
  int* count;
  CHECK(cudaMalloc(&a, kBytes));
  CHECK(cudaMalloc(&b, kBytes));
  CHECK(cudaMalloc(&src_bytes, kBytes / 8));
  CHECK(cudaMalloc(&count, kRows * sizeof(int)));
  CHECK(cudaMemset(src_bytes, 1, kBytes / 8));
  CHECK(cudaMemset(count, 0, kRows * sizeof(int)));
  int4* p = static_cast<int4*>(a);
  const int4* src = static_cast<const int4*>(src_bytes);
  const int64_t n = kBytes / 16;
  const double mixed = kBytes * 9.0 / 8;  // the table written, one row in eight read
  CHECK(cudaFuncSetAttribute(store_bulk<16384>, cudaFuncAttributeMaxDynamicSharedMemorySize, 16384));
  for (int round = 0; round < 2; ++round) {
    std::printf("round %d (%d SMs)\n", round, n_sm);
    timed(2.0 * kBytes, [&] { cudaMemcpyAsync(b, a, kBytes, cudaMemcpyDeviceToDevice); },
          "copy (read + write counted)");
    timed(kBytes, [&] { cudaMemsetAsync(a, 0, kBytes); }, "cudaMemsetAsync");
    for (int per_sm : {4, 8, 16}) {
      timed(kBytes, [&] { store_grid_stride<4, false><<<n_sm * per_sm, 256>>>(p, n); },
            "grid-stride st.128 unroll 4, %d blocks/SM", per_sm);
      timed(kBytes, [&] { store_grid_stride<4, true><<<n_sm * per_sm, 256>>>(p, n); },
            "grid-stride st.global.cs unroll 4, %d blocks/SM", per_sm);
    }
    timed(kBytes, [&] { store_rows<false, 0><<<65536, 256>>>(p, count, nullptr); },
          "rows: block per row, 65536 blocks");
    timed(kBytes, [&] { store_rows<true, 0><<<65536, 256>>>(p, count, nullptr); },
          "rows + count read, 65536 blocks");
    for (int grid : {65536, 131072})
      timed(mixed, [&] { store_rows<true, 8><<<grid, 256>>>(p, count, src); },
            "rows + count + 1/8 copied, %d blocks (w+r)", grid);
    auto narrow = [&](auto kernel, int threads) {
      for (int64_t grid : {int64_t(65536), kRows * threads / 256, int64_t(n_sm) * 8 * 4})
        timed(mixed, [&] { kernel<<<grid, 256>>>(p, count, src); },
              "rows + count + 1/8 copied, %d thr/row, grid %lld", threads, (long long)grid);
    };
    narrow(store_rows_narrow<256>, 256);
    narrow(store_rows_narrow<128>, 128);
    narrow(store_rows_narrow<64>, 64);
    narrow(store_rows_narrow<32>, 32);
    for (int64_t grid : {int64_t(65536), kRows}) {
      timed(mixed, [&] {
        store_phased<1><<<grid, 256>>>(p, count, src);
        store_phased<2><<<grid, 256>>>(p, count, src);
      }, "phased: copies, then zeros, 2 launches, grid %lld", (long long)grid);
      timed(mixed, [&] {
        store_phased<2><<<grid, 256>>>(p, count, src);
        store_phased<1><<<grid, 256>>>(p, count, src);
      }, "phased: zeros, then copies, 2 launches, grid %lld", (long long)grid);
      timed(mixed, [&] { store_phased<0><<<grid, 256>>>(p, count, src); },
            "phased: copies first, 1 launch, grid %lld", (long long)grid);
      timed(mixed, [&] { store_phased<3><<<grid, 256>>>(p, count, src); },
            "phased: zeros first, 1 launch, grid %lld", (long long)grid);
    }
    timed(kBytes / 4.0, [&] { store_phased<1><<<65536, 256>>>(p, count, src); },
          "copies alone (128 MiB read + written)");
    timed(kBytes * 7.0 / 8, [&] { store_phased<2><<<65536, 256>>>(p, count, src); }, "zeros alone (896 MiB)");
    for (int per_sm : {1, 2, 4, 8})
      timed(kBytes, [&] { store_bulk<16384><<<n_sm * per_sm, 32, 16384>>>(static_cast<char*>(a), kBytes); },
            "TMA bulk store 16 KiB chunks, %d blocks/SM", per_sm);
  }
  // Checks that the stores landed: the bulk store last wrote zeros everywhere.
  CHECK(cudaMemset(a, 0xff, kBytes));
  store_bulk<16384><<<n_sm * 2, 32, 16384>>>(static_cast<char*>(a), kBytes);
  CHECK(cudaDeviceSynchronize());
  unsigned char probe[3];
  for (int i = 0; i < 3; ++i)
    CHECK(cudaMemcpy(probe + i, static_cast<char*>(a) + (kBytes - 1) / 2 * i, 1, cudaMemcpyDeviceToHost));
  std::printf("bulk store check: %s\n", probe[0] == 0 && probe[1] == 0 && probe[2] == 0 ? "ok" : "FAILED");
  return 0;
}
