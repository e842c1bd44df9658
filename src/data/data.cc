// Token shard / .npy readers, the windowed token dataset and synthetic tasks.
#include "zerorun/data.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "zerorun/fsutil.h"
#include "zerorun/hash.h"
#include "zerorun/platform.h"
#include "zerorun/rng.h"

namespace zerorun {
namespace {

std::vector<std::string> expand(const std::string& spec) {
  std::vector<std::string> out;
  std::stringstream ss(spec);
  std::string part;
  while (std::getline(ss, part, ',')) {
    if (part.empty()) continue;
    const std::vector<std::string> found = platform::glob(part);
    out.insert(out.end(), found.begin(), found.end());
    ZR_CHECK(!found.empty(), "data: no file matches '", part, "'");
  }
  ZR_CHECK(!out.empty(), "data: no files given");
  return out;
}

void read_llmc(const std::string& path, std::vector<uint32_t>& out) {
  ZR_CHECK(!is_directory(path), path, ": is a directory (give the shard files in it, e.g. '", path, "/*.bin')");
  regular_file_size(path);  // a FIFO or a device: an error naming it, not a hang
  std::ifstream in(platform::to_path(path), std::ios::binary);
  ZR_CHECK(in, path, ": cannot open token shard");
  int32_t h[256];
  in.read(reinterpret_cast<char*>(h), sizeof h);
  ZR_CHECK(in, path, ": too short for an llm.c token shard header (1024 bytes)");
  if (h[0] == kZerorunShardMagic) {  // zerorun prepare's shards: the tokens (the loss mask is not read here yet)
    const TokenShard s = read_token_shard(path);
    out.insert(out.end(), s.tokens.begin(), s.tokens.end());
    return;
  }
  ZR_CHECK(h[0] == 20240520, path, ": bad magic ", h[0], " (an llm.c token shard starts with 20240520, a zerorun ",
           "shard with ", kZerorunShardMagic, ")");
  ZR_CHECK(h[1] == 1, path, ": unsupported token shard version ", h[1], " (expected 1: uint16 tokens)");
  ZR_CHECK(h[2] >= 0, path, ": negative token count");
  in.seekg(0, std::ios::end);
  const uint64_t size = static_cast<uint64_t>(in.tellg());
  ZR_CHECK(size >= sizeof h + 2 * static_cast<uint64_t>(h[2]), path, ": header says ", h[2], " tokens (",
           sizeof h + 2 * static_cast<uint64_t>(h[2]), " bytes) but the file has ", size, " bytes (truncated shard?)");
  in.seekg(sizeof h);
  std::vector<uint16_t> t(static_cast<size_t>(h[2]));
  in.read(reinterpret_cast<char*>(t.data()), static_cast<std::streamsize>(t.size() * 2));
  ZR_CHECK(in && static_cast<size_t>(in.gcount()) == t.size() * 2, path, ": header says ", h[2],
           " tokens but the file is shorter (truncated shard?)");
  out.insert(out.end(), t.begin(), t.end());
}

void read_npy(const std::string& path, std::vector<uint32_t>& out) {
  std::string s = read_file(path);
  ZR_CHECK(s.size() >= 10 && s.compare(0, 6, "\x93NUMPY") == 0, path, ": not a .npy file");
  uint8_t major = static_cast<uint8_t>(s[6]);
  size_t hl, off;
  if (major == 1) {
    hl = static_cast<uint8_t>(s[8]) | (static_cast<size_t>(static_cast<uint8_t>(s[9])) << 8);
    off = 10;
  } else {
    ZR_CHECK(s.size() >= 12, path, ": truncated .npy header");
    hl = 0;
    for (int i = 3; i >= 0; --i) hl = (hl << 8) | static_cast<uint8_t>(s[8 + i]);
    off = 12;
  }
  ZR_CHECK(off + hl <= s.size(), path, ": truncated .npy header");
  std::string header = s.substr(off, hl);
  size_t width = 0;
  if (header.find("'<u2'") != std::string::npos || header.find("'|u2'") != std::string::npos) width = 2;
  if (header.find("'<u4'") != std::string::npos) width = 4;
  ZR_CHECK(width, path, ": .npy dtype must be uint16 ('<u2') or uint32 ('<u4'); header is ", header);
  ZR_CHECK(header.find("'fortran_order': False") != std::string::npos, path, ": .npy must be C-ordered");
  // The shape (any rank, read flat) must account for every data byte.
  const size_t sp = header.find("'shape':"), open = header.find('(', sp), close = header.find(')', open);
  ZR_CHECK(sp != std::string::npos && open != std::string::npos && close != std::string::npos, path,
           ": .npy header has no shape tuple: ", header);
  uint64_t count = 1;
  std::istringstream dims(header.substr(open + 1, close - open - 1));
  for (std::string d; std::getline(dims, d, ',');) {
    d.erase(0, d.find_first_not_of(' '));
    d.erase(d.find_last_not_of(' ') + 1);
    if (d.empty()) continue;  // the trailing comma of "(N,)"
    ZR_CHECK(d.size() <= 15 && d.find_first_not_of("0123456789") == std::string::npos, path, ": .npy shape entry '", d,
             "' is not a dimension");
    const uint64_t v = std::stoull(d);
    ZR_CHECK(v == 0 || count <= s.size() / v, path, ": .npy shape ", header.substr(open, close - open + 1),
             " is larger than the file");
    count *= v;
  }
  size_t data = off + hl, n = (s.size() - data) / width;
  ZR_CHECK(n == count && (s.size() - data) % width == 0, path, ": .npy shape ", header.substr(open, close - open + 1),
           " holds ", count, " tokens but the data section has ", s.size() - data, " bytes (", width,
           " bytes a token; truncated file?)");
  for (size_t i = 0; i < n; ++i) {
    uint32_t v = 0;
    std::memcpy(&v, s.data() + data + i * width, width);
    out.push_back(v);
  }
}

class TokenWindows : public DataSource {
 public:
  TokenWindows(std::vector<uint32_t> toks, int64_t T, int64_t vocab, std::string desc)
      : t_(std::move(toks)), T_(T), desc_(std::move(desc)) {
    ZR_CHECK(static_cast<int64_t>(t_.size()) >= T + 1, desc_, ": ", t_.size(), " tokens is fewer than one sequence of ",
             T + 1);
    for (size_t i = 0; i < t_.size(); ++i)
      ZR_CHECK(t_[i] < static_cast<uint64_t>(vocab), desc_, ": token ", t_[i], " at index ", i,
               " is outside the model's vocabulary of ", vocab);
    windows_ = (static_cast<int64_t>(t_.size()) - 1) / T;
  }
  std::map<std::string, Tensor> batch(int64_t first, int64_t count) override {
    Tensor x = Tensor::empty({count, T_}, DType::I32), y = Tensor::empty({count, T_}, DType::I32);
    for (int64_t b = 0; b < count; ++b) {
      int64_t w = (first + b) % windows_;
      for (int64_t t = 0; t < T_; ++t) {
        x.i32()[b * T_ + t] = static_cast<int32_t>(t_[w * T_ + t]);
        y.i32()[b * T_ + t] = static_cast<int32_t>(t_[w * T_ + t + 1]);
      }
    }
    return {{"tokens", x}, {"targets", y}};
  }
  std::string describe() const override {
    return desc_ + " (" + std::to_string(t_.size()) + " tokens, " + std::to_string(windows_) + " sequences of " +
           std::to_string(T_) + ")";
  }
  uint64_t fingerprint() const override {  // the token count, T and every 61st token (not the file names)
    uint64_t h = fnv1a(&T_, sizeof T_);
    const uint64_t n = t_.size();
    h = fnv1a(&n, sizeof n, h);
    for (size_t i = 0; i < t_.size(); i += 61) h = fnv1a(&t_[i], sizeof t_[i], h);
    return h;
  }
  int64_t tokens_per_sample() const override { return T_; }

 private:
  std::vector<uint32_t> t_;
  int64_t T_, windows_;
  std::string desc_;
};

// Synthetic language: each sequence follows x[t+1] = (5 x[t] + 3) mod V from
// a random start, so a model that learns the bigram reaches ~0 loss.
class SyntheticTokens : public DataSource {
 public:
  SyntheticTokens(int64_t T, int64_t V, uint64_t seed) : T_(T), V_(V), seed_(seed) {}
  std::map<std::string, Tensor> batch(int64_t first, int64_t count) override {
    Tensor x = Tensor::empty({count, T_}, DType::I32), y = Tensor::empty({count, T_}, DType::I32);
    for (int64_t b = 0; b < count; ++b) {
      int64_t v = static_cast<int64_t>(splitmix64(seed_ ^ static_cast<uint64_t>(first + b)) % V_);
      for (int64_t t = 0; t <= T_; ++t) {
        if (t < T_) x.i32()[b * T_ + t] = static_cast<int32_t>(v);
        if (t > 0) y.i32()[b * T_ + t - 1] = static_cast<int32_t>(v);
        v = (5 * v + 3) % V_;
      }
    }
    return {{"tokens", x}, {"targets", y}};
  }
  std::string describe() const override { return "synthetic token sequences (x' = 5x+3 mod V)"; }
  int64_t tokens_per_sample() const override { return T_; }

 private:
  int64_t T_, V_;
  uint64_t seed_;
};

// Synthetic regression for f32 models with inputs "x" [B, in] and "y" [B, out]:
// x uniform in [-1, 1), y[j] = x[(7 j + 3) mod in].
class SyntheticRegression : public DataSource {
 public:
  SyntheticRegression(int64_t in, int64_t out, uint64_t seed) : in_(in), out_(out), seed_(seed) {}
  std::map<std::string, Tensor> batch(int64_t first, int64_t count) override {
    Tensor x = Tensor::empty({count, in_}, DType::F32), y = Tensor::empty({count, out_}, DType::F32);
    for (int64_t b = 0; b < count; ++b) {
      uint64_t s = static_cast<uint64_t>(first + b);
      for (int64_t i = 0; i < in_; ++i)
        x.f32()[b * in_ + i] = 2.f * hash_uniform(seed_, s * static_cast<uint64_t>(in_) + i) - 1.f;
      for (int64_t j = 0; j < out_; ++j) y.f32()[b * out_ + j] = x.f32()[b * in_ + (7 * j + 3) % in_];
    }
    return {{"x", x}, {"y", y}};
  }
  std::string describe() const override { return "synthetic regression (y[j] = x[(7j+3) mod in])"; }

 private:
  int64_t in_, out_;
  uint64_t seed_;
};

}  // namespace

std::vector<uint32_t> load_token_files(const std::string& spec, std::vector<std::string>* files) {
  std::vector<uint32_t> toks;
  auto list = expand(spec);
  for (auto& f : list) {
    if (f.size() >= 4 && f.compare(f.size() - 4, 4, ".npy") == 0)
      read_npy(f, toks);
    else
      read_llmc(f, toks);
  }
  if (files) *files = list;
  return toks;
}

void write_token_shard(const std::string& path, const std::vector<uint16_t>& tokens) {
  int32_t h[256] = {};
  h[0] = 20240520;
  h[1] = 1;
  h[2] = static_cast<int32_t>(tokens.size());
  AtomicFile f(path);
  f.write(h, sizeof h);
  f.write(tokens.data(), tokens.size() * 2);
  f.commit();
}

uint64_t DataSource::fingerprint() const {
  const std::string d = describe();
  return fnv1a(d.data(), d.size());
}

namespace {
// Whether `path` (a regular file: load_token_files checked it) is a zerorun shard whose header says a loss mask
// follows (header word 7, bit 0).
bool zerorun_shard_has_mask(const std::string& path) {
  std::ifstream in(platform::to_path(path), std::ios::binary);
  int32_t h[8] = {};
  in.read(reinterpret_cast<char*>(h), sizeof h);
  return in && h[0] == kZerorunShardMagic && (h[7] & 1) != 0;
}
}  // namespace

std::unique_ptr<DataSource> make_data_source(const std::string& spec, const Model& m, int64_t seq_len, uint64_t seed,
                                             bool packing) {
  const Graph& g = m.graph;
  auto has_input = [&](const char* n, DType dt) {
    for (auto& in : g.inputs)
      if (in.name == n && in.dtype == dt) return true;
    return false;
  };
  const bool positions = has_input("positions", DType::I32);  // the optional per-document positions (builders.cc)
  bool token_model =
      has_input("tokens", DType::I32) && has_input("targets", DType::I32) && g.inputs.size() == (positions ? 3u : 2u);
  bool regression = has_input("x", DType::F32) && has_input("y", DType::F32) && g.inputs.size() == 2;
  if (token_model) {
    int64_t V = 0;
    int32_t pad = 0;
    for (auto& n : g.nodes)
      if (n.op == "embedding" && n.in[0] == "tokens" && !n.attrs.value("position", false)) {
        V = m.shape(n.params.at("weight")).at(0);
        pad = n.attrs.value("padding_idx", 0);
      }
    ZR_CHECK(V > 0, "model has a 'tokens' input but no token embedding");
    if (spec.empty() || spec == "synthetic") return std::make_unique<SyntheticTokens>(seq_len, V, seed);
    std::vector<std::string> files;
    auto toks = load_token_files(spec, &files);
    // Shards with a loss mask or documents (zerorun prepare's): targets the mask leaves out are -100, which the loss
    // ignores; documents packed with per-document attention and positions, or one a sequence, padded.
    bool documents = !packing;
    for (const std::string& f : files) documents = documents || zerorun_shard_has_mask(f);
    if (documents && !packing) return make_padded_document_source(spec, seq_len, V, pad);
    if (documents) return make_masked_token_source(spec, seq_len, V, -100, positions);
    std::string desc = files.size() == 1 ? files[0] : std::to_string(files.size()) + " files matching " + spec;
    return std::make_unique<TokenWindows>(std::move(toks), seq_len, V, desc);
  }
  if (regression) {
    ZR_CHECK(spec.empty() || spec == "synthetic", "data: model with f32 inputs x/y only trains on 'synthetic' data",
             " (token files need a model with tokens/targets inputs)");
    Shape sx = g.input_shape(g.inputs[0].name == "x" ? g.inputs[0] : g.inputs[1], {{"B", 1}});
    Shape sy = g.input_shape(g.inputs[0].name == "y" ? g.inputs[0] : g.inputs[1], {{"B", 1}});
    ZR_CHECK(sx.size() == 2 && sy.size() == 2, "synthetic regression needs x [B, in] and y [B, out]");
    return std::make_unique<SyntheticRegression>(sx[1], sy[1], seed);
  }
  ZR_FAIL("data: no data source fits this model's inputs (expected tokens/targets or x/y)");
}

}  // namespace zerorun
