// `zerorun report` and the start of a GPU run decide from CMake's CUDA_ARCHITECTURES list whether the kernels run
// on a GPU: code for exactly its compute capability, or PTX at or below it.
#include <catch2/catch.hpp>

#include "zerorun/build_info.h"

using namespace zerorun;

TEST_CASE("CUDA_ARCHITECTURES coverage of a GPU", "[report]") {
  CHECK(cuda_archs_run_on("90", 90));   // sm_90 code
  CHECK(cuda_archs_run_on("90", 100));  // compute_90 PTX, compiled by the driver
  CHECK_FALSE(cuda_archs_run_on("90", 80));
  CHECK_FALSE(cuda_archs_run_on("90", 89));
  CHECK(cuda_archs_run_on("90-real", 90));
  CHECK_FALSE(cuda_archs_run_on("90-real", 100));  // no PTX
  CHECK_FALSE(cuda_archs_run_on("90-virtual", 80));
  CHECK(cuda_archs_run_on("90-virtual", 120));
  // The default list as the build passes it: SASS for Ampere..Blackwell, PTX of the last for later cards.
  const char* dflt = "80-real,86-real,89-real,90-real,100-real,120";
  for (int sm : {80, 86, 89, 90, 100, 120, 121}) CHECK(cuda_archs_run_on(dflt, sm));
  CHECK_FALSE(cuda_archs_run_on(dflt, 75));
  CHECK_FALSE(cuda_archs_run_on(dflt, 87));  // Jetson Orin: not in the list, and no PTX below 120
  CHECK(cuda_archs_run_on("80;90", 90));
  CHECK(cuda_archs_run_on("80-real;90", 80));
  CHECK(cuda_archs_run_on("80-real;90", 90));
  CHECK_FALSE(cuda_archs_run_on("80-real;90-real", 86));
  CHECK(cuda_archs_run_on("80;90-real", 86));
  for (const char* unknown : {"", "native", "all", "all-major", "OFF"}) CHECK(cuda_archs_run_on(unknown, 90));
}
