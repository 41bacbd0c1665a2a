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
