// `zerorun estimate`'s NVMe rows (src/engine/estimate.cc) against what the engine makes: the files and chunk slots
// of zero::NvmeStates, and a one-rank ZeRO-3 engine with the moments and part of the parameter shard on NVMe (its
// NVMe bytes, chunk slots and the model states left in RAM).
#include <catch2/catch.hpp>
#include <filesystem>
#include <random>
#include <regex>

#include "tests/common/tiny.h"
#include "zerorun/estimate.h"
#include "zerorun/nvme.h"
#include "zerorun/zero_state.h"

using namespace zerorun;
namespace fs = std::filesystem;

namespace {
fs::path scratch_dir() {
  fs::path d = fs::temp_directory_path() / ("zr_est_unit_" + std::to_string(std::random_device{}()));
  fs::create_directories(d);
  return d;
}
// The sum of every "<key>=<x>MiB" in s, in bytes.
double sum_mib(const std::string& s, const std::string& key) {
  const std::regex re(key + "=([0-9.]+)MiB");
  double b = 0;
  for (auto it = std::sregex_iterator(s.begin(), s.end(), re); it != std::sregex_iterator(); ++it)
    b += std::stod((*it)[1].str()) * 1048576.0;
  return b;
}
}  // namespace

TEST_CASE("zerorun estimate sizes NVMe files and chunk slots as NvmeStates makes them", "[estimate][posix]") {
  const fs::path dir = scratch_dir();
  struct Shape {
    int64_t n;
    int arrays, esize;
    int64_t chunk;
    int slots;
  };
  for (const Shape& s : {Shape{70001, 2, 4, 10000, 4}, Shape{70001, 2, 2, 10000, 1}, Shape{5, 1, 4, 1 << 24, 5},
                         Shape{3 << 20, 2, 4, 1 << 20, 3}, Shape{1000, 1, 4, 0, 2}, Shape{4097, 2, 2, 4096, 8}}) {
    INFO("n " << s.n << ", " << s.arrays << " arrays of " << s.esize << " bytes, chunk " << s.chunk << ", " << s.slots
              << " slots");
    const NvmeFileEstimate e = estimate_nvme_file(s.n, s.arrays, s.esize, s.chunk, s.slots);
    zero::NvmeStates st(dir.string(), 0, "e.bin", s.n, s.arrays, s.esize, s.chunk, s.slots, zero::AioConfig{});
    CHECK(e.file == static_cast<double>(st.file_bytes()));
    CHECK(e.file == static_cast<double>(fs::file_size(st.path())));
    CHECK(e.buffers == static_cast<double>(st.buffer_bytes()));
  }
  fs::remove_all(dir);
}

TEST_CASE("zerorun estimate's NVMe rows are what a ZeRO-3 engine with NVMe offload holds", "[estimate][posix]") {
  const fs::path dir = scratch_dir();
  Model g = testing::tiny_gpt();
  const std::string path = dir.string();
  for (int64_t max_in_cpu : {int64_t{0}, int64_t{3000}, int64_t{1} << 40}) {
    INFO("max_in_cpu " << max_in_cpu);
    Config c = testing::make_cfg(R"({"train_batch_size": 2, "zero_optimization": {"stage": 3,
        "reduce_bucket_size": 2000, "sub_group_size": 3000, "stage3_param_persistence_threshold": 0,
        "offload_optimizer": {"device": "nvme", "nvme_path": ")" +
                                 path + R"(", "buffer_count": 3},
        "offload_param": {"device": "nvme", "nvme_path": ")" +
                                 path + R"(", "buffer_size": 1500, "buffer_count": 2, "max_in_cpu": )" +
                                 std::to_string(max_in_cpu) + "}}}");
    auto comm = make_self_comm();
    Engine e(g, c, *comm, 1);
    EstimateRequest r;
    r.gpu = false;
    r.precision = "fp32";
    r.reduce_bucket_size = 2000;
    r.sub_group_size = 3000, r.opt_buffer_count = 3;
    r.param_buffer_size = 1500, r.param_buffer_count = 2, r.max_in_cpu = max_in_cpu;
    const MemoryEstimate m = estimate_memory(g, r);
    REQUIRE(m.nvme.size() == 4);
    const StageEstimate& row = m.nvme.back();
    CHECK((row.stage == 3 && row.nvme_optimizer && row.nvme_param));
    double moments = 0, params = 0;
    for (const zero::BufferInfo& b : e.sharded_state().buffers())
      if (b.placement == zero::Placement::Nvme)
        (b.name == "moments" ? moments : params) += static_cast<double>(b.bytes);
    CHECK(row.nvme_moments == moments);
    CHECK(row.nvme_params == params);
    CHECK((max_in_cpu == 0 ? params > 0 && row.params == 0 : max_in_cpu > 10000000 ? params == 0 : params > 0));
    // The memory line's chunk slots (the moments', then the parameters'), to the 3 decimals it prints.
    CHECK(row.nvme_buffers == Approx(sum_mib(e.optimizer_report(), "buffers in RAM")).margin(0.001 * 1048576));
    // The model states left in RAM: the f32 shard before the file (P/world, unpadded, in the estimate).
    const ModelStateBytes b = e.model_state_bytes();
    CHECK(row.params == Approx(static_cast<double>(b.params)).epsilon(0.02).margin(2048));
    CHECK(row.grads == Approx(static_cast<double>(b.grads)).epsilon(0.02));
    CHECK(row.optimizer == static_cast<double>(b.optimizer));
  }
  fs::remove_all(dir);
}
