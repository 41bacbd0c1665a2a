// FFI handlers for softmax over the last axis: buffers in, a
// SoftmaxFwdParams / SoftmaxBwdParams out to the CPU loop or the CUDA launcher.
#include "common/ffi/buffers.h"
#include "common/ffi/task_runner.h"
#include "cpu/softmax.h"
#include "ffi/handlers.h"
#ifdef JAXCRAFT_WITH_CUDA
#include "common/ffi/cuda_check.h"
#include "kernels/softmax/launch.h"
#endif

namespace jaxcraft {
namespace {

// x, y: [rows, cols] of one float dtype; mask: empty, [1, cols] or [rows, cols].
ffi::ErrorOr<SoftmaxFwdParams> fwd_params(ffi::AnyBuffer x, ffi::Buffer<ffi::PRED> mask,
                                          ffi::Result<ffi::AnyBuffer> y) {
  const auto dtype = to_dtype(x.element_type());
  if (!dtype) return invalid("softmax: x must be float32, bfloat16 or float16");
  const auto xd = x.dimensions(), yd = y->dimensions();
  if (xd.size() != 2 || yd.size() != 2 || xd[0] != yd[0] || xd[1] != yd[1])
    return invalid("softmax: x and y must be [rows, cols] of the same shape");
  if (y->element_type() != x.element_type()) return invalid("softmax: x and y must share a dtype");
  SoftmaxFwdParams p;
  p.dtype = *dtype;
  p.rows = xd[0];
  p.cols = xd[1];
  p.x = x.untyped_data();
  p.y = y->untyped_data();
  if (mask.element_count() > 0) {
    const auto md = mask.dimensions();
    if (md.size() != 2 || md[1] != p.cols || (md[0] != 1 && md[0] != p.rows))
      return invalid("softmax: mask must be [1, cols] or [rows, cols]");
    p.mask = reinterpret_cast<const uint8_t*>(mask.untyped_data());
    p.mask_row_stride = md[0] == 1 ? 0 : p.cols;
  }
  return p;
}

ffi::ErrorOr<SoftmaxBwdParams> bwd_params(ffi::AnyBuffer y, ffi::AnyBuffer dy,
                                          ffi::Result<ffi::AnyBuffer> dx) {
  const auto dtype = to_dtype(y.element_type());
  if (!dtype) return invalid("softmax backward: y must be float32, bfloat16 or float16");
  const auto yd = y.dimensions();
  if (yd.size() != 2) return invalid("softmax backward: y must be [rows, cols]");
  for (const ffi::AnyBuffer* b : {&dy, &*dx}) {
    if (b->element_type() != y.element_type() || b->dimensions().size() != 2 ||
        b->dimensions()[0] != yd[0] || b->dimensions()[1] != yd[1])
      return invalid("softmax backward: y, dy and dx must share a shape and dtype");
  }
  SoftmaxBwdParams p;
  p.dtype = *dtype;
  p.rows = yd[0];
  p.cols = yd[1];
  p.y = y.untyped_data();
  p.dy = dy.untyped_data();
  p.dx = dx->untyped_data();
  return p;
}

// The argument list shared by the CPU and CUDA handlers; `b` carries what
// comes first (the thread pool on CPU, the stream on CUDA).
template <typename Binding>
auto fwd_binding(Binding b) {
  return std::move(b)
      .template Arg<ffi::AnyBuffer>()          // x
      .template Arg<ffi::Buffer<ffi::PRED>>()  // where mask (empty: all kept)
      .template Ret<ffi::AnyBuffer>();         // y
}

template <typename Binding>
auto bwd_binding(Binding b) {
  return std::move(b)
      .template Arg<ffi::AnyBuffer>()   // y (the forward's output)
      .template Arg<ffi::AnyBuffer>()   // dy
      .template Ret<ffi::AnyBuffer>();  // dx
}

ffi::Error fwd_cpu_impl(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::Buffer<ffi::PRED> mask,
                        ffi::Result<ffi::AnyBuffer> y) {
  auto p = fwd_params(x, mask, y);
  if (p.has_error()) return p.error();
  FfiTaskRunner runner(pool);
  softmax_fwd_cpu(p.value(), &runner);
  return ffi::Error::Success();
}

ffi::Error bwd_cpu_impl(ffi::ThreadPool pool, ffi::AnyBuffer y, ffi::AnyBuffer dy,
                        ffi::Result<ffi::AnyBuffer> dx) {
  auto p = bwd_params(y, dy, dx);
  if (p.has_error()) return p.error();
  FfiTaskRunner runner(pool);
  softmax_bwd_cpu(p.value(), &runner);
  return ffi::Error::Success();
}

#ifdef JAXCRAFT_WITH_CUDA
ffi::Error fwd_cuda_impl(cudaStream_t stream, ffi::AnyBuffer x, ffi::Buffer<ffi::PRED> mask,
                         ffi::Result<ffi::AnyBuffer> y) {
  auto p = fwd_params(x, mask, y);
  if (p.has_error()) return p.error();
  return cuda_error(launch_softmax_fwd(p.value(), stream), "softmax forward launch");
}

ffi::Error bwd_cuda_impl(cudaStream_t stream, ffi::AnyBuffer y, ffi::AnyBuffer dy,
                         ffi::Result<ffi::AnyBuffer> dx) {
  auto p = bwd_params(y, dy, dx);
  if (p.has_error()) return p.error();
  return cuda_error(launch_softmax_bwd(p.value(), stream), "softmax backward launch");
}
#endif

}  // namespace
}  // namespace jaxcraft

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxcraft_softmax_fwd_cpu, jaxcraft::fwd_cpu_impl,
                              jaxcraft::fwd_binding(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxcraft_softmax_bwd_cpu, jaxcraft::bwd_cpu_impl,
                              jaxcraft::bwd_binding(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));
#ifdef JAXCRAFT_WITH_CUDA
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    jaxcraft_softmax_fwd_cuda, jaxcraft::fwd_cuda_impl,
    jaxcraft::fwd_binding(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
    {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    jaxcraft_softmax_bwd_cuda, jaxcraft::bwd_cuda_impl,
    jaxcraft::bwd_binding(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
    {ffi::Traits::kCmdBufferCompatible});
#endif
