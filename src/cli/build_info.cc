// Build features and library versions for `zerorun report`.
#include "zerorun/build_info.h"

#include <cblas.h>
#include <mpi.h>
#include <omp.h>

#include <sstream>

extern "C" char* openblas_get_config(void);

namespace zerorun {

std::string build_report() {
  std::ostringstream os;
  os << "zerorun " << ZERORUN_VERSION << "\n";
  os << "--------------------------------------------------\n";
  os << "compiler ............ " << __VERSION__ << "\n";
  os << "CPU backend ......... yes (OpenMP " << _OPENMP << ", max threads " << omp_get_max_threads() << ")\n";
  os << "BLAS ................ " << openblas_get_config() << "\n";
  char mpi[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(mpi, &len);
  std::string mv(mpi, static_cast<size_t>(len));
  mv = mv.c_str();  // the length counts a terminating NUL
  if (auto nl = mv.find('\n'); nl != std::string::npos) mv = mv.substr(0, nl);
  os << "MPI ................. " << mv << "\n";
  os << "mpirun .............. " << ZERORUN_MPIRUN << "\n";
  GpuInfo g = query_gpus();
  os << "CUDA backend ........ " << (built_with_cuda() ? "yes" : "no") << "\n";
  os << "CUDA runtime ........ " << g.runtime_version << "\n";
  os << "GPUs seen ........... " << g.count << "\n";
  if (!g.summary.empty()) os << "  " << g.summary << (g.summary.back() == '\n' ? "" : "\n");
  return os.str();
}

}  // namespace zerorun
