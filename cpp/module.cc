// The Python extension: hands JAX the FFI handlers, grouped by platform.
#include <nanobind/nanobind.h>

#include "cpu/blocked.h"
#include "cpu/row_convert.h"
#include "ffi/handlers.h"

namespace nb = nanobind;

namespace {

template <typename Fn>
nb::capsule capsule(Fn* fn) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}

}  // namespace

NB_MODULE(_jaxcraft, m) {
  m.def("registrations", []() {
    nb::dict cpu, cuda;
    cpu["jaxcraft_norm_fwd"] = capsule(jaxcraft_norm_fwd_cpu);
    cpu["jaxcraft_norm_bwd"] = capsule(jaxcraft_norm_bwd_cpu);
    cpu["jaxcraft_attention_fwd_v3"] = capsule(jaxcraft_attention_fwd_v3_cpu);
    cpu["jaxcraft_attention_bwd_v2"] = capsule(jaxcraft_attention_bwd_v2_cpu);
    cpu["jaxcraft_decode_attention_fwd"] = capsule(jaxcraft_decode_attention_fwd_cpu);
    cpu["jaxcraft_activation_fwd"] = capsule(jaxcraft_activation_fwd_cpu);
    cpu["jaxcraft_activation_bwd"] = capsule(jaxcraft_activation_bwd_cpu);
    cpu["jaxcraft_embedding_fwd"] = capsule(jaxcraft_embedding_fwd_cpu);
    cpu["jaxcraft_embedding_bwd"] = capsule(jaxcraft_embedding_bwd_cpu);
    cpu["jaxcraft_softmax_fwd"] = capsule(jaxcraft_softmax_fwd_cpu);
    cpu["jaxcraft_softmax_bwd"] = capsule(jaxcraft_softmax_bwd_cpu);
#ifdef JAXCRAFT_WITH_CUDA
    cuda["jaxcraft_norm_fwd"] = capsule(jaxcraft_norm_fwd_cuda);
    cuda["jaxcraft_norm_bwd"] = capsule(jaxcraft_norm_bwd_cuda);
    cuda["jaxcraft_attention_fwd_v3"] = capsule(jaxcraft_attention_fwd_v3_cuda);
    cuda["jaxcraft_attention_bwd_v2"] = capsule(jaxcraft_attention_bwd_v2_cuda);
    cuda["jaxcraft_decode_attention_fwd"] = capsule(jaxcraft_decode_attention_fwd_cuda);
    cuda["jaxcraft_activation_fwd"] = capsule(jaxcraft_activation_fwd_cuda);
    cuda["jaxcraft_activation_bwd"] = capsule(jaxcraft_activation_bwd_cuda);
    cuda["jaxcraft_embedding_fwd"] = capsule(jaxcraft_embedding_fwd_cuda);
    cuda["jaxcraft_embedding_bwd"] = capsule(jaxcraft_embedding_bwd_cuda);
    cuda["jaxcraft_softmax_fwd"] = capsule(jaxcraft_softmax_fwd_cuda);
    cuda["jaxcraft_softmax_bwd"] = capsule(jaxcraft_softmax_bwd_cuda);
#endif
    nb::dict out;
    out["cpu"] = cpu;
    out["CUDA"] = cuda;
    return out;
  });
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
