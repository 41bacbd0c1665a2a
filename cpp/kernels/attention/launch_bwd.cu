// Backward launcher: delta pre-pass, then dK/dV (plus atomic dQ) and either
// the dQ conversion or the deterministic dQ kernel.
#include "kernels/attention/bwd_small_kernels.cuh"
#include "kernels/attention/host_args.h"
#include "kernels/attention/launch.h"
#include "kernels/attention/sm90/entry.h"

namespace jaxcraft {
namespace {

template <DType kDt>
cudaError_t dkdv_for_bucket(const attn::BwdArgs& a, int bucket, cudaStream_t stream) {
  switch (bucket) {
    case 32: return attn::run_bwd_dkdv<kDt, 32>(a, stream);
    case 64: return attn::run_bwd_dkdv<kDt, 64>(a, stream);
    case 96: return attn::run_bwd_dkdv<kDt, 96>(a, stream);
    case 128: return attn::run_bwd_dkdv<kDt, 128>(a, stream);
    case 192: return attn::run_bwd_dkdv<kDt, 192>(a, stream);
    default: return attn::run_bwd_dkdv<kDt, 256>(a, stream);
  }
}

template <DType kDt>
cudaError_t dq_for_bucket(const attn::BwdArgs& a, int bucket, cudaStream_t stream) {
  switch (bucket) {
    case 32: return attn::run_bwd_dq<kDt, 32>(a, stream);
    case 64: return attn::run_bwd_dq<kDt, 64>(a, stream);
    case 96: return attn::run_bwd_dq<kDt, 96>(a, stream);
    case 128: return attn::run_bwd_dq<kDt, 128>(a, stream);
    case 192: return attn::run_bwd_dq<kDt, 192>(a, stream);
    default: return attn::run_bwd_dq<kDt, 256>(a, stream);
  }
}

// dK/dV with atomic dQ on the Hopper kernel when this device, build and
// bucket have one.
template <DType kDt>
bool try_bwd_sm90(const attn::BwdArgs& a, int bucket, cudaStream_t stream, cudaError_t* err) {
  return attn::sm90::for_hopper_bucket(bucket, [&](auto b) {
    if (!attn::sm90::bwd_sm90_available<kDt, b()>()) return false;
    *err = attn::sm90::run_bwd_sm90<kDt, b()>(a, stream);
    return true;
  });
}

template <DType kDt>
cudaError_t run_bwd(const AttentionBwdParams& p, attn::BwdArgs a, cudaStream_t stream) {
  const AttentionShape& s = p.shape;
  const int bucket = attn::head_dim_bucket(static_cast<int>(s.head_dim));
  const int64_t rows = s.batch * s.seqlen_q * s.num_heads;
  const bool has_queries = rows > 0;
  const bool has_keys = s.batch * s.seqlen_k * s.num_kv_heads > 0;
  cudaError_t err = cudaSuccess;

  a.dq_accum = p.deterministic ? nullptr : p.dq_accum;  // zeroed by the delta kernel
  if (has_queries) {
    const int64_t threads = rows * attn::delta_lanes_per_row(s.head_dim);
    const int64_t blocks = (threads + attn::kDeltaThreads - 1) / attn::kDeltaThreads;
    attn::attn_bwd_delta_kernel<kDt><<<static_cast<unsigned>(blocks), attn::kDeltaThreads, 0, stream>>>(a);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
  }
  const int64_t dq_elems = rows * s.head_dim;
  if (has_keys) {
    const bool sm90 = !p.deterministic && has_queries && attn::sm90::bwd_supports(a) &&
                      try_bwd_sm90<kDt>(a, bucket, stream, &err);
    if (!sm90 && (err = attn::zero_dbias(a, stream)) == cudaSuccess)
      err = dkdv_for_bucket<kDt>(a, bucket, stream);
    if (err != cudaSuccess) return err;
  }
  if (!has_queries) return cudaSuccess;
  if (p.deterministic) return dq_for_bucket<kDt>(a, bucket, stream);

  const int64_t n8 = dq_elems / attn::kElemsPerCopy;
  const int64_t want = (n8 + attn::kConvertThreads - 1) / attn::kConvertThreads;
  const int64_t cap = int64_t(attn::multiprocessor_count()) * attn::kConvertBlocksPerSm;
  const unsigned blocks = static_cast<unsigned>(want < cap ? want : cap);
  attn::attn_bwd_dq_convert_kernel<kDt>
      <<<blocks, attn::kConvertThreads, 0, stream>>>(p.dq_accum, p.dq, n8, p.scale);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_attention_bwd(const AttentionBwdParams& p, cudaStream_t stream) {
  const AttentionShape& s = p.shape;
  if (attention_cuda_unsupported(s, p.dtype) != nullptr) return cudaErrorInvalidValue;
  const bool has_queries = s.batch * s.seqlen_q * s.num_heads > 0;
  const bool has_keys = s.batch * s.seqlen_k * s.num_kv_heads > 0;
  if (has_queries && (!p.q || !p.o || !p.d_o || !p.lse || !p.dq || !p.delta ||
                      (!p.deterministic && !p.dq_accum)))
    return cudaErrorInvalidValue;
  if (has_keys && (!p.k || !p.v || !p.dk || !p.dv)) return cudaErrorInvalidValue;

  attn::BwdArgs a{};
  if (!attn::to_kernel_args(s, p.mask, &a.shape, &a.mask)) return cudaErrorInvalidValue;
  a.scale = p.scale;
  a.q = p.q;
  a.k = p.k;
  a.v = p.v;
  a.o = p.o;
  a.d_o = p.d_o;
  a.lse = p.lse;
  a.dq = p.dq;
  a.dk = p.dk;
  a.dv = p.dv;
  a.delta = p.delta;
  a.scores = attn::to_score_args(p.scores);
  a.dbias = p.scores.bias ? p.dbias : nullptr;
  a.dbias_f32 = p.dbias_f32 ? 1 : 0;
  if (a.dbias && !a.dbias_f32 && dbias_shared(p.scores, s)) return cudaErrorInvalidValue;
  return p.dtype == DType::kBF16 ? run_bwd<DType::kBF16>(p, a, stream)
                                 : run_bwd<DType::kF16>(p, a, stream);
}

}  // namespace jaxcraft
