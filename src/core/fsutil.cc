// Atomic writes, whole-file reads, CRC32 and directory helpers.
#include "zerorun/fsutil.h"

#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "zerorun/error.h"
#include "zerorun/platform.h"

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
  uint64_t size = 0;
  std::string err;
  const platform::FileKind k = platform::file_kind(path, &size, &err);
  ZR_CHECK(k != platform::FileKind::Missing, path, ": cannot open file: ", err);
  ZR_CHECK(k == platform::FileKind::Regular, path, ": not a regular file (", platform::file_kind_name(k), ")");
  return size;
}

uint32_t file_crc32(const std::string& path) {
  regular_file_size(path);  // never read a FIFO or a device: it would block or never end
  std::ifstream in(platform::to_path(path), std::ios::binary);
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
  tmp_ = path + ".tmp." + std::to_string(platform::process_id());
  std::string err;
  fd_ = platform::file_create(tmp_, &err);
  ZR_CHECK(fd_ >= 0, path, ": cannot create file: ", err);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) platform::file_close(fd_);
  if (!committed_) platform::remove_file(tmp_);
}

void AtomicFile::write(const void* data, size_t n) {
  auto* p = static_cast<const char*>(data);
  crc_ = crc32_update(crc_, data, n);
  while (n > 0) {
    const int64_t w = platform::file_write(fd_, p, n);
    ZR_CHECK(w > 0, path_, ": write failed: ", std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void AtomicFile::commit() {
  std::string err;
  ZR_CHECK(platform::file_sync(fd_, &err), path_, ": fsync failed: ", err);
  platform::file_close(fd_);
  fd_ = -1;
  ZR_CHECK(platform::replace_file(tmp_, path_, &err), path_, ": rename failed: ", err);
  committed_ = true;
  std::string dir = platform::generic_path(platform::to_path(path_).parent_path());
  platform::sync_directory(dir.empty() ? "." : dir);
}

void write_file_atomic(const std::string& path, const std::string& content) {
  AtomicFile f(path);
  f.write(content.data(), content.size());
  f.commit();
}

std::string read_file(const std::string& path, bool allow_pipe) {
  // a pipe only where asked for (--config <(...)); a directory or device is an error
  const platform::FileKind k = platform::file_kind(path);
  if (k != platform::FileKind::Missing && !(allow_pipe && k == platform::FileKind::Fifo)) regular_file_size(path);
  std::ifstream in(platform::to_path(path), std::ios::binary);
  ZR_CHECK(in, path, ": cannot open file");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void make_dirs(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(platform::to_path(path), ec);
  ZR_CHECK(!ec, path, ": cannot create directory: ", ec.message());
}

bool path_exists(const std::string& path) { return std::filesystem::exists(platform::to_path(path)); }
void check_writable_dir(const std::string& dir, const std::string& what) {
  std::error_code ec;
  std::filesystem::create_directories(platform::to_path(dir), ec);
  ZR_CHECK(!ec, what, " ", dir, ": cannot create the directory: ", ec.message());
  const std::string probe = dir + "/.zerorun_write_test." + std::to_string(platform::process_id());
  std::string err;
  const int fd = platform::file_create(probe, &err);
  if (fd >= 0) {
    platform::file_close(fd);
    platform::remove_file(probe);
  }
  ZR_CHECK(fd >= 0, what, " ", dir, ": cannot write there: ", err);
}

bool is_directory(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_directory(platform::to_path(path), ec);
}

}  // namespace zerorun
