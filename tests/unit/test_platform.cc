// The platform layer (include/zerorun/platform.h) on the platform at hand: the same test runs on Linux and, in the
// Windows cross-build, under wine, where each of these was a silent bug before (text-mode writes, rename onto an
// existing file, lost exit codes, backslashes in written paths).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "zerorun/fsutil.h"
#include "zerorun/platform.h"

using namespace zerorun;

TEST_CASE("platform: binary files, atomic replace of an existing file, file kinds", "[platform]") {
  const std::string d = platform::make_temp_dir("zr_plat_");
  CHECK(platform::file_kind(d) == platform::FileKind::Directory);
  const std::string f = d + "/a.bin";
  std::string err;
  const int fd = platform::file_create(f, &err);
  REQUIRE(fd >= 0);
  const char bytes[] = {'a', '\n', '\r', '\n', 0, 'z'};
  CHECK(platform::file_write(fd, bytes, sizeof bytes) == static_cast<int64_t>(sizeof bytes));
  CHECK(platform::file_sync(fd, &err));
  platform::file_close(fd);
  uint64_t size = 0;
  CHECK(platform::file_kind(f, &size) == platform::FileKind::Regular);
  CHECK(size == sizeof bytes);  // text mode would have made 8 bytes of 6
  // write_file_atomic over an existing file (rename() onto it fails on Windows without MOVEFILE_REPLACE_EXISTING).
  write_file_atomic(f, "first");
  write_file_atomic(f, "second\n");
  CHECK(read_file(f) == "second\n");
  CHECK(platform::file_kind(d + "/missing", nullptr, &err) == platform::FileKind::Missing);
  CHECK(!err.empty());
  CHECK(platform::remove_file(f));
  CHECK(!platform::remove_file(f));
  std::filesystem::remove_all(d);
}

TEST_CASE("platform: glob is sorted, matches *, ? and [...], and nothing for no match", "[platform]") {
  const std::string d = platform::make_temp_dir("zr_glob_");
  for (const char* n : {"s_02.bin", "s_10.bin", "s_01.bin", "t_01.bin", "s_xx.txt"}) std::ofstream(d + "/" + n) << "x";
  std::filesystem::create_directories(d + "/sub");
  std::ofstream(d + "/sub/s_03.bin") << "x";
  CHECK(platform::glob(d + "/s_*.bin") == std::vector<std::string>{d + "/s_01.bin", d + "/s_02.bin", d + "/s_10.bin"});
  CHECK(platform::glob(d + "/s_0?.bin").size() == 2);
  CHECK(platform::glob(d + "/[st]_01.bin").size() == 2);
  CHECK(platform::glob(d + "/*/s_*.bin") == std::vector<std::string>{d + "/sub/s_03.bin"});
  CHECK(platform::glob(d + "/nothing_*.bin").empty());
  CHECK(platform::glob(d + "/t_01.bin") == std::vector<std::string>{d + "/t_01.bin"});  // no wildcard: itself
  CHECK(platform::glob(d + "/u_01.bin").empty());
  std::filesystem::remove_all(d);
}

TEST_CASE("platform: paths written with forward slashes, environment, processes", "[platform]") {
  const std::string p = platform::generic_path(std::filesystem::path("a") / "b" / "c.json");
  CHECK(p == "a/b/c.json");
  CHECK(platform::executable_path().find('\\') == std::string::npos);
  CHECK(platform::temp_dir().find('\\') == std::string::npos);
  platform::set_env("ZR_PLATFORM_TEST", "x y");
  REQUIRE(std::getenv("ZR_PLATFORM_TEST") != nullptr);
  CHECK(std::string(std::getenv("ZR_PLATFORM_TEST")) == "x y");
  platform::unset_env("ZR_PLATFORM_TEST");
  const char* gone = std::getenv("ZR_PLATFORM_TEST");
  CHECK((gone == nullptr || *gone == '\0'));
  // A child's exit code comes back (execvp on Windows returned at once and lost it).
  std::string err;
  const std::vector<std::string> exit3 = platform::kHaveNccl ? std::vector<std::string>{"sh", "-c", "exit 3"}
                                                             : std::vector<std::string>{"cmd", "/c", "exit 3"};
  CHECK(platform::run_process(exit3, &err) == 3);
  CHECK(platform::usable_cores() >= 1);
  CHECK(platform::process_id() > 0);
  void* p64 = platform::aligned_alloc(64, 256);
  REQUIRE(p64 != nullptr);
  CHECK(reinterpret_cast<uintptr_t>(p64) % 64 == 0);
  platform::aligned_free(p64);
  CHECK(platform::peak_rss_bytes() > 0);
  CHECK(platform::is_ipv6_literal("::1"));
  CHECK(!platform::is_ipv6_literal("host-1"));
}

TEST_CASE("platform: UTF-8 paths, a file under a non-ASCII directory written, found, listed and read", "[platform]") {
  namespace fs = std::filesystem;
  // "Jürgen_日本_Ωmega" and "dätä.bin" as UTF-8 bytes (no dependence on the compiler's source charset). On Windows
  // std::ifstream(std::string) and fs::path(std::string) read such a name in the ANSI code page: not found, or a
  // file created under a mangled name.
  const std::string name = "J\xc3\xbcrgen_\xe6\x97\xa5\xe6\x9c\xac_\xce\xa9mega";
  const std::string file = "d\xc3\xa4t\xc3\xa4.bin";
  const std::string root = platform::make_temp_dir("zr_utf8_");
  const std::string dir = root + "/" + name;
  make_dirs(dir);
  CHECK(is_directory(dir));
  CHECK(platform::file_kind(dir) == platform::FileKind::Directory);
  const std::string f = dir + "/" + file;
  write_file_atomic(f, std::string("bytes\n\0z", 8));
  CHECK(path_exists(f));
  CHECK(regular_file_size(f) == 8);
  CHECK(read_file(f) == std::string("bytes\n\0z", 8));
  CHECK(file_crc32(f) == (crc32_update(0xffffffffu, "bytes\n\0z", 8) ^ 0xffffffffu));
  {
    std::ifstream in(platform::to_path(f), std::ios::binary);
    REQUIRE(in);
    std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK(s.size() == 8);
  }
  std::ofstream(platform::to_path(dir + "/\xc3\xb6.txt"), std::ios::binary) << "x";
  CHECK(platform::glob(dir + "/*.bin") == std::vector<std::string>{f});
  CHECK(platform::glob(root + "/J*/d*.bin") == std::vector<std::string>{f});
  // The names on disk are the UTF-8 ones (what the file system holds, read back through the wide API on Windows).
  std::vector<std::string> listed;
  for (const auto& e : fs::directory_iterator(platform::to_path(dir)))
    listed.push_back(platform::generic_path(e.path().filename()));
  std::sort(listed.begin(), listed.end());
  CHECK(listed == std::vector<std::string>{file, "\xc3\xb6.txt"});
  CHECK(platform::generic_path(platform::to_path(f)) == f);
  CHECK(platform::generic_path(platform::to_path(f).parent_path()) == dir);
  std::string err;
  CHECK(platform::replace_file(dir + "/\xc3\xb6.txt", f, &err));
  CHECK(read_file(f) == "x");
  CHECK(platform::remove_file(f));
  CHECK(!path_exists(f));
  // The program's arguments come back as given (on Windows: through the wide command line, when it is ours).
  const char* args[] = {"zerorun", "--save_dir", "J\xc3\xbcrgen"};
  const std::vector<std::string> a = platform::utf8_args(3, const_cast<char**>(args));
  REQUIRE(a.size() == 3);
  if (platform::kHaveNccl) CHECK(a[2] == "J\xc3\xbcrgen");  // POSIX: argv itself
  fs::remove_all(platform::to_path(root));
  CHECK(!path_exists(dir));
}
