// Adam/AdamW/SGD state and update over the rank's flat parameter range.
#include <algorithm>

#include "kernels/backend.h"
#include "zerorun/optim.h"

namespace zerorun {

Optimizer::Optimizer(const OptimizerConfig& cfg, int64_t n, Device dev, bool bf16_master, bool bf16_states,
                     zero::MomentStore* states)
    : cfg_(cfg), n_(n), dev_(dev), bf16_master_(bf16_master), bf16_states_(bf16_states), st_(states) {
  ZR_CHECK(!bf16_states || bf16_master, "bf16.bf16_optimizer_states requires bf16.bf16_master_weights_and_grads");
  ZR_CHECK(!bf16_master || cfg_.type != "SGD", "bf16.bf16_master_weights_and_grads is implemented for Adam/AdamW ",
           "(the optimizer is SGD)");
  const DType st = bf16_states ? DType::BF16 : DType::F32;
  const int arrays = cfg_.type == "SGD" ? 1 : 2;
  if (!st_) {
    own_ = std::make_unique<zero::MomentStore>(n, arrays, st, dev);
    st_ = own_.get();
  }
  ZR_CHECK(st_->size() == n && st_->arrays() == arrays && st_->dtype() == st, "optimizer moments of ", st_->size(),
           " elements x ", st_->arrays(), " (", dtype_name(st_->dtype()), ") for an optimizer of ", n, " x ", arrays,
           " (", dtype_name(st), ")");
}

void Optimizer::step(float* p, const float* g, double lr, double beta1, RoundedOut out) {
  begin_step();
  update(p, g, 0, n_, lr, beta1, out);
}

void Optimizer::update(float* p, const float* g, int64_t off, int64_t n, double lr, double beta1, RoundedOut out) {
  ZR_CHECK(off >= 0 && off + n <= n_, "optimizer update [", off, ", ", off + n, ") outside its state of ", n_);
  if (!st_->nvme()) {
    update_mem(p, g, st_->at(0, off), st_->at(1, off), n, lr, beta1, out);
    return;
  }
  // NVMe: chunk by chunk as the file's cache hands them over (elementwise: the same bits as in memory).
  st_->nvme()->for_each(off, n, [&](const std::vector<char*>& st, int64_t b, int64_t k) {
    const int64_t d = b - off;
    RoundedOut o = out;
    if (o.f32_slots)
      o.f32_base += d;
    else if (o.f32)
      o.f32 += d;
    if (o.h) o.h += d;
    update_mem(p + d, g + d, st[0], st.size() > 1 ? st[1] : nullptr, k, lr, beta1, o);
  });
}

void Optimizer::update_mem(float* p, const float* g, void* m, void* v, int64_t n, double lr, double beta1,
                           const RoundedOut& out) {
  kernels::Backend& be = kernels::backend(dev_);
  if (cfg_.type == "SGD") {
    be.sgd_step(p, g, static_cast<float*>(m), n, static_cast<float>(lr), static_cast<float>(beta1),
                static_cast<float>(cfg_.dampening), static_cast<float>(cfg_.weight_decay), cfg_.nesterov, steps_ == 1);
    be.round_copies(out.dt, p, out.f32, out.h, n, out.f32_slots, out.f32_base);
  } else if (bf16_master_) {  // the weights are the master: already rounded to bf16 by the update itself
    ZR_CHECK(out.f32 == nullptr && out.h == nullptr, "bf16 master weights keep no separate compute copies");
    be.adam_step_bf16_master(p, g, m, v, bf16_states_, n, static_cast<float>(lr), static_cast<float>(beta1),
                             static_cast<float>(cfg_.beta2), static_cast<float>(cfg_.eps),
                             static_cast<float>(cfg_.weight_decay), cfg_.adam_w_mode, cfg_.bias_correction, steps_);
  } else {
    be.adam_step_rounded(p, g, static_cast<float*>(m), static_cast<float*>(v), n, static_cast<float>(lr),
                         static_cast<float>(beta1), static_cast<float>(cfg_.beta2), static_cast<float>(cfg_.eps),
                         static_cast<float>(cfg_.weight_decay), cfg_.adam_w_mode, cfg_.bias_correction, steps_, out.dt,
                         out.f32, out.h, out.f32_slots, out.f32_base);
  }
}

void Optimizer::place_on_nvme(const std::string& nvme_path, int rank, int64_t chunk_elems, int buffer_count,
                              const zero::AioConfig& aio) {
  st_->place_on_nvme(nvme_path, rank, chunk_elems, buffer_count, aio);
}

int64_t Optimizer::ram_bytes() const { return st_->ram_bytes(); }
int64_t Optimizer::nvme_bytes() const { return st_->nvme_bytes(); }

void Optimizer::read_state(int k, int64_t off, int64_t n, float* dst) { st_->read(k, off, n, dst); }
void Optimizer::write_state(int k, int64_t off, int64_t n, const float* src) { st_->write(k, off, n, src); }

std::vector<std::pair<std::string, Tensor>> Optimizer::state() const {
  if (cfg_.type == "SGD") return {{"momentum_buffer", st_->array(0)}};
  return {{"exp_avg", st_->array(0)}, {"exp_avg_sq", st_->array(1)}};
}

}  // namespace zerorun
