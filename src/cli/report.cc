// `zerorun report`: build features, library versions and the GPUs this process sees.
#include "report.h"

#include <cblas.h>
#include <mpi.h>
#include <omp.h>

#include <sstream>

#include "zerorun/build_info.h"
#include "zerorun/comm.h"
#include "zerorun/platform.h"

extern "C" char* openblas_get_config(void);

namespace zerorun {

std::string build_report() {
  std::ostringstream os;
  os << "zerorun " << ZERORUN_VERSION << "\n";
  os << "--------------------------------------------------\n";
  os << "compiler ............ " << ZERORUN_COMPILER << "\n";
  os << "platform ............ " << platform::os_name() << "\n";
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
  if (built_with_cuda()) {
    os << "kernels built for ... CUDA_ARCHITECTURES " << g.archs << "\n";
    os << "cuBLAS(Lt) .......... " << g.cublas_version << "\n";
    os << "cuDNN ............... not used (attention and every other op are zerorun's own kernels)\n";
  }
  os << "NCCL ................ " << nccl_report() << "\n";
  os << "GPUs seen ........... " << g.count << "\n";
  if (!g.summary.empty()) os << "  " << g.summary << (g.summary.back() == '\n' ? "" : "\n");
  os << "--device auto ....... " << (g.count > 0 ? "cuda" : "cpu")
     << (g.count > 0 ? " (a GPU is visible; --device cpu trains on the CPU)"
                     : built_with_cuda() ? " (no GPU visible)" : " (built without CUDA)")
     << "\n";
  // The collectives of several GPU ranks when --comm is not given (CPU ranks always use MPI).
  os << "--comm default ...... "
     << (platform::kHaveNccl ? "nccl (GPU ranks; --comm mpi stages collectives through host memory)"
                             : "mpi (GPU ranks' collectives through host memory: NCCL has no Windows build)")
     << "\n";
  return os.str();
}

}  // namespace zerorun
