// Token shards: llm.c's (uint16 tokens) and zerorun's (uint16/uint32 tokens, loss mask, document starts); the
// layout is documented in zerorun/data.h.

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>

#include "zerorun/data.h"
#include "zerorun/error.h"
#include "zerorun/fsutil.h"
#include "zerorun/platform.h"

namespace zerorun {

TokenShard read_token_shard(const std::string& path) {
  ZR_CHECK(!is_directory(path), path, ": is a directory (give the shard files in it, e.g. '", path, "/*.bin')");
  regular_file_size(path);  // a FIFO or a device: an error naming it, not a hang
  std::ifstream in(platform::to_path(path), std::ios::binary);
  ZR_CHECK(in, path, ": cannot open token shard");
  int32_t h[256];
  in.read(reinterpret_cast<char*>(h), sizeof h);
  ZR_CHECK(in, path, ": too short for a token shard header (1024 bytes)");
  in.seekg(0, std::ios::end);
  const uint64_t size = static_cast<uint64_t>(in.tellg());
  in.seekg(sizeof h);
  TokenShard s;
  auto read = [&](void* dst, uint64_t n, const char* what) {
    in.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
    ZR_CHECK(in && static_cast<uint64_t>(in.gcount()) == n, path, ": the file ends inside the ", what,
             " (truncated shard?)");
  };
  if (h[0] == 20240520) {  // llm.c
    ZR_CHECK(h[1] == 1, path, ": unsupported llm.c token shard version ", h[1], " (expected 1: uint16 tokens)");
    ZR_CHECK(h[2] >= 0, path, ": negative token count");
    ZR_CHECK(size >= sizeof h + 2 * static_cast<uint64_t>(h[2]), path, ": header says ", h[2], " tokens (",
             sizeof h + 2 * static_cast<uint64_t>(h[2]), " bytes) but the file has ", size,
             " bytes (truncated shard?)");
    std::vector<uint16_t> t(static_cast<size_t>(h[2]));
    read(t.data(), t.size() * 2, "tokens");
    s.tokens.assign(t.begin(), t.end());
    return s;
  }
  ZR_CHECK(h[0] == kZerorunShardMagic, path, ": bad magic ", h[0], " (an llm.c token shard starts with 20240520, a ",
           "zerorun shard with ", kZerorunShardMagic, ")");
  ZR_CHECK(h[1] == 1, path, ": unsupported zerorun token shard version ", h[1], " (this build reads version 1)");
  auto i64 = [&](int k) {
    return static_cast<int64_t>(static_cast<uint32_t>(h[k])) | (static_cast<int64_t>(h[k + 1]) << 32);
  };
  const int64_t count = i64(2), docs = i64(5);
  const int width = h[4];
  const bool has_mask = h[7] & 1;
  ZR_CHECK(width == 2 || width == 4, path, ": header word 4 (bytes a token) is ", width, ", expected 2 or 4");
  ZR_CHECK(count >= 0 && docs >= 0, path, ": negative token or document count");
  ZR_CHECK(static_cast<uint64_t>(count) <= size && static_cast<uint64_t>(docs) <= size, path, ": header says ", count,
           " tokens and ", docs, " documents, more than the file's ", size, " bytes can hold");
  const uint64_t need = sizeof h + static_cast<uint64_t>(count) * (static_cast<uint64_t>(width) + (has_mask ? 1 : 0)) +
                        8 * (static_cast<uint64_t>(docs) + 1);
  ZR_CHECK(size == need, path, ": header says ", count, " tokens of ", width, " bytes",
           has_mask ? " with a loss mask" : "", " and ", docs, " documents (", need, " bytes) but the file has ", size,
           " bytes");
  s.vocab_size = h[8];
  s.tokens.resize(static_cast<size_t>(count));
  if (width == 4) {
    read(s.tokens.data(), s.tokens.size() * 4, "tokens");
  } else {
    std::vector<uint16_t> t(s.tokens.size());
    read(t.data(), t.size() * 2, "tokens");
    s.tokens.assign(t.begin(), t.end());
  }
  if (has_mask) {
    s.loss_mask.resize(s.tokens.size());
    read(s.loss_mask.data(), s.loss_mask.size(), "loss mask");
  }
  s.doc_starts.resize(static_cast<size_t>(docs) + 1);
  read(s.doc_starts.data(), s.doc_starts.size() * 8, "document starts");
  ZR_CHECK(s.doc_starts.front() == 0 && s.doc_starts.back() == count, path,
           ": document starts must begin at 0 and end at the token count");
  for (size_t d = 1; d < s.doc_starts.size(); ++d)
    ZR_CHECK(s.doc_starts[d] >= s.doc_starts[d - 1], path, ": document starts decrease at document ", d);
  if (s.vocab_size > 0)
    for (size_t i = 0; i < s.tokens.size(); ++i)
      ZR_CHECK(s.tokens[i] < static_cast<uint64_t>(s.vocab_size), path, ": token ", s.tokens[i], " at index ", i,
               " is outside the vocabulary size ", s.vocab_size, " in the header");
  return s;
}

TokenShard load_token_shards(const std::string& spec, std::vector<std::string>* files) {
  std::vector<std::string> list;
  std::stringstream ss(spec);
  for (std::string part; std::getline(ss, part, ',');) {
    if (part.empty()) continue;
    const std::vector<std::string> found = platform::glob(part);
    list.insert(list.end(), found.begin(), found.end());
    ZR_CHECK(!found.empty(), "data: no file matches '", part, "'");
  }
  ZR_CHECK(!list.empty(), "data: no files given");
  TokenShard all;
  all.doc_starts.push_back(0);
  bool any_mask = false;
  for (const std::string& f : list) {
    TokenShard s = read_token_shard(f);
    const int64_t base = static_cast<int64_t>(all.tokens.size());
    if (!s.loss_mask.empty() && !any_mask) {
      all.loss_mask.assign(all.tokens.size(), 1);
      any_mask = true;
    }
    if (any_mask) {
      if (s.loss_mask.empty()) s.loss_mask.assign(s.tokens.size(), 1);
      all.loss_mask.insert(all.loss_mask.end(), s.loss_mask.begin(), s.loss_mask.end());
    }
    all.tokens.insert(all.tokens.end(), s.tokens.begin(), s.tokens.end());
    if (s.doc_starts.empty()) s.doc_starts = {0, static_cast<int64_t>(s.tokens.size())};
    for (size_t d = 1; d < s.doc_starts.size(); ++d) all.doc_starts.push_back(base + s.doc_starts[d]);
    all.vocab_size = std::max(all.vocab_size, s.vocab_size);
  }
  if (files) *files = list;
  return all;
}

void write_zerorun_shard(const std::string& path, const TokenShard& s) {
  ZR_CHECK(s.loss_mask.empty() || s.loss_mask.size() == s.tokens.size(), path, ": loss mask size ", s.loss_mask.size(),
           " != token count ", s.tokens.size());
  std::vector<int64_t> starts = s.doc_starts;
  if (starts.empty()) starts = {0, static_cast<int64_t>(s.tokens.size())};
  ZR_CHECK(starts.front() == 0 && starts.back() == static_cast<int64_t>(s.tokens.size()), path,
           ": document starts must begin at 0 and end at the token count");
  uint32_t max_tok = 0;
  for (uint32_t t : s.tokens) max_tok = std::max(max_tok, t);
  const int width = (s.vocab_size > 65536 || max_tok > 65535) ? 4 : 2;
  int32_t h[256] = {};
  const int64_t count = static_cast<int64_t>(s.tokens.size()), docs = static_cast<int64_t>(starts.size()) - 1;
  h[0] = kZerorunShardMagic;
  h[1] = 1;
  h[2] = static_cast<int32_t>(count & 0xffffffff);
  h[3] = static_cast<int32_t>(count >> 32);
  h[4] = width;
  h[5] = static_cast<int32_t>(docs & 0xffffffff);
  h[6] = static_cast<int32_t>(docs >> 32);
  h[7] = s.loss_mask.empty() ? 0 : 1;
  h[8] = static_cast<int32_t>(s.vocab_size);
  AtomicFile f(path);
  f.write(h, sizeof h);
  if (width == 4) {
    f.write(s.tokens.data(), s.tokens.size() * 4);
  } else {
    std::vector<uint16_t> t(s.tokens.begin(), s.tokens.end());
    f.write(t.data(), t.size() * 2);
  }
  if (!s.loss_mask.empty()) f.write(s.loss_mask.data(), s.loss_mask.size());
  f.write(starts.data(), starts.size() * 8);
  f.commit();
}

}  // namespace zerorun
