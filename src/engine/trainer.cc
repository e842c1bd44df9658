// The per-rank training driver behind `zerorun train`.
#include "zerorun/trainer.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>

#include "kernels/backend.h"
#include "zerorun/build_info.h"
#include "zerorun/checkpoint.h"
#include "zerorun/cuda_rt.h"
#include "zerorun/engine.h"
#include "zerorun/fsutil.h"
#include "zerorun/platform.h"
#include "zerorun/profile.h"
#include "zerorun/rank_agreement.h"
#include "zerorun/rank_status.h"
#include "zerorun/safetensors.h"
#include "zerorun/stop_signal.h"

namespace zerorun {

int local_rank() {
  if (const int l = mpi_local_rank(); l >= 0) return l;  // MPI_Comm_split_type(SHARED): every MPI, every platform
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char* s = std::getenv(v)) return std::atoi(s);
  return 0;
}

int launcher_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (const char* s = std::getenv(v)) return std::atoi(s);
  return 0;
}

int gpu_for_rank(const TrainOptions& o) {
  const int local = local_rank(), n = cuda::device_count();
  ZR_CHECK(n > 0, "--device cuda: no GPU is visible",
           built_with_cuda() ? "" : " (this zerorun was built without CUDA)");
  if (o.comm == "mpi") return local % n;
  ZR_CHECK(local < n, "local rank ", local, " has no GPU of its own (", n, " visible): NCCL needs one GPU per rank. ",
           "Start at most ", n, " rank(s) per node, or pass --comm mpi to let ranks share GPUs");
  return local;
}

namespace {
// --device auto: cuda when every rank sees a GPU, cpu when none does; a job whose ranks disagree is an error
// (training some ranks on a GPU and others on the CPU is never what was meant).
void resolve_auto_device(TrainOptions& o, Communicator& host) {
  if (o.device != "auto") return;
  const int n = cuda::device_count();  // 0 without CUDA, without a driver, or with no GPU visible
  int have = n > 0 ? 1 : 0;            // ranks that see a GPU
  host.all_reduce(&have, 1, DType::I32, ReduceOp::Sum);
  const int world = host.size();
  if (have == 0) {
    o.device = "cpu";
    o.device_note = built_with_cuda() ? "auto: no GPU visible" : "auto: this zerorun is built without CUDA";
  } else {
    ZR_CHECK(have == world, "--device auto: ", world - have, " of ", world, " ranks see no GPU (rank ", host.rank(),
             " sees ", n, "); pass --device cuda or --device cpu");
    o.device = "cuda";
    o.device_note = world == 1 ? "auto: " + std::to_string(n) + " GPU(s) visible; --device cpu to train on the CPU"
                               : "auto: every rank sees a GPU; --device cpu to train on the CPU";
  }
}
}  // namespace

std::unique_ptr<Communicator> make_train_comm(TrainOptions& o) {
  ZR_CHECK(o.comm.empty() || o.comm == "nccl" || o.comm == "mpi", "--comm must be nccl or mpi, got '", o.comm, "'");
  ZR_CHECK(o.device == "cpu" || o.device == "cuda" || o.device == "auto", "--device must be auto, cpu or cuda, got '",
           o.device, "'");
  std::unique_ptr<Communicator> comm = launched_by_mpi() ? make_mpi_comm() : make_self_comm();
  resolve_auto_device(o, *comm);
  if (o.comm.empty() && !platform::kHaveNccl) o.comm = "mpi";  // Windows: no NCCL; collectives through host memory
  ZR_CHECK(o.comm != "nccl" || o.device == "cuda", "--comm nccl needs --device cuda (CPU ranks use MPI)",
           o.device_note.empty() ? "" : " (" + o.device_note + ")");
  if (o.device == "cuda" && comm->size() > 1) {
    cuda::set_device(gpu_for_rank(o));  // before NCCL binds the communicator to a GPU
    comm = o.comm == "mpi" ? make_staged_comm(std::move(comm)) : make_nccl_comm(std::move(comm));
  }
  return comm;
}

int run_training(const TrainOptions& o, Communicator& comm) {
  Config cfg = load_config(o.config_path);
  if (o.steps) cfg.train.steps = *o.steps;
  ZR_CHECK(!o.data || !o.data->empty(), "--data is empty: give token shards (a path, glob or comma list) or ",
           "'synthetic'");
  if (o.data) cfg.train.data = *o.data;
  ZR_CHECK(!o.eval_data || !o.eval_data->empty(), "--eval_data is empty: give held-out token shards or 'synthetic'");
  if (o.eval_data) cfg.train.eval_data = *o.eval_data;
  if (o.eval_interval) cfg.train.eval_interval = *o.eval_interval;
  if (o.eval_batches) cfg.train.eval_batches = *o.eval_batches;
  if (o.eval_only) {
    if (cfg.train.eval_data.empty()) cfg.train.eval_data = cfg.train.data;  // `zerorun eval --data D` works too
    ZR_CHECK(!cfg.train.eval_data.empty(), "zerorun eval: give the data to evaluate on (--eval_data or --data)");
  }
  if (o.save_dir) cfg.train.save_dir = *o.save_dir;
  if (o.log_dir) cfg.train.log_dir = *o.log_dir;
  if (o.seed) cfg.train.seed = *o.seed;
  if (o.seq_len) cfg.train.seq_len = *o.seq_len;
  if (o.micro_batch) cfg.micro_batch = *o.micro_batch;
  ZR_CHECK(cfg.train.steps > 0 || o.eval_only,
           "no number of steps: pass --steps N or set \"train\": {\"steps\": N} in ", o.config_path);
  ZR_CHECK(o.device == "cpu" || o.device == "cuda", "--device must be cpu or cuda, got '", o.device,
           "' (make_train_comm resolves auto)");
  const bool gpu = o.device == "cuda";
  if (gpu) {
    const int gi = gpu_for_rank(o);  // fails when no GPU is visible
    const std::string arch = gpu_arch_problem(gi);
    ZR_CHECK(arch.empty(), arch);
    cuda::set_device(gi);
    cfg.device = Device::cuda(gi);
  }
  Model model = open_model(o.model_path);  // each rank reads the weights it keeps (the Engine)
  // Every rank must train the same job; a node with other files would otherwise hang or diverge silently.
  {
    const std::string c = cfg.raw.dump();  // the parsed JSON: formatting and key order do not count
    const std::string v = ZERORUN_VERSION;
    require_same_on_all_ranks(comm, {{"the zerorun version (" + v + ")", fnv1a(v.data(), v.size())},
                                     {"the config (" + o.config_path + ")", fnv1a(c.data(), c.size())},
                                     {"the model (" + o.model_path + ")", model_fingerprint(model)}});
  }
  ResolveContext rc;
  rc.world_size = comm.size();
  rc.hidden = model_hidden(model);
  rc.on_gpu = gpu;
  resolve_config(cfg, rc);

  const bool lead = comm.rank() == 0;
  if (lead) {
    for (auto& w : cfg.warnings) spdlog::warn("{}", w);
    for (auto& n : cfg.notes) spdlog::info("{}", n);
    if (!cfg.optimizer.given) spdlog::info("no optimizer in {}: using AdamW lr={}", o.config_path, cfg.optimizer.lr);
    if (cfg.fp16_enabled != "false" || cfg.bf16_enabled != "false")
      spdlog::info("precision: {} (fp16.enabled={}, bf16.enabled={}; {}; {})", precision_name(cfg.precision),
                   cfg.fp16_enabled, cfg.bf16_enabled,
                   cfg.bf16_master_weights_and_grads
                       ? (cfg.bf16_optimizer_states
                              ? "bf16_master_weights_and_grads + bf16_optimizer_states: bf16 master weights, gradients "
                                "rounded to bf16, bf16 exp_avg / exp_avg_sq, the update in f32"
                              : "bf16_master_weights_and_grads: bf16 master weights, gradients rounded to bf16, fp32 "
                                "exp_avg / exp_avg_sq")
                       : "16-bit weights are rounded copies of the fp32 master",
                   gpu ? "matrix products take 16-bit operands on tensor cores, other arithmetic in f32"
                       : "CPU arithmetic in f32");
  }
  Engine engine(model, cfg, comm, cfg.train.steps);
  std::unique_ptr<DataSource> data, eval_data;  // `zerorun eval` reads no training data
  std::vector<Fingerprint> data_prints;
  if (!o.eval_only) {
    data = make_data_source(cfg.train.data, model, engine.seq_len(), cfg.train.seed, cfg.train.packing);
    data_prints.push_back({"the data (" + data->describe() + ")", data->fingerprint()});
  }
  ZR_CHECK(cfg.train.eval_interval == 0 || !cfg.train.eval_data.empty(), o.config_path,
           ": 'train.eval_interval' needs held-out data: set 'train.eval_data' or pass --eval_data");
  if (!cfg.train.eval_data.empty()) {
    eval_data = make_data_source(cfg.train.eval_data, model, engine.seq_len(), cfg.train.seed + 1, cfg.train.packing);
    data_prints.push_back({"the eval data (" + eval_data->describe() + ")", eval_data->fingerprint()});
  }
  require_same_on_all_ranks(comm, data_prints);
  if (lead) {
    spdlog::info("model {}: {} parameters, graph {} ({} blocks)", o.model_path, model.num_params(), model.graph_hash,
                 model.graph.blocks.size());
    spdlog::info("world {} ({}) | ZeRO stage {} | batch {} = micro {} x gas {} x world {} | {} | optimizer {} lr {}",
                 comm.size(), comm.name(), cfg.zero.stage, cfg.batch, cfg.micro, cfg.gas, comm.size(),
                 precision_name(cfg.precision), cfg.optimizer.type, cfg.optimizer.lr);
    spdlog::info("data: {}", (data ? data : eval_data)->describe());
    spdlog::info("device: {}{}", gpu ? "cuda" : "cpu", o.device_note.empty() ? "" : " (" + o.device_note + ")");
  }
  spdlog::info("{}", engine.memory_report());  // every rank: its own shard sizes
  if (lead && gpu && kernels::backend(cfg.device).deterministic())
    spdlog::info(
        "deterministic GPU kernels (ZERORUN_DETERMINISTIC=1): the embedding gradient through a sort, attention's "
        "backward without atomics; the run gives the same bits every time");
  if (lead && engine.cuda_graphs())
    spdlog::info(
        "CUDA graphs: each micro-batch's forward + backward is replayed from a graph after the first step "
        "(ZERORUN_CUDA_GRAPHS=0 turns this off)");
  if (!o.resume.empty()) {
    std::string root = o.resume, tag;
    if (path_exists(o.resume + "/latest")) {
      tag = "latest";  // a save_dir: its latest checkpoint
    } else if (!path_exists(o.resume + "/manifest.json")) {
      ZR_CHECK(!cfg.train.save_dir.empty(), "--resume ", o.resume,
               ": no checkpoint directory (manifest.json) or save_dir (latest) of that name, and no --save_dir to "
               "look in");
      root = cfg.train.save_dir;
      tag = o.resume;
    }
    engine.load_checkpoint(root, tag);
    if (lead)
      spdlog::info("resumed from {} at step {} ({} samples)", ckpt::resolve_dir(root, tag), engine.global_step(),
                   engine.samples_seen());
  }
  // The held-out loss now, and the seconds it took.
  auto timed_eval = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    const double l = engine.eval_loss(*eval_data, cfg.train.eval_batches);
    ZR_CHECK(std::isfinite(l), "eval loss became ", l, " at step ", engine.global_step());
    return std::pair{l, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
  };
  if (o.eval_only) {
    const auto [l, sec] = timed_eval();
    if (lead)
      spdlog::info("eval at step {} | eval_loss {:.6f} | perplexity {:.3f} | {} batches of {} | {:.2f} s",
                   engine.global_step(), l, std::exp(l), cfg.train.eval_batches, cfg.batch, sec);
    return 0;
  }
  // Before the first step: a run that cannot save should not find out at its first checkpoint.
  if (!cfg.train.save_dir.empty()) check_writable_dir(cfg.train.save_dir, "--save_dir");
  if (lead && !o.final_weights.empty()) {
    const std::string parent = platform::generic_path(platform::to_path(o.final_weights).parent_path());
    check_writable_dir(parent.empty() ? "." : parent, "--final_weights");
  }
  std::ofstream metrics;
  if (lead && !cfg.train.log_dir.empty()) {
    make_dirs(cfg.train.log_dir);
    std::string p = cfg.train.log_dir + "/metrics.jsonl";
    metrics.open(platform::to_path(p), std::ios::binary | (o.resume.empty() ? std::ios::trunc : std::ios::app));
    ZR_CHECK(metrics, p, ": cannot open for writing");
  }
  // The step line's tokens/s is the job's (the global batch); its TFLOP/s is a rank's share, what one device does.
  const double flops_per_token = train_flops_per_token(model, data->tokens_per_sample() > 1 ? engine.seq_len() : 1);
  double window_s = 0;
  int64_t window_tok = 0;
  int64_t last_save = -1;
  auto save = [&] {
    std::string tag = engine.save_checkpoint(cfg.train.save_dir, {{"steps", cfg.train.steps}});
    last_save = engine.global_step();
    if (lead) spdlog::info("saved checkpoint {}/{}", cfg.train.save_dir, tag);
  };
  // Held-out loss every eval_interval steps and at the end: a line, and a row {"step", "eval_loss"} in
  // log_dir/eval.jsonl (metrics.jsonl keeps one kind of row).
  std::ofstream eval_log;
  if (lead && eval_data && !cfg.train.log_dir.empty()) {
    const std::string p = cfg.train.log_dir + "/eval.jsonl";
    eval_log.open(platform::to_path(p), std::ios::binary | (o.resume.empty() ? std::ios::trunc : std::ios::app));
    ZR_CHECK(eval_log, p, ": cannot open for writing");
  }
  auto evaluate = [&](int64_t step) {
    const auto [l, sec] = timed_eval();
    if (!lead) return;
    spdlog::info("eval   {:>6}/{} | eval_loss {:.6f} | {} batches of {} | {:.2f} s", step, cfg.train.steps, l,
                 cfg.train.eval_batches, cfg.batch, sec);
    if (eval_log.is_open()) eval_log << json{{"step", step}, {"eval_loss", l}}.dump() << "\n" << std::flush;
  };
  // At a fixed loss scale (fp32, bf16, fp16 with a static loss_scale) a step with non-finite gradients is skipped
  // as under dynamic scaling, but no scale change will cure it: each such step is a warning, and a run of them
  // ends the job instead of "training" on with every step skipped.
  const bool dynamic_scale = cfg.precision == Precision::FP16 && cfg.loss_scale.loss_scale == 0;
  constexpr int kMaxFixedScaleSkips = 5;
  int fixed_skips = 0;
  int stopped_by = 0;  // a graceful-stop signal all ranks agreed on (stop_signal.h)
  while (engine.global_step() < cfg.train.steps && !stopped_by) {
    rank_status::set_step(engine.global_step() + 1);  // for the launcher's report when this rank fails
    StepStats st = engine.train_step(*data);
    ZR_CHECK(std::isfinite(st.loss) || st.skipped, "loss became ", st.loss, " at step ", st.step,
             " (diverged; lower the learning rate or enable gradient_clipping)");
    fixed_skips = st.skipped && !dynamic_scale ? fixed_skips + 1 : 0;
    if (fixed_skips && lead)
      spdlog::warn("step {}: gradients are not finite at a fixed loss scale ({}): the step is skipped", st.step,
                   precision_name(cfg.precision));
    ZR_CHECK(fixed_skips < kMaxFixedScaleSkips, "gradients were not finite for ", fixed_skips,
             " steps in a row (to step ", st.step, ") at a fixed loss scale (", precision_name(cfg.precision),
             "): the run diverged; lower the learning rate or enable gradient_clipping");
    window_s += st.seconds;
    window_tok += st.tokens;
    if (metrics.is_open()) {
      json j = {{"step", st.step},
                {"loss", st.loss},
                {"lr", st.lr},
                {"grad_norm", st.grad_norm},
                {"loss_scale", st.loss_scale},
                {"skipped", st.skipped},
                {"seconds", st.seconds},
                {"optimizer_seconds", st.optimizer_seconds}};
      const bool nvme = cfg.zero.offload_optimizer.device == "nvme" || cfg.zero.offload_param.device == "nvme";
      if (nvme) j["nvme_wait_seconds"] = st.nvme_wait_seconds;
      if (engine.offloads()) j["transfer_wait_seconds"] = st.transfer_wait_seconds;
      // Bytes by category at the step's end: host memory (and of it page-locked), device memory, NVMe.
      auto by_category = [](const MemoryNow::ByCategory& v) {
        json o = json::object();
        for (size_t c = 0; c < v.size(); ++c) o[mem_category_name(static_cast<MemCategory>(c))] = v[c];
        return o;
      };
      j["host_bytes"] = by_category(st.memory.host);
      j["host_bytes"]["pinned"] = st.memory.pinned;
      if (nvme) j["host_bytes"]["nvme_buffers"] = st.memory.nvme_buffers;
      if (gpu) j["device_bytes"] = by_category(st.memory.device);
      if (nvme) j["nvme_bytes"] = by_category(st.memory.nvme);
      metrics << j.dump() << "\n" << std::flush;
    }
    if (lead && (st.step % cfg.steps_per_print == 0 || st.step == cfg.train.steps || st.step == 1)) {
      const double per_s = window_tok / window_s, tflops = per_s * flops_per_token / 1e12 / comm.size();
      spdlog::info(
          "step {:>6}/{} | loss {:.6f} | lr {:.3e} | grad_norm {:.4f} | scale {} | {:.0f} {}/s | {:.{}f} "
          "TFLOP/s{}{}",
          st.step, cfg.train.steps, st.loss, st.lr, st.grad_norm, st.loss_scale, per_s,
          data->tokens_per_sample() > 1 ? "tok" : "samples", tflops, tflops < 10 ? 3 : 1,
          comm.size() > 1 ? " a rank" : "", st.skipped ? " | SKIPPED (overflow)" : "");
      window_s = 0;
      window_tok = 0;
    }
    if (eval_data &&
        ((cfg.train.eval_interval > 0 && st.step % cfg.train.eval_interval == 0) || st.step == cfg.train.steps))
      evaluate(st.step);
    if (!cfg.train.save_dir.empty() && cfg.train.save_interval > 0 && st.step % cfg.train.save_interval == 0) save();
    int sig = stop_signal();  // any rank's signal stops every rank after this same step
    if (comm.size() > 1) comm.all_reduce(&sig, 1, DType::I32, ReduceOp::Max);
    if (sig) {
      stopped_by = sig;
      if (lead)
        spdlog::warn(
            "signal {} ({}): stopping after step {}{}", sig, platform::signal_description(sig), st.step,
            cfg.train.save_dir.empty() ? " (no --save_dir: nothing is saved)" : "; saving a checkpoint to resume from");
    }
  }
  if (!cfg.train.save_dir.empty() && last_save != engine.global_step()) save();
  if (lead)
    spdlog::info("done: {} steps, {} samples | {}", engine.global_step(), engine.samples_seen(),
                 engine.memory_report());
  else  // every rank's peak (its own shards, its own process)
    spdlog::info("done: {}", engine.memory_report());
  if (lead && engine.cuda_graphs()) spdlog::info("CUDA graphs: {} captures", engine.graph_captures());
  if (lead && profile::enabled()) spdlog::info("{}", profile::report());
  if (!o.final_weights.empty()) {
    auto w = engine.master_weights();  // collective
    if (lead) {
      std::vector<SafetensorsWriteItem> items;
      for (auto& name : model.tensor_names) items.push_back({name, w.at(name)});
      write_safetensors(o.final_weights, items, {{"format", "pt"}});
      spdlog::info("wrote final fp32 weights to {}", o.final_weights);
    }
  }
  return stopped_by ? 128 + stopped_by : 0;  // stopped by a signal: the job did not finish its steps
}

}  // namespace zerorun
