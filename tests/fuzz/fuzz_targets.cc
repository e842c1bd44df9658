// The fuzz targets of fuzz_targets.h: each writes the input where the parser expects a file (parsers of user
// files take paths) and runs what zerorun runs on such a file, up to one training step for a model that loads.
#include "fuzz_targets.h"

#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <typeinfo>

#include "zerorun/checkpoint.h"
#include "zerorun/comm.h"
#include "zerorun/config.h"
#include "zerorun/data.h"
#include "zerorun/engine.h"
#include "zerorun/error.h"
#include "zerorun/launch.h"
#include "zerorun/merge.h"
#include "zerorun/model.h"
#include "zerorun/platform.h"
#include "zerorun/safetensors.h"
#include "zerorun/strict_json.h"

namespace zerorun::fuzz {

namespace fs = std::filesystem;

namespace {

struct Scratch {
  std::string dir;
  Scratch() : dir(platform::make_temp_dir("zerorun_fuzz_")) {}
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

void write_bytes(const std::string& path, const uint8_t* d, size_t n) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(d), static_cast<std::streamsize>(n));
  if (!f) throw ContractViolation{"fuzz harness: cannot write " + path};
}

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

Config tiny_config(int64_t hidden) {
  Config c = parse_config(json::parse(R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                                          "gradient_clipping": 1.0, "zero_optimization": {"stage": 2}})"),
                          "fuzz");
  ResolveContext rc;
  rc.hidden = hidden;
  resolve_config(c, rc);
  return c;
}

// A model that loaded: one training step and one eval at micro batch 1 where its activations are small (the graph
// passed validation, so the executor must run it or reject it with an Error).
void train_one_step(const Model& m) {
  auto syms = m.symbols;
  syms["B"] = 1;
  if (!syms.count("T")) syms["T"] = 1;
  if (m.num_params() > (1 << 20) || syms["T"] > 256) return;
  int64_t elems = 0;
  for (auto& [name, v] : m.graph.validate(m.param_shapes(), syms)) {
    int64_t n = 1;
    for (int64_t d : v.shape) n = d > 0 && n <= (int64_t{1} << 40) / d ? n * d : (int64_t{1} << 40);
    elems += n;
  }
  if (elems > (1 << 22)) return;
  auto comm = make_self_comm();
  Engine e(m, tiny_config(32), *comm, 1);
  auto data = make_data_source("synthetic", m, e.seq_len(), 1);
  e.train_step(*data);
  e.eval_loss(*data, 1);
}

// The models the targets train and save: vocab 32, T 8, C 16, one layer of two heads.
const Gpt2Spec kTinyGpt2{32, 8, 16, 1, 2};

// A config that resolved: two training steps of a tiny GPT-2 with it (as `zerorun train` would after its own
// checks). An error there is a rejection too; the trainer reports it against the config, as this does.
void train_with_config(const Config& c, const std::string& path) {
  if (c.micro > 64 || c.gas > 64) return;  // valid but slow, not what this target looks for
  static const Model m = build_gpt2(kTinyGpt2, 2);
  auto comm = make_self_comm();
  ZR_WITH_CONTEXT(path, {
    Engine e(m, c, *comm, 2);
    auto data = make_data_source("synthetic", m, e.seq_len(), 1);
    e.train_step(*data);
    e.train_step(*data);
  });
}

// The checkpoint the manifest target mutates the manifest of: a tiny GPT-2 after one ZeRO-2 step.
struct CheckpointFixture {
  Model model;
  std::string save_dir, step_dir, manifest;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<Engine> engine;
  CheckpointFixture() {
    model = build_gpt2(kTinyGpt2, 3);
    save_dir = scratch_dir() + "/ckpt";
    comm = make_self_comm();
    engine = std::make_unique<Engine>(model, tiny_config(16), *comm, 2);
    auto data = make_data_source("synthetic", model, engine->seq_len(), 1);
    engine->train_step(*data);
    step_dir = save_dir + "/" + engine->save_checkpoint(save_dir);
    manifest = read_bytes(step_dir + "/manifest.json");
  }
};

CheckpointFixture& checkpoint_fixture() {
  static CheckpointFixture f;
  return f;
}

Model seed_model(const std::string& arch) {
  if (arch == "gpt2") return build_gpt2(kTinyGpt2, 1);
  if (arch == "llama") return build_llama(LlamaSpec{32, 8, 16, 1, 2, 24}, 1);
  MlpSpec s;
  return build_mlp(s, 1);
}

void run_target(const std::string& target, const uint8_t* d, size_t n, std::string& named) {
  const std::string& dir = scratch_dir();
  if (target == "model") {
    named = dir + "/model.bin";
    write_bytes(named, d, n);
    Model m = load_model(named);
    train_flops_per_token(m, 8);
    train_one_step(m);
  } else if (target == "safetensors") {
    named = dir + "/t.safetensors";
    write_bytes(named, d, n);
    SafetensorsFile f = read_safetensors_header(named);
    for (auto& e : f.entries) {
      int64_t numel = 1;
      for (int64_t x : e.shape) numel *= x;
      if (numel <= (1 << 22)) read_safetensors_tensor(f, e, MemCategory::Buffers);
      if (numel > 0) {
        std::vector<uint8_t> buf(static_cast<size_t>(std::min<int64_t>(numel, 16)) * 8);
        read_safetensors_range(f, e, numel / 2, std::min<int64_t>(numel - numel / 2, 16), buf.data());
      }
    }
  } else if (target == "config") {
    named = dir + "/ds_config.json";
    write_bytes(named, d, n);
    Config c = load_config(named);
    for (int world : {1, 3}) {  // another world size where the config leaves the batch to it
      if (world > 1 && c.train_batch_size) break;
      Config r = c;
      ResolveContext rc;
      rc.world_size = world;
      rc.hidden = 64;
      resolve_config(r, rc);
      if (world == 1) train_with_config(r, named);
    }
  } else if (target == "hostfile") {
    // Input: hostfile text, then optionally "\n--\n" and an --include spec, "\n--\n" and an --exclude spec.
    std::string s(reinterpret_cast<const char*>(d), n), host = s, inc, exc;
    if (auto p = s.find("\n--\n"); p != std::string::npos) {
      host = s.substr(0, p);
      inc = s.substr(p + 4);
      if (auto q = inc.find("\n--\n"); q != std::string::npos) {
        exc = inc.substr(q + 4);
        inc = inc.substr(0, q);
      }
    }
    named = dir + "/hostfile";
    write_bytes(named, reinterpret_cast<const uint8_t*>(host.data()), host.size());
    launch::LaunchRequest r;
    r.hosts = launch::load_hostfile(named);
    named += "|--include|--exclude";  // a placement error names one of these
    r.include = inc;
    r.exclude = exc;
    r.mpirun = "mpirun";
    auto p = launch::place(r);
    launch::build_command(r, p, {"zerorun", "train"});
  } else if (target == "tokens" || target == "npy") {
    named = dir + (target == "tokens" ? "/shard.bin" : "/shard.npy");
    write_bytes(named, d, n);
    std::vector<uint32_t> toks = load_token_files(named);
    (void)toks;
    static Model m = seed_model("gpt2");
    auto src = make_data_source(named, m, 8, 1);
    src->batch(0, 2);
    src->batch(3, 1);
  } else if (target == "manifest") {
    CheckpointFixture& f = checkpoint_fixture();
    named = f.step_dir;
    write_bytes(f.step_dir + "/manifest.json", d, n);
    f.engine->load_checkpoint(f.save_dir, fs::path(f.step_dir).filename().string());
    merge_checkpoint(f.save_dir, fs::path(f.step_dir).filename().string(), dir + "/merged", DType::F32);
  } else {
    throw ContractViolation{"unknown fuzz target '" + target + "'"};
  }
}

// Whether an error message names the input: its path, or for the hostfile target one of the flags.
bool names_input(const std::string& msg, const std::string& named) {
  size_t b = 0;
  while (b <= named.size()) {
    size_t e = named.find('|', b);
    if (e == std::string::npos) e = named.size();
    if (e > b && msg.find(named.substr(b, e - b)) != std::string::npos) return true;
    b = e + 1;
  }
  return false;
}

}  // namespace

const std::string& scratch_dir() {
  static Scratch s;
  return s.dir;
}

const std::vector<std::string>& target_names() {
  static const std::vector<std::string> t = {"model", "safetensors", "config", "hostfile", "tokens", "npy", "manifest"};
  return t;
}

namespace {
std::string g_last_error;
}

const std::string& last_error() { return g_last_error; }

Outcome run(const std::string& target, const uint8_t* data, size_t size) {
  std::string named;
  g_last_error.clear();
  try {
    run_target(target, data, size, named);
    return Outcome::Accepted;
  } catch (const Error& e) {
    g_last_error = e.what();
    if (!names_input(e.what(), named))
      throw ContractViolation{"zerorun::Error that does not name " + named + ": " + e.what()};
    return Outcome::Rejected;
  } catch (const ContractViolation&) {
    throw;
  } catch (const std::exception& e) {
    throw ContractViolation{std::string("exception of type ") + typeid(e).name() +
                            " instead of zerorun::Error: " + e.what()};
  } catch (...) {
    throw ContractViolation{"a non-std exception"};
  }
}

std::vector<std::string> seeds(const std::string& target, const std::string& source_dir) {
  std::vector<std::string> out;
  const std::string& dir = scratch_dir();
  if (target == "model" || target == "safetensors") {
    for (const char* arch : {"gpt2", "llama", "mlp"}) {
      std::string p = dir + "/seed_" + arch + ".bin";
      save_model(p, seed_model(arch));
      out.push_back(read_bytes(p));
    }
    if (target == "safetensors") {
      CheckpointFixture& f = checkpoint_fixture();
      out.push_back(read_bytes(f.step_dir + "/zero_rank_00000.safetensors"));
    }
  } else if (target == "config") {
    for (const char* d : {"/configs", "/../shared/configs"}) {
      std::error_code ec;
      for (auto& e : fs::directory_iterator(source_dir + d, ec))
        if (e.path().extension() == ".json") out.push_back(read_bytes(e.path().string()));
    }
    out.push_back(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
      "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 100, "warmup_num_steps": 10}},
      "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
               "hysteresis": 2, "min_loss_scale": 1},
      "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": true},
                            "stage3_prefetch_bucket_size": "auto", "reduce_bucket_size": 5e8},
      "activation_checkpointing": {"partition_activations": false},
      "train": {"steps": 10, "save_interval": 5, "eval_interval": 5, "eval_batches": 2, "seq_len": 8}})");
  } else if (target == "hostfile") {
    out.push_back("worker-0 slots=8\nworker-1 slots=8\n");
    out.push_back("# cluster\nworker-0 slots=2\n\nworker-1 slots=4  # big one\n--\nworker-1:0,2");
    out.push_back("a slots=1\nb slots=1\nc slots=3\n--\n\n--\nb@c:1");
  } else if (target == "tokens") {
    std::vector<uint16_t> t;
    for (int i = 0; i < 64; ++i) t.push_back(static_cast<uint16_t>((i * 7) % 32));
    write_token_shard(dir + "/seed.bin", t);
    out.push_back(read_bytes(dir + "/seed.bin"));
  } else if (target == "npy") {
    for (const char* descr : {"<u2", "<u4"}) {
      int w = descr[2] - '0';
      std::string h = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (48,), }";
      while ((10 + h.size() + 1) % 64) h += ' ';
      h += '\n';
      std::string f = "\x93NUMPY\x01";
      f += '\0';
      f += static_cast<char>(h.size() & 0xff);
      f += static_cast<char>(h.size() >> 8);
      f += h;
      for (int i = 0; i < 48; ++i) {
        uint32_t v = static_cast<uint32_t>((i * 5) % 32);
        f.append(reinterpret_cast<const char*>(&v), static_cast<size_t>(w));
      }
      out.push_back(f);
    }
  } else if (target == "manifest") {
    out.push_back(checkpoint_fixture().manifest);
  }
  return out;
}

}  // namespace zerorun::fuzz
