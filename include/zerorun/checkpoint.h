// Sharded checkpoints: the shards written and read through ZeRO's state (the ranges each rank keeps) and the
// optimizer, for the engine's save/load; and the layout helpers shared with `zerorun merge`: manifest reading with
// integrity checks, and resolving "latest" / tags to directories.
#pragma once
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

namespace zerorun {
class Communicator;
class Optimizer;
namespace zero {
class ShardedState;
}
}  // namespace zerorun

namespace zerorun::ckpt {

// Writes save_dir/<tag>/ (collective): this rank's shard (fp32 master and optimizer states over the ranges zs names
// for it), then, once every rank confirmed its shard (size and crc32), rank 0 writes manifest.json, made of
// fields() (the caller's counters and settings, called on rank 0 only) with the parameters' shapes and per-rank
// ranges and the shards' sizes and checksums, then `latest`.
void save(const std::string& save_dir, const std::string& tag, const std::function<nlohmann::json()>& fields,
          zero::ShardedState& zs, Optimizer& opt, Communicator& comm);
// Reads this rank's ranges of the checkpoint in dir (manifest m, from read_manifest) into zs (master and compute
// copies) and opt (states), at any world size and stage: the sizes of every shard and the checksums of the ones
// read are checked first. The caller then restores its counters and calls zs.after_load().
void load_shards(const std::string& dir, const nlohmann::json& m, zero::ShardedState& zs, Optimizer& opt);

// save_dir + "latest"/"global_step<N>"/a checkpoint directory -> the
// checkpoint directory (throws naming what is missing).
std::string resolve_dir(const std::string& save_dir, const std::string& tag);
// Reads dir/manifest.json, checks every field loading and merging use (types, ranges, slices covering each
// parameter, the graph against its hash and the parameter shapes), and verifies every listed file's size and crc32.
nlohmann::json read_manifest(const std::string& dir, bool verify_files = true);
// Every listed file exists with the manifest's size; the crc32 is checked for
// the files in `checksummed` only (a resuming rank reads a subset of shards).
void verify_shards(const std::string& dir, const nlohmann::json& manifest, const std::set<std::string>& checksummed);

// Where to read elements [b, e) of a parameter from: (file, first element
// inside the stored slice, count, destination offset, elements of the stored slice).
struct Piece {
  std::string file, tensor;
  int64_t src_first, count, dst_offset, stored;
};
std::vector<Piece> pieces_for(const nlohmann::json& manifest, const std::string& param, const std::string& kind,
                              int64_t b, int64_t e);

}  // namespace zerorun::ckpt
