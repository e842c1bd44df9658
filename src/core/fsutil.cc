// Atomic writes, whole-file reads, CRC32 and directory helpers.
#include "zerorun/fsutil.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "zerorun/error.h"

namespace zerorun {

namespace {
const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> t = [] {
    std::array<uint32_t, 256> r{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      r[i] = c;
    }
    return r;
  }();
  return t;
}
}  // namespace

uint32_t crc32_update(uint32_t crc, const void* data, size_t n) {
  const auto& t = crc_table();
  auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) crc = t[(crc ^ p[i]) & 0xffu] ^ (crc >> 8);
  return crc;
}

uint64_t regular_file_size(const std::string& path) {
  struct stat st {};
  ZR_CHECK(::stat(path.c_str(), &st) == 0, path, ": cannot open file: ", std::strerror(errno));
  const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                     : S_ISFIFO(st.st_mode) ? "a FIFO (named pipe)"
                     : S_ISCHR(st.st_mode)  ? "a character device"
                     : S_ISBLK(st.st_mode)  ? "a block device"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                                            : nullptr;
  ZR_CHECK(S_ISREG(st.st_mode), path, ": not a regular file (", kind ? kind : "not a file", ")");
  return static_cast<uint64_t>(st.st_size);
}

uint32_t file_crc32(const std::string& path) {
  regular_file_size(path);  // never read a FIFO or a device: it would block or never end
  std::ifstream in(path, std::ios::binary);
  ZR_CHECK(in, path, ": cannot open file");
  std::vector<char> buf(1 << 20);
  uint32_t crc = 0xffffffffu;
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    crc = crc32_update(crc, buf.data(), static_cast<size_t>(in.gcount()));
  }
  return crc ^ 0xffffffffu;
}

AtomicFile::AtomicFile(const std::string& path) : path_(path) {
  tmp_ = path + ".tmp." + std::to_string(getpid());
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ZR_CHECK(fd_ >= 0, path, ": cannot create file: ", std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t n) {
  auto* p = static_cast<const char*>(data);
  crc_ = crc32_update(crc_, data, n);
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    ZR_CHECK(w > 0, path_, ": write failed: ", std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void AtomicFile::commit() {
  ZR_CHECK(::fsync(fd_) == 0, path_, ": fsync failed: ", std::strerror(errno));
  ::close(fd_);
  fd_ = -1;
  ZR_CHECK(::rename(tmp_.c_str(), path_.c_str()) == 0, path_, ": rename failed: ", std::strerror(errno));
  committed_ = true;
  std::string dir = std::filesystem::path(path_).parent_path().string();
  if (dir.empty()) dir = ".";
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void write_file_atomic(const std::string& path, const std::string& content) {
  AtomicFile f(path);
  f.write(content.data(), content.size());
  f.commit();
}

std::string read_file(const std::string& path, bool allow_pipe) {
  struct stat st {};  // a pipe only where asked for (--config <(...)); a directory or device is an error
  if (::stat(path.c_str(), &st) == 0 && !(allow_pipe && S_ISFIFO(st.st_mode))) regular_file_size(path);
  std::ifstream in(path, std::ios::binary);
  ZR_CHECK(in, path, ": cannot open file");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void make_dirs(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  ZR_CHECK(!ec, path, ": cannot create directory: ", ec.message());
}

bool path_exists(const std::string& path) { return std::filesystem::exists(path); }
void check_writable_dir(const std::string& dir, const std::string& what) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  ZR_CHECK(!ec, what, " ", dir, ": cannot create the directory: ", ec.message());
  const std::string probe = dir + "/.zerorun_write_test." + std::to_string(::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const int err = errno;
  if (fd >= 0) {
    ::close(fd);
    ::unlink(probe.c_str());
  }
  ZR_CHECK(fd >= 0, what, " ", dir, ": cannot write there: ", std::strerror(err));
}

bool is_directory(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec);
}

}  // namespace zerorun
