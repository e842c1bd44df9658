// NvmeStates (include/zerorun/nvme.h): optimizer states in a file under nvme_path, through io_uring and O_DIRECT.
// Linux with liburing only (ZR_HAVE_URING); elsewhere the constructor says so.
#include "zerorun/nvme.h"

#include <chrono>
#include <cstdlib>
#include <cstring>

#include "zerorun/error.h"

#if defined(ZR_HAVE_URING)
#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#endif

namespace zerorun::zero {

#if defined(ZR_HAVE_URING)
namespace {
constexpr int64_t kAlign = 4096;  // O_DIRECT: offsets, sizes and buffers aligned to the logical block size
int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
}  // namespace

struct NvmeStates::Ring {
  io_uring ring;
};

NvmeStates::NvmeStates(const std::string& nvme_path, int rank, const std::string& name, int64_t n, int arrays,
                       int elem_bytes, int64_t chunk_elems, int buffer_count, const AioConfig& aio)
    : nvme_path_(nvme_path), n_(n), esize_(elem_bytes), arrays_(arrays) {
  ZR_CHECK(!nvme_path.empty(), "offload device \"nvme\" needs 'nvme_path' (a directory on the NVMe disk)");
  struct stat st {};
  ZR_CHECK(::stat(nvme_path.c_str(), &st) == 0, "nvme_path '", nvme_path, "': ", std::strerror(errno));
  ZR_CHECK(S_ISDIR(st.st_mode), "nvme_path '", nvme_path, "' is not a directory");
  ZR_CHECK(n >= 0 && arrays >= 1 && (elem_bytes == 2 || elem_bytes == 4), "NVMe states: bad shape");
  ZR_CHECK(aio.block_size > 0 && aio.queue_depth > 0, "aio.block_size and aio.queue_depth must be positive");
  overlap_ = aio.overlap_events;
  single_submit_ = aio.single_submit;
  depth_ = aio.queue_depth;
  chunk_ = round_up(std::min(std::max<int64_t>(chunk_elems, 1), std::max<int64_t>(n, 1)), kAlign / esize_);
  block_ = std::min(round_up(aio.block_size, kAlign), chunk_ * esize_);
  region_ = round_up(std::max<int64_t>(n, 1), chunk_) * esize_;
  file_bytes_ = region_ * arrays_;
  dir_ = nvme_path + "/zerorun_" + std::to_string(::getpid()) + "_rank" + std::to_string(rank);
  ZR_CHECK(::mkdir(dir_.c_str(), 0700) == 0 || errno == EEXIST, "nvme_path '", nvme_path, "': cannot create ", dir_,
           ": ", std::strerror(errno));
  file_ = dir_ + "/" + name;
  fd_ = ::open(file_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0600);
  if (fd_ < 0 && errno == EINVAL) {  // tmpfs and some others refuse O_DIRECT
    direct_ = false;
    fd_ = ::open(file_.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  }
  if (fd_ < 0) {
    const int e = errno;
    ::rmdir(dir_.c_str());
    ZR_FAIL("nvme_path '", nvme_path, "': cannot create ", file_, ": ", std::strerror(e));
  }
  // The whole file now (zeros, as the moments start; the parameters are written over them): a disk without room fails
  // here, naming nvme_path.
  if (const int e = ::posix_fallocate(fd_, 0, file_bytes_); e != 0) {
    ::close(fd_), ::unlink(file_.c_str()), ::rmdir(dir_.c_str());
    fd_ = -1;
    ZR_FAIL("nvme_path '", nvme_path, "': no room for ", file_bytes_ / 1048576.0, " MiB (", name, ": ",
            std::strerror(e), ")");
  }
  // buffer_count slots (at least two, one read ahead while one is used), but never more than the file has chunks.
  const int64_t chunks = region_ / (chunk_ * esize_);
  slots_.resize(static_cast<size_t>(std::min<int64_t>(std::max(2, buffer_count), chunks)));
  for (Slot& s : slots_)
    for (int a = 0; a < arrays_; ++a) {
      void* p = std::aligned_alloc(kAlign, static_cast<size_t>(chunk_ * esize_));
      ZR_CHECK(p, "NVMe states: out of host memory for a ", chunk_ * esize_, "-byte buffer");
      mem_.push_back(p);
      s.buf.push_back(static_cast<char*>(p));
    }
  ring_ = std::make_unique<Ring>();
  if (const int e = io_uring_queue_init(static_cast<unsigned>(depth_), &ring_->ring, 0); e < 0) {
    ring_.reset();
    ZR_FAIL("io_uring_queue_init(", depth_, "): ", std::strerror(-e), " (NVMe offload needs io_uring)");
  }
}

NvmeStates::~NvmeStates() {
  try {
    drain();
  } catch (...) {
  }
  if (ring_) io_uring_queue_exit(&ring_->ring);
  if (fd_ >= 0) ::close(fd_), ::unlink(file_.c_str()), ::rmdir(dir_.c_str());
  for (void* p : mem_) std::free(p);
}

NvmeStates::Slot* NvmeStates::find(int64_t k) {
  for (Slot& s : slots_)
    if (s.chunk == k) return &s;
  return nullptr;
}

NvmeStates::Slot& NvmeStates::victim(const Slot* keep) {  // least recently used, idle ones first
  Slot* best = nullptr;
  for (Slot& s : slots_)
    if (&s != keep && (!best || (s.pending == 0) > (best->pending == 0) ||
                       ((s.pending == 0) == (best->pending == 0) && s.used < best->used)))
      best = &s;
  return *best;
}

void NvmeStates::complete(bool block) {
  io_uring_cqe* cqe = nullptr;
  if (block) io_uring_submit(&ring_->ring);  // requests prepared but not yet submitted (batched) first
  const auto t0 = std::chrono::steady_clock::now();
  const int e = block ? io_uring_wait_cqe(&ring_->ring, &cqe) : io_uring_peek_cqe(&ring_->ring, &cqe);
  if (block) wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (e == -EAGAIN || !cqe) return;
  ZR_CHECK(e == 0, "io_uring wait on ", file_, ": ", std::strerror(-e));
  const int64_t res = cqe->res;
  Slot& s = slots_[static_cast<size_t>(io_uring_cqe_get_data64(cqe) >> 32)];
  const int64_t want = static_cast<int64_t>(io_uring_cqe_get_data64(cqe) & 0xffffffffu);
  io_uring_cqe_seen(&ring_->ring, cqe);
  --s.pending, --inflight_;
  if (res == -ENOSPC) ZR_FAIL("nvme_path '", nvme_path_, "' is full (writing ", file_, ")");
  ZR_CHECK(res >= 0, "I/O on ", file_, " (nvme_path '", nvme_path_, "'): ", std::strerror(static_cast<int>(-res)));
  ZR_CHECK(res == want, "short I/O on ", file_, ": ", res, " of ", want, " bytes");
}

void NvmeStates::submit(Slot& s, bool write) {
  const int64_t bytes = chunk_ * esize_;
  const uint64_t idx = static_cast<uint64_t>(&s - slots_.data());
  for (int a = 0; a < arrays_; ++a)
    for (int64_t o = 0; o < bytes; o += block_) {
      while (inflight_ >= depth_) complete(true);
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_->ring);
      if (!sqe) {
        io_uring_submit(&ring_->ring);
        complete(true);
        sqe = io_uring_get_sqe(&ring_->ring);
      }
      ZR_CHECK(sqe, "io_uring: no submission entry");
      const int64_t len = std::min(block_, bytes - o);
      const int64_t at = a * region_ + s.chunk * bytes + o;
      if (write)
        io_uring_prep_write(sqe, fd_, s.buf[static_cast<size_t>(a)] + o, static_cast<unsigned>(len), at);
      else
        io_uring_prep_read(sqe, fd_, s.buf[static_cast<size_t>(a)] + o, static_cast<unsigned>(len), at);
      io_uring_sqe_set_data64(sqe, (idx << 32) | static_cast<uint64_t>(len));
      ++s.pending, ++inflight_;
      (write ? written_bytes_ : read_bytes_) += len;
      if (single_submit_) io_uring_submit(&ring_->ring);
    }
  if (!single_submit_) io_uring_submit(&ring_->ring);
}

void NvmeStates::wait_slot(Slot& s) {
  while (s.pending > 0) complete(true);
}

NvmeStates::Slot& NvmeStates::acquire(int64_t k) {
  Slot* s = find(k);
  if (!s) {
    s = &victim();
    wait_slot(*s);
    s->chunk = k;
    submit(*s, false);
  }
  wait_slot(*s);
  s->used = ++tick_;
  return *s;
}

void NvmeStates::prefetch(int64_t k, const Slot* keep) {
  if (find(k)) return;
  Slot& s = victim(keep);
  wait_slot(s);
  s.chunk = k;
  s.used = ++tick_;
  submit(s, false);
}

void NvmeStates::write_back(Slot& s) { submit(s, true); }

void NvmeStates::drain() {
  while (inflight_ > 0) complete(true);
}

void NvmeStates::read(int a, int64_t off, int64_t n, void* dst) {
  ZR_CHECK(a >= 0 && a < arrays_ && off >= 0 && off + n <= n_, "NVMe states: read outside the file");
  for (int64_t e = off; e < off + n;) {
    const int64_t k = e / chunk_, end = std::min(off + n, (k + 1) * chunk_);
    Slot& s = acquire(k);
    std::memcpy(static_cast<char*>(dst) + (e - off) * esize_, s.buf[static_cast<size_t>(a)] + (e - k * chunk_) * esize_,
                static_cast<size_t>((end - e) * esize_));
    e = end;
  }
}

void NvmeStates::write(int a, int64_t off, int64_t n, const void* src) {
  ZR_CHECK(a >= 0 && a < arrays_ && off >= 0 && off + n <= n_, "NVMe states: write outside the file");
  for (int64_t e = off; e < off + n;) {
    const int64_t k = e / chunk_, end = std::min(off + n, (k + 1) * chunk_);
    Slot& s = acquire(k);
    std::memcpy(s.buf[static_cast<size_t>(a)] + (e - k * chunk_) * esize_,
                static_cast<const char*>(src) + (e - off) * esize_, static_cast<size_t>((end - e) * esize_));
    write_back(s);  // with overlap_events: in flight until the slot is needed again (acquire, victim) or drain()
    e = end;
  }
  if (!overlap_) drain();
}

void NvmeStates::prefetch_range(int64_t off, int64_t n) {
  ZR_CHECK(off >= 0 && off + n <= n_, "NVMe states: prefetch outside the file");
  if (n <= 0 || !overlap_) return;
  // At most every slot but one (the least recently used chunks make room; a chunk read here is not evicted by the
  // next one read here).
  const int64_t first = off / chunk_, last = (off + n - 1) / chunk_;
  const int64_t most = static_cast<int64_t>(slots_.size()) - 1;
  for (int64_t k = first; k <= last && k - first < most; ++k) prefetch(k, nullptr);
}

#else  // no io_uring in this build

struct NvmeStates::Ring {};
NvmeStates::NvmeStates(const std::string& nvme_path, int, const std::string&, int64_t, int, int, int64_t, int,
                       const AioConfig&) {
  ZR_FAIL("offload device \"nvme\" (nvme_path '", nvme_path,
          "') needs Linux with io_uring: this build has no liburing (Debian: liburing-dev)");
}
NvmeStates::~NvmeStates() = default;
NvmeStates::Slot* NvmeStates::find(int64_t) { return nullptr; }
NvmeStates::Slot& NvmeStates::victim(const Slot*) { return slots_.front(); }
void NvmeStates::complete(bool) {}
void NvmeStates::submit(Slot&, bool) {}
void NvmeStates::wait_slot(Slot&) {}
NvmeStates::Slot& NvmeStates::acquire(int64_t) { return slots_.front(); }
void NvmeStates::prefetch(int64_t, const Slot*) {}
void NvmeStates::write_back(Slot&) {}
void NvmeStates::drain() {}
void NvmeStates::read(int, int64_t, int64_t, void*) {}
void NvmeStates::write(int, int64_t, int64_t, const void*) {}
void NvmeStates::prefetch_range(int64_t, int64_t) {}

#endif

}  // namespace zerorun::zero
