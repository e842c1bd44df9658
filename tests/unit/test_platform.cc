// The platform layer (include/zerorun/platform.h) on the platform at hand: the same test runs on Linux and, in the
// Windows cross-build, under wine, where each of these was a silent bug before (text-mode writes, rename onto an
// existing file, lost exit codes, backslashes in written paths).
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

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
