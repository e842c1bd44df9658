// Adam/AdamW/SGD state and update over the rank's flat parameter range.
#include "kernels/backend.h"
#include "zerorun/optim.h"

namespace zerorun {

Optimizer::Optimizer(const OptimizerConfig& cfg, int64_t n, Device dev) : cfg_(cfg), n_(n), dev_(dev) {
  m_ = Tensor::zeros({n}, DType::F32, MemCategory::Optimizer, dev);
  if (cfg_.type != "SGD") v_ = Tensor::zeros({n}, DType::F32, MemCategory::Optimizer, dev);
}

void Optimizer::step(float* p, const float* g, double lr, double beta1, RoundedOut out) {
  begin_step();
  update(p, g, 0, n_, lr, beta1, out);
}

void Optimizer::update(float* p, const float* g, int64_t off, int64_t n, double lr, double beta1, RoundedOut out) {
  ZR_CHECK(off >= 0 && off + n <= n_, "optimizer update [", off, ", ", off + n, ") outside its state of ", n_);
  kernels::Backend& be = kernels::backend(dev_);
  if (cfg_.type == "SGD") {
    be.sgd_step(p, g, m_.f32() + off, n, static_cast<float>(lr), static_cast<float>(beta1),
                static_cast<float>(cfg_.dampening), static_cast<float>(cfg_.weight_decay), cfg_.nesterov, steps_ == 1);
    be.round_copies(out.dt, p, out.f32, out.h, n, out.f32_slots, out.f32_base);
  } else {
    be.adam_step_rounded(p, g, m_.f32() + off, v_.f32() + off, n, static_cast<float>(lr), static_cast<float>(beta1),
                         static_cast<float>(cfg_.beta2), static_cast<float>(cfg_.eps),
                         static_cast<float>(cfg_.weight_decay), cfg_.adam_w_mode, cfg_.bias_correction, steps_, out.dt,
                         out.f32, out.h, out.f32_slots, out.f32_base);
  }
}

std::vector<std::pair<std::string, Tensor>> Optimizer::state() const {
  if (cfg_.type == "SGD") return {{"momentum_buffer", m_}};
  return {{"exp_avg", m_}, {"exp_avg_sq", v_}};
}

}  // namespace zerorun
