// CPU-only build: no CUDA runtime is linked, so no GPU is visible.
#include "zerorun/build_info.h"

namespace zerorun {
bool built_with_cuda() { return false; }
GpuInfo query_gpus() { return {0, "CUDA support not built (no CUDA toolkit found at configure time)", "none"}; }
}  // namespace zerorun
