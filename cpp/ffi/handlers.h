// Every FFI target, declared once: X(name) for the target "jaxcraft_<name>",
// whose handlers are jaxcraft_<name>_cpu and (CUDA builds) jaxcraft_<name>_cuda,
// defined in ffi/<op>.cc. Names are an ABI: <op>_<fwd|bwd>[_vN], a new N for a
// changed signature.
#pragma once
#include "xla/ffi/api/c_api.h"

#define JAXCRAFT_FFI_TARGETS(X) \
  X(norm_fwd)                   \
  X(norm_bwd)                   \
  X(attention_fwd_v3)           \
  X(attention_bwd_v2)           \
  X(decode_attention_fwd)       \
  X(activation_fwd)             \
  X(activation_bwd)             \
  X(embedding_fwd)              \
  X(embedding_bwd)              \
  X(softmax_fwd)                \
  X(softmax_bwd)

#define JAXCRAFT_DECLARE_HANDLER(name) extern "C" XLA_FFI_Error* name(XLA_FFI_CallFrame*);
#define JAXCRAFT_DECLARE_CPU(name) JAXCRAFT_DECLARE_HANDLER(jaxcraft_##name##_cpu)
#define JAXCRAFT_DECLARE_CUDA(name) JAXCRAFT_DECLARE_HANDLER(jaxcraft_##name##_cuda)
JAXCRAFT_FFI_TARGETS(JAXCRAFT_DECLARE_CPU)
#ifdef JAXCRAFT_WITH_CUDA
JAXCRAFT_FFI_TARGETS(JAXCRAFT_DECLARE_CUDA)
#endif
