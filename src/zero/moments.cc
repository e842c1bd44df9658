// The optimizer's moments as ZeRO state with a placement: device or host memory, or a file on NVMe (ZeRO-Infinity's
// offload_optimizer "nvme", src/zero/nvme.cc). The optimizer updates them where they live; checkpoints read and
// write them in f32 through here.
#include <algorithm>

#include "zerorun/zero_state.h"

namespace zerorun::zero {

MomentStore::MomentStore(int64_t n, int arrays, DType dt, Device dev) : n_(n), arrays_(arrays), dt_(dt), dev_(dev) {
  ZR_CHECK(arrays == 1 || arrays == 2, "optimizer moments: 1 or 2 arrays, got ", arrays);
  ZR_CHECK(dt == DType::F32 || dt == DType::BF16, "optimizer moments in f32 or bf16, got ", dtype_name(dt));
  for (int k = 0; k < arrays; ++k) mem_[k] = Tensor::zeros({n}, dt, MemCategory::Optimizer, dev);
}

void MomentStore::place_on_nvme(const std::string& nvme_path, int rank, int64_t chunk_elems, int buffer_count,
                                const AioConfig& aio) {
  ZR_CHECK(dev_.is_cpu(), "NVMe optimizer states need the CPU optimizer");
  nvme_ = std::make_unique<NvmeStates>(nvme_path, rank, "optimizer_states.bin", n_, arrays_,
                                       static_cast<int>(dtype_size(dt_)), chunk_elems, buffer_count, aio);
  mem_[0] = Tensor(), mem_[1] = Tensor();  // the file starts as zeros, as the moments do
}

Placement MomentStore::placement() const {
  if (nvme_) return Placement::Nvme;
  if (dev_.is_cuda()) return Placement::Device;
  return mem_[0].pinned() ? Placement::PinnedHost : Placement::Host;
}

void* MomentStore::at(int k, int64_t off) const {
  if (nvme_ || k >= arrays_) return nullptr;
  return static_cast<char*>(mem_[k].raw()) + dtype_size(dt_) * static_cast<size_t>(off);
}

int64_t MomentStore::ram_bytes() const {
  return static_cast<int64_t>((mem_[0].defined() ? mem_[0].nbytes() : 0) + (mem_[1].defined() ? mem_[1].nbytes() : 0));
}

int64_t MomentStore::nvme_bytes() const { return nvme_ ? n_ * static_cast<int64_t>(dtype_size(dt_)) * arrays_ : 0; }

void MomentStore::read(int k, int64_t off, int64_t n, float* dst) {
  ZR_CHECK(off >= 0 && off + n <= n_, "optimizer state read outside its range");
  const bool bf16 = dt_ == DType::BF16;
  std::vector<uint16_t> h;
  uint16_t* src16 = nullptr;
  if (nvme_) {
    if (!bf16) return nvme_->read(k, off, n, dst);
    h.resize(static_cast<size_t>(n));
    nvme_->read(k, off, n, h.data());
    src16 = h.data();
  } else {
    const Tensor& t = mem_[k];
    ZR_CHECK(t.device().is_cpu(), "read_state: states in device memory (the engine copies those itself)");
    if (!bf16) {
      std::copy(t.f32() + off, t.f32() + off + n, dst);
      return;
    }
    src16 = static_cast<uint16_t*>(t.raw()) + off;
  }
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src16[i]);
}

void MomentStore::write(int k, int64_t off, int64_t n, const float* src) {
  ZR_CHECK(off >= 0 && off + n <= n_, "optimizer state write outside its range");
  const bool bf16 = dt_ == DType::BF16;
  std::vector<uint16_t> h;
  if (bf16) {
    h.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) h[static_cast<size_t>(i)] = f32_to_bf16(src[i]);
  }
  if (nvme_) return bf16 ? nvme_->write(k, off, n, h.data()) : nvme_->write(k, off, n, src);
  const Tensor& t = mem_[k];
  ZR_CHECK(t.device().is_cpu(), "write_state: states in device memory (the engine copies those itself)");
  if (bf16)
    std::copy(h.begin(), h.end(), static_cast<uint16_t*>(t.raw()) + off);
  else
    std::copy(src, src + n, t.f32() + off);
}

}  // namespace zerorun::zero
