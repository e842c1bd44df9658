// `zerorun estimate` (see estimate.h): model states from zero::estimate_model_states, the stage-2/3 buckets by
// replaying the engine's gather / free / gradient-bucket life cycle over zero::bucket_layout, activations from the
// graph's value shapes at the requested micro batch and sequence length.
#include "zerorun/estimate.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <set>
#include <sstream>

#include "zerorun/build_info.h"
#include "zerorun/zero_plan.h"

namespace zerorun {

double process_base_bytes() { return kProcessBaseBytes + (built_with_cuda() ? kCudaLibrariesHostBytes : 0.0); }
namespace {

// Peak bytes of gathered stage-3 groups plus live gradient buckets (stage 2: buckets only), replaying
// Engine::on_block: before a block, its groups are gathered and the next block's prefetched within the budget;
// after it, what the next block does not use is freed; a bucket lives from the backward of the last block using
// it to the backward of the first.
double bucket_peak(const zero::BucketLayout& L, const zero::Plan& plan, int stage, int64_t prefetch) {
  if (stage < 2) return 0;
  const int nb = static_cast<int>(L.block_groups.size());
  auto bytes = [&](const std::set<int>& s) {
    double b = 0;
    for (int g : s) b += 4.0 * static_cast<double>(plan.groups[static_cast<size_t>(g)].padded);
    return b;
  };
  std::set<int> live, work;
  double peak = 0;
  auto gather = [&](int b, int nxt) {
    if (stage != 3) return;
    for (int g : L.block_groups[static_cast<size_t>(b)]) live.insert(g);
    if (nxt < 0 || nxt >= nb) return;
    int64_t budget = prefetch;
    for (int g : L.block_groups[static_cast<size_t>(nxt)]) {
      const int64_t n = plan.groups[static_cast<size_t>(g)].padded;
      if (live.count(g)) continue;
      if (n > budget) break;
      live.insert(g);
      budget -= n;
    }
  };
  auto release = [&](int b, int nxt) {
    for (int g : L.block_groups[static_cast<size_t>(b)]) {
      const auto& keep = nxt >= 0 && nxt < nb ? L.block_groups[static_cast<size_t>(nxt)] : std::vector<int>{};
      if (std::find(keep.begin(), keep.end(), g) == keep.end()) live.erase(g);
    }
  };
  for (int b = 0; b < nb; ++b) {
    gather(b, b + 1);
    peak = std::max(peak, bytes(live));
    if (b + 1 != nb) release(b, b + 1);
  }
  for (int b = nb; b-- > 0;) {
    gather(b, b - 1);
    for (int g : L.block_groups[static_cast<size_t>(b)]) work.insert(g);
    peak = std::max(peak, bytes(live) + bytes(work));
    for (int g : L.block_groups[static_cast<size_t>(b)])
      if (L.ready_block[static_cast<size_t>(g)] == b) work.erase(g);
    release(b, b - 1);
  }
  return peak;
}

// Activations of one micro-batch in f32: every value the forward makes (kept for the backward) and what ops save
// besides (Op::saved_bytes: attention's B x H x T x T probabilities on the CPU, B x H x T row statistics on a GPU), as
// the engine's activations peak counts them (checked by tests/load_memory_test.sh). Activation checkpointing is not
// modelled.
double activation_bytes(const Model& m, int64_t B, int64_t T, bool gpu) {
  std::map<std::string, int64_t> syms = {{"B", B}, {"T", T}};
  std::map<std::string, ValueInfo> v = m.graph.validate(m.param_shapes(), syms);
  auto size = [&](const std::string& name) {
    auto it = v.find(name);
    if (it == v.end() || m.shapes.count(name)) return 0.0;
    return static_cast<double>(shape_numel(it->second.shape)) * 4.0;
  };
  double total = 0;
  for (const Node& n : m.graph.nodes) {
    for (const std::string& out : n.out) total += size(out);
    std::vector<ValueInfo> in;
    for (const std::string& x : n.in) {
      auto it = v.find(x);
      in.push_back(it == v.end() ? ValueInfo{} : it->second);
    }
    total += op_lookup(n.op).saved_bytes(n, in, gpu);  // Op::saved_bytes: attention's
  }
  return total;
}

}  // namespace

NvmeFileEstimate estimate_nvme_file(int64_t n, int arrays, int elem_bytes, int64_t chunk_elems, int buffer_count) {
  constexpr int64_t kAlign = 4096;  // O_DIRECT alignment (src/zero/nvme.cc)
  auto round_up = [](int64_t x, int64_t m) { return (x + m - 1) / m * m; };
  const int64_t chunk =
      round_up(std::min(std::max<int64_t>(chunk_elems, 1), std::max<int64_t>(n, 1)), kAlign / elem_bytes);
  NvmeFileEstimate f;
  f.chunk = static_cast<double>(chunk);
  f.file = static_cast<double>(round_up(std::max<int64_t>(n, 1), chunk)) * elem_bytes * arrays;
  // NvmeStates' slots: buffer_count (at least two), never more than the file's chunks; every one is used.
  const int64_t chunks = round_up(std::max<int64_t>(n, 1), chunk) / chunk;
  const int64_t slots = std::min<int64_t>(std::max(2, buffer_count), chunks);
  f.buffers = static_cast<double>(slots) * arrays * static_cast<double>(chunk) * elem_bytes;
  return f;
}

MemoryEstimate estimate_memory(const Model& m, const EstimateRequest& r) {
  ZR_CHECK(r.gpus_per_node >= 1 && r.nodes >= 1, "estimate: --num_gpus and --num_nodes must be >= 1");
  ZR_CHECK(r.precision == "fp32" || r.precision == "bf16" || r.precision == "fp16",
           "--precision must be fp32, bf16 or fp16, got '", r.precision, "'");
  ZR_CHECK(r.micro_batch >= 1, "--micro_batch_size must be >= 1");
  ZR_CHECK(!r.bf16_states || r.bf16_master, "--bf16_optimizer_states needs --bf16_master_weights_and_grads");
  ZR_CHECK(!r.bf16_master || r.precision == "bf16", "--bf16_master_weights_and_grads needs --precision bf16");
  MemoryEstimate e;
  e.world = r.gpus_per_node * r.nodes;
  e.params = static_cast<double>(m.num_params());
  const bool mixed = r.precision != "fp32";
  double f32_read = 0;  // parameters some op reads in f32 (16-bit GPU runs keep f32 copies of those only)
  for (const std::string& p : m.graph.params_read_f32()) f32_read += static_cast<double>(m.numel(p));
  e.seq_len = r.seq_len > 0 ? r.seq_len : m.symbols.count("T") ? m.symbols.at("T") : 1;
  e.activations = activation_bytes(m, r.micro_batch, e.seq_len, r.gpu);
  // The engine's layout: one group a block at stages 0-1, reduce_bucket_size buckets at 2-3.
  std::vector<zero::ParamUse> uses;
  const auto ranges = m.graph.block_ranges();
  for (size_t b = 0; b < ranges.size(); ++b)
    for (size_t i = ranges[b].first; i < ranges[b].second; ++i)
      for (auto& [role, name] : m.graph.nodes[i].params) uses.push_back({static_cast<int>(b), name, m.numel(name)});
  const int nb = static_cast<int>(ranges.size());
  {
    zero::BucketLayout whole = zero::bucket_layout(uses, nb, std::numeric_limits<int64_t>::max());
    zero::Plan p = zero::plan(whole.params, 1, 1);
    for (const zero::Group& g : p.groups) e.largest_block = std::max(e.largest_block, static_cast<double>(g.numel));
  }
  zero::BucketLayout buckets = zero::bucket_layout(uses, nb, std::max<int64_t>(r.reduce_bucket_size, 1));
  zero::Plan plan = zero::plan(buckets.params, e.world, 1);
  for (int stage = 0; stage <= 3; ++stage)
    for (bool off : {false, true}) {
      if (off && (!r.gpu || stage == 0)) continue;
      if (r.bf16_master && stage == 0) continue;     // DeepSpeed: stages 1-3 only
      if (r.bf16_master && r.gpu && !off) continue;  // GPU runs: with offload_optimizer only (the CPU optimizer)
      StageEstimate s;
      s.stage = stage;
      s.offload = off;
      const zero::StateEstimate st = zero::estimate_model_states(
          e.params, stage, e.world, mixed, r.gpu, off, off && stage == 3, f32_read, r.bf16_master, r.bf16_states);
      s.params = st.params, s.grads = st.grads, s.optimizer = st.optimizer;
      s.states_device = st.device, s.states_host = st.host;
      s.buckets = bucket_peak(buckets, plan, stage, r.stage3_prefetch_bucket_size);
      if (r.gpu) {
        s.device = st.device + s.buckets + e.activations;
        s.host_rank = st.host + process_base_bytes();
      } else {
        s.host_rank = st.host + s.buckets + e.activations + process_base_bytes();
      }
      s.host_node = s.host_rank * r.gpus_per_node;
      e.rows.push_back(s);
    }
  // NVMe offload (stages 1-3): the engine's plan for the stage (one group a block at stage 1, the buckets at 2-3)
  // sizes the files exactly as NvmeStates does; the moments leave RAM for their chunk slots, and with offload_param
  // the parameter shard's groups past the first max_in_cpu elements leave it for theirs.
  const zero::Plan plan1 =
      zero::plan(zero::bucket_layout(uses, nb, std::numeric_limits<int64_t>::max()).params, e.world, 1);
  constexpr int64_t kMaxChunk = int64_t{1} << 24;  // the engine's cap on a chunk (16M elements)
  for (int stage = 1; stage <= 3; ++stage)
    for (bool par : {false, true}) {
      if (par && stage != 3) continue;
      const zero::Plan& pl = stage == 1 ? plan1 : plan;
      StageEstimate s;
      s.stage = stage;
      s.offload = r.gpu;  // a GPU run offloads the optimizer (and at stage 3 with par the parameters) to the host
      s.nvme_optimizer = true;
      s.nvme_param = par;
      const zero::StateEstimate st = zero::estimate_model_states(e.params, stage, e.world, mixed, r.gpu, r.gpu,
                                                                 r.gpu && par, f32_read, r.bf16_master, r.bf16_states);
      const int esize = r.bf16_states ? 2 : 4;
      const int64_t n = pl.shard_numel();
      const NvmeFileEstimate mf =
          estimate_nvme_file(n, 2, esize, std::min(r.sub_group_size, kMaxChunk), r.opt_buffer_count);
      s.nvme_moments = static_cast<double>(n) * esize * 2;
      const double moments_ram = esize * 2 * e.params / e.world;  // what estimate_model_states counts
      s.nvme_files = mf.file;
      s.nvme_buffers = mf.buffers;
      double params_ram_less = 0;  // compute bytes the parameters' file takes out of RAM
      if (par) {
        // ShardedState: the first group whose piece ends past max_in_cpu and every one after it go to the file.
        int64_t off = 0;
        size_t g = 0;
        for (; g < pl.groups.size() && off + pl.groups[g].shard <= r.max_in_cpu; ++g) off += pl.groups[g].shard;
        if (g < pl.groups.size()) {
          const NvmeFileEstimate pf =
              estimate_nvme_file(n - off, 1, 4, std::min(r.param_buffer_size, kMaxChunk), r.param_buffer_count);
          s.nvme_params = 4.0 * static_cast<double>(n - off);
          s.nvme_files += pf.file;
          s.nvme_buffers += pf.buffers;
          params_ram_less = std::min(s.nvme_params, 4 * e.params / e.world);
        }
      }
      s.params = st.params - params_ram_less, s.grads = st.grads, s.optimizer = st.optimizer - moments_ram;
      s.states_device = st.device;
      s.states_host = st.host - moments_ram - params_ram_less;
      s.buckets = bucket_peak(buckets, plan, stage, r.stage3_prefetch_bucket_size);
      if (r.gpu) {
        s.device = st.device + s.buckets + e.activations;
        s.host_rank = s.states_host + s.nvme_buffers + process_base_bytes();
      } else {
        s.host_rank = s.states_host + s.nvme_buffers + s.buckets + e.activations + process_base_bytes();
      }
      s.host_node = s.host_rank * r.gpus_per_node;
      e.nvme.push_back(s);
    }
  return e;
}

std::string format_estimate(const MemoryEstimate& e, const EstimateRequest& r, const std::string& what) {
  auto gib = [](double b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, b >= 1024.0 * 1048576 ? "%.2fGiB" : "%.1fMiB",
                  b >= 1024.0 * 1048576 ? b / 1073741824.0 : b / 1048576.0);
    return std::string(buf);
  };
  std::ostringstream os;
  os << what << ": " << static_cast<int64_t>(e.params) << " parameters; " << r.precision << " on "
     << (r.gpu ? "cuda" : "cpu") << ", " << r.gpus_per_node << (r.gpu ? " GPU(s)" : " rank(s)") << " per node x "
     << r.nodes << " node(s) = " << e.world << " rank(s); AdamW"
     << (r.bf16_states   ? " (bf16 master weights and moments)"
         : r.bf16_master ? " (bf16 master weights)"
                         : "")
     << "\n";
  os << "activations per rank: " << gib(e.activations) << " at micro batch " << r.micro_batch << " x sequence "
     << e.seq_len << " (f32 values; 16-bit GPU runs store some in 16 bits)\n";
  char line[256];
  std::snprintf(line, sizeof line, "%-6s %-8s %11s %11s %11s %11s %11s %13s %13s\n", "stage", "offload", "params",
                "grads", "optimizer", "buckets", r.gpu ? "GPU/rank" : "-", "host/rank", "host/node");
  os << line;
  for (const StageEstimate& s : e.rows) {
    std::snprintf(line, sizeof line, "ZeRO-%-1d %-8s %11s %11s %11s %11s %11s %13s %13s\n", s.stage,
                  s.offload ? (s.stage == 3 ? "opt+par" : "opt") : "none", gib(s.params).c_str(), gib(s.grads).c_str(),
                  gib(s.optimizer).c_str(), gib(s.buckets).c_str(), r.gpu ? gib(s.device).c_str() : "-",
                  gib(s.host_rank).c_str(), gib(s.host_node).c_str());
    os << line;
  }
  os << "params/grads/optimizer: model states per rank as the engine counts them; buckets: stage-2/3 gradient "
        "buckets and gathered stage-3 parameters at their peak; host/rank adds "
     << gib(process_base_bytes()) << " for the process itself" << (r.gpu ? " (not the CUDA runtime's own)" : "")
     << "\n";
  if (!e.nvme.empty()) {
    constexpr int64_t kMaxChunk = int64_t{1} << 24;
    os << "NVMe offload (ZeRO-Infinity), " << (r.config.empty() ? "DeepSpeed's defaults" : r.config + "'s keys")
       << ": offload_optimizer \"nvme\": the moments in a file, chunks of sub_group_size " << r.sub_group_size
       << " elements (at most " << kMaxChunk << "), buffer_count " << r.opt_buffer_count
       << "; offload_param \"nvme\" (stage 3): the parameter shard past max_in_cpu " << r.max_in_cpu
       << " elements in a file, chunks of buffer_size " << r.param_buffer_size << " (at most " << kMaxChunk
       << "), buffer_count " << r.param_buffer_count << "\n";
    std::snprintf(line, sizeof line, "%-6s %-8s %11s %11s %11s %11s %11s %11s %13s %13s %11s %11s\n", "stage",
                  "offload", "params", "grads", "optimizer", "buckets", "NVMe bufs", r.gpu ? "GPU/rank" : "-",
                  "host/rank", "host/node", "NVMe/rank", "NVMe/node");
    os << line;
    for (const StageEstimate& s : e.nvme) {
      std::snprintf(line, sizeof line, "ZeRO-%-1d %-8s %11s %11s %11s %11s %11s %11s %13s %13s %11s %11s\n", s.stage,
                    s.nvme_param ? "nvme+par" : "nvme", gib(s.params).c_str(), gib(s.grads).c_str(),
                    gib(s.optimizer).c_str(), gib(s.buckets).c_str(), gib(s.nvme_buffers).c_str(),
                    r.gpu ? gib(s.device).c_str() : "-", gib(s.host_rank).c_str(), gib(s.host_node).c_str(),
                    gib(s.nvme_moments + s.nvme_params).c_str(), gib(s.nvme_files * r.gpus_per_node).c_str());
      os << line;
    }
    os << "nvme: offload_optimizer \"nvme\"" << (r.gpu ? " (the fp32 master and gradients in host RAM)" : "")
       << "; nvme+par: and offload_param \"nvme\"; params/optimizer: what stays in RAM"
       << (r.gpu ? " or GPU memory" : "")
       << "; NVMe bufs: the files' chunk slots in RAM, buffer_count each (no more than a file has chunks); NVMe/rank: "
          "the states on NVMe (moments, "
          "parameters); NVMe/node: the files of a node's ranks (rounded up to whole chunks): the room nvme_path "
          "needs\n";
  }
  if (r.config_stage >= 0) {
    const std::string& o = r.config_offload_optimizer;
    const std::string& p = r.config_offload_param;
    const int st = r.config_stage;
    std::string row;
    if (o == "nvme" && (p == "none" || (p == "nvme" && st == 3)))
      row = p == "nvme" ? "nvme+par" : "nvme";
    else if (o == "nvme" || (o == "none" && p != "none" && r.gpu))
      row = "";
    else if (!r.gpu)  // CPU ranks: offload "cpu" changes nothing; parameters on NVMe without the moments: no row
      row = p == "nvme" ? "" : "none";
    else
      row = o == "none" ? "none" : st == 3 && p == "cpu" ? "opt+par" : p == "none" ? "opt" : "";
    if (st == 0 && row != "none") row.clear();
    os << r.config << ": ZeRO-" << st << ", offload_optimizer " << o << ", offload_param " << p << ": "
       << (row.empty() ? std::string("no row of this table") : "row 'ZeRO-" + std::to_string(st) + " " + row + "'")
       << "\n";
  }
  return os.str();
}

}  // namespace zerorun
