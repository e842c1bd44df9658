// Device memory as core's storage (memory.h, tensor.h) and profiler need it: allocation, copies, page-locking host
// memory, waiting for the device. Core declares these; the kernels layer defines them (kernels/cuda/runtime.cu, or
// kernels/stub/device_stub.cc in a build without CUDA, whose versions throw "not built"), so core includes no CUDA
// header and nothing of kernels. cuda_rt.h has the rest of the runtime.
#pragma once
#include <cstddef>
#include <string>

namespace zerorun::cuda {

bool available();  // built with CUDA and at least one GPU visible
void synchronize();
// Caching allocator: freed blocks are kept for reuse by size class. Out of memory, the error says what the block
// was for (`what`, e.g. "params"), what this rank holds per category, and how to fit.
void* device_alloc(size_t bytes, int device, const char* what = "scratch");
// Page-locks host memory already allocated (cudaHostRegister), so copies to and from GPUs are direct DMA; false
// with the reason in *why where it cannot (no CUDA, the memlock limit, ...). Undone by host_unregister.
bool host_register(void* p, size_t bytes, std::string* why);
void host_unregister(void* p);
void device_free(void* p, size_t bytes, int device);
void device_memset0(void* p, size_t bytes);
void device_fill_ff(void* p, size_t bytes);           // every byte 0xFF (NaN in f32/bf16/f16): poisoned memory
void copy(void* dst, const void* src, size_t bytes);  // any direction, synchronous

}  // namespace zerorun::cuda
