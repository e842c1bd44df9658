// Loads MS-MPI's msmpi.dll at run time (include/zerorun/msmpi.h): a Windows zerorun needs no MPI SDK to build and
// starts without MS-MPI installed; only a multi-rank run (or --comm mpi) asks for it, with a message saying what to
// install. Plain C++ over the platform layer, so the loader is tested on Linux too.
#include <cstdlib>
#include <mutex>

#include "zerorun/error.h"
#include "zerorun/knobs.h"
#include "zerorun/msmpi.h"
#include "zerorun/platform.h"

namespace zerorun::msmpi {

std::string library_name() {
  const std::string& e = knobs().msmpi_dll;
  return !e.empty() ? e : "msmpi.dll";
}

namespace {
template <class F>
bool resolve(void* lib, const char* name, F*& fn, std::string* missing) {
  fn = reinterpret_cast<F*>(platform::library_symbol(lib, name));
  if (!fn && missing->empty()) *missing = name;
  return fn != nullptr;
}
}  // namespace

std::string load(const std::string& path, Api* out) {
  std::string err;
  void* lib = platform::load_library(path, &err);
  if (!lib)
    return "cannot load " + path + " (" + err +
           "): install Microsoft MPI (the msmpisetup.exe redistributable of MS-MPI 10.x; its SDK is not needed), "
           "or run a single rank without --comm mpi";
  Api a{};
  std::string missing;
  resolve(lib, "MPI_Initialized", a.Initialized, &missing);
  resolve(lib, "MPI_Finalized", a.Finalized, &missing);
  resolve(lib, "MPI_Init_thread", a.Init_thread, &missing);
  resolve(lib, "MPI_Finalize", a.Finalize, &missing);
  resolve(lib, "MPI_Abort", a.Abort, &missing);
  resolve(lib, "MPI_Error_string", a.Error_string, &missing);
  resolve(lib, "MPI_Get_library_version", a.Get_library_version, &missing);
  resolve(lib, "MPI_Comm_set_errhandler", a.Comm_set_errhandler, &missing);
  resolve(lib, "MPI_Comm_rank", a.Comm_rank, &missing);
  resolve(lib, "MPI_Comm_size", a.Comm_size, &missing);
  resolve(lib, "MPI_Comm_split_type", a.Comm_split_type, &missing);
  resolve(lib, "MPI_Comm_free", a.Comm_free, &missing);
  resolve(lib, "MPI_Op_create", a.Op_create, &missing);
  resolve(lib, "MPI_Barrier", a.Barrier, &missing);
  resolve(lib, "MPI_Bcast", a.Bcast, &missing);
  resolve(lib, "MPI_Allreduce", a.Allreduce, &missing);
  resolve(lib, "MPI_Allgather", a.Allgather, &missing);
  resolve(lib, "MPI_Reduce_scatter_block", a.Reduce_scatter_block, &missing);
  resolve(lib, "MPI_Iallreduce", a.Iallreduce, &missing);
  resolve(lib, "MPI_Iallgather", a.Iallgather, &missing);
  resolve(lib, "MPI_Ireduce_scatter_block", a.Ireduce_scatter_block, &missing);
  resolve(lib, "MPI_Wait", a.Wait, &missing);
  if (!missing.empty())
    return path + " has no " + missing + ": it is not MS-MPI 10 or later (install the current Microsoft MPI)";
  *out = a;
  return "";
}

const Api& api() {
  static Api a{};
  static std::string err;
  static std::once_flag once;
  std::call_once(once, [] { err = load(library_name(), &a); });
  ZR_CHECK(err.empty(), "MPI: ", err);
  return a;
}

}  // namespace zerorun::msmpi
