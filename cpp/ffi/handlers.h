// Every FFI handler symbol, for module.cc to hand to JAX. Names are an ABI:
// jaxcraft_<op>_<fwd|bwd>[_vN]_<platform>.
#pragma once
#include "xla/ffi/api/c_api.h"

#define JAXCRAFT_DECLARE_HANDLER(name) extern "C" XLA_FFI_Error* name(XLA_FFI_CallFrame*)

JAXCRAFT_DECLARE_HANDLER(jaxcraft_norm_fwd_cpu);
JAXCRAFT_DECLARE_HANDLER(jaxcraft_norm_bwd_cpu);
JAXCRAFT_DECLARE_HANDLER(jaxcraft_attention_fwd_v3_cpu);
JAXCRAFT_DECLARE_HANDLER(jaxcraft_attention_bwd_v2_cpu);
JAXCRAFT_DECLARE_HANDLER(jaxcraft_decode_attention_fwd_cpu);
JAXCRAFT_DECLARE_HANDLER(jaxcraft_activation_fwd_cpu);
JAXCRAFT_DECLARE_HANDLER(jaxcraft_activation_bwd_cpu);
JAXCRAFT_DECLARE_HANDLER(jaxcraft_embedding_fwd_cpu);
JAXCRAFT_DECLARE_HANDLER(jaxcraft_embedding_bwd_cpu);
JAXCRAFT_DECLARE_HANDLER(jaxcraft_softmax_fwd_cpu);
JAXCRAFT_DECLARE_HANDLER(jaxcraft_softmax_bwd_cpu);
#ifdef JAXCRAFT_WITH_CUDA
JAXCRAFT_DECLARE_HANDLER(jaxcraft_norm_fwd_cuda);
JAXCRAFT_DECLARE_HANDLER(jaxcraft_norm_bwd_cuda);
JAXCRAFT_DECLARE_HANDLER(jaxcraft_attention_fwd_v3_cuda);
JAXCRAFT_DECLARE_HANDLER(jaxcraft_attention_bwd_v2_cuda);
JAXCRAFT_DECLARE_HANDLER(jaxcraft_decode_attention_fwd_cuda);
JAXCRAFT_DECLARE_HANDLER(jaxcraft_activation_fwd_cuda);
JAXCRAFT_DECLARE_HANDLER(jaxcraft_activation_bwd_cuda);
JAXCRAFT_DECLARE_HANDLER(jaxcraft_embedding_fwd_cuda);
JAXCRAFT_DECLARE_HANDLER(jaxcraft_embedding_bwd_cuda);
JAXCRAFT_DECLARE_HANDLER(jaxcraft_softmax_fwd_cuda);
JAXCRAFT_DECLARE_HANDLER(jaxcraft_softmax_bwd_cuda);
#endif
