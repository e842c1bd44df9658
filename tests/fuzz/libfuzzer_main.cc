// libFuzzer entry point for one fuzz target (ZR_FUZZ_TARGET, set per binary by CMake with -DZERORUN_FUZZ=ON):
// a contract violation (see fuzz_targets.h) aborts, so libFuzzer saves the input; sanitizers catch the rest.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>

#include "fuzz_targets.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    zerorun::fuzz::run(ZR_FUZZ_TARGET, data, size);
  } catch (const zerorun::fuzz::ContractViolation& v) {
    std::fprintf(stderr, "contract violation (%s): %s\n", ZR_FUZZ_TARGET, v.what.c_str());
    std::abort();
  }
  return 0;
}
