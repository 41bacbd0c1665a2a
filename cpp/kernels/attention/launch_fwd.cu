// Forward launcher: validates the contract and picks the head-dim bucket.
#include "kernels/attention/host_args.h"
#include "kernels/attention/launch.h"
#include "kernels/attention/sm90/entry.h"

namespace jaxcraft {
namespace {

template <DType kDt>
cudaError_t fwd_for_bucket(const attn::FwdArgs& a, int bucket, cudaStream_t stream) {
  switch (bucket) {
    case 32: return attn::run_fwd<kDt, 32>(a, stream);
    case 64: return attn::run_fwd<kDt, 64>(a, stream);
    case 96: return attn::run_fwd<kDt, 96>(a, stream);
    case 128: return attn::run_fwd<kDt, 128>(a, stream);
    case 192: return attn::run_fwd<kDt, 192>(a, stream);
    default: return attn::run_fwd<kDt, 256>(a, stream);
  }
}

// Runs the Hopper kernel when this device, build and bucket have one.
template <DType kDt>
bool try_fwd_sm90(const attn::FwdArgs& a, int bucket, cudaStream_t stream, cudaError_t* err) {
  return attn::sm90::for_hopper_bucket(bucket, [&](auto b) {
    if (!attn::sm90::fwd_sm90_available<kDt, b()>()) return false;
    *err = attn::sm90::run_fwd_sm90<kDt, b()>(a, stream);
    return true;
  });
}

}  // namespace

cudaError_t launch_attention_fwd(const AttentionFwdParams& p, cudaStream_t stream) {
  const AttentionShape& s = p.shape;
  if (attention_cuda_unsupported(s, p.dtype) != nullptr) return cudaErrorInvalidValue;
  if (s.batch == 0 || s.seqlen_q == 0 || s.num_heads == 0) return cudaSuccess;
  const bool has_keys = s.seqlen_k > 0;
  if (!p.q || !p.o || !p.lse || (has_keys && (!p.k || !p.v))) return cudaErrorInvalidValue;

  attn::FwdArgs a{};
  if (!attn::to_kernel_args(s, p.mask, &a.shape, &a.mask)) return cudaErrorInvalidValue;
  a.scale = p.scale;
  a.q = p.q;
  a.k = p.k;
  a.v = p.v;
  a.o = p.o;
  a.lse = p.lse;
  a.tile_counter = p.tile_counter;
  a.scores = attn::to_score_args(p.scores);
  const int bucket = attn::head_dim_bucket(static_cast<int>(s.head_dim));
  cudaError_t err = cudaSuccess;
  const bool sm90 = has_keys && attn::sm90::fwd_supports(a) && (p.dtype == DType::kBF16 ? try_fwd_sm90<DType::kBF16>(a, bucket, stream, &err)
                                                          : try_fwd_sm90<DType::kF16>(a, bucket, stream, &err));
  if (sm90) return err;
  return p.dtype == DType::kBF16 ? fwd_for_bucket<DType::kBF16>(a, bucket, stream)
                                 : fwd_for_bucket<DType::kF16>(a, bucket, stream);
}

}  // namespace jaxcraft
