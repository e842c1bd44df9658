// Crash-safe file writing: data goes to "<path>.tmp.<pid>", is fsynced and
// renamed over <path>, so a reader never sees a half-written file and a
// failed write never destroys the previous one.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace zerorun {

class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path);
  ~AtomicFile();  // removes the temp file unless committed
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  void write(const void* data, size_t n);
  void commit();                                         // fsync + rename + fsync of the directory
  uint64_t crc32() const { return crc_ ^ 0xffffffffu; }  // of everything written

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
  uint32_t crc_ = 0xffffffffu;
};

void write_file_atomic(const std::string& path, const std::string& content);
// A regular file (or, with allow_pipe, a pipe read to its end); anything else is an error naming it.
std::string read_file(const std::string& path, bool allow_pipe = false);
// The size of a regular file; a directory, FIFO, device or socket (also through a symlink) is an error naming the
// path and what it is, so no reader blocks on a pipe or reads /dev/zero forever.
uint64_t regular_file_size(const std::string& path);
uint32_t crc32_update(uint32_t crc, const void* data, size_t n);  // crc starts at 0xffffffff
uint32_t file_crc32(const std::string& path);
void make_dirs(const std::string& path);
bool path_exists(const std::string& path);
bool is_directory(const std::string& path);
// Creates dir (and parents) and writes + removes a probe file in it; fails naming `what` (e.g. "--save_dir") and
// the reason, so a run learns before its first step that it cannot save.
void check_writable_dir(const std::string& dir, const std::string& what);

}  // namespace zerorun
