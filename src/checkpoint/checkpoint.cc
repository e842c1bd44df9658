// Sharded checkpoints: every rank writes the fp32 master and optimizer-state
// slices it owns (per parameter, so any later world size or ZeRO stage can
// read exactly the ranges it needs); rank 0 writes manifest.json with
// checksums, then `latest`, only after all ranks confirmed their shard.
#include "zerorun/checkpoint.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "zerorun/fsutil.h"
#include "zerorun/knobs.h"
#include "zerorun/model.h"
#include "zerorun/optim.h"
#include "zerorun/platform.h"
#include "zerorun/safetensors.h"
#include "zerorun/strict_json.h"
#include "zerorun/zero_state.h"

namespace zerorun {

namespace ckpt {

std::string shard_name(int rank) {
  char b[64];
  std::snprintf(b, sizeof b, "zero_rank_%05d.safetensors", rank);
  return b;
}

std::string resolve_dir(const std::string& save_dir, const std::string& tag) {
  namespace fs = std::filesystem;
  const fs::path dir = platform::to_path(save_dir);
  if (fs::exists(dir / "manifest.json") && (tag.empty() || tag == "latest")) return save_dir;
  std::string t = tag.empty() ? "latest" : tag;
  if (t == "latest") {
    std::string lp = platform::generic_path(dir / "latest");
    ZR_CHECK(path_exists(lp), save_dir, ": no checkpoint here (no 'latest' file and no manifest.json)");
    t = read_file(lp);
    while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
    ZR_CHECK(!t.empty() && t.find('/') == std::string::npos, lp, ": does not name a checkpoint tag");
  }
  std::string d = platform::generic_path(dir / t);
  if (!is_directory(d)) {  // a tag that was never saved: say which ones were
    std::vector<std::string> tags;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.is_directory() && fs::exists(e.path() / "manifest.json"))
        tags.push_back(platform::generic_path(e.path().filename()));
    std::sort(tags.begin(), tags.end());
    std::string list;
    for (const auto& x : tags) list += (list.empty() ? "" : ", ") + x;
    ZR_FAIL(save_dir, ": no checkpoint '", t, "' (", tags.empty() ? "none saved here" : "saved: " + list, ")");
  }
  ZR_CHECK(path_exists(d + "/manifest.json"), d, ": checkpoint '", t, "' has no manifest.json", " (incomplete save?)");
  return d;
}

namespace {

// Every field loading and merging read, checked for type and range before any is used: a manifest edited by hand
// or damaged gives an error naming the field, never a JSON type error or a read outside a shard.
void check_manifest(const nlohmann::json& m) {
  using json = nlohmann::json;
  auto field = [](const json& o, const std::string& where, const char* k) -> const json& {
    ZR_CHECK(o.is_object() && o.contains(k), "missing '", where, k, "'");
    return o[k];
  };
  auto count = [&](const json& o, const std::string& where, const char* k, int64_t lo, int64_t hi) {
    const json& v = field(o, where, k);
    ZR_CHECK(v.is_number_integer() && v.get<int64_t>() >= lo && v.get<int64_t>() <= hi, "'", where, k,
             "' must be an integer in [", lo, ", ", hi, "], got ", v.dump());
    return v.get<int64_t>();
  };
  auto text = [&](const json& o, const std::string& where, const char* k) {
    const json& v = field(o, where, k);
    ZR_CHECK(v.is_string(), "'", where, k, "' must be a string, got ", v.dump());
    return v.get<std::string>();
  };
  constexpr int64_t kMax = int64_t{1} << 50;
  ZR_CHECK(m.is_object() && m.value("format", json()) == "zerorun.checkpoint", "not a zerorun checkpoint manifest");
  ZR_CHECK(m.value("version", json()) == 1, "unsupported checkpoint version ", m.value("version", json()).dump(),
           " (this zerorun reads version 1)");
  count(m, "", "step", 0, kMax);
  count(m, "", "updates", 0, kMax);
  if (m.contains("samples")) count(m, "", "samples", 0, kMax);
  if (m.contains("data")) count(field(m, "", "data"), "data.", "next_sample", 0, kMax);
  const int64_t world = count(m, "", "world_size", 1, 1 << 20);
  // Fields only reported (or written by older zerorun versions, hence optional): still in range when present.
  if (m.contains("zero_stage")) count(m, "", "zero_stage", 0, 3);
  if (m.contains("precision")) {
    const std::string p = text(m, "", "precision");
    ZR_CHECK(p == "fp32" || p == "bf16" || p == "fp16", "'precision' must be fp32, bf16 or fp16, got '", p, "'");
  }
  if (m.contains("tag")) text(m, "", "tag");
  if (m.contains("config")) ZR_CHECK(m["config"].is_object(), "'config' must be an object");
  if (m.contains("data") && m["data"].contains("seed")) count(m["data"], "data.", "seed", 0, INT64_MAX);
  if (m.contains("rng")) {
    ZR_CHECK(m["rng"].is_object(), "'rng' must be an object");
    if (m["rng"].contains("data_seed")) count(m["rng"], "rng.", "data_seed", 0, INT64_MAX);
  }
  if (m.contains("scheduler")) {
    const json& sc = field(m, "", "scheduler");
    ZR_CHECK(sc.is_object(), "'scheduler' must be an object");
    if (sc.contains("type")) text(sc, "scheduler.", "type");
    if (sc.contains("last_batch_iteration")) count(sc, "scheduler.", "last_batch_iteration", -1, kMax);
  }
  const json& opt = field(m, "", "optimizer");
  text(opt, "optimizer.", "type");
  count(opt, "optimizer.", "steps", 0, kMax);
  if (opt.contains("states")) {
    ZR_CHECK(opt["states"].is_array(), "'optimizer.states' must be an array of names");
    for (auto& st : opt["states"])
      ZR_CHECK(st.is_string(), "'optimizer.states' must be an array of names, got ", opt["states"].dump());
  }
  ZR_CHECK(field(m, "", "loss_scaler").is_object(), "'loss_scaler' must be an object");
  // The graph: the one the hash names, valid with the parameters' shapes.
  const std::string hash = text(m, "", "graph_hash");
  Graph g;
  ZR_WITH_CONTEXT("'graph'", g = Graph::from_json(field(m, "", "graph")));
  ZR_CHECK(graph_hash(g) == hash, "'graph' does not match 'graph_hash' ", hash, " (edited manifest?)");
  // Shards: zero_rank_<r>.safetensors for r < world_size (never another path), with size and checksum.
  const json& files = field(m, "", "files");
  ZR_CHECK(files.is_object(), "'files' must be an object");
  for (auto& [name, info] : files.items()) {
    bool ours = false;
    for (int r = 0; r < world && !ours; ++r) ours = name == shard_name(r);
    ZR_CHECK(ours, "files: '", name, "' is not a shard name of this world size (zero_rank_<r>.safetensors, r < ", world,
             ")");
    count(info, "files." + name + ".", "bytes", 0, kMax);
    std::string crc = text(info, "files." + name + ".", "crc32");
    ZR_CHECK(crc.size() == 8 && crc.find_first_not_of("0123456789abcdef") == std::string::npos, "files.", name,
             ".crc32 must be 8 hex digits, got '", crc, "'");
  }
  // Parameters: shape and numel agree; slices of listed shards cover [0, numel) once, in order.
  const json& params = field(m, "", "params");
  ZR_CHECK(params.is_object(), "'params' must be an object");
  std::map<std::string, Shape> shapes;
  for (auto& [name, p] : params.items()) {
    const std::string w = "params." + name + ".";
    const json& shape = field(p, w, "shape");
    ZR_CHECK(shape.is_array(), "'", w, "shape' must be an array");
    Shape sh;
    int64_t n = 1;
    for (auto& d : shape) {
      ZR_CHECK(d.is_number_integer() && d.get<int64_t>() >= 1 && d.get<int64_t>() <= kMax / n, "'", w,
               "shape' must hold positive integers, got ", shape.dump());
      sh.push_back(d.get<int64_t>());
      n *= sh.back();
    }
    ZR_CHECK(count(p, w, "numel", 0, kMax) == n, "'", w, "numel' ", p["numel"].dump(),
             " is not the product of its shape ", shape.dump());
    const json& slices = field(p, w, "slices");
    ZR_CHECK(slices.is_array(), "'", w, "slices' must be an array");
    int64_t at = 0;
    for (auto& sl : slices) {
      const int64_t r = count(sl, w + "slices[].", "rank", 0, world - 1);
      const int64_t b = count(sl, w + "slices[].", "begin", 0, n), e = count(sl, w + "slices[].", "end", 0, n);
      ZR_CHECK(b == at && e > b, "'", w, "slices' must cover [0, ", n, ") in order without gaps or overlaps; got ",
               slices.dump());
      ZR_CHECK(files.contains(shard_name(static_cast<int>(r))), "'", w, "slices' name rank ", r,
               " whose shard is not in 'files'");
      at = e;
    }
    ZR_CHECK(at == n, "'", w, "slices' must cover [0, ", n, "), they end at ", at);
    shapes[name] = sh;
  }
  ZR_WITH_CONTEXT("'graph' and 'params'", check_graph_params(g, shapes));
}

}  // namespace

nlohmann::json read_manifest(const std::string& dir, bool verify) {
  std::string mp = dir + "/manifest.json";
  nlohmann::json m = load_json_file_strict(mp);
  ZR_WITH_CONTEXT(mp, check_manifest(m));
  if (verify) {
    std::set<std::string> all;
    for (auto& [name, info] : m["files"].items()) all.insert(name);
    verify_shards(dir, m, all);
  }
  return m;
}

void verify_shards(const std::string& dir, const nlohmann::json& m, const std::set<std::string>& checksummed) {
  for (auto& [name, info] : m["files"].items()) {
    std::string p = dir + "/" + name;
    ZR_CHECK(path_exists(p), p, ": shard listed in the manifest is missing");
    uint64_t sz = regular_file_size(p);
    ZR_CHECK(sz == info.at("bytes").get<uint64_t>(), p, ": size ", sz, " bytes, manifest says ",
             info.at("bytes").get<uint64_t>(), " (truncated or replaced shard)");
    if (!checksummed.count(name)) continue;
    char crc[16];
    std::snprintf(crc, sizeof crc, "%08x", file_crc32(p));
    ZR_CHECK(crc == info.at("crc32").get<std::string>(), p, ": checksum ", crc, " does not match the manifest's ",
             info.at("crc32").get<std::string>(), " (corrupt shard)");
  }
}

std::vector<Piece> pieces_for(const nlohmann::json& m, const std::string& param, const std::string& kind, int64_t b,
                              int64_t e) {
  ZR_CHECK(m["params"].contains(param), "checkpoint has no parameter '", param, "'");
  ZR_CHECK(b >= 0 && b <= e && e <= m["params"][param]["numel"].get<int64_t>(), "checkpoint parameter '", param,
           "' has no elements [", b, ", ", e, ")");
  std::vector<Piece> out;
  int64_t covered = 0;
  for (auto& s : m["params"][param]["slices"]) {
    int64_t sb = s["begin"].get<int64_t>(), se = s["end"].get<int64_t>();
    int64_t lo = std::max(b, sb), hi = std::min(e, se);
    if (hi <= lo) continue;
    out.push_back({shard_name(s["rank"].get<int>()), param + "." + kind, lo - sb, hi - lo, lo - b, se - sb});
    covered += hi - lo;
  }
  ZR_CHECK(covered == e - b, "checkpoint slices of '", param, "' do not cover elements [", b, ", ", e, ")");
  return out;
}

}  // namespace ckpt

// ---- the shards, through ZeRO's state (zero::ShardedState) and the optimizer ------------------------------------

namespace {

// Optimizer state k (0 = m, 1 = v) of param p, elements [elem, elem + n), read into / written from f32 (bf16
// states widened / rounded), at the index ZeRO's state gives it, wherever its moments live.
void state_io(zero::ShardedState& zs, int k, int p, int64_t elem, int64_t n, float* buf, bool write) {
  zero::MomentStore& ms = zs.moments();
  const Tensor& t = ms.array(k);
  const int64_t at = zs.state_offset(p, elem);
  if (ms.nvme() || t.dtype() != DType::F32 || t.device().is_cpu()) {  // NVMe, bf16 or host memory
    if (write)
      ms.write(k, at, n, buf);
    else
      ms.read(k, at, n, buf);
    return;
  }
  if (write)  // f32 in device memory
    zs.copy_f32(t.f32() + at, buf, n);
  else
    zs.copy_f32(buf, t.f32() + at, n);
}

}  // namespace

namespace ckpt {

void save(const std::string& save_dir, const std::string& tag, const std::function<nlohmann::json()>& fields,
          zero::ShardedState& zs, Optimizer& opt, Communicator& comm) {
  const int r = comm.rank(), W = comm.size();
  const std::string dir = save_dir + "/" + tag;
  if (r == 0) make_dirs(dir);
  comm.barrier();
  auto states = opt.state();
  const zero::Plan& plan = zs.plan();
  // 1. This rank's shard.
  std::vector<SafetensorsWriteItem> items;
  for (size_t p = 0; p < plan.params.size(); ++p) {
    zero::Range rg = zs.ckpt_range(static_cast<int>(p), r);
    if (rg.empty()) continue;
    const std::string& name = plan.params[p].name;
    Tensor mt = Tensor::empty({rg.size()}, DType::F32, MemCategory::Buffers);
    zs.read_master(static_cast<int>(p), rg, mt.f32());
    items.push_back({name + ".master", mt});
    for (size_t k = 0; k < states.size(); ++k) {
      Tensor st = Tensor::empty({rg.size()}, DType::F32, MemCategory::Buffers);
      state_io(zs, static_cast<int>(k), static_cast<int>(p), rg.begin, rg.size(), st.f32(), false);
      items.push_back({name + "." + states[k].first, st});
    }
  }
  const std::string shard = shard_name(r);
  write_safetensors(dir + "/" + shard, items, {{"format", "zerorun.checkpoint.shard"}, {"rank", std::to_string(r)}});
  if (knobs().has_fault_inject) {  // testing: die between shard and confirmation
    const char* f = knobs().fault_inject.c_str();
    std::string want = "die_after_shard:" + std::to_string(r);
    if (want == f) {
      std::fprintf(stderr, "zerorun: fault injection: rank %d dies after writing its shard\n", r);
      std::fflush(stderr);
      platform::kill_self_hard();
    }
    if (std::strncmp(f, "pause_after_shard:", 18) == 0)  // testing: a slow save, to stop it midway
      std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(f + 18)));
  }
  // 2. Confirmations (size + crc of every shard) to rank 0.
  uint32_t crc = file_crc32(dir + "/" + shard);
  uint64_t bytes = regular_file_size(dir + "/" + shard);
  int32_t mine[3] = {static_cast<int32_t>(crc), static_cast<int32_t>(bytes & 0xffffffffu),
                     static_cast<int32_t>(bytes >> 32)};
  std::vector<int32_t> all(static_cast<size_t>(3 * W));
  comm.all_gather(mine, all.data(), 3, DType::I32);
  // 3. Manifest (the caller's fields, the parameters' ranges per rank, the shards' sizes and checksums), then
  // `latest` (rank 0).
  if (r == 0) {
    nlohmann::json m = fields();
    nlohmann::json params = nlohmann::json::object();
    for (size_t p = 0; p < plan.params.size(); ++p) {
      const zero::ParamSlot& s = plan.params[p];
      nlohmann::json slices = nlohmann::json::array();
      for (int rr = 0; rr < W; ++rr) {
        zero::Range rg = zs.ckpt_range(static_cast<int>(p), rr);
        if (!rg.empty()) slices.push_back({{"rank", rr}, {"begin", rg.begin}, {"end", rg.end}});
      }
      params[s.name] = {{"shape", zs.shape(s.name)}, {"numel", s.numel}, {"slices", slices}};
    }
    m["params"] = params;
    nlohmann::json files = nlohmann::json::object();
    for (int rr = 0; rr < W; ++rr) {
      char c[16];
      std::snprintf(c, sizeof c, "%08x", static_cast<uint32_t>(all[static_cast<size_t>(3 * rr)]));
      uint64_t b = static_cast<uint32_t>(all[static_cast<size_t>(3 * rr + 1)]) |
                   (static_cast<uint64_t>(static_cast<uint32_t>(all[static_cast<size_t>(3 * rr + 2)])) << 32);
      files[shard_name(rr)] = {{"bytes", b}, {"crc32", c}};
    }
    m["files"] = files;
    write_file_atomic(dir + "/manifest.json", m.dump(1));
    write_file_atomic(save_dir + "/latest", tag + "\n");
  }
  comm.barrier();
}

void load_shards(const std::string& dir, const nlohmann::json& m, zero::ShardedState& zs, Optimizer& opt) {
  const std::string mp = dir + "/manifest.json";
  auto states = opt.state();
  std::map<std::string, SafetensorsFile> headers;
  auto read_into = [&](const std::string& param, const std::string& kind, int64_t b, int64_t e, float* dst) {
    for (auto& pc : pieces_for(m, param, kind, b, e)) {
      auto it = headers.find(pc.file);
      if (it == headers.end()) it = headers.emplace(pc.file, read_safetensors_header(dir + "/" + pc.file)).first;
      const SafetensorsEntry* ent = it->second.find(pc.tensor);
      ZR_CHECK(ent && ent->dtype == DType::F32 && shape_numel(ent->shape) == pc.stored, dir, "/", pc.file,
               ": has no f32 tensor '", pc.tensor, "' of ", pc.stored, " elements (the manifest's slice)");
      read_safetensors_range(it->second, *ent, pc.src_first, pc.count, dst + pc.dst_offset);
    }
  };
  // Master weights read (zs.load_range): everything where the rank keeps a full f32 compute copy, else its own
  // shard; optimizer state: own shard (everything at stage 0).
  const zero::Plan& plan = zs.plan();
  // Integrity first: sizes of every shard, checksums of the shards this rank reads.
  std::set<std::string> reads;
  for (size_t p = 0; p < plan.params.size(); ++p) {
    const zero::ParamSlot& s = plan.params[p];
    ZR_CHECK(m["params"].contains(s.name) && m["params"][s.name]["numel"].get<int64_t>() == s.numel, mp,
             ": parameter '", s.name, "' is missing or has another size");
    zero::Range need = zs.load_range(static_cast<int>(p)), own = zs.own_range(static_cast<int>(p));
    if (!need.empty())
      for (auto& pc : pieces_for(m, s.name, "master", need.begin, need.end)) reads.insert(pc.file);
    if (!own.empty())
      for (auto& st : states)
        for (auto& pc : pieces_for(m, s.name, st.first, own.begin, own.end)) reads.insert(pc.file);
  }
  verify_shards(dir, m, reads);
  for (size_t p = 0; p < plan.params.size(); ++p) {
    const zero::ParamSlot& s = plan.params[p];
    const int pi = static_cast<int>(p);
    zero::Range need = zs.load_range(pi), own = zs.own_range(pi);
    if (!need.empty()) {
      std::vector<float> v(static_cast<size_t>(need.size()));
      read_into(s.name, "master", need.begin, need.end, v.data());
      zs.load_master(pi, need, std::move(v));  // the compute copies and this rank's master
    }
    if (!own.empty())
      for (size_t k = 0; k < states.size(); ++k) {
        std::vector<float> st(static_cast<size_t>(own.size()));
        read_into(s.name, states[k].first, own.begin, own.end, st.data());
        state_io(zs, static_cast<int>(k), pi, own.begin, own.size(), st.data(), true);
      }
  }
}

}  // namespace ckpt

}  // namespace zerorun
