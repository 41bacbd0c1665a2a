// cudaError_t -> ffi::Error. Handlers never abort: a failed launch becomes an
// XLA error the user sees as a Python exception.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "xla/ffi/api/ffi.h"

namespace jaxcraft {

inline xla::ffi::Error cuda_error(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return xla::ffi::Error::Success();
  return xla::ffi::Error::Internal(std::string("jaxcraft: ") + what + ": " +
                                   cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

}  // namespace jaxcraft
