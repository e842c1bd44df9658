// Build information every layer may ask for (see build_info.h): which CUDA architectures run on a GPU. The GPU
// queries are the kernels layer's (kernels/cuda/device.cu, kernels/stub), the `zerorun report` text is the CLI's
// (src/cli/report.cc).
#include "zerorun/build_info.h"

#include <cstdlib>
#include <sstream>

namespace zerorun {

bool cuda_archs_run_on(const std::string& archs, int sm) {
  if (archs.empty()) return true;
  std::string list = archs;  // CMake's list: ';' or (as the build passes it in one definition) ',' between
  for (char& c : list)
    if (c == ',') c = ';';
  std::stringstream ss(list);
  std::string a;
  while (std::getline(ss, a, ';')) {
    const bool real_only = a.size() > 5 && a.compare(a.size() - 5, 5, "-real") == 0;
    const bool virt_only = a.size() > 8 && a.compare(a.size() - 8, 8, "-virtual") == 0;
    const int v = std::atoi(a.c_str());
    if (v <= 0) return true;  // "native", "all", "all-major", OFF: nvcc chose; cannot tell, let CUDA decide
    if (!virt_only && v == sm) return true;  // code for this GPU
    if (!real_only && v <= sm) return true;  // PTX the driver compiles for it
  }
  return false;
}

}  // namespace zerorun
