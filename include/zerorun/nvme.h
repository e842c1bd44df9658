// NVMe placement of optimizer states (ZeRO-Infinity's offload_optimizer.device "nvme"): one file a rank under
// nvme_path, read and written in aligned chunks through io_uring with O_DIRECT, kept apart from the Engine (DESIGN.md
// layer 6: a placement of ShardedState's buffers). A chunk cache of buffer_count slots lets the optimizer update one
// chunk while the next is read and the previous written.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zerorun/aio_config.h"

namespace zerorun::zero {

// The states of n elements (`arrays` arrays of `elem_bytes` each, e.g. exp_avg and exp_avg_sq) in one file.
class NvmeStates {
 public:
  // Creates <nvme_path>/zerorun_<pid>_rank<rank>/<name> sized for the states (zeros), checking nvme_path (exists,
  // writable, room): errors name it. chunk_elems: elements a chunk (rounded up to the O_DIRECT alignment).
  NvmeStates(const std::string& nvme_path, int rank, const std::string& name, int64_t n, int arrays, int elem_bytes,
             int64_t chunk_elems, int buffer_count, const AioConfig& aio);
  ~NvmeStates();  // waits for I/O in flight, removes the file and its directory
  NvmeStates(const NvmeStates&) = delete;
  NvmeStates& operator=(const NvmeStates&) = delete;

  // Runs fn(ptrs, begin, count) over [off, off + n) chunk by chunk, in order: ptrs[a] points at element `begin` of
  // array a in memory (count elements), written back after fn. With overlap_events, the chunk after each is read
  // while fn runs and the written chunks go out behind it.
  template <class F>
  void for_each(int64_t off, int64_t n, F&& fn) {
    for (int64_t e = off; e < off + n;) {
      const int64_t k = e / chunk_;
      const int64_t end = std::min(off + n, (k + 1) * chunk_);
      Slot& s = acquire(k);
      std::vector<char*> ptrs(static_cast<size_t>(arrays_));
      for (int a = 0; a < arrays_; ++a) ptrs[a] = s.buf[a] + (e - k * chunk_) * esize_;
      if (overlap_) prefetch((k + 1) * chunk_ < n_ ? k + 1 : 0, &s);  // the next chunk, or the next step's first
      fn(ptrs, e, end - e);
      write_back(s);
      e = end;
    }
    if (!overlap_) drain();
  }
  // Copies of array a's elements [off, off + n) through the chunk cache: read waits for the data; write returns
  // once the data is in the cache (with overlap_events the disk write goes on behind, else it is waited for).
  void read(int a, int64_t off, int64_t n, void* dst);
  void write(int a, int64_t off, int64_t n, const void* src);
  // With overlap_events: starts reading the chunks of [off, off + n) (as many as all slots but one hold) so that a
  // read() soon after finds them (a stage-3 prefetch of the next block's parameters).
  void prefetch_range(int64_t off, int64_t n);
  void drain();  // waits for every request in flight

  int64_t file_bytes() const { return file_bytes_; }
  const std::string& path() const { return file_; }
  bool direct() const { return direct_; }          // O_DIRECT (false: the filesystem refused it; buffered I/O)
  double wait_seconds() const { return wait_s_; }  // time spent waiting on the disk so far
  int64_t buffer_bytes() const { return static_cast<int64_t>(slots_.size()) * arrays_ * chunk_ * esize_; }
  int64_t bytes_read() const { return read_bytes_; }
  int64_t bytes_written() const { return written_bytes_; }

 private:
  struct Slot {
    int64_t chunk = -1;
    std::vector<char*> buf;  // one aligned buffer an array
    int pending = 0;         // requests in flight on this slot
    bool loaded = false;     // chunk's data in buf (a read completed, or it was written from here)
    int64_t used = 0;        // last use (LRU)
  };
  Slot& acquire(int64_t k);                    // the slot holding chunk k, read now if not there (or in flight)
  void prefetch(int64_t k, const Slot* keep);  // starts reading chunk k into a slot other than `keep`
  void write_back(Slot& s);
  Slot* find(int64_t k);
  Slot& victim(const Slot* keep = nullptr);  // the slot to reuse (never `keep`)
  void submit(Slot& s, bool write);
  void wait_slot(Slot& s);
  void complete(bool block);

  std::string dir_, file_, nvme_path_;
  int fd_ = -1;
  bool direct_ = true, overlap_ = true, single_submit_ = false;
  int64_t n_ = 0, chunk_ = 0, esize_ = 0, region_ = 0, file_bytes_ = 0, block_ = 0;
  int arrays_ = 0, depth_ = 8, inflight_ = 0;
  int64_t tick_ = 0, read_bytes_ = 0, written_bytes_ = 0;
  double wait_s_ = 0;
  std::vector<Slot> slots_;
  std::vector<void*> mem_;
  struct Ring;
  std::unique_ptr<Ring> ring_;
};

}  // namespace zerorun::zero
