// Small adapters between XLA FFI buffers and the kernels' Params structs.
// Only FFI handler files include this.
#pragma once
#include <optional>
#include <string>

#include "contract/dtype.h"
#include "xla/ffi/api/ffi.h"

namespace jaxcraft {

namespace ffi = xla::ffi;

// The three floating types every kernel handles; anything else is a caller bug
// that the Python layer should have rejected first.
inline std::optional<DType> to_dtype(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F32: return DType::kF32;
    case ffi::DataType::BF16: return DType::kBF16;
    case ffi::DataType::F16: return DType::kF16;
    default: return std::nullopt;
  }
}

// Optional operands travel as zero-sized buffers: one FFI signature serves
// every combination of present and absent inputs.
template <typename Buffer>
void* data_or_null(const Buffer& b) {
  return b.element_count() == 0 ? nullptr : b.untyped_data();
}

// For the Params builders, which return ffi::ErrorOr<Params>.
inline ffi::Unexpected<ffi::Error> invalid(const std::string& what) {
  return ffi::Unexpected<ffi::Error>(ffi::Error::InvalidArgument("jaxcraft: " + what));
}

}  // namespace jaxcraft
