// Hopper backward instances for head-dim bucket 256 (one file per bucket so the
// heavy kernels compile in parallel).
#include "kernels/attention/sm90/bwd_kernel.cuh"

namespace jaxcraft {
namespace attn {
namespace sm90 {

template cudaError_t run_bwd_sm90<DType::kBF16, 256>(const BwdArgs&, cudaStream_t);
template cudaError_t run_bwd_sm90<DType::kF16, 256>(const BwdArgs&, cudaStream_t);
template bool bwd_sm90_available<DType::kBF16, 256>();
template bool bwd_sm90_available<DType::kF16, 256>();

}  // namespace sm90
}  // namespace attn
}  // namespace jaxcraft
