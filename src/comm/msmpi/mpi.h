// <mpi.h> for Windows builds without an MPI SDK (CMake puts this folder on the include path only there): the
// standard MPI names zerorun uses, mapped onto MS-MPI's ABI (include/zerorun/msmpi.h) and calling msmpi.dll through
// the run-time loader, so src/comm/mpi_comm.cc is the same source on Linux (OpenMPI/MPICH linked) and Windows.
#pragma once
#include <cstring>

#include "zerorun/msmpi.h"

using MPI_Comm = zerorun::msmpi::Comm;
using MPI_Datatype = zerorun::msmpi::Datatype;
using MPI_Op = zerorun::msmpi::Op;
using MPI_Request = zerorun::msmpi::Request;
using MPI_Errhandler = zerorun::msmpi::Errhandler;
using MPI_Info = zerorun::msmpi::Info;
using MPI_Status = zerorun::msmpi::Status;
using MPI_User_function = zerorun::msmpi::UserFunction;

#define MPI_SUCCESS zerorun::msmpi::kSuccess
#define MPI_COMM_NULL zerorun::msmpi::kCommNull
#define MPI_COMM_WORLD zerorun::msmpi::kCommWorld
#define MPI_COMM_SELF zerorun::msmpi::kCommSelf
#define MPI_FLOAT zerorun::msmpi::kFloat
#define MPI_INT zerorun::msmpi::kInt
#define MPI_INT32_T zerorun::msmpi::kInt32
#define MPI_UINT16_T zerorun::msmpi::kUint16
#define MPI_MAX zerorun::msmpi::kMax
#define MPI_MIN zerorun::msmpi::kMin
#define MPI_SUM zerorun::msmpi::kSum
#define MPI_REQUEST_NULL zerorun::msmpi::kRequestNull
#define MPI_ERRORS_ARE_FATAL zerorun::msmpi::kErrorsAreFatal
#define MPI_ERRORS_RETURN zerorun::msmpi::kErrorsReturn
#define MPI_INFO_NULL zerorun::msmpi::kInfoNull
#define MPI_COMM_TYPE_SHARED zerorun::msmpi::kCommTypeShared
#define MPI_THREAD_FUNNELED zerorun::msmpi::kThreadFunneled
#define MPI_MAX_ERROR_STRING zerorun::msmpi::kMaxErrorString
#define MPI_MAX_LIBRARY_VERSION_STRING zerorun::msmpi::kMaxLibraryVersionString
#define MPI_IN_PLACE zerorun::msmpi::in_place()
#define MPI_STATUS_IGNORE zerorun::msmpi::status_ignore()

namespace zerorun::msmpi::detail {
inline const Api& api() { return zerorun::msmpi::api(); }
}  // namespace zerorun::msmpi::detail

// Queries that must answer without MS-MPI installed (a single-rank run asks whether MPI is up; `zerorun report` prints
// the library) do not throw; everything else loads msmpi.dll or throws saying how to install it.
inline int MPI_Initialized(int* flag) {
  zerorun::msmpi::Api a{};
  static const bool have = zerorun::msmpi::load(zerorun::msmpi::library_name(), &a).empty();
  if (!have) {
    *flag = 0;
    return MPI_SUCCESS;
  }
  return zerorun::msmpi::api().Initialized(flag);
}
inline int MPI_Get_library_version(char* v, int* len) {
  zerorun::msmpi::Api a{};
  const std::string err = zerorun::msmpi::load(zerorun::msmpi::library_name(), &a);
  if (!err.empty()) {
    const std::string m = "not loaded: " + err;
    const size_t n = std::min(m.size(), static_cast<size_t>(MPI_MAX_LIBRARY_VERSION_STRING - 1));
    std::memcpy(v, m.data(), n);
    *len = static_cast<int>(n);
    return MPI_SUCCESS;
  }
  return a.Get_library_version(v, len);
}
inline int MPI_Finalized(int* f) { return zerorun::msmpi::detail::api().Finalized(f); }
inline int MPI_Init_thread(int* c, char*** v, int req, int* prov) {
  return zerorun::msmpi::detail::api().Init_thread(c, v, req, prov);
}
inline int MPI_Finalize() { return zerorun::msmpi::detail::api().Finalize(); }
inline int MPI_Abort(MPI_Comm c, int code) { return zerorun::msmpi::detail::api().Abort(c, code); }
inline int MPI_Error_string(int e, char* s, int* n) { return zerorun::msmpi::detail::api().Error_string(e, s, n); }
inline int MPI_Comm_set_errhandler(MPI_Comm c, MPI_Errhandler h) {
  return zerorun::msmpi::detail::api().Comm_set_errhandler(c, h);
}
inline int MPI_Comm_rank(MPI_Comm c, int* r) { return zerorun::msmpi::detail::api().Comm_rank(c, r); }
inline int MPI_Comm_size(MPI_Comm c, int* s) { return zerorun::msmpi::detail::api().Comm_size(c, s); }
inline int MPI_Comm_split_type(MPI_Comm c, int type, int key, MPI_Info info, MPI_Comm* out) {
  return zerorun::msmpi::detail::api().Comm_split_type(c, type, key, info, out);
}
inline int MPI_Comm_free(MPI_Comm* c) { return zerorun::msmpi::detail::api().Comm_free(c); }
inline int MPI_Op_create(MPI_User_function* f, int commute, MPI_Op* op) {
  return zerorun::msmpi::detail::api().Op_create(f, commute, op);
}
inline int MPI_Barrier(MPI_Comm c) { return zerorun::msmpi::detail::api().Barrier(c); }
inline int MPI_Bcast(void* b, int n, MPI_Datatype t, int root, MPI_Comm c) {
  return zerorun::msmpi::detail::api().Bcast(b, n, t, root, c);
}
inline int MPI_Allreduce(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
  return zerorun::msmpi::detail::api().Allreduce(s, r, n, t, op, c);
}
inline int MPI_Allgather(const void* s, int sn, MPI_Datatype st, void* r, int rn, MPI_Datatype rt, MPI_Comm c) {
  return zerorun::msmpi::detail::api().Allgather(s, sn, st, r, rn, rt, c);
}
inline int MPI_Reduce_scatter_block(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
  return zerorun::msmpi::detail::api().Reduce_scatter_block(s, r, n, t, op, c);
}
inline int MPI_Iallreduce(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c, MPI_Request* q) {
  return zerorun::msmpi::detail::api().Iallreduce(s, r, n, t, op, c, q);
}
inline int MPI_Iallgather(const void* s, int sn, MPI_Datatype st, void* r, int rn, MPI_Datatype rt, MPI_Comm c,
                          MPI_Request* q) {
  return zerorun::msmpi::detail::api().Iallgather(s, sn, st, r, rn, rt, c, q);
}
inline int MPI_Ireduce_scatter_block(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c,
                                     MPI_Request* q) {
  return zerorun::msmpi::detail::api().Ireduce_scatter_block(s, r, n, t, op, c, q);
}
inline int MPI_Wait(MPI_Request* q, MPI_Status* s) { return zerorun::msmpi::detail::api().Wait(q, s); }
