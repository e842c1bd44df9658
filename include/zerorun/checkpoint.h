// Checkpoint layout helpers shared by the engine (save/load) and
// `zerorun merge`: manifest reading with integrity checks, and resolving
// "latest" / tags to directories.
#pragma once
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

namespace zerorun::ckpt {

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
