// Adam/AdamW/SGD state and update over the rank's flat parameter range.
#include <algorithm>

#include "kernels/backend.h"
#include "zerorun/optim.h"

namespace zerorun {

Optimizer::Optimizer(const OptimizerConfig& cfg, int64_t n, Device dev, bool bf16_master, bool bf16_states)
    : cfg_(cfg), n_(n), dev_(dev), bf16_master_(bf16_master), bf16_states_(bf16_states) {
  ZR_CHECK(!bf16_states || bf16_master, "bf16.bf16_optimizer_states requires bf16.bf16_master_weights_and_grads");
  ZR_CHECK(!bf16_master || cfg_.type != "SGD", "bf16.bf16_master_weights_and_grads is implemented for Adam/AdamW ",
           "(the optimizer is SGD)");
  const DType st = bf16_states ? DType::BF16 : DType::F32;
  m_ = Tensor::zeros({n}, st, MemCategory::Optimizer, dev);
  if (cfg_.type != "SGD") v_ = Tensor::zeros({n}, st, MemCategory::Optimizer, dev);
}

void Optimizer::step(float* p, const float* g, double lr, double beta1, RoundedOut out) {
  begin_step();
  update(p, g, 0, n_, lr, beta1, out);
}

void Optimizer::update(float* p, const float* g, int64_t off, int64_t n, double lr, double beta1, RoundedOut out) {
  ZR_CHECK(off >= 0 && off + n <= n_, "optimizer update [", off, ", ", off + n, ") outside its state of ", n_);
  if (!nvme_) {
    const size_t es = bf16_states_ ? 2 : 4;
    update_mem(p, g, static_cast<char*>(m_.raw()) + es * static_cast<size_t>(off),
               v_.defined() ? static_cast<char*>(v_.raw()) + es * static_cast<size_t>(off) : nullptr, n, lr, beta1,
               out);
    return;
  }
  // NVMe: chunk by chunk as the file's cache hands them over (elementwise: the same bits as in memory).
  nvme_->for_each(off, n, [&](const std::vector<char*>& st, int64_t b, int64_t k) {
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
  ZR_CHECK(dev_.is_cpu(), "NVMe optimizer states need the CPU optimizer");
  const int arrays = cfg_.type == "SGD" ? 1 : 2;
  nvme_ = std::make_unique<zero::NvmeStates>(nvme_path, rank, "optimizer_states.bin", n_, arrays, bf16_states_ ? 2 : 4,
                                             chunk_elems, buffer_count, aio);
  m_ = Tensor(), v_ = Tensor();  // the file starts as zeros, as the moments do
}

int64_t Optimizer::ram_bytes() const {
  return static_cast<int64_t>((m_.defined() ? m_.nbytes() : 0) + (v_.defined() ? v_.nbytes() : 0));
}
int64_t Optimizer::nvme_bytes() const { return nvme_ ? n_ * (bf16_states_ ? 2 : 4) * (cfg_.type == "SGD" ? 1 : 2) : 0; }

void Optimizer::read_state(int k, int64_t off, int64_t n, float* dst) {
  ZR_CHECK(off >= 0 && off + n <= n_, "optimizer state read outside its range");
  std::vector<uint16_t> h;
  uint16_t* src16 = nullptr;
  if (nvme_) {
    if (!bf16_states_) return nvme_->read(k, off, n, dst);
    h.resize(static_cast<size_t>(n));
    nvme_->read(k, off, n, h.data());
    src16 = h.data();
  } else {
    const Tensor& t = k == 0 ? m_ : v_;
    ZR_CHECK(t.device().is_cpu(), "read_state: states in device memory (the engine copies those itself)");
    if (!bf16_states_) {
      std::copy(t.f32() + off, t.f32() + off + n, dst);
      return;
    }
    src16 = static_cast<uint16_t*>(t.raw()) + off;
  }
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src16[i]);
}

void Optimizer::write_state(int k, int64_t off, int64_t n, const float* src) {
  ZR_CHECK(off >= 0 && off + n <= n_, "optimizer state write outside its range");
  std::vector<uint16_t> h;
  if (bf16_states_) {
    h.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) h[static_cast<size_t>(i)] = f32_to_bf16(src[i]);
  }
  if (nvme_) return bf16_states_ ? nvme_->write(k, off, n, h.data()) : nvme_->write(k, off, n, src);
  const Tensor& t = k == 0 ? m_ : v_;
  ZR_CHECK(t.device().is_cpu(), "write_state: states in device memory (the engine copies those itself)");
  if (bf16_states_)
    std::copy(h.begin(), h.end(), static_cast<uint16_t*>(t.raw()) + off);
  else
    std::copy(src, src + n, t.f32() + off);
}

std::vector<std::pair<std::string, Tensor>> Optimizer::state() const {
  if (cfg_.type == "SGD") return {{"momentum_buffer", m_}};
  return {{"exp_avg", m_}, {"exp_avg_sq", v_}};
}

}  // namespace zerorun
