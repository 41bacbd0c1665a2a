// Hopper forward instances for head-dim bucket 256 (one file per bucket so the
// heavy kernels compile in parallel).
#include "kernels/attention/sm90/fwd_kernel.cuh"

namespace jaxcraft {
namespace attn {
namespace sm90 {

template cudaError_t run_fwd_sm90<DType::kBF16, 256>(const FwdArgs&, cudaStream_t);
template cudaError_t run_fwd_sm90<DType::kF16, 256>(const FwdArgs&, cudaStream_t);
template bool fwd_sm90_available<DType::kBF16, 256>();
template bool fwd_sm90_available<DType::kF16, 256>();

}  // namespace sm90
}  // namespace attn
}  // namespace jaxcraft
