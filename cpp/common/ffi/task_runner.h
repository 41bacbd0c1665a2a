// XLA's intra-op thread pool as a TaskRunner for the CPU kernels.
#pragma once
#include "cpu/parallel.h"
#include "xla/ffi/api/ffi.h"

namespace jaxcraft {

class FfiTaskRunner final : public TaskRunner {
 public:
  explicit FfiTaskRunner(xla::ffi::ThreadPool& pool) : pool_(pool) {}
  int64_t num_threads() const override { return pool_.num_threads(); }
  void schedule(std::function<void()> task) const override { pool_.Schedule(std::move(task)); }

 private:
  xla::ffi::ThreadPool& pool_;
};

}  // namespace jaxcraft
