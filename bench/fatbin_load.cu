// Times the CUDA driver loading fatbins: cuModuleLoadData then cuModuleUnload,
// the median of 9 loads per file after one untimed load, in the order given.
// CUDA_MODULE_LOADING (EAGER: every kernel of the module at load; LAZY: at its
// first use) is read by cuInit. Prints "<file> <bytes> <median ms>".
//   nvcc -o /tmp/fatbin_load bench/fatbin_load.cu -lcuda && /tmp/fatbin_load a.fatbin ...
#include <cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <vector>

namespace {

bool ok(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return true;
  const char* msg = nullptr;
  cuGetErrorString(r, &msg);
  std::fprintf(stderr, "%s: %s\n", what, msg ? msg : "unknown error");
  return false;
}

// Milliseconds to load and unload `image` once; negative on failure.
double load_ms(const std::vector<char>& image) {
  CUmodule module;
  const auto t0 = std::chrono::steady_clock::now();
  if (!ok(cuModuleLoadData(&module, image.data()), "cuModuleLoadData")) return -1;
  const auto t1 = std::chrono::steady_clock::now();
  cuModuleUnload(module);
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  CUdevice device;
  CUcontext context;
  if (!ok(cuInit(0), "cuInit") || !ok(cuDeviceGet(&device, 0), "cuDeviceGet") ||
      !ok(cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain") ||
      !ok(cuCtxSetCurrent(context), "cuCtxSetCurrent"))
    return 1;
  for (int i = 1; i < argc; ++i) {
    std::ifstream file(argv[i], std::ios::binary);
    std::vector<char> image((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    if (image.empty() || load_ms(image) < 0) return 1;
    std::vector<double> ms;
    for (int r = 0; r < 9; ++r) ms.push_back(load_ms(image));
    std::sort(ms.begin(), ms.end());
    std::printf("%s %zu %.2f\n", argv[i], image.size(), ms[ms.size() / 2]);
  }
  return 0;
}
