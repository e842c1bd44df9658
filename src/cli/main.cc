// The `zerorun` command: launch (default), train, eval, init, import, merge, report, estimate, prepare, tokenizer.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <thread>

#include "crash_handler.h"
#include "report.h"
#include "run_options.h"
#include "sample_cmd.h"
#include "zerorun/build_info.h"
#include "zerorun/config.h"
#include "zerorun/cuda_rt.h"
#include "zerorun/data.h"
#include "zerorun/error.h"
#include "zerorun/estimate.h"
#include "zerorun/fsutil.h"
#include "zerorun/hf_arch.h"
#include "zerorun/launch.h"
#include "zerorun/merge.h"
#include "zerorun/model.h"
#include "zerorun/platform.h"
#include "zerorun/rank_status.h"
#include "zerorun/stop_signal.h"
#include "zerorun/strict_json.h"
#include "zerorun/tokenizer.h"
#include "zerorun/trainer.h"
#include "zerorun/zero_plan.h"

using namespace zerorun;

namespace {

int cmd_init(const std::string& arch, const std::string& out, uint64_t seed, const MlpSpec& mlp, const Gpt2Spec& gpt,
             const LlamaSpec& llama, DType dtype) {
  Model m;
  if (arch == "mlp")
    m = build_mlp(mlp, seed);
  else if (arch == "gpt2")
    m = build_gpt2(gpt, seed);
  else if (arch == "llama")
    m = build_llama(llama, seed);
  else
    ZR_FAIL("--arch must be mlp, gpt2 or llama, got '", arch, "'");
  m.dtype = dtype;
  save_model(out, m);
  std::printf("wrote %s: %s, %lld parameters in %zu tensors, graph %s\n", out.c_str(), arch.c_str(),
              static_cast<long long>(m.num_params()), m.tensors.size(), m.graph_hash.c_str());
  return 0;
}

// The config.json a decoder family's --arch with the size flags spells (init and estimate read it as import reads
// one); `cmd` says which of the optional flags were given.
json decoder_flags_config(const std::string& arch, const Gpt2Spec& gpt, const LlamaSpec& llama, int64_t head_dim,
                          const CLI::App& cmd) {
  json cfg = {{"model_type", arch},
              {"vocab_size", gpt.vocab},
              {"max_position_embeddings", gpt.n_ctx},
              {"hidden_size", gpt.n_embd},
              {"num_hidden_layers", gpt.n_layer},
              {"num_attention_heads", gpt.n_head},
              {"intermediate_size", llama.ffn}};
  if (cmd.count("--n_kv_head")) cfg["num_key_value_heads"] = llama.n_kv_head;
  if (cmd.count("--head_dim")) cfg["head_dim"] = head_dim;
  return cfg;
}

// The model `zerorun estimate` sizes, without weights: a model.bin's header, a transformers config.json (or the
// directory holding it), or --arch with the size flags as init takes them.
Model estimate_model(const std::string& source, const std::string& arch, const Gpt2Spec& gpt, LlamaSpec llama,
                     bool tied, const CLI::App& cmd) {
  ZR_CHECK(source.empty() != arch.empty(), "zerorun estimate: give a model.bin, a config.json (or its directory), or ",
           "--arch with size flags (one of them)");
  if (!source.empty()) {
    std::string cfg_path = source;
    if (is_directory(source)) cfg_path = source + "/config.json";
    if (cfg_path.size() < 5 || cfg_path.substr(cfg_path.size() - 5) != ".json") return open_model(source);
    const json cfg = load_json_file_strict(cfg_path);
    ZR_CHECK(cfg.is_object(), cfg_path, ": must be a JSON object");
    const std::string mt = cfg.value("model_type", std::string());
    if (mt == "gpt2") {
      Gpt2Spec g;
      g.vocab = cfg.value("vocab_size", g.vocab);
      g.n_ctx = cfg.value("n_positions", g.n_ctx);
      g.n_embd = cfg.value("n_embd", g.n_embd);
      g.n_layer = cfg.value("n_layer", g.n_layer);
      g.n_head = cfg.value("n_head", g.n_head);
      g.tied = cfg.value("tie_word_embeddings", true);
      return build_gpt2(g, 0, true);
    }
    std::vector<std::string> notes;
    return build_llama(hf_decoder_spec(cfg, cfg_path, &notes, true), 0, true);
  }
  if (arch == "gpt2") return build_gpt2(gpt, 0, true);
  llama.vocab = gpt.vocab, llama.n_ctx = gpt.n_ctx, llama.n_embd = gpt.n_embd, llama.n_layer = gpt.n_layer;
  llama.n_head = gpt.n_head, llama.tied = tied;
  if (arch == "llama") return build_llama(llama, 0, true);
  ZR_CHECK(hf_decoder_type(arch), "--arch must be gpt2, llama or a decoder model_type, got '", arch, "'");
  json cfg = decoder_flags_config(arch, gpt, llama, llama.head_dim, cmd);
  if (cmd.count("--tied")) cfg["tie_word_embeddings"] = true;
  std::vector<std::string> notes;
  return build_llama(hf_decoder_spec(cfg, "--arch " + arch, &notes, true), 0, true);
}

// `zerorun estimate --config ds.json`: the run's own keys (precision, micro batch, train.seq_len, bucket sizes, bf16
// master/states, the NVMe keys), resolved as the trainer resolves them ("auto" included) at the asked world size;
// flags given on the command line win.
void apply_estimate_config(const std::string& path, const Model& m, const CLI::App& cmd, EstimateRequest& est) {
  Config c = load_config(path);
  if (cmd.count("--micro_batch_size")) {  // the batch rule then holds at any world size
    c.micro_batch = est.micro_batch;
    c.train_batch_size.reset(), c.grad_accum.reset();
  }
  ResolveContext rc;
  rc.world_size = est.gpus_per_node * est.nodes;
  rc.hidden = model_hidden(m);
  rc.on_gpu = est.gpu;
  try {
    resolve_config(c, rc);
  } catch (const Error& e) {
    ZR_FAIL(e.what(), " (zerorun estimate --config: --micro_batch_size N sizes another world size)");
  }
  if (!cmd.count("--precision")) est.precision = precision_name(c.precision);
  if (!cmd.count("--micro_batch_size")) est.micro_batch = c.micro;
  if (!cmd.count("--seq_len") && c.train.seq_len > 0) est.seq_len = c.train.seq_len;
  if (!cmd.count("--reduce_bucket_size") && c.zero.reduce_bucket_size)
    est.reduce_bucket_size = std::max<int64_t>(*c.zero.reduce_bucket_size, 1);  // 0: a bucket per parameter
  if (c.zero.stage3_prefetch_bucket_size) est.stage3_prefetch_bucket_size = *c.zero.stage3_prefetch_bucket_size;
  if (est.precision == "bf16") {
    est.bf16_master = est.bf16_master || c.bf16_master_weights_and_grads;
    est.bf16_states = est.bf16_states || c.bf16_optimizer_states;
  }
  const json& z = c.raw.is_object() ? c.raw.value("zero_optimization", json::object()) : json::object();
  if (z.is_object() && z.value("offload_optimizer", json()).is_object())
    est.opt_buffer_count = c.zero.offload_optimizer.buffer_count;
  if (z.is_object() && z.value("offload_param", json()).is_object()) {
    est.param_buffer_count = c.zero.offload_param.buffer_count;
    est.param_buffer_size = c.zero.offload_param.buffer_size;
    est.max_in_cpu = c.zero.offload_param.max_in_cpu;
  }
  est.sub_group_size = c.zero.sub_group_size;
  est.config = path;
  est.config_stage = c.zero.stage;
  est.config_offload_optimizer = c.zero.offload_optimizer.device;
  est.config_offload_param = c.zero.offload_param.device;
}

}  // namespace

int main(int argc, char** argv) {
  zerorun::install_crash_handler();
  zerorun::install_stop_handler();
  spdlog::set_pattern("[zerorun] %v");
  CLI::App app{"zerorun: native ZeRO training runtime (DeepSpeed-format configs)"};
  // Options are --name on every platform: "/data/x.bin" is a path (CLI11 reads it as an option /data on Windows by
  // default). Set before the subcommands, which copy it.
  app.allow_windows_style_options(false);
  app.require_subcommand(0, 1);
  app.set_version_flag("--version", std::string(ZERORUN_VERSION));

  // Default: launch.
  TrainOptions launch;
  int num_gpus = 1;
  add_run_options(app, launch, kRunLaunch);  // the run options, each forwarded to the ranks by rank_command
  app.add_option("--num_gpus", num_gpus, "ranks to start (one per GPU, or CPU slots with --device cpu)")
      ->check(at_least(1));
  bool dry_run = false;
  app.add_flag("--dry_run", dry_run, "print the launcher command instead of running it");
  std::string hostfile;
  launch::LaunchRequest lr;
  lr.mpirun = ZERORUN_MPIRUN;
  app.add_option("--hostfile", hostfile, "DeepSpeed-format hostfile ('worker-0 slots=8' per line)");
  app.add_option("--include", lr.include, "hosts/slots to use, e.g. 'worker-0@worker-1:0,2'");
  app.add_option("--exclude", lr.exclude, "hosts/slots to leave out, same syntax as --include");
  app.add_option("--num_nodes", lr.num_nodes, "use the first N hosts of the hostfile")->check(at_least(1));
  app.add_option("--master_addr", lr.master_addr, "address of rank 0 (exported as MASTER_ADDR)");
  app.add_option("--master_port", lr.master_port, "port (exported as MASTER_PORT, default 29500)")
      ->check(CLI::Range(1, 65535));
  app.add_option("--launcher", lr.launcher, "openmpi | mpich | slurm | msmpi")
      ->check(CLI::IsMember({"openmpi", "mpich", "slurm", "msmpi"}));
  auto split_check = [](const char* opt) {
    return [opt](const std::string& s) {
      try {
        launch::shell_split(s, opt);
        return std::string();
      } catch (const Error& e) {  // CLI11 puts the option's name first
        const std::string m = e.what(), o = std::string(opt) + " ";
        return m.rfind(o, 0) == 0 ? m.substr(o.size()) : m;
      }
    };
  };
  app.add_option("--launcher_args", lr.launcher_args, "extra launcher arguments, split like a shell (quotes kept)")
      ->check(split_check("--launcher_args"));
  app.add_option("--ssh", lr.ssh, "remote shell and its arguments for the launcher, e.g. \"ssh -p 2222 -o X=y\"")
      ->check(split_check("--ssh"));
  app.add_option("--ssh_port", lr.ssh_port, "port of the remote shell (ssh -p)")->check(CLI::Range(1, 65535));
  app.add_option("--nic", lr.nic, "network interface(s) for MPI and NCCL, e.g. eth1 or eth1,eth2")
      ->check([](const std::string& s) {
        return launch::valid_nic_list(s) ? std::string()
                                         : "'" + s + "' is not a comma-separated list of network interface names";
      });

  TrainOptions train;
  auto* train_cmd = app.add_subcommand("train", "train on one rank (what the launcher starts per rank)");
  add_run_options(*train_cmd, train, kRunTrain);
  TrainOptions evalo;
  auto* eval_cmd =
      app.add_subcommand("eval", "held-out loss of a model.bin or a checkpoint (--resume), no training (per rank)");
  add_run_options(*eval_cmd, evalo, kRunEval);

  std::string arch, out = "model.bin";
  uint64_t seed = 1;
  MlpSpec mlp;
  Gpt2Spec gpt;
  LlamaSpec llama;
  bool untied = false;
  std::string import_dir, import_out = "model.bin";
  auto* import_cmd = app.add_subcommand(
      "import", "write a model.bin from a transformers GPT-2 or Llama checkpoint (config.json + model.safetensors)");
  import_cmd->add_option("dir", import_dir, "checkpoint directory (e.g. what save_pretrained wrote)")->required();
  import_cmd->add_option("-o,--out", import_out, "output path");
  bool no_dropout = false;
  import_cmd->add_flag("--no_dropout", no_dropout,
                       "train without the dropout config.json asks for (GPT-2's 0.1): zerorun does not apply dropout "
                       "yet, and without this flag such a config is an error");
  auto* init_cmd = app.add_subcommand("init", "write a model.bin with fresh weights");
  std::string from_config;
  init_cmd->add_option(
      "--arch", arch,
      "mlp | gpt2 | llama, or a decoder model_type (mistral, qwen2, qwen3, phi3, olmo2, gemma, gemma2, "
      "gemma3_text) with that family's features and the size flags");
  init_cmd->add_option("--from_config", from_config,
                       "a transformers config.json (llama, mistral, qwen2, qwen3, phi3, olmo2, gemma, gemma2, gemma3): "
                       "that model with fresh weights");
  init_cmd->add_option("-o,--out", out, "output path");
  std::string init_dtype = "f32";
  init_cmd->add_option("--dtype", init_dtype, "f32 (default) | bf16 | f16: how model.bin stores the weights")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
  init_cmd->add_option("--seed", seed, "init seed");
  init_cmd->add_option("--in", mlp.in, "mlp: input width");
  init_cmd->add_option("--hidden", mlp.hidden, "mlp: hidden width");
  init_cmd->add_option("--out_features", mlp.out, "mlp: output width");
  init_cmd->add_option("--layers", mlp.layers, "mlp: hidden layers");
  init_cmd->add_option("--act", mlp.act, "mlp: relu | gelu | silu");
  init_cmd->add_option("--vocab", gpt.vocab, "gpt2/llama: vocabulary size");
  init_cmd->add_option("--n_ctx", gpt.n_ctx, "gpt2/llama: context length");
  init_cmd->add_option("--n_embd", gpt.n_embd, "gpt2/llama: width");
  init_cmd->add_option("--n_layer", gpt.n_layer, "gpt2/llama: layers");
  init_cmd->add_option("--n_head", gpt.n_head, "gpt2/llama: heads");
  init_cmd->add_option("--ffn", llama.ffn, "llama: MLP width");
  init_cmd->add_flag("--untied", untied, "gpt2: separate lm_head weight");
  bool tied = false;
  init_cmd->add_flag("--tied", tied, "llama: lm_head tied to the token embedding");
  init_cmd->add_option("--n_kv_head", llama.n_kv_head, "llama: key/value heads (grouped-query; default n_head)");
  init_cmd->add_option("--rope_theta", llama.rope_theta, "llama: rotary embedding base (default 10000)");
  int64_t init_head_dim = 0, init_window = 0;
  init_cmd->add_option("--head_dim", init_head_dim, "decoder model_types: head size (default: the family's)");
  init_cmd->add_option("--window", init_window, "decoder model_types: sliding window (mistral, phi3, gemma2/3)");

  std::string est_model, est_device = "cuda", est_arch, est_config;
  EstimateRequest est;
  Gpt2Spec est_gpt;
  LlamaSpec est_llama;
  bool est_tied = false;
  auto* est_cmd = app.add_subcommand(
      "estimate", "GPU memory per rank and host memory per node for each ZeRO stage, with and without offload");
  est_cmd->add_option("model", est_model, "model.bin, a transformers config.json or its directory (or use --arch)");
  est_cmd->add_option("--num_gpus", est.gpus_per_node, "ranks per node (GPUs, or CPU slots with --device cpu)")
      ->check(at_least(1));
  est_cmd->add_option("--num_nodes", est.nodes, "nodes")->check(at_least(1));
  est_cmd->add_option("--precision", est.precision, "fp32 | bf16 | fp16");
  est_cmd->add_option("--device", est_device, "cuda | cpu (the training device)");
  est_cmd->add_option("--micro_batch_size", est.micro_batch, "micro batch per rank (activations)")->check(at_least(1));
  est_cmd->add_option("--seq_len", est.seq_len, "sequence length (default: the model's context)")->check(at_least(1));
  est_cmd->add_option("--reduce_bucket_size", est.reduce_bucket_size, "stage 2/3 bucket elements")->check(at_least(1));
  est_cmd->add_option("--arch", est_arch, "gpt2 | llama | a decoder model_type, sized by the flags below");
  est_cmd->add_option("--vocab", est_gpt.vocab, "--arch: vocabulary size");
  est_cmd->add_option("--n_ctx", est_gpt.n_ctx, "--arch: context length");
  est_cmd->add_option("--n_embd", est_gpt.n_embd, "--arch: width");
  est_cmd->add_option("--n_layer", est_gpt.n_layer, "--arch: layers");
  est_cmd->add_option("--n_head", est_gpt.n_head, "--arch: heads");
  est_cmd->add_option("--ffn", est_llama.ffn, "--arch: MLP width");
  est_cmd->add_option("--n_kv_head", est_llama.n_kv_head, "--arch: key/value heads");
  est_cmd->add_option("--head_dim", est_llama.head_dim, "--arch: head size");
  est_cmd->add_flag("--tied", est_tied, "--arch llama and decoders: lm_head tied to the embedding");
  est_cmd->add_flag("--bf16_master_weights_and_grads", est.bf16_master,
                    "bf16.bf16_master_weights_and_grads: no fp32 master (CPU ranks; GPU runs with offload_optimizer)");
  est_cmd->add_flag("--bf16_optimizer_states", est.bf16_states, "bf16.bf16_optimizer_states: 2-byte Adam moments");
  est_cmd->add_option("--config", est_config,
                      "a DeepSpeed config: its precision, micro batch, bucket sizes, bf16 keys and NVMe offload keys "
                      "(buffer_count, buffer_size, max_in_cpu, sub_group_size); flags given win");

  auto* report_cmd = app.add_subcommand("report", "build features, library versions, GPUs seen");

  PrepareOptions prep;
  bool prep_no_eos = false, prep_quiet = false;
  auto* prep_cmd = app.add_subcommand(
      "prepare", "text files and JSONL ({\"text\"}, {\"messages\"}, {\"prompt\", \"completion\"}) -> token shards");
  prep_cmd->add_option("inputs", prep.inputs, "input files or glob patterns (*.jsonl: one record a line; else text)")
      ->required();
  prep_cmd->add_option("--tokenizer", prep.tokenizer, "tokenizer.json or a model directory with it")->required();
  prep_cmd->add_option("-o,--out", prep.out, "output prefix: <out>_000000.bin, ... (default: data)");
  prep_cmd->add_option("--format", prep.format, "zerorun (default: loss mask + document starts) | llmc (uint16)")
      ->check(CLI::IsMember({"zerorun", "llmc"}));
  prep_cmd->add_option("--chat_template", prep.chat_template, "a .jinja file instead of the tokenizer's template");
  prep_cmd->add_option("--train_on", prep.train_on, "completions (default: assistant turns / completions) | all")
      ->check(CLI::IsMember({"completions", "all"}));
  prep_cmd->add_flag("--no_eos", prep_no_eos, "do not end text and prompt-completion documents with EOS");
  prep_cmd->add_option("--shard_tokens", prep.shard_tokens, "tokens a shard (default 100000000)")->check(at_least(1));
  prep_cmd->add_option("--val_docs", prep.val_docs, "the first N documents go to <out>_val_*.bin")->check(at_least(0));
  prep_cmd->add_option("--threads", prep.threads, "tokenizer threads (default: every core)")->check(at_least(0));
  prep_cmd->add_flag("--quiet", prep_quiet, "no progress bar");

  SampleOptions sample;
  auto* sample_cmd = add_sample_command(app, sample);

  TokenizerTrainOptions tok_train;
  auto* tok_cmd = app.add_subcommand("tokenizer", "learn a byte-level BPE tokenizer.json from text (GPT-2's scheme)");
  tok_cmd->add_option("inputs", tok_train.inputs, "text files or glob patterns (*.jsonl: the \"text\" of each line)")
      ->required();
  tok_cmd->add_option("-o,--out", tok_train.out_dir, "directory for tokenizer.json + tokenizer_config.json")
      ->required();
  tok_cmd->add_option("--vocab_size", tok_train.vocab_size, "tokens in all (default 4096)")->check(at_least(1));
  tok_cmd->add_option("--min_frequency", tok_train.min_frequency, "stop when the best pair is rarer (default 2)")
      ->check(at_least(1));

  std::string merge_in, merge_out, merge_tag = "latest", merge_dtype = "fp32";
  auto* merge_cmd = app.add_subcommand("merge", "rebuild full weights from ZeRO shards (no GPU, no MPI)");
  merge_cmd->add_option("checkpoint", merge_in, "save_dir or a global_step<N> directory")->required();
  merge_cmd->add_option("out", merge_out, "output directory")->required();
  merge_cmd->add_option("--tag", merge_tag, "checkpoint tag in save_dir (default: latest)");
  merge_cmd->add_option("--dtype", merge_dtype, "fp32 | bf16")->check(CLI::IsMember({"fp32", "bf16"}));
  std::string merge_layout = "hf";
  merge_cmd
      ->add_option("--layout", merge_layout,
                   "model.safetensors layout: hf (default: gpt2 as transformers' GPT2LMHeadModel loads it) | zerorun "
                   "(model.bin's names, torch.nn.Linear [out, in] weights)")
      ->check(CLI::IsMember({"hf", "zerorun"}));

  // UTF-8 arguments on every platform (Windows' argv is in the ANSI code page: a non-ASCII path would not survive).
  const std::vector<std::string> args = platform::utf8_args(argc, argv);
  std::vector<char*> arg_ptrs;
  for (const std::string& a : args) arg_ptrs.push_back(const_cast<char*>(a.c_str()));
  try {
    app.parse(static_cast<int>(arg_ptrs.size()), arg_ptrs.data());
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints the help, or the message naming the option
    return rc == 0 ? 0 : 2;      // a usage error, like every other bad command line
  }
  try {
    if (*train_cmd || *eval_cmd) {
      TrainOptions& run = *train_cmd ? train : evalo;
      run.eval_only = !*train_cmd;
      std::unique_ptr<Communicator> comm;
      try {
        launch::apply_host_threads();  // this host's cores / its ranks, unless OMP_NUM_THREADS is given
        comm = make_train_comm(run);
        return run_training(run, *comm);
      } catch (const Error& e) {
        // One rank's error ends the whole job: the others may be waiting in a collective (or in MPI's
        // finalise) for it, so exiting alone would leave them hanging. Before the communicator exists
        // (choosing this rank's GPU), the rank comes from the launcher's environment.
        if (comm ? comm->size() > 1 : launched_by_mpi()) {
          const std::string who = comm ? std::to_string(comm->rank()) + " of " + std::to_string(comm->size())
                                       : std::to_string(launcher_rank());
          std::fprintf(stderr, "zerorun: error on rank %s: %s\n", who.c_str(), e.what());
          std::fflush(stderr);
          rank_status::report("error", std::string("zerorun: error: ") + e.what(), 1);  // for the launcher's report
          mpi_abort_job(1);
        }
        throw;
      }
    }
    if (*init_cmd && !from_config.empty()) {
      ZR_CHECK(arch.empty(), "--from_config takes the architecture from config.json: leave out --arch");
      const json cfg = load_json_file_strict(from_config);
      ZR_CHECK(cfg.is_object(), from_config, ": must be a JSON object");
      std::vector<std::string> notes;
      LlamaSpec s = hf_decoder_spec(cfg, from_config, &notes);
      for (auto& n : notes) std::printf("note: %s\n", n.c_str());
      Model m = build_llama(s, seed);
      m.dtype = dtype_from_string(init_dtype);
      save_model(out, m);
      std::printf("wrote %s: %s (%s) with fresh weights, %lld parameters\n", out.c_str(), s.model_type.c_str(),
                  from_config.c_str(), static_cast<long long>(m.num_params()));
      return 0;
    }
    if (*init_cmd && arch != "llama" && hf_decoder_type(arch)) {
      // The family's features with the flags' sizes: the config.json the flags spell, read as import reads one.
      json cfg = decoder_flags_config(arch, gpt, llama, init_head_dim, *init_cmd);
      if (init_cmd->count("--rope_theta")) cfg["rope_theta"] = llama.rope_theta;
      if (init_cmd->count("--window")) cfg["sliding_window"] = init_window;
      if (arch == "qwen2" || arch == "qwen3") cfg["use_sliding_window"] = init_cmd->count("--window") > 0;
      if (tied || untied) cfg["tie_word_embeddings"] = tied;
      std::vector<std::string> notes;
      LlamaSpec s = hf_decoder_spec(cfg, "--arch " + arch, &notes);
      for (auto& n : notes) std::printf("note: %s\n", n.c_str());
      // merge writes this config.json: the keys the flags set, transformers' defaults (which hf_decoder_spec
      // mirrors) for the rest.
      Model m = build_llama(s, seed);
      m.dtype = dtype_from_string(init_dtype);
      save_model(out, m);
      std::printf("wrote %s: %s, %lld parameters in %zu tensors, graph %s\n", out.c_str(), arch.c_str(),
                  static_cast<long long>(m.num_params()), m.tensors.size(), m.graph_hash.c_str());
      return 0;
    }
    if (*init_cmd) {
      if (arch.empty()) {
        std::cerr << "zerorun init: error: give --arch mlp|gpt2|llama or --from_config config.json\n";
        return 2;
      }
      llama.vocab = gpt.vocab;
      llama.n_ctx = gpt.n_ctx;
      llama.n_embd = gpt.n_embd;
      llama.n_layer = gpt.n_layer;
      llama.n_head = gpt.n_head;
      gpt.tied = !untied;
      llama.tied = tied;
      ZR_CHECK(!(tied && arch != "llama"), "--tied is for --arch llama (gpt2 is tied unless --untied)");
      ZR_CHECK(!(untied && arch != "gpt2"), "--untied is for --arch gpt2 (llama is untied unless --tied)");
      ZR_CHECK(
          arch == "llama" || (llama.n_kv_head == LlamaSpec{}.n_kv_head && llama.rope_theta == LlamaSpec{}.rope_theta),
          "--n_kv_head and --rope_theta are for --arch llama");
      return cmd_init(arch, out, seed, mlp, gpt, llama, dtype_from_string(init_dtype));
    }
    if (*import_cmd) {
      std::vector<std::string> notes;
      Model m = import_hf(import_dir, &notes, no_dropout);
      for (auto& n : notes) std::printf("note: %s\n", n.c_str());
      save_model(import_out, m);
      std::printf("wrote %s: %s from %s, %lld parameters in %zu tensors, graph %s\n", import_out.c_str(),
                  m.graph.meta["arch"].get<std::string>().c_str(), import_dir.c_str(),
                  static_cast<long long>(m.num_params()), m.tensors.size(), m.graph_hash.c_str());
      return 0;
    }
    if (*est_cmd) {
      ZR_CHECK(est_device == "cuda" || est_device == "cpu", "--device must be cuda or cpu, got '", est_device, "'");
      est.gpu = est_device == "cuda";
      Model m = estimate_model(est_model, est_arch, est_gpt, est_llama, est_tied, *est_cmd);
      if (!est_config.empty()) apply_estimate_config(est_config, m, *est_cmd, est);
      const MemoryEstimate e = estimate_memory(m, est);
      std::fputs(format_estimate(e, est, est_model.empty() ? "--arch " + est_arch : est_model).c_str(), stdout);
      return 0;
    }
    if (*merge_cmd) {
      MergeResult r = merge_checkpoint(merge_in, merge_tag, merge_out, merge_dtype == "bf16" ? DType::BF16 : DType::F32,
                                       merge_layout == "hf" ? MergeLayout::Hf : MergeLayout::Zerorun);
      std::printf("merged %s: %lld parameters -> %s (%s, %s layout), %s%s%s\n", r.dir.c_str(),
                  static_cast<long long>(r.params), r.safetensors.c_str(), merge_dtype.c_str(),
                  r.hf_layout() ? ("transformers " + r.hf_class).c_str() : "zerorun", r.model_bin.c_str(),
                  r.config_json.empty() ? "" : ", ", r.config_json.c_str());
      for (auto& f : r.tokenizer_files) std::printf("copied %s/%s\n", merge_out.c_str(), f.c_str());
      for (auto& n : r.notes) std::printf("note: %s\n", n.c_str());
      std::printf(
          "peak memory +%.1f MiB while merging (process peak %.1f MiB; model %.1f MiB fp32, largest tensor "
          "%.1f MiB)\n",
          (r.peak_rss_bytes - r.baseline_rss_bytes) / 1048576.0, r.peak_rss_bytes / 1048576.0, r.params * 4 / 1048576.0,
          r.largest * 4 / 1048576.0);
      return 0;
    }
    if (*sample_cmd) return run_sample(sample);
    if (*tok_cmd) {
      const int64_t n = train_bpe_tokenizer(tok_train);
      std::printf("wrote %s/tokenizer.json: byte-level BPE, %lld tokens\n", tok_train.out_dir.c_str(),
                  static_cast<long long>(n));
      return 0;
    }
    if (*prep_cmd) {
      prep.eos = !prep_no_eos;
      prep.progress = !prep_quiet;
      const PrepareResult r = prepare_data(prep);
      std::printf(
          "prepared %lld documents: %lld tokens (%lld = %.1f%% in the loss) in %zu shard(s), %.2f MB in %.1f s\n",
          static_cast<long long>(r.documents), static_cast<long long>(r.tokens),
          static_cast<long long>(r.target_tokens), r.tokens ? 100.0 * r.target_tokens / r.tokens : 0.0, r.shards.size(),
          r.bytes_in / 1e6, r.seconds);
      for (auto& f : r.shards) std::printf("  %s\n", f.c_str());
      return 0;
    }
    if (*report_cmd) {
      std::fputs(build_report().c_str(), stdout);
      return 0;
    }
    if (launch.model_path.empty() || launch.config_path.empty()) {
      std::cerr << app.help() << "\nzerorun: error: give a model.bin and --config (or a subcommand)\n";
      return 2;
    }
    ZR_CHECK(num_gpus >= 1, "--num_gpus must be >= 1, got ", num_gpus);
    const bool distributed = num_gpus > 1 || !hostfile.empty() || lr.num_nodes > 0 || !lr.include.empty() ||
                             !lr.exclude.empty() || lr.launcher != "openmpi" || dry_run;
    if (distributed) {
      if (!hostfile.empty()) lr.hosts = launch::load_hostfile(hostfile);
      lr.env = launch::job_environment();  // ZERORUN_*, NCCL_*, ..., then .deepspeed_env
      // Every rank tells the launcher why it ended (rank_status.h): the root-cause report.
      lr.env.erase(std::remove_if(lr.env.begin(), lr.env.end(),
                                  [](const launch::EnvVar& v) { return v.name == "ZERORUN_RANK_STATUS"; }),
                   lr.env.end());
      lr.env.push_back({"ZERORUN_RANK_STATUS", "1", false});
      if (*app.get_option("--num_gpus") || lr.hosts.empty()) lr.num_gpus = num_gpus;
      lr.as_root = platform::is_root_user();
      lr.local_cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      auto placement = launch::place(lr);
      std::vector<std::string> argv_s = launch::build_command(lr, placement, rank_command(launch));
      if (dry_run) {  // one line a shell runs as is
        std::printf("%s\n", launch::shell_quote(argv_s).c_str());
        return 0;
      }
      // Where the ranks save (for the message and the clean-up after a stop that ends mid-save).
      std::string save_dir = launch.save_dir.value_or("");
      if (save_dir.empty()) try {
          save_dir = load_config(launch.config_path).train.save_dir;
        } catch (const Error&) {  // the ranks report a bad config
        }
      std::vector<std::string> rank_hosts;  // in rank order, as the launchers fill slots
      for (const launch::Placement& p : placement) rank_hosts.insert(rank_hosts.end(), p.slots.size(), p.host);
      return launch::supervise(argv_s, save_dir, rank_hosts);
    }
    auto comm = make_train_comm(launch);
    return run_training(launch, *comm);
  } catch (const Error& e) {
    std::fprintf(stderr, "zerorun: error: %s\n", e.what());
    rank_status::report("error", std::string("zerorun: error: ") + e.what(), 1);  // a rank: for the launcher
    return 1;
  } catch (const std::filesystem::filesystem_error& e) {  // a path that cannot be used: an input fault
    std::fprintf(stderr, "zerorun: error: %s\n", e.what());
    rank_status::report("error", std::string("zerorun: error: ") + e.what(), 1);
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zerorun: internal error: %s\n", e.what());
    rank_status::report("error", std::string("zerorun: internal error: ") + e.what(), 3);
    return 3;
  }
}
