// Tensor construction, views and copies.
#include "zerorun/tensor.h"

#include <cstring>

#include "zerorun/device_memory.h"

namespace zerorun {

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s)
    if (d == 0) return 0;  // first: the other dimensions' product may not fit
  for (auto d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

Tensor Tensor::alloc(const Shape& shape, DType dt, MemCategory cat, Device dev, bool zero) {
  for (auto d : shape) ZR_CHECK(d >= 0, "negative dimension in shape ", shape_str(shape));
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dt;
  t.storage_ = std::make_shared<HostBuffer>(static_cast<size_t>(shape_numel(shape)) * dtype_size(dt), cat, dev, zero);
  return t;
}
Tensor Tensor::empty(const Shape& shape, DType dt, MemCategory cat, Device dev) {
  return alloc(shape, dt, cat, dev, true);
}
Tensor Tensor::uninit(const Shape& shape, DType dt, MemCategory cat, Device dev) {
  return alloc(shape, dt, cat, dev, false);
}

Tensor Tensor::view_of(const Tensor& base, int64_t offset, const Shape& shape) {
  ZR_CHECK(base.defined(), "view of an undefined tensor");
  int64_t n = shape_numel(shape);
  ZR_CHECK(offset >= 0 && offset + n <= base.numel(), "view [", offset, ", ", offset + n,
           ") out of range of a tensor with ", base.numel(), " elements");
  Tensor t;
  t.storage_ = base.storage_;
  t.offset_ = base.offset_ + offset;
  t.shape_ = shape;
  t.dtype_ = base.dtype_;
  return t;
}

float* Tensor::f32() const {
  ZR_CHECK(dtype_ == DType::F32, "expected an f32 tensor, got ", dtype_name(dtype_));
  return data<float>();
}

int32_t* Tensor::i32() const {
  ZR_CHECK(dtype_ == DType::I32, "expected an i32 tensor, got ", dtype_name(dtype_));
  return data<int32_t>();
}

Tensor Tensor::reshape(const Shape& s) const {
  ZR_CHECK(shape_numel(s) == numel(), "cannot reshape ", shape_str(shape_), " to ", shape_str(s));
  Tensor t = *this;
  t.shape_ = s;
  return t;
}

Tensor Tensor::clone(MemCategory cat) const {
  Tensor t = empty(shape_, dtype_, cat, device());
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(Device dev, MemCategory cat) const {
  Tensor t = empty(shape_, dtype_, cat, dev);
  t.copy_from(*this);
  return t;
}

void Tensor::zero_() const {
  if (!defined()) return;
  if (device().is_cuda())
    cuda::device_memset0(raw(), nbytes());
  else
    std::memset(raw(), 0, nbytes());
}

void Tensor::copy_from(const Tensor& src) const {
  ZR_CHECK(src.numel() == numel() && src.dtype() == dtype_, "copy between tensors of ", shape_str(src.shape()), " ",
           dtype_name(src.dtype()), " and ", shape_str(shape_), " ", dtype_name(dtype_));
  if (device().is_cpu() && src.device().is_cpu())
    std::memcpy(raw(), src.raw(), nbytes());
  else
    cuda::copy(raw(), src.raw(), nbytes());  // cudaMemcpyDefault: any direction
}

}  // namespace zerorun
