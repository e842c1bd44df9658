// zero::NvmeStates (src/zero/nvme.cc) alone: the chunk cache streamed over unaligned ranges with two buffer slots
// (every prefetch evicts), partial chunks, bf16-sized elements and one request at a time give what an array in
// memory gives, also under random reads, writes, prefetches and updates; the file is removed; errors name nvme_path.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "zerorun/nvme.h"

using namespace zerorun;
namespace fs = std::filesystem;

namespace {
fs::path scratch_dir() {
  fs::path d = fs::temp_directory_path() / ("zr_nvme_unit_" + std::to_string(std::random_device{}()));
  fs::create_directories(d);
  return d;
}
}  // namespace

TEST_CASE("NVMe states: streamed updates equal the same updates in memory", "[nvme][posix]") {
  const fs::path dir = scratch_dir();
  for (int esize : {4, 2})
    for (bool overlap : {true, false})
      for (int slots : {2, 4}) {
        INFO("element " << esize << " bytes, overlap " << overlap << ", " << slots << " slots");
        const int64_t n = 70001;
        zero::AioConfig aio;
        aio.block_size = 4096 * 3;  // a chunk in several requests, the last one short
        aio.queue_depth = 3;
        aio.overlap_events = overlap;
        aio.single_submit = !overlap;
        std::string file;
        {
          zero::NvmeStates st(dir.string(), 0, "s.bin", n, 2, esize, 10000, slots, aio);
          file = st.path();
          REQUIRE(fs::exists(file));
          std::vector<std::vector<uint8_t>> ref(2, std::vector<uint8_t>(static_cast<size_t>(n * esize), 0));
          std::mt19937 rng(esize * 10 + slots + overlap);
          for (int step = 0; step < 3; ++step) {
            // Unaligned, uneven ranges covering [0, n) in order (an optimizer step's groups), each element of both
            // arrays bumped by a function of its index and the step.
            int64_t off = 0;
            while (off < n) {
              const int64_t len = std::min<int64_t>(n - off, 1 + rng() % 9000);
              st.for_each(off, len, [&](const std::vector<char*>& p, int64_t b, int64_t k) {
                for (int a = 0; a < 2; ++a)
                  for (int64_t i = 0; i < k; ++i) {
                    uint8_t* x = reinterpret_cast<uint8_t*>(p[static_cast<size_t>(a)]) + i * esize;
                    uint8_t* r = ref[static_cast<size_t>(a)].data() + (b + i) * esize;
                    for (int c = 0; c < esize; ++c) {
                      x[c] = static_cast<uint8_t>(x[c] + (b + i) * 7 + a + step + c);
                      r[c] = static_cast<uint8_t>(r[c] + (b + i) * 7 + a + step + c);
                    }
                  }
              });
              off += len;
            }
          }
          std::vector<uint8_t> got(static_cast<size_t>(n * esize));
          for (int a = 0; a < 2; ++a) {
            st.read(a, 0, n, got.data());
            CHECK(got == ref[static_cast<size_t>(a)]);
          }
          // Synchronous writes and reads of a range straddling chunks.
          std::vector<uint8_t> w(static_cast<size_t>(25000 * esize), 0x5a);
          st.write(1, 9000, 25000, w.data());
          std::vector<uint8_t> back(w.size());
          st.read(1, 9000, 25000, back.data());
          CHECK(back == w);
          st.read(0, 9000, 25000, back.data());
          CHECK(std::memcmp(back.data(), ref[0].data() + 9000 * esize, back.size()) == 0);
          CHECK(st.bytes_written() > 0);
        }
        CHECK_FALSE(fs::exists(file));                          // removed with the object
        CHECK_FALSE(fs::exists(fs::path(file).parent_path()));  // and its directory
      }
  fs::remove_all(dir);
}

TEST_CASE("NVMe states: errors name nvme_path", "[nvme][posix]") {
  zero::AioConfig aio;
  CHECK_THROWS_WITH(zero::NvmeStates("/nonexistent/zr_nvme", 0, "s.bin", 100, 2, 4, 1000, 2, aio),
                    Catch::Contains("nvme_path '/nonexistent/zr_nvme'"));
  CHECK_THROWS_WITH(zero::NvmeStates("", 0, "s.bin", 100, 2, 4, 1000, 2, aio), Catch::Contains("nvme_path"));
}

TEST_CASE("NVMe states: random reads, writes, prefetches and streamed updates equal an array in memory",
          "[nvme][posix]") {
  // Random file shapes (one-chunk files get one slot; chunks that split every range), 0-5 buffer slots, overlap on
  // and off, queue depths and block sizes, single_submit: every read sees what the writes and updates left.
  const fs::path dir = scratch_dir();
  std::mt19937 rng(7);
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t n = 1 + rng() % 20000, chunk = 1 + rng() % 6000;
    const int arrays = 1 + static_cast<int>(rng() % 2), slots = static_cast<int>(rng() % 6);
    zero::AioConfig aio;
    aio.overlap_events = rng() % 2;
    aio.queue_depth = 1 + static_cast<int>(rng() % 8);
    aio.block_size = 4096 * (1 + static_cast<int64_t>(rng() % 3));
    aio.single_submit = rng() % 2;
    CAPTURE(trial, n, chunk, arrays, slots, aio.overlap_events, aio.queue_depth);
    zero::NvmeStates st(dir.string(), 0, "r.bin", n, arrays, 4, chunk, slots, aio);
    std::vector<std::vector<float>> mem(static_cast<size_t>(arrays), std::vector<float>(static_cast<size_t>(n), 0.f));
    for (int op = 0; op < 80; ++op) {
      const int64_t off = static_cast<int64_t>(rng() % static_cast<uint64_t>(n));
      const int64_t len = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(n - off));
      const int a = static_cast<int>(rng() % static_cast<uint64_t>(arrays));
      std::vector<float> buf(static_cast<size_t>(len));
      switch (rng() % 4) {
        case 0:
          for (float& x : buf) x = static_cast<float>(rng() % 100000);
          st.write(a, off, len, buf.data());
          std::copy(buf.begin(), buf.end(), mem[static_cast<size_t>(a)].begin() + off);
          break;
        case 1:
          st.read(a, off, len, buf.data());
          REQUIRE(std::equal(buf.begin(), buf.end(), mem[static_cast<size_t>(a)].begin() + off));
          break;
        case 2:
          st.prefetch_range(off, len);
          break;
        default: {
          const float v = static_cast<float>(rng() % 1000);
          bool same = true;
          st.for_each(off, len, [&](const std::vector<char*>& p, int64_t b, int64_t c) {
            for (size_t k = 0; k < static_cast<size_t>(arrays); ++k) {
              float* f = reinterpret_cast<float*>(p[k]);
              for (int64_t i = 0; i < c; ++i) {
                same = same && f[i] == mem[k][static_cast<size_t>(b + i)];
                f[i] += v;
                mem[k][static_cast<size_t>(b + i)] += v;
              }
            }
          });
          REQUIRE(same);
        }
      }
    }
  }
  CHECK(fs::is_empty(dir));
  fs::remove_all(dir);
}
