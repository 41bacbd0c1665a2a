// FFI handlers for the embedding lookup: buffers and attributes in, an
// EmbeddingFwdParams / EmbeddingBwdParams out to the CPU loop or the CUDA launcher.
#include <limits>
#include <optional>

#include "common/ffi/buffers.h"
#include "common/ffi/task_runner.h"
#include "cpu/embedding.h"
#include "ffi/handlers.h"
#ifdef JAXCRAFT_WITH_CUDA
#include "common/ffi/cuda_check.h"
#include "kernels/embedding/launch.h"
#endif

namespace jaxcraft {
namespace {

std::optional<EmbeddingMode> to_mode(int32_t mode) {
  switch (mode) {
    case int32_t(EmbeddingMode::kFill): return EmbeddingMode::kFill;
    case int32_t(EmbeddingMode::kClip): return EmbeddingMode::kClip;
    case int32_t(EmbeddingMode::kWrap): return EmbeddingMode::kWrap;
  }
  return std::nullopt;
}

constexpr char kBadMode[] = "embedding: mode must be 0 (fill), 1 (clip) or 2 (wrap)";

// Positions of ids are int32 in the kernels (and the sort's order).
bool fits_int32(int64_t n) { return n < std::numeric_limits<int32_t>::max(); }

ffi::ErrorOr<EmbeddingFwdParams> fwd_params(ffi::AnyBuffer table, ffi::Buffer<ffi::S32> ids,
                                            ffi::Result<ffi::AnyBuffer> out, int32_t mode,
                                            float fill_value) {
  const auto dims = table.dimensions();
  if (dims.size() != 2) return invalid("embedding expects the table as [rows, dim]");
  const auto dtype = to_dtype(table.element_type());
  if (!dtype || out->element_type() != table.element_type())
    return invalid("embedding: table and output must share a float32, bfloat16 or float16 dtype");
  const auto m = to_mode(mode);
  if (!m) return invalid(kBadMode);
  EmbeddingFwdParams p;
  p.dtype = *dtype;
  p.rows = dims[0];
  p.dim = dims[1];
  p.num_ids = int64_t(ids.element_count());
  p.mode = *m;
  p.fill_value = fill_value;
  p.table = table.untyped_data();
  p.ids = ids.typed_data();
  p.out = out->untyped_data();
  if (out->element_count() != size_t(p.num_ids) * size_t(p.dim))
    return invalid("embedding: the output must be [num_ids, dim]");
  if (p.rows < 1 && p.num_ids > 0) return invalid("embedding: cannot look up ids in an empty table");
  if (!fits_int32(p.rows) || !fits_int32(p.num_ids))
    return invalid("embedding: rows and the number of ids must be below 2^31 - 1");
  return p;
}

ffi::ErrorOr<EmbeddingBwdParams> bwd_params(ffi::AnyBuffer dout, ffi::Buffer<ffi::S32> ids,
                                            ffi::Buffer<ffi::S32> sorted_rows,
                                            ffi::Buffer<ffi::S32> order,
                                            ffi::Result<ffi::AnyBuffer> dtable,
                                            ffi::Result<ffi::Buffer<ffi::F32>> scratch,
                                            ffi::Result<ffi::Buffer<ffi::S32>> row_index,
                                            int32_t mode) {
  const auto dims = dtable->dimensions();
  if (dims.size() != 2) return invalid("embedding backward expects dtable as [rows, dim]");
  const auto dtype = to_dtype(dtable->element_type());
  if (!dtype || dout.element_type() != dtable->element_type())
    return invalid("embedding backward: dout and dtable must share a float dtype");
  const auto m = to_mode(mode);
  if (!m) return invalid(kBadMode);
  EmbeddingBwdParams p;
  p.dtype = *dtype;
  p.rows = dims[0];
  p.dim = dims[1];
  p.num_ids = int64_t(ids.element_count());
  p.mode = *m;
  p.dout = dout.untyped_data();
  p.ids = ids.typed_data();
  p.sorted_rows = static_cast<const int32_t*>(data_or_null(sorted_rows));
  p.order = static_cast<const int32_t*>(data_or_null(order));
  p.dtable = dtable->untyped_data();
  p.scratch = static_cast<float*>(data_or_null(*scratch));
  p.row_index = static_cast<int32_t*>(data_or_null(*row_index));
  if (dout.element_count() != size_t(p.num_ids) * size_t(p.dim))
    return invalid("embedding backward: dout must be [num_ids, dim]");
  if (p.sorted_rows && (sorted_rows.element_count() != size_t(p.num_ids) ||
                        order.element_count() != size_t(p.num_ids)))
    return invalid("embedding backward: sorted_rows and order must have one entry per id");
  if (!p.row_index ||
      row_index->element_count() != size_t(embedding_index_entries(p.rows, p.num_ids)))
    return invalid("embedding backward: row_index must have 3 * rows + 1 + num_ids entries");
  if (p.scratch && scratch->element_count() != size_t(p.num_ids) * size_t(p.dim))
    return invalid("embedding backward: scratch must be [num_ids, dim]");
  if (!fits_int32(p.rows) || !fits_int32(p.num_ids))
    return invalid("embedding backward: rows and the number of ids must be below 2^31 - 1");
  return p;
}

// The argument list shared by the CPU and CUDA handlers; `b` carries what
// comes first (the thread pool on CPU, the stream on CUDA).
template <typename Binding>
auto fwd_binding(Binding b) {
  return std::move(b)
      .template Arg<ffi::AnyBuffer>()          // table [rows, dim]
      .template Arg<ffi::Buffer<ffi::S32>>()   // ids [num_ids]
      .template Ret<ffi::AnyBuffer>()          // out [num_ids, dim]
      .template Attr<int32_t>("mode")
      .template Attr<float>("fill_value");
}

template <typename Binding>
auto bwd_binding(Binding b) {
  return std::move(b)
      .template Arg<ffi::AnyBuffer>()          // dout [num_ids, dim]
      .template Arg<ffi::Buffer<ffi::S32>>()   // ids [num_ids]
      .template Arg<ffi::Buffer<ffi::S32>>()   // sorted rows (empty: fast path)
      .template Arg<ffi::Buffer<ffi::S32>>()   // their positions (empty: fast path)
      .template Ret<ffi::AnyBuffer>()          // dtable [rows, dim]
      .template Ret<ffi::Buffer<ffi::F32>>()   // scratch [num_ids, dim] (empty: unused)
      .template Ret<ffi::Buffer<ffi::S32>>()   // row index scratch [3 * rows + 1 + num_ids]
      .template Attr<int32_t>("mode");
}

ffi::Error embedding_fwd_cpu_impl(ffi::ThreadPool pool, ffi::AnyBuffer table,
                                  ffi::Buffer<ffi::S32> ids, ffi::Result<ffi::AnyBuffer> out,
                                  int32_t mode, float fill_value) {
  auto p = fwd_params(table, ids, out, mode, fill_value);
  if (p.has_error()) return p.error();
  FfiTaskRunner runner(pool);
  embedding_fwd_cpu(p.value(), &runner);
  return ffi::Error::Success();
}

ffi::Error embedding_bwd_cpu_impl(ffi::ThreadPool pool, ffi::AnyBuffer dout,
                                  ffi::Buffer<ffi::S32> ids, ffi::Buffer<ffi::S32> sorted_rows,
                                  ffi::Buffer<ffi::S32> order, ffi::Result<ffi::AnyBuffer> dtable,
                                  ffi::Result<ffi::Buffer<ffi::F32>> scratch,
                                  ffi::Result<ffi::Buffer<ffi::S32>> row_index, int32_t mode) {
  auto p = bwd_params(dout, ids, sorted_rows, order, dtable, scratch, row_index, mode);
  if (p.has_error()) return p.error();
  FfiTaskRunner runner(pool);
  embedding_bwd_cpu(p.value(), &runner);
  return ffi::Error::Success();
}

#ifdef JAXCRAFT_WITH_CUDA
ffi::Error embedding_fwd_cuda_impl(cudaStream_t stream, ffi::AnyBuffer table,
                                   ffi::Buffer<ffi::S32> ids, ffi::Result<ffi::AnyBuffer> out,
                                   int32_t mode, float fill_value) {
  auto p = fwd_params(table, ids, out, mode, fill_value);
  if (p.has_error()) return p.error();
  return cuda_error(launch_embedding_fwd(p.value(), stream), "embedding forward launch");
}

ffi::Error embedding_bwd_cuda_impl(cudaStream_t stream, ffi::AnyBuffer dout,
                                   ffi::Buffer<ffi::S32> ids, ffi::Buffer<ffi::S32> sorted_rows,
                                   ffi::Buffer<ffi::S32> order, ffi::Result<ffi::AnyBuffer> dtable,
                                   ffi::Result<ffi::Buffer<ffi::F32>> scratch,
                                   ffi::Result<ffi::Buffer<ffi::S32>> row_index, int32_t mode) {
  auto p = bwd_params(dout, ids, sorted_rows, order, dtable, scratch, row_index, mode);
  if (p.has_error()) return p.error();
  return cuda_error(launch_embedding_bwd(p.value(), stream), "embedding backward launch");
}
#endif

}  // namespace
}  // namespace jaxcraft

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxcraft_embedding_fwd_cpu, jaxcraft::embedding_fwd_cpu_impl,
                              jaxcraft::fwd_binding(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxcraft_embedding_bwd_cpu, jaxcraft::embedding_bwd_cpu_impl,
                              jaxcraft::bwd_binding(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));
#ifdef JAXCRAFT_WITH_CUDA
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    jaxcraft_embedding_fwd_cuda, jaxcraft::embedding_fwd_cuda_impl,
    jaxcraft::fwd_binding(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
    {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    jaxcraft_embedding_bwd_cuda, jaxcraft::embedding_bwd_cuda_impl,
    jaxcraft::bwd_binding(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
    {ffi::Traits::kCmdBufferCompatible});
#endif
