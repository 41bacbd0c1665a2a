// Kernel instances for head-dim bucket 256 (one file per bucket so the heavy
// templates compile in parallel).
#include "kernels/attention/bwd_dkdv_kernel.cuh"
#include "kernels/attention/bwd_dq_kernel.cuh"
#include "kernels/attention/fwd_kernel.cuh"

namespace jaxcraft {
namespace attn {

template cudaError_t run_fwd<DType::kBF16, 256>(const FwdArgs&, cudaStream_t);
template cudaError_t run_fwd<DType::kF16, 256>(const FwdArgs&, cudaStream_t);
template cudaError_t run_bwd_dkdv<DType::kBF16, 256>(const BwdArgs&, cudaStream_t);
template cudaError_t run_bwd_dkdv<DType::kF16, 256>(const BwdArgs&, cudaStream_t);
template cudaError_t run_bwd_dq<DType::kBF16, 256>(const BwdArgs&, cudaStream_t);
template cudaError_t run_bwd_dq<DType::kF16, 256>(const BwdArgs&, cudaStream_t);

}  // namespace attn
}  // namespace jaxcraft
