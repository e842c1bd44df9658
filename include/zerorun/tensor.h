// A contiguous tensor: shape + dtype + a view (offset) into shared storage.
// Views let ZeRO keep parameters inside one flat buffer while ops see
// ordinary tensors.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zerorun/dtype.h"
#include "zerorun/error.h"
#include "zerorun/memory.h"

namespace zerorun {

using Shape = std::vector<int64_t>;
int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(const Shape& shape, DType dt, MemCategory cat = MemCategory::Activations,
                      Device dev = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dt, MemCategory cat = MemCategory::Activations,
                      Device dev = Device::cpu()) {
    return empty(shape, dt, cat, dev);  // storage is zero-initialised
  }
  // Uninitialised storage, for outputs a kernel writes in full (no fill pass over the bytes).
  static Tensor uninit(const Shape& shape, DType dt, MemCategory cat = MemCategory::Activations,
                       Device dev = Device::cpu());
  // A view of `numel(shape)` elements starting at element `offset` of `base`.
  static Tensor view_of(const Tensor& base, int64_t offset, const Shape& shape);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_.at(i < 0 ? shape_.size() + i : i); }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::cpu(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }

  void* raw() const { return static_cast<char*>(storage_->data()) + offset_ * dtype_size(dtype_); }
  template <typename T>
  T* data() const {
    return static_cast<T*>(raw());
  }
  float* f32() const;
  int32_t* i32() const;

  // Same storage, new shape with the same element count.
  Tensor reshape(const Shape& s) const;
  Tensor clone(MemCategory cat = MemCategory::Activations) const;
  void zero_() const;
  void copy_from(const Tensor& src) const;  // same numel and dtype, any devices
  Tensor to(Device dev, MemCategory cat = MemCategory::Buffers) const;
  // Host tensors: page-lock the whole storage (see HostBuffer::pin).
  bool pin_memory(std::string* why = nullptr) const { return storage_ && storage_->pin(why); }
  bool pinned() const { return storage_ && storage_->pinned(); }

 private:
  static Tensor alloc(const Shape& shape, DType dt, MemCategory cat, Device dev, bool zero);
  std::shared_ptr<HostBuffer> storage_;
  int64_t offset_ = 0;
  Shape shape_;
  DType dtype_ = DType::F32;
};

}  // namespace zerorun
