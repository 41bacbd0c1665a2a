// The Python extension: hands JAX the FFI handlers, grouped by platform.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <optional>
#include <string>

#include "contract/attention.h"
#include "contract/decode.h"
#include "cpu/blocked.h"
#include "cpu/row_convert.h"
#include "ffi/handlers.h"

namespace nb = nanobind;

namespace {

template <typename Fn>
nb::capsule capsule(Fn* fn) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}

std::optional<std::string> reason(const char* why) {
  return why ? std::optional<std::string>(why) : std::nullopt;
}

// The dtype names numpy gives (np.dtype(...).name); anything else is not a kernel dtype.
std::optional<jaxcraft::DType> dtype_named(const std::string& name) {
  if (name == "float32") return jaxcraft::DType::kF32;
  if (name == "bfloat16") return jaxcraft::DType::kBF16;
  if (name == "float16") return jaxcraft::DType::kF16;
  return std::nullopt;
}

}  // namespace

NB_MODULE(_jaxcraft, m) {
  m.def("registrations", []() {
    nb::dict cpu, cuda;
#define JAXCRAFT_REGISTER_CPU(name) cpu["jaxcraft_" #name] = capsule(jaxcraft_##name##_cpu);
    JAXCRAFT_FFI_TARGETS(JAXCRAFT_REGISTER_CPU)
#ifdef JAXCRAFT_WITH_CUDA
#define JAXCRAFT_REGISTER_CUDA(name) cuda["jaxcraft_" #name] = capsule(jaxcraft_##name##_cuda);
    JAXCRAFT_FFI_TARGETS(JAXCRAFT_REGISTER_CUDA)
#endif
    nb::dict out;
    out["cpu"] = cpu;
    out["CUDA"] = cuda;
    return out;
  });
  // Why the CUDA kernels cannot take an input (None: they can), from the
  // rules the handlers apply (contract/<op>.h), so Python never restates them.
  m.def(
      "attention_cuda_unsupported",
      [](int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t num_heads, int64_t num_kv_heads,
         int64_t head_dim, const std::string& dtype) {
        const auto dt = dtype_named(dtype);
        if (!dt) return reason("the CUDA attention kernels take bfloat16 or float16");
        return reason(jaxcraft::attention_cuda_unsupported(
            {batch, seqlen_q, seqlen_k, num_heads, num_kv_heads, head_dim}, *dt));
      },
      nb::arg("batch"), nb::arg("seqlen_q"), nb::arg("seqlen_k"), nb::arg("num_heads"),
      nb::arg("num_kv_heads"), nb::arg("head_dim"), nb::arg("dtype"));
  m.def(
      "decode_attention_cuda_unsupported",
      [](int64_t head_dim, int64_t cache_rows, int64_t capacity) {
        return reason(jaxcraft::decode_attention_cuda_unsupported(head_dim, cache_rows, capacity));
      },
      nb::arg("head_dim"), nb::arg("cache_rows"), nb::arg("capacity"));
  // The CPU paths chosen at run time (cpu/blocked.h, cpu/row_convert.h), for the tests.
  m.def("cpu_gemm_lanes", &jaxcraft::cpu::gemm_lanes);
  m.def("cpu_f16c_rows", &jaxcraft::cpu::f16c_rows);
  m.attr("with_cuda") =
#ifdef JAXCRAFT_WITH_CUDA
      true;
#else
      false;
#endif
}
