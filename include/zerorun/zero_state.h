// ShardedState: ZeRO's sharded model state, apart from any graph (DESIGN.md layer 6). It owns the flat buffers
// (compute weights, their 16-bit copy, the stage-3 parameter shard, the fp32 master, the gradients and the
// offload gradient shard), each with a placement; the bucket layout; the stage-3 gather/free life cycle with
// prefetch; the stage-2/3 gradient buckets and their reduce-scatter; the compute copies an update refreshes; and
// the ranges a checkpoint reads and writes. Whoever computes (the Engine's executor) sees the weights and the
// gradients through a Binding; the Engine keeps the step (micro-batches, loss scale, clipping, the schedule).
#pragma once
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "zerorun/comm.h"
#include "zerorun/nvme.h"
#include "zerorun/tensor.h"
#include "zerorun/zero_plan.h"

namespace zerorun::zero {

// Where a flat buffer lives. Nvme: the optimizer's moments under offload_optimizer "nvme", the stage-3 parameter
// shard (past max_in_cpu) under offload_param "nvme" (zero::NvmeStates).
enum class Placement { Device, Host, PinnedHost, Nvme };
const char* placement_name(Placement p);

struct BufferInfo {
  std::string name;  // "compute", "compute16", "param_shard", "master", "grads", "host_grad", ...
  Placement placement = Placement::Host;
  int64_t bytes = 0;
  MemCategory category = MemCategory::Buffers;  // what the allocator counts it as (Nvme: what it would be)
};

struct StateOptions {
  int stage = 0;
  Device device = Device::cpu();     // the training device
  DType compute_dtype = DType::F32;  // BF16 / F16: 16-bit compute (rounded compute copies of an fp32 master)
  bool bf16_master = false;          // bf16.bf16_master_weights_and_grads: the compute weights are the master
  bool offload_optimizer = false;    // GPU runs, stage >= 1: the master and a gradient shard in host memory
  bool offload_param = false;        // GPU runs, stage 3 (needs offload_optimizer): the parameter shard on the host
  bool pin_optimizer = false;        // page-lock the offloaded gradient shard and the update's staging buffer
  bool pin_param = false;            // page-lock the offloaded parameter shard
  // Stage 3, offload_param "nvme" (any device): the parameter shard's groups past the first max_in_cpu elements live
  // in a file under param_nvme_path, read and written in chunks of param_nvme_chunk elements through
  // param_nvme_buffers cache slots.
  std::string param_nvme_path;
  int64_t param_max_in_cpu = 0;
  int64_t param_nvme_chunk = int64_t{1} << 20;
  int param_nvme_buffers = 2;
  AioConfig aio;
  int64_t bucket = std::numeric_limits<int64_t>::max();    // elements a bucket (stages 2-3)
  int64_t persistence_threshold = 0;                       // stage 3: groups below it stay gathered
  int64_t prefetch_bucket = 0;                             // stage 3: elements prefetched ahead of a block
  int64_t max_live = std::numeric_limits<int64_t>::max();  // stage 3: gathered elements at most (prefetch)
};

// Elements [first, first + count) of weight `name` into host memory at dst (f32).
using WeightReader = std::function<void(const std::string& name, int64_t first, int64_t count, float* dst)>;

// How the buffers reach whoever computes: a parameter's (or gradient's) tensor, or none (an undefined tensor).
struct Binding {
  std::function<void(const std::string&name, const Tensor&t)> set_param, set_grad;
};

// Where an update also writes the new weights rounded to `dt` (the optimizer's RoundedOut; all null: nowhere):
// f32 values and / or 16-bit bits, each optional.
struct UpdateTargets {
  DType dt = DType::F32;
  float* f32 = nullptr;
  uint16_t* h = nullptr;
  // Null: f32[i] for element i of the update. Otherwise the f32 copies are compact (kernels::f32_copy_at): the
  // update's element i is element f32_base + i of the flat layout, whose 256-element chunk k has its copy at
  // f32[256 f32_slots[k] + (f32_base + i) % 256], or none where f32_slots[k] < 0; needs h.
  const int32_t* f32_slots = nullptr;
  int64_t f32_base = 0;
};

// One group's piece of an update: the weights the optimizer updates in place, their gradients (in host memory with
// offload_optimizer), where the piece starts in the optimizer's state and in the flat layout.
struct UpdatePiece {
  float* weights = nullptr;
  const float* grads = nullptr;
  int64_t state_offset = 0, flat_begin = 0, n = 0;
};

// The optimizer's moments (src/zero/moments.cc): `arrays` arrays (exp_avg[, exp_avg_sq]) of n elements, f32 or
// bf16, in device or host memory, or (place_on_nvme) in a file under nvme_path streamed chunk by chunk (NvmeStates).
class MomentStore {
 public:
  MomentStore(int64_t n, int arrays, DType dt, Device dev);
  MomentStore(const MomentStore&) = delete;
  MomentStore& operator=(const MomentStore&) = delete;
  // offload_optimizer.device "nvme" (host states only): the moments move to a file (zeros, as they start).
  void place_on_nvme(const std::string& nvme_path, int rank, int64_t chunk_elems, int buffer_count,
                     const AioConfig& aio);
  int64_t size() const { return n_; }
  int arrays() const { return arrays_; }
  DType dtype() const { return dt_; }
  Placement placement() const;
  const Tensor& array(int k) const { return mem_[k]; }  // in memory (undefined on NVMe)
  // Array k at element off in memory (null on NVMe or past the arrays).
  void* at(int k, int64_t off) const;
  NvmeStates* nvme() const { return nvme_.get(); }
  // Array k's elements [off, off + n) as f32 (bf16 widened / rounded), in host memory or on NVMe.
  void read(int k, int64_t off, int64_t n, float* dst);
  void write(int k, int64_t off, int64_t n, const float* src);
  int64_t ram_bytes() const;   // bytes in memory
  int64_t nvme_bytes() const;  // bytes in the NVMe file

 private:
  int64_t n_;
  int arrays_;
  DType dt_;
  Device dev_;
  Tensor mem_[2];
  std::unique_ptr<NvmeStates> nvme_;
};

class ShardedState {
 public:
  // `uses`: every parameter use of the blocks in execution order (see bucket_layout); `shapes` every parameter's
  // shape. Allocates the buffers and reads this rank's weights through `read` (the whole model at stages 0-2, the
  // owned shard at stage 3), range by range.
  ShardedState(const std::vector<ParamUse>& uses, int num_blocks, const std::map<std::string, Shape>& shapes,
               const StateOptions& o, Communicator& comm, const WeightReader& read);
  ~ShardedState();  // waits for gathers in flight
  ShardedState(const ShardedState&) = delete;
  ShardedState& operator=(const ShardedState&) = delete;

  // ---- layout
  const Plan& plan() const { return plan_; }
  const StateOptions& options() const { return o_; }
  int stage() const { return o_.stage; }
  bool mixed() const { return o_.compute_dtype != DType::F32; }
  bool offload() const { return o_.offload_optimizer; }
  Device param_device() const { return pdev_; }  // where the stage-3 parameter shard lives
  int64_t shard_offset(int g) const { return shard_off_[static_cast<size_t>(g)]; }
  const std::vector<std::vector<int>>& block_groups() const { return block_groups_; }
  const Shape& shape(const std::string& name) const { return shapes_.at(name); }

  // ---- buffers
  const Tensor& compute() const { return compute_; }          // stages 0-2: full padded compute weights
  const Tensor& compute16() const { return compute16_; }      // 16-bit GPU runs, stages 0-2
  const Tensor& param_shard() const { return param_shard_; }  // stage 3
  const Tensor& master() const { return master_; }            // fp32 master; undefined: the compute weights are it
  // The gradients the step reduces, unscales and clips: full (stages 0-1) or this rank's shard (stages 2-3).
  const Tensor& grads() const { return o_.stage < 2 ? grads_full_ : grads_shard_; }
  std::vector<BufferInfo> buffers() const;
  int64_t param_bytes() const;  // compute copies, parameter shard, persistent gathered groups
  int64_t grad_bytes() const;
  int64_t master_bytes() const { return master_.defined() ? static_cast<int64_t>(master_.nbytes()) : 0; }
  NvmeStates* param_nvme() const { return param_nvme_.get(); }  // offload_param "nvme": the shard's file
  int64_t param_nvme_bytes() const;                             // parameter bytes in that file
  int64_t pinned_bytes() const { return pinned_bytes_; }
  // Offload (GPU runs): wall time so far in the copies between host and device memory of the update (gradient
  // pieces to the host, updated weights back) and of the stage-3 gathers (the host shard to the device).
  double transfer_seconds() const { return transfer_s_; }

  // ---- binding to the computation
  std::map<std::string, Tensor> param_views() const;    // stages 0-2 (stage 3: undefined, bound when gathered)
  std::map<std::string, Tensor> grad_views() const;     // stages 0-1 (stages 2-3: bound per bucket in backward)
  std::map<std::string, Tensor> param16_views() const;  // empty without a 16-bit copy
  // Binds, then gathers the stage-3 groups below the persistence threshold (kept for the whole run).
  void bind(Binding b);
  // Compact f32 copy (16-bit copy + an on-device master, no f32 all-gather: stage 0, or one rank): only the
  // 256-element chunks some op reads in f32 stay; the others are bound to their 16-bit copies.
  void make_compact(const std::function<bool(const std::string&)>& reads_f32);
  bool compact() const { return compact_; }

  // ---- stage-3 parameters and stage-2/3 gradient buckets (called around each block's forward and backward)
  void on_block(size_t b, bool forward, bool before);
  void start_gather(int g);  // stage 3: all-gather of group g started (no-op when live or in flight)
  void ensure_live(int g);   // stage 3: group g gathered and bound
  void release(int g);       // stage 3: group g freed and unbound (persistent groups stay)
  void release_all();        // stage 3: after a forward with no backward (evaluation)
  bool gathered(int g) const { return rt_[static_cast<size_t>(g)].full.defined(); }  // live or in flight
  bool persistent(int g) const { return rt_[static_cast<size_t>(g)].persistent; }

  // ---- the update
  // Stage 0 without group pieces: the flat weights the optimizer updates (the master, or the compute weights).
  float* full_master();
  UpdatePiece update_piece(int g);              // copies the gradient piece to the host first with offload_optimizer
  void end_update_piece(int g);                 // after the optimizer updated update_piece(g)'s weights
  UpdateTargets update_targets(int64_t begin);  // fused-update targets at compute element `begin` (or none)
  // After the update: compute copies refreshed from the master (unless `rounded`: the update wrote them) and
  // gathered where sharded.
  void after_update(bool rounded);
  // Stages 1-2 on several ranks with the compact f32 copy: the weights go round as the 16-bit copy.
  bool gathers16() const;
  void gather16();        // each rank's piece of the 16-bit copy all-gathered, the compact f32 copy widened from it
  void sync_compute16();  // the 16-bit copy = the compute weights in 16 bits (compact: both from the master)
  // Full fp32 master weights by name (collective at stages >= 1).
  std::map<std::string, Tensor> full_master_weights();

  // ---- the optimizer's moments: over the update's range (the whole flat layout at stage 0, else this rank's
  // shards), where the optimizer runs (host memory with offload_optimizer), placed on NVMe by the caller's choice.
  MomentStore& make_moments(int arrays, DType dt);
  MomentStore& moments() { return *moments_; }
  const MomentStore* moments_if_any() const { return moments_.get(); }

  // ---- checkpoint ranges
  Range ckpt_range(int p, int rank) const;          // elements of param p that `rank` saves (stage 0: rank 0 all)
  Range own_range(int p) const;                     // master and optimizer elements of param p this rank keeps
  Range load_range(int p) const;                    // master elements of param p a load reads (compute copy included)
  void read_master(int p, Range r, float* dst);     // fp32 master elements r of param p (inside own_range) to dst
  int64_t state_offset(int p, int64_t elem) const;  // the optimizer state's index of element elem of param p
  // Loaded master values of param p over `need` (= load_range(p)) into the compute copies and the master.
  void load_master(int p, Range need, std::vector<float> values);
  void after_load();  // persistent stage-3 groups gathered again, 16-bit copies from the loaded weights

  void copy_f32(float* dst, const float* src, int64_t n) const;  // any devices

 private:
  struct GroupRt {
    Tensor full;                         // stage 3: gathered params (padded group)
    std::unique_ptr<CommHandle> gather;  // in-flight prefetch
    Tensor work_grad;                    // stage 2/3: this micro-batch's full group grads
    Tensor staged;                       // offload_param: host shard copied to the device for the gather
    bool persistent = false;             // stage 3: below the persistence threshold
    Tensor window;                       // offload_param "nvme": the shard piece read from the file, while used
    int window_users = 0;
    bool window_dirty = false;
  };
  void load_weights(const WeightReader& read, const std::string& name, int64_t first, int64_t count, const Tensor& dst,
                    int64_t at);
  void pin_offload_buffers();
  void bind_params(int g, bool live);
  void begin_grads(size_t b);
  void finish_grads(size_t b);
  void refresh_compute_params();
  // This rank's fp32 master piece of group g in memory, and its release (`dirty`: written; an NVMe piece goes back
  // to its file). Stage 3 without a separate master: the parameter shard's piece (see shard_piece).
  float* owned_master(int g);
  void done_master(int g, bool dirty);
  // Stage 3: group g's piece of the parameter shard in memory: in param_shard_, or (on NVMe) a window read from the
  // file (read false: zeros, for a piece about to be written whole), written back by put_piece when dirty and freed
  // when its last user puts it.
  bool piece_on_nvme(int g) const { return param_nvme_ && g >= first_nvme_group_; }
  float* shard_piece(int g, bool read = true);
  void put_piece(int g, bool dirty);
  // n elements at `at` of group g's shard piece from (write: to) buf: straight from the file where it is on NVMe and
  // no window holds it, else through shard_piece.
  void piece_io(int g, int64_t at, int64_t n, float* buf, bool write);
  // Stage 3: group g's shard piece where an all-gather can read it (the device): in place, or into `staged`.
  const float* gather_source(int g, Tensor& staged);

  StateOptions o_;
  Communicator& comm_;
  Device dev_, pdev_;
  std::map<std::string, Shape> shapes_;
  Plan plan_;
  std::vector<int64_t> shard_off_;              // group -> offset inside this rank's shard arrays
  std::vector<std::vector<int>> block_groups_;  // groups each block uses
  std::vector<size_t> ready_block_;             // group -> block after whose backward its grads are complete
  std::vector<GroupRt> rt_;
  Binding bind_;
  Tensor compute_;    // stages 0-2: full padded compute params
  Tensor compute16_;  // 16-bit CUDA runs, stages 0-2: compute_ in 16 bits, what the products read
  // Compact: compute_ keeps only the 256-element chunks of the flat layout that some op reads in f32, chunk k at
  // slot f32_slots_[k] (-1: none), and the views of 16-bit-only weights are their 16-bit copies.
  bool compact_ = false;
  Tensor f32_slots_;
  Tensor param_shard_;  // stage 3: this rank's compute-param shard (the groups before first_nvme_group_)
  std::unique_ptr<NvmeStates> param_nvme_;  // offload_param "nvme": the groups from first_nvme_group_ on
  int first_nvme_group_ = std::numeric_limits<int>::max();
  int64_t nvme_base_ = 0;     // shard offset of first_nvme_group_ (the file's element 0)
  Tensor master_;             // fp32 master: full (stage 0) or shard (stage >= 1, 16-bit); empty = compute is master
  Tensor grads_full_;         // stages 0-1
  Tensor grads_shard_;        // stages 2-3
  Tensor host_grad_;          // offload: this rank's gradient shard in host memory
  Tensor offload_stage_;      // offload with device compute params: a group's rounded update on its way there
  int64_t pinned_bytes_ = 0;  // host memory page-locked by pin_memory
  double transfer_s_ = 0;     // see transfer_seconds()
  void copy_timed(float* dst, const float* src, int64_t n);  // copy_f32 between host and device, timed
  std::unique_ptr<MomentStore> moments_;
};

}  // namespace zerorun::zero
