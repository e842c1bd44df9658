// The seeded mutation test ctest runs (no clang or libFuzzer needed): every fuzz target gets its valid seeds, the
// saved regression inputs of tests/fuzz/corpus/<target>/, and a fixed number of mutants of the seeds (byte edits,
// and edits of the JSON inside: config, manifest, the safetensors header and model.bin's graph). Each must be
// accepted or rejected with a zerorun::Error naming the file; anything else fails the test, with the input saved.
//   zerorun_fuzz_test [--iters N] [--target T] [--seed S]   run the test (N mutants per target, default 1500)
//   zerorun_fuzz_test --write-seeds DIR                      write the seeds as DIR/<target>/seed_<i> (libFuzzer)
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "fuzz_targets.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace zerorun::fuzz;

namespace {

using Rng = std::mt19937_64;

size_t pick(Rng& r, size_t n) { return n ? static_cast<size_t>(r() % n) : 0; }

const std::vector<std::string> kTokens = {"0",
                                          "-1",
                                          "1e999",
                                          "-0",
                                          "4294967296",
                                          "9223372036854775807",
                                          "18446744073709551616",
                                          "\"\"",
                                          "null",
                                          "[]",
                                          "{}",
                                          "{",
                                          "\"",
                                          ",",
                                          ":",
                                          "@",
                                          "slots=",
                                          "slots=0",
                                          "\xff",
                                          "\n",
                                          "#",
                                          " ",
                                          "1.5",
                                          "true"};

const std::vector<json> kValues = {json(0),
                                   json(-1),
                                   json(1),
                                   json(2),
                                   json(7),
                                   json(int64_t{1} << 31),
                                   json(int64_t{1} << 40),
                                   json(INT64_MAX),
                                   json(INT64_MIN),
                                   json(UINT64_MAX),
                                   json(0.5),
                                   json(-1e300),
                                   json(1e300),
                                   json(""),
                                   json("x"),
                                   json("auto"),
                                   json("F32"),
                                   json("BF16"),
                                   json("I32"),
                                   json(nullptr),
                                   json(true),
                                   json::array(),
                                   json::object(),
                                   json::array({0, 0})};

void all_nodes(json& j, std::vector<json*>& out) {
  out.push_back(&j);
  if (j.is_object() || j.is_array())
    for (auto& v : j) all_nodes(v, out);
}

// One structural edit somewhere in `j`: a value replaced, a key or element removed or duplicated, a number scaled.
void mutate_json(json& j, Rng& r) {
  std::vector<json*> nodes;
  all_nodes(j, nodes);
  json* n = nodes[pick(r, nodes.size())];
  switch (pick(r, 6)) {
    case 0:
    case 1:
      *n = kValues[pick(r, kValues.size())];
      break;
    case 2:  // remove a member / element
      if (n->is_object() && !n->empty()) {
        auto it = n->begin();
        std::advance(it, static_cast<long>(pick(r, n->size())));
        n->erase(it.key());
      } else if (n->is_array() && !n->empty()) {
        n->erase(pick(r, n->size()));
      }
      break;
    case 3:  // duplicate an element / copy a member's value to another member
      if (n->is_array() && !n->empty()) {
        n->push_back((*n)[pick(r, n->size())]);
      } else if (n->is_object() && n->size() >= 2) {
        auto a = n->begin(), b = n->begin();
        std::advance(a, static_cast<long>(pick(r, n->size())));
        std::advance(b, static_cast<long>(pick(r, n->size())));
        b.value() = a.value();
      }
      break;
    case 4:  // scale or negate a number
      if (n->is_number_integer()) {
        const uint64_t v = static_cast<uint64_t>(n->get<int64_t>()), f[] = {~uint64_t{0}, 2, 1000, 0};
        *n = static_cast<int64_t>(v * f[pick(r, 4)] + pick(r, 3) - 1);  // wraps, as unsigned arithmetic does
      } else if (n->is_number()) {
        *n = n->get<double>() * (pick(r, 2) ? -1.0 : 1e6);
      } else if (n->is_string()) {
        *n = n->get<std::string>() + (pick(r, 2) ? "x" : "");
      }
      break;
    default:  // a member added under a new or existing name
      if (n->is_object()) (*n)[pick(r, 2) ? "zz" : (n->empty() ? "a" : n->begin().key())] = kValues[pick(r, 9)];
      break;
  }
}

void mutate_bytes(std::string& s, Rng& r, bool text) {
  size_t n = s.size();
  switch (pick(r, text ? 8 : 7)) {
    case 0:
      if (n) s[pick(r, n)] ^= static_cast<char>(1u << pick(r, 8));
      break;
    case 1: {
      const unsigned char v[] = {0, 1, 0x7f, 0x80, 0xff, '9', '"', '{'};
      if (n) s[pick(r, n)] = static_cast<char>(v[pick(r, 8)]);
      break;
    }
    case 2: {  // a 4- or 8-byte integer overwritten (little endian)
      const uint64_t v[] = {0, 1, 0x7fffffff, 0x80000000, 0xffffffff, UINT64_MAX, uint64_t{1} << 40, 255};
      uint64_t x = v[pick(r, 8)];
      size_t w = pick(r, 2) ? 8 : 4;
      if (n >= w) std::memcpy(&s[pick(r, n - w + 1)], &x, w);
      break;
    }
    case 3:
      s.resize(pick(r, n + 1));
      break;
    case 4: {
      size_t at = pick(r, n + 1), len = 1 + pick(r, 16);
      std::string ins;
      for (size_t i = 0; i < len; ++i) ins += static_cast<char>(r());
      s.insert(at, ins);
      break;
    }
    case 5:
      if (n) {
        size_t a = pick(r, n);
        s.erase(a, 1 + pick(r, std::min<size_t>(64, n - a)));
      }
      break;
    case 6:
      if (n) {
        size_t a = pick(r, n), len = 1 + pick(r, std::min<size_t>(64, n - a));
        s.insert(pick(r, n + 1), s.substr(a, len));
      }
      break;
    default:
      s.insert(pick(r, n + 1), kTokens[pick(r, kTokens.size())]);
      break;
  }
}

// The safetensors header (u64 length + JSON) edited as JSON, the tensor bytes kept; in model.bin sometimes the
// graph inside __metadata__ instead.
bool mutate_safetensors_header(std::string& s, Rng& r, bool model) {
  if (s.size() < 8) return false;
  uint64_t hl = 0;
  std::memcpy(&hl, s.data(), 8);
  if (hl > s.size() - 8) return false;
  json h = json::parse(s.substr(8, hl), nullptr, false);
  if (h.is_discarded()) return false;
  bool graph = model && pick(r, 3) != 0 && h.contains("__metadata__") && h["__metadata__"].is_object() &&
               h["__metadata__"].contains("graph") && h["__metadata__"]["graph"].is_string();
  if (graph) {
    json g = json::parse(h["__metadata__"]["graph"].get<std::string>(), nullptr, false);
    if (g.is_discarded()) return false;
    for (size_t k = 0, m = 1 + pick(r, 2); k < m; ++k) mutate_json(g, r);
    h["__metadata__"]["graph"] = g.dump();
  } else {
    mutate_json(h, r);
  }
  std::string nh = h.dump();
  uint64_t nl = nh.size();
  std::string out(8, '\0');
  std::memcpy(&out[0], &nl, 8);
  s = out + nh + s.substr(8 + hl);
  return true;
}

std::string mutate(const std::string& target, std::string s, Rng& r) {
  const bool json_doc = target == "config" || target == "manifest";
  const bool st = target == "model" || target == "safetensors";
  const bool text = json_doc || target == "hostfile";
  for (size_t k = 0, m = 1 + pick(r, 3); k < m; ++k) {
    if (json_doc && pick(r, 3) != 0) {
      json j = json::parse(s, nullptr, false);
      if (!j.is_discarded()) {
        mutate_json(j, r);
        s = j.dump(pick(r, 2) ? 1 : -1);
        continue;
      }
    }
    if (st && pick(r, 3) != 0 && mutate_safetensors_header(s, r, target == "model")) continue;
    mutate_bytes(s, r, text);
  }
  return s;
}

std::string hex_head(const std::string& s) {
  std::string out;
  char b[4];
  for (size_t i = 0; i < std::min<size_t>(s.size(), 64); ++i) {
    std::snprintf(b, sizeof b, "%02x", static_cast<unsigned char>(s[i]));
    out += b;
  }
  return out + (s.size() > 64 ? "..." : "");
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::off);
  int64_t iters = 1500;
  uint64_t seed = 20261205;
  std::string only, write_seeds;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--iters" && i + 1 < argc)
      iters = std::atoll(argv[++i]);
    else if (a == "--target" && i + 1 < argc)
      only = argv[++i];
    else if (a == "--seed" && i + 1 < argc)
      seed = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--write-seeds" && i + 1 < argc)
      write_seeds = argv[++i];
    else {
      std::fprintf(stderr, "usage: %s [--iters N] [--target T] [--seed S] | --write-seeds DIR\n", argv[0]);
      return 2;
    }
  }
  const std::string src = ZR_SOURCE_DIR;
  const bool verbose = std::getenv("ZERORUN_FUZZ_VERBOSE") != nullptr;  // print every rejection's message
  int failures = 0;
  for (const std::string& t : target_names()) {
    if (!only.empty() && t != only) continue;
    std::vector<std::string> inputs = seeds(t, src);
    if (!write_seeds.empty()) {
      fs::create_directories(fs::path(write_seeds) / t);
      for (size_t i = 0; i < inputs.size(); ++i)
        std::ofstream(fs::path(write_seeds) / t / ("seed_" + std::to_string(i)), std::ios::binary) << inputs[i];
      continue;
    }
    const size_t n_seeds = inputs.size();
    if (n_seeds == 0) {
      std::printf("FAIL %s: no seeds\n", t.c_str());
      ++failures;
      continue;
    }
    std::error_code ec;
    std::vector<fs::path> saved;
    for (auto& e : fs::directory_iterator(fs::path(src) / "tests/fuzz/corpus" / t, ec)) saved.push_back(e.path());
    std::sort(saved.begin(), saved.end());
    for (auto& p : saved) inputs.push_back(read_file(p));
    Rng r(seed ^ std::hash<std::string>()(t));
    int64_t accepted = 0, rejected = 0, bad = 0, seeds_ok = 0;
    const int64_t total = static_cast<int64_t>(inputs.size()) + iters;
    for (int64_t i = 0; i < total; ++i) {
      std::string in = i < static_cast<int64_t>(inputs.size()) ? inputs[static_cast<size_t>(i)]
                                                               : mutate(t, inputs[pick(r, n_seeds)], r);
      // Kept on disk while it runs: a crash leaves the input behind.
      std::ofstream("fuzz_current_" + t + ".bin", std::ios::binary | std::ios::trunc) << in;
      try {
        Outcome o = run(t, reinterpret_cast<const uint8_t*>(in.data()), in.size());
        (o == Outcome::Accepted ? accepted : rejected)++;
        if (verbose && o == Outcome::Rejected) std::printf("rejected: %s\n", last_error().c_str());
        if (i < static_cast<int64_t>(n_seeds)) {
          if (o == Outcome::Accepted)
            ++seeds_ok;
          else
            std::printf("FAIL %s: seed %lld rejected: %s\n", t.c_str(), static_cast<long long>(i),
                        last_error().c_str());
        }
      } catch (const ContractViolation& v) {
        ++bad;
        std::string keep = "fuzz_failure_" + t + "_" + std::to_string(i) + ".bin";
        std::ofstream(keep, std::ios::binary) << in;
        if (bad <= 5)
          std::printf("FAIL %s input %lld (%zu bytes, saved as %s, starts %s):\n  %s\n", t.c_str(),
                      static_cast<long long>(i), in.size(), keep.c_str(), hex_head(in).c_str(), v.what.c_str());
      }
    }
    std::remove(("fuzz_current_" + t + ".bin").c_str());
    std::printf("%-12s %lld inputs: %lld accepted, %lld rejected with an error naming the file, %lld violations\n",
                t.c_str(), static_cast<long long>(total), static_cast<long long>(accepted),
                static_cast<long long>(rejected), static_cast<long long>(bad));
    if (seeds_ok != static_cast<int64_t>(n_seeds)) {
      std::printf("FAIL %s: only %lld of %zu valid seeds were accepted\n", t.c_str(), static_cast<long long>(seeds_ok),
                  n_seeds);
      ++failures;
    }
    failures += bad > 0;
  }
  if (!write_seeds.empty()) return 0;
  std::printf(failures ? "FAILED\n" : "all fuzz targets kept the contract\n");
  return failures ? 1 : 0;
}
