// Startup check that every rank of a job trains the same thing: the config, the model (graph and weights) and the
// data each get a 64-bit fingerprint, gathered from all ranks. On a cluster a node with a stale config, another
// model.bin or other token files would otherwise hang in a mismatched collective or train on silently diverging
// shards; here the job stops at start, naming what differs and on which ranks.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "zerorun/comm.h"
#include "zerorun/hash.h"
#include "zerorun/model.h"

namespace zerorun {

// Tensor names, shapes, the graph hash, and every 997th element of each tensor (an init with another seed, or
// trained weights, differ in all of them); of an opened model.bin, its header and 64 pieces of each tensor's bytes.
uint64_t model_fingerprint(const Model& m);

struct Fingerprint {
  std::string what;  // e.g. "the config (c.json)"
  uint64_t value = 0;
};
// Collective: every rank passes its fingerprints, in the same order. Throws on every rank when some rank's
// value differs from rank 0's: "rank 2 (and 5) ... differs from rank 0's".
void require_same_on_all_ranks(Communicator& comm, const std::vector<Fingerprint>& items);

}  // namespace zerorun
