// MS-MPI's C ABI (msmpi.dll, x64), written out so that zerorun builds on Windows without the MS-MPI SDK and loads
// the DLL at run time, as it loads libnccl.so.2. The values are facts of MS-MPI's public mpi.h (handles are ints with
// fixed bit patterns; MPIAPI is __stdcall, which x64 ignores). src/comm/msmpi/mpi.h maps the standard MPI names onto
// this for the Windows build; the loader (src/comm/msmpi_loader.cc) is plain C++ and unit-tested on every platform.
#pragma once
#include <cstdint>
#include <string>

namespace zerorun::msmpi {

using Comm = int;
using Datatype = int;
using Op = int;
using Request = int;
using Errhandler = int;
using Info = int;
struct Status {
  int internal[2];
  int source, tag, error;
};

constexpr int kSuccess = 0;
constexpr Comm kCommNull = 0x04000000;
constexpr Comm kCommWorld = 0x44000000;
constexpr Comm kCommSelf = 0x44000001;
constexpr Datatype kFloat = 0x4c00040a;
constexpr Datatype kInt = 0x4c000405;
constexpr Datatype kInt32 = 0x4c000435;
constexpr Datatype kUint16 = 0x4c000238;
constexpr Op kMax = 0x58000001;
constexpr Op kMin = 0x58000002;
constexpr Op kSum = 0x58000003;
constexpr Request kRequestNull = 0x2c000000;
constexpr Errhandler kErrorsAreFatal = 0x54000000;
constexpr Errhandler kErrorsReturn = 0x54000001;
constexpr Info kInfoNull = 0x1c000000;
constexpr int kCommTypeShared = 1;  // MPI_COMM_TYPE_SHARED
constexpr int kThreadFunneled = 1;
constexpr int kMaxErrorString = 512;
constexpr int kMaxLibraryVersionString = 64;
inline void* in_place() { return reinterpret_cast<void*>(static_cast<intptr_t>(-1)); }          // MPI_IN_PLACE
inline Status* status_ignore() { return reinterpret_cast<Status*>(static_cast<intptr_t>(1)); }  // MPI_STATUS_IGNORE

using UserFunction = void(void* in, void* inout, int* len, Datatype* type);

// The entry points zerorun uses, resolved by name from the DLL.
struct Api {
  int (*Initialized)(int*);
  int (*Finalized)(int*);
  int (*Init_thread)(int*, char***, int, int*);
  int (*Finalize)();
  int (*Abort)(Comm, int);
  int (*Error_string)(int, char*, int*);
  int (*Get_library_version)(char*, int*);
  int (*Comm_set_errhandler)(Comm, Errhandler);
  int (*Comm_rank)(Comm, int*);
  int (*Comm_size)(Comm, int*);
  int (*Comm_split_type)(Comm, int, int, Info, Comm*);
  int (*Comm_free)(Comm*);
  int (*Op_create)(UserFunction*, int, Op*);
  int (*Barrier)(Comm);
  int (*Bcast)(void*, int, Datatype, int, Comm);
  int (*Allreduce)(const void*, void*, int, Datatype, Op, Comm);
  int (*Allgather)(const void*, int, Datatype, void*, int, Datatype, Comm);
  int (*Reduce_scatter_block)(const void*, void*, int, Datatype, Op, Comm);
  int (*Iallreduce)(const void*, void*, int, Datatype, Op, Comm, Request*);
  int (*Iallgather)(const void*, int, Datatype, void*, int, Datatype, Comm, Request*);
  int (*Ireduce_scatter_block)(const void*, void*, int, Datatype, Op, Comm, Request*);
  int (*Wait)(Request*, Status*);
};

// The DLL zerorun loads: $ZERORUN_MSMPI_DLL, else "msmpi.dll" (MS-MPI's installer puts it in System32).
std::string library_name();
// Loads `path` and resolves every entry point: "" on success, else the reason (the library or the first missing
// symbol), with what to install.
std::string load(const std::string& path, Api* out);
// The process's Api, loaded on first use; throws zerorun::Error saying how to install MS-MPI when it cannot.
const Api& api();

}  // namespace zerorun::msmpi
