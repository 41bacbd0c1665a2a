// FFI handlers for layer norm / RMS norm: buffers and attributes in, a
// NormFwdParams / NormBwdParams out to the CPU loop or the CUDA launcher.
#include "common/ffi/buffers.h"
#include "common/ffi/task_runner.h"
#include "cpu/norm.h"
#include "ffi/handlers.h"
#ifdef JAXCRAFT_WITH_CUDA
#include "common/ffi/cuda_check.h"
#include "kernels/norm/launch.h"
#endif

namespace jaxcraft {
namespace {

ffi::ErrorOr<NormFwdParams> fwd_params(ffi::AnyBuffer x, ffi::AnyBuffer residual,
                                       ffi::Buffer<ffi::F32> scale, ffi::Buffer<ffi::F32> bias,
                                       ffi::Result<ffi::AnyBuffer> y,
                                       ffi::Result<ffi::AnyBuffer> h_out,
                                       ffi::Result<ffi::Buffer<ffi::F32>> mean,
                                       ffi::Result<ffi::Buffer<ffi::F32>> rstd, float epsilon,
                                       bool rms) {
  const auto dims = x.dimensions();
  if (dims.size() != 2) return invalid("norm expects x as [rows, cols]");
  const auto dtype = to_dtype(x.element_type());
  if (!dtype) return invalid("norm: x must be float32, bfloat16 or float16");
  NormFwdParams p;
  p.dtype = *dtype;
  p.rows = dims[0];
  p.cols = dims[1];
  p.epsilon = epsilon;
  p.rms = rms;
  p.x = x.untyped_data();
  p.residual = data_or_null(residual);
  p.scale = static_cast<const float*>(data_or_null(scale));
  p.bias = static_cast<const float*>(data_or_null(bias));
  p.y = y->untyped_data();
  p.h_out = data_or_null(*h_out);
  p.mean = static_cast<float*>(data_or_null(*mean));
  p.rstd = rstd->typed_data();
  if (p.residual && residual.element_count() != x.element_count())
    return invalid("norm: residual must have the shape of x");
  if ((p.scale && scale.element_count() != size_t(p.cols)) ||
      (p.bias && bias.element_count() != size_t(p.cols)))
    return invalid("norm: scale and bias must have cols elements");
  if (!rms && !p.mean) return invalid("layer norm needs the mean output");
  return p;
}

ffi::ErrorOr<NormBwdParams> bwd_params(ffi::AnyBuffer dy, ffi::AnyBuffer h,
                                       ffi::Buffer<ffi::F32> scale, ffi::Buffer<ffi::F32> mean,
                                       ffi::Buffer<ffi::F32> rstd, ffi::AnyBuffer dh_extra,
                                       ffi::Result<ffi::AnyBuffer> dh,
                                       ffi::Result<ffi::Buffer<ffi::F32>> dscale_partial,
                                       ffi::Result<ffi::Buffer<ffi::F32>> dbias_partial,
                                       bool rms) {
  const auto dims = dy.dimensions();
  if (dims.size() != 2) return invalid("norm backward expects dy as [rows, cols]");
  const auto dtype = to_dtype(dy.element_type());
  if (!dtype || dy.element_type() != h.element_type())
    return invalid("norm backward: dy and h must share a float dtype");
  NormBwdParams p;
  p.dtype = *dtype;
  p.rows = dims[0];
  p.cols = dims[1];
  p.rms = rms;
  p.dy = dy.untyped_data();
  p.h = h.untyped_data();
  p.scale = static_cast<const float*>(data_or_null(scale));
  p.mean = static_cast<const float*>(data_or_null(mean));
  p.rstd = rstd.typed_data();
  p.dh_extra = data_or_null(dh_extra);
  p.dh = dh->untyped_data();
  p.dscale_partial = static_cast<float*>(data_or_null(*dscale_partial));
  p.dbias_partial = static_cast<float*>(data_or_null(*dbias_partial));
  const auto part_dims = (p.dscale_partial ? dscale_partial : dbias_partial)->dimensions();
  p.num_partials = part_dims.size() == 2 ? part_dims[0] : 1;
  if (p.num_partials < 1) return invalid("norm backward: need at least one partial row");
  if (!rms && !p.mean) return invalid("layer norm backward needs the mean");
  return p;
}

// The argument list shared by the CPU and CUDA handlers; `b` carries what
// comes first (the thread pool on CPU, the stream on CUDA).
template <typename Binding>
auto fwd_binding(Binding b) {
  return std::move(b)
      .template Arg<ffi::AnyBuffer>()          // x
      .template Arg<ffi::AnyBuffer>()          // residual (empty: none)
      .template Arg<ffi::Buffer<ffi::F32>>()   // scale (empty: none)
      .template Arg<ffi::Buffer<ffi::F32>>()   // bias (empty: none)
      .template Ret<ffi::AnyBuffer>()          // y
      .template Ret<ffi::AnyBuffer>()          // h = x + residual (empty without residual)
      .template Ret<ffi::Buffer<ffi::F32>>()   // mean (empty for RMS)
      .template Ret<ffi::Buffer<ffi::F32>>()   // rstd
      .template Attr<float>("epsilon")
      .template Attr<bool>("rms");
}

template <typename Binding>
auto bwd_binding(Binding b) {
  return std::move(b)
      .template Arg<ffi::AnyBuffer>()          // dy
      .template Arg<ffi::AnyBuffer>()          // h
      .template Arg<ffi::Buffer<ffi::F32>>()   // scale (empty: none)
      .template Arg<ffi::Buffer<ffi::F32>>()   // mean (empty for RMS)
      .template Arg<ffi::Buffer<ffi::F32>>()   // rstd
      .template Arg<ffi::AnyBuffer>()          // cotangent of h (empty: none)
      .template Ret<ffi::AnyBuffer>()          // dh
      .template Ret<ffi::Buffer<ffi::F32>>()   // dscale partial sums (empty: not wanted)
      .template Ret<ffi::Buffer<ffi::F32>>()   // dbias partial sums (empty: not wanted)
      .template Attr<bool>("rms");
}

ffi::Error norm_fwd_cpu_impl(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::AnyBuffer residual, ffi::Buffer<ffi::F32> scale,
                             ffi::Buffer<ffi::F32> bias, ffi::Result<ffi::AnyBuffer> y,
                             ffi::Result<ffi::AnyBuffer> h_out,
                             ffi::Result<ffi::Buffer<ffi::F32>> mean,
                             ffi::Result<ffi::Buffer<ffi::F32>> rstd, float epsilon, bool rms) {
  auto p = fwd_params(x, residual, scale, bias, y, h_out, mean, rstd, epsilon, rms);
  if (p.has_error()) return p.error();
  FfiTaskRunner runner(pool);
  norm_fwd_cpu(p.value(), &runner);
  return ffi::Error::Success();
}

ffi::Error norm_bwd_cpu_impl(ffi::ThreadPool pool, ffi::AnyBuffer dy, ffi::AnyBuffer h, ffi::Buffer<ffi::F32> scale,
                             ffi::Buffer<ffi::F32> mean, ffi::Buffer<ffi::F32> rstd,
                             ffi::AnyBuffer dh_extra, ffi::Result<ffi::AnyBuffer> dh,
                             ffi::Result<ffi::Buffer<ffi::F32>> dscale_partial,
                             ffi::Result<ffi::Buffer<ffi::F32>> dbias_partial, bool rms) {
  auto p = bwd_params(dy, h, scale, mean, rstd, dh_extra, dh, dscale_partial, dbias_partial, rms);
  if (p.has_error()) return p.error();
  FfiTaskRunner runner(pool);
  norm_bwd_cpu(p.value(), &runner);
  return ffi::Error::Success();
}

#ifdef JAXCRAFT_WITH_CUDA
ffi::Error norm_fwd_cuda_impl(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer residual,
                              ffi::Buffer<ffi::F32> scale, ffi::Buffer<ffi::F32> bias,
                              ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::AnyBuffer> h_out,
                              ffi::Result<ffi::Buffer<ffi::F32>> mean,
                              ffi::Result<ffi::Buffer<ffi::F32>> rstd, float epsilon, bool rms) {
  auto p = fwd_params(x, residual, scale, bias, y, h_out, mean, rstd, epsilon, rms);
  if (p.has_error()) return p.error();
  return cuda_error(launch_norm_fwd(p.value(), stream), "norm forward launch");
}

ffi::Error norm_bwd_cuda_impl(cudaStream_t stream, ffi::AnyBuffer dy, ffi::AnyBuffer h,
                              ffi::Buffer<ffi::F32> scale, ffi::Buffer<ffi::F32> mean,
                              ffi::Buffer<ffi::F32> rstd, ffi::AnyBuffer dh_extra,
                              ffi::Result<ffi::AnyBuffer> dh,
                              ffi::Result<ffi::Buffer<ffi::F32>> dscale_partial,
                              ffi::Result<ffi::Buffer<ffi::F32>> dbias_partial, bool rms) {
  auto p = bwd_params(dy, h, scale, mean, rstd, dh_extra, dh, dscale_partial, dbias_partial, rms);
  if (p.has_error()) return p.error();
  return cuda_error(launch_norm_bwd(p.value(), stream), "norm backward launch");
}
#endif

}  // namespace
}  // namespace jaxcraft

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxcraft_norm_fwd_cpu, jaxcraft::norm_fwd_cpu_impl,
                              jaxcraft::fwd_binding(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxcraft_norm_bwd_cpu, jaxcraft::norm_bwd_cpu_impl,
                              jaxcraft::bwd_binding(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));
#ifdef JAXCRAFT_WITH_CUDA
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    jaxcraft_norm_fwd_cuda, jaxcraft::norm_fwd_cuda_impl,
    jaxcraft::fwd_binding(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
    {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    jaxcraft_norm_bwd_cuda, jaxcraft::norm_bwd_cuda_impl,
    jaxcraft::bwd_binding(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
    {ffi::Traits::kCmdBufferCompatible});
#endif
