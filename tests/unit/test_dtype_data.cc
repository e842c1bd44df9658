// 16-bit float conversions and the token data readers.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <limits>

#include "zerorun/cuda_rt.h"
#include "zerorun/data.h"
#include "zerorun/fsutil.h"
#include "zerorun/tensor.h"

using namespace zerorun;

TEST_CASE("bf16 and f16 conversions round to nearest even", "[dtype]") {
  REQUIRE(bf16_to_f32(f32_to_bf16(1.0f)) == 1.0f);
  REQUIRE(f32_to_bf16(1.0f) == 0x3f80);
  REQUIRE(bf16_to_f32(f32_to_bf16(1.00390625f)) == 1.0f);  // halfway -> even
  REQUIRE(bf16_to_f32(f32_to_bf16(1.01171875f)) == 1.015625f);
  REQUIRE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  REQUIRE(f32_to_f16(1.0f) == 0x3c00);
  REQUIRE(f32_to_f16(-2.0f) == 0xc000);
  REQUIRE(f32_to_f16(65504.0f) == 0x7bff);
  REQUIRE(f32_to_f16(70000.0f) == 0x7c00);               // overflow -> inf
  REQUIRE(f16_to_f32(0x0001) == std::ldexp(1.0f, -24));  // smallest subnormal
  REQUIRE(f32_to_f16(std::ldexp(1.0f, -24)) == 0x0001);
  REQUIRE(f32_to_f16(std::ldexp(1.0f, -26)) == 0x0000);
  REQUIRE(f32_to_f16(std::ldexp(3.0f, -26)) == 0x0001);  // 0.75 ulp rounds up
  // Every f16 value survives a round trip through f32.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;  // NaNs
    REQUIRE(f32_to_f16(f16_to_f32(static_cast<uint16_t>(h))) == h);
  }
  REQUIRE(round_to(DType::BF16, 3.14159f) == bf16_to_f32(f32_to_bf16(3.14159f)));
}

TEST_CASE("llm.c token shards and .npy files", "[data]") {
  namespace fs = std::filesystem;
  fs::path d = fs::temp_directory_path() / "zerorun_test_data";
  fs::create_directories(d);
  std::vector<uint16_t> toks(100);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<uint16_t>(i % 50);
  write_token_shard((d / "a_000.bin").string(), toks);
  write_token_shard((d / "a_001.bin").string(), toks);
  auto all = load_token_files((d / "a_*.bin").string());
  REQUIRE(all.size() == 200);
  REQUIRE(all[150] == 0);
  std::string bad = read_file((d / "a_000.bin").string());
  bad[0] = 1;
  write_file_atomic((d / "bad.bin").string(), bad);
  REQUIRE_THROWS_WITH(load_token_files((d / "bad.bin").string()), Catch::Contains("bad magic"));
  std::string trunc = read_file((d / "a_000.bin").string()).substr(0, 1100);
  write_file_atomic((d / "trunc.bin").string(), trunc);
  REQUIRE_THROWS_WITH(load_token_files((d / "trunc.bin").string()), Catch::Contains("truncated shard"));
  REQUIRE_THROWS_WITH(load_token_files((d / "nothing_*.bin").string()), Catch::Contains("no file matches"));
  // .npy uint16, version 1 header
  std::string header = "{'descr': '<u2', 'fortran_order': False, 'shape': (4,), }";
  while ((10 + header.size() + 1) % 64) header += ' ';
  header += '\n';
  std::string npy("\x93NUMPY\x01\x00", 8);
  npy += static_cast<char>(header.size() & 0xff);
  npy += static_cast<char>(header.size() >> 8);
  npy += header;
  uint16_t vals[4] = {7, 8, 9, 65535};
  npy.append(reinterpret_cast<const char*>(vals), 8);
  write_file_atomic((d / "t.npy").string(), npy);
  auto nt = load_token_files((d / "t.npy").string());
  REQUIRE(nt == std::vector<uint32_t>{7, 8, 9, 65535});
}

TEST_CASE("pinning host memory without a usable GPU fails with the reason, and the tensor stays usable", "[memory]") {
  if (cuda::available()) return;  // with a GPU: tests/cuda/test_cuda_ops.cc pins for real
  Tensor t = Tensor::zeros({1000}, DType::F32, MemCategory::Buffers);
  std::string why;
  REQUIRE_FALSE(t.pin_memory(&why));
  REQUIRE_FALSE(why.empty());
  REQUIRE_FALSE(t.pinned());
  t.f32()[999] = 2.f;
  REQUIRE(t.clone().f32()[999] == 2.f);
}
