// A stand-in msmpi.dll for tests (built by the Windows cross-build, loaded through ZERORUN_MSMPI_DLL under wine):
// MS-MPI's entry points with its ABI (include/zerorun/msmpi.h) for a job of one rank, so the run-time loader, the
// MPI communicator over it and `--comm mpi` run without MS-MPI installed. It counts the collectives it served in
// $MSMPI_STANDIN_LOG (appended at MPI_Finalize), so a test can tell that zerorun really went through it.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "zerorun/msmpi.h"

using namespace zerorun::msmpi;

namespace {
int g_init = 0, g_final = 0, g_calls = 0;
size_t type_size(Datatype t) { return static_cast<size_t>((t >> 8) & 0xff); }  // MS-MPI keeps the size in bits 8-15
void copy(const void* s, void* r, int n, Datatype t) {
  if (s != in_place() && s != r) std::memmove(r, s, static_cast<size_t>(n) * type_size(t));
}
}  // namespace

#define EXPORT extern "C" __declspec(dllexport)
EXPORT int MPI_Initialized(int* f) {
  *f = g_init;
  return kSuccess;
}
EXPORT int MPI_Finalized(int* f) {
  *f = g_final;
  return kSuccess;
}
EXPORT int MPI_Init_thread(int*, char***, int req, int* prov) {
  g_init = 1;
  *prov = req;
  return kSuccess;
}
EXPORT int MPI_Finalize() {
  g_final = 1;
  if (const char* log = std::getenv("MSMPI_STANDIN_LOG")) {
    if (FILE* f = std::fopen(log, "a")) {
      std::fprintf(f, "collectives %d\n", g_calls);
      std::fclose(f);
    }
  }
  return kSuccess;
}
EXPORT int MPI_Abort(Comm, int code) { std::exit(code); }
EXPORT int MPI_Error_string(int e, char* s, int* n) {
  *n = std::snprintf(s, kMaxErrorString, "stand-in error %d", e);
  return kSuccess;
}
EXPORT int MPI_Get_library_version(char* v, int* n) {
  *n = std::snprintf(v, kMaxLibraryVersionString, "zerorun msmpi stand-in (1 rank)");
  return kSuccess;
}
EXPORT int MPI_Comm_set_errhandler(Comm, Errhandler) { return kSuccess; }
EXPORT int MPI_Comm_rank(Comm, int* r) {
  *r = 0;
  return kSuccess;
}
EXPORT int MPI_Comm_size(Comm, int* s) {
  *s = 1;
  return kSuccess;
}
EXPORT int MPI_Comm_split_type(Comm, int type, int, Info, Comm* out) {
  *out = type == kCommTypeShared ? 0x84000002 : kCommNull;
  return kSuccess;
}
EXPORT int MPI_Comm_free(Comm* c) {
  *c = kCommNull;
  return kSuccess;
}
EXPORT int MPI_Op_create(UserFunction*, int, Op* op) {
  static int next = 0x98000000;
  *op = next++;
  return kSuccess;
}
EXPORT int MPI_Barrier(Comm) {
  ++g_calls;
  return kSuccess;
}
EXPORT int MPI_Bcast(void*, int, Datatype, int, Comm) {
  ++g_calls;
  return kSuccess;
}
EXPORT int MPI_Allreduce(const void* s, void* r, int n, Datatype t, Op, Comm) {
  ++g_calls;
  copy(s, r, n, t);
  return kSuccess;
}
EXPORT int MPI_Allgather(const void* s, int sn, Datatype st, void* r, int, Datatype, Comm) {
  ++g_calls;
  copy(s, r, sn, st);
  return kSuccess;
}
EXPORT int MPI_Reduce_scatter_block(const void* s, void* r, int n, Datatype t, Op, Comm) {
  ++g_calls;
  copy(s, r, n, t);
  return kSuccess;
}
EXPORT int MPI_Iallreduce(const void* s, void* r, int n, Datatype t, Op op, Comm c, Request* q) {
  *q = kRequestNull;
  return MPI_Allreduce(s, r, n, t, op, c);
}
EXPORT int MPI_Iallgather(const void* s, int sn, Datatype st, void* r, int rn, Datatype rt, Comm c, Request* q) {
  *q = kRequestNull;
  return MPI_Allgather(s, sn, st, r, rn, rt, c);
}
EXPORT int MPI_Ireduce_scatter_block(const void* s, void* r, int n, Datatype t, Op op, Comm c, Request* q) {
  *q = kRequestNull;
  return MPI_Reduce_scatter_block(s, r, n, t, op, c);
}
EXPORT int MPI_Wait(Request* q, Status*) {
  *q = kRequestNull;
  return kSuccess;
}
