// The slice of the CUDA runtime the layers above kernels use (device selection, streams, graphs; the device memory
// core's storage needs is in device_memory.h), so their code has no CUDA headers and no #ifdefs. Implemented by
// kernels/cuda/runtime.cu; a CPU-only build links kernels/stub/, whose versions throw "not built".
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "zerorun/device_memory.h"

namespace zerorun::cuda {

int device_count();
void set_device(int index);
int current_device();
std::string pci_bus_id(int device);     // "0000:19:00.0": the same GPU however CUDA_VISIBLE_DEVICES numbers it
bool is_device_pointer(const void* p);  // memory on a GPU (false for host, pinned host and unknown pointers)
// Host to device without waiting for the device: src is copied into a pinned staging buffer, then queued.
void upload(void* dst, const void* src, size_t bytes);
size_t cached_bytes();  // held by the allocator but not in use

// A CUDA graph of the work queued on the stream between begin_capture and end_capture, replayed by launch()
// without the host queueing each kernel again. While capturing nothing runs; allocations come from the graph
// pool, whose blocks are never given to work outside captures (replays write to the captured addresses), and
// host reads of device values or synchronous copies fail the capture.
class Graph {
 public:
  Graph() = default;
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  void begin_capture();
  void end_capture();    // instantiates it; throws with CUDA's reason when the capture broke
  void abort_capture();  // after an error between the two: stops capturing, keeps nothing
  void launch();
  bool ready() const { return exec_ != nullptr; }
  void reset();

 private:
  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
};

// A second stream, below the main one in priority, for work that may run alongside it (the optimizer's update of
// a parameter group while the next forward already runs the blocks before it), and events ordering the two.
// Kernels queued while a Scope is alive go to the side stream.
class SideStream {
 public:
  explicit SideStream(int events);
  ~SideStream();  // waits for the side stream's work first
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;
  void after_main();             // the side stream's next work waits for all the main stream's work queued so far
  void record(int k);            // event k marks the side stream's work queued so far
  void main_waits(int k) const;  // the main stream's next work waits for event k (a node when it is captured)
  class Scope {
   public:
    explicit Scope(SideStream& s);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    void* prev_;
  };

 private:
  void* stream_ = nullptr;     // cudaStream_t
  void* main_done_ = nullptr;  // cudaEvent_t for after_main
  std::vector<void*> events_;  // cudaEvent_t
};

}  // namespace zerorun::cuda
