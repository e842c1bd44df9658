// DeepSpeed config parsing: the shared seed configs, the batch rule and its
// exact message, "auto" resolution, unknown keys, JSON syntax errors.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>

#include "zerorun/config.h"
#include "zerorun/optim.h"
#include "zerorun/strict_json.h"

using namespace zerorun;

namespace {
std::string shared_config(const std::string& name) {
  for (auto dir : {std::string(ZR_SOURCE_DIR) + "/../shared/configs", std::string(ZR_SOURCE_DIR) + "/configs"}) {
    std::string p = dir + "/" + name;
    if (std::filesystem::exists(p)) return p;
  }
  FAIL("config " << name << " not found");
  return "";
}
Config parse(const std::string& text) { return parse_config(parse_json_strict(text, "test.json"), "test.json"); }
}  // namespace

TEST_CASE("shared zero3 offload config loads and resolves auto values", "[config]") {
  Config c = load_config(shared_config("ds_config_zero3.json"));
  ResolveContext rc;
  rc.world_size = 4;
  rc.hidden = 64;
  resolve_config(c, rc);
  REQUIRE(c.zero.stage == 3);
  REQUIRE(c.zero.offload_optimizer.device == "cpu");
  REQUIRE(c.zero.offload_param.device == "cpu");
  REQUIRE(c.micro == 2);
  REQUIRE(c.gas == 8);
  REQUIRE(c.batch == 64);
  REQUIRE(*c.zero.reduce_bucket_size == 64 * 64);
  REQUIRE(*c.zero.stage3_prefetch_bucket_size == static_cast<int64_t>(0.9 * 64 * 64));
  REQUIRE(*c.zero.stage3_param_persistence_threshold == 640);
  REQUIRE(c.precision == Precision::FP32);  // fp16/bf16 "auto" on CPU
  REQUIRE(c.gradient_clipping == 1.0);
  REQUIRE(c.steps_per_print == 100);
  rc.on_gpu = true;
  Config g = load_config(shared_config("ds_config_zero3.json"));
  resolve_config(g, rc);
  REQUIRE(g.precision == Precision::BF16);
}

TEST_CASE("shared zero2 offload config: micro batch only", "[config]") {
  Config c = load_config(shared_config("ds_config_zero2_offload.json"));
  ResolveContext rc;
  rc.world_size = 3;
  resolve_config(c, rc);
  REQUIRE(c.zero.stage == 2);
  REQUIRE(c.micro == 2);
  REQUIRE(c.gas == 1);
  REQUIRE(c.batch == 6);
  REQUIRE(c.precision == Precision::BF16);
}

TEST_CASE("tiny fp16 config: batch rule message with micro 8", "[config]") {
  std::string p = shared_config("ds_config_tiny_zero2_fp16.json");
  Config c = load_config(p);
  c.micro_batch = 8;
  ResolveContext rc;
  rc.world_size = 1;
  REQUIRE_THROWS_WITH(resolve_config(c, rc), Catch::Contains("16 != 8 * 1 * 1") && Catch::Contains(p));
  Config c2 = load_config(p);
  c2.micro_batch = 8;
  rc.world_size = 2;
  resolve_config(c2, rc);
  REQUIRE(c2.batch == 16);
  REQUIRE(c2.precision == Precision::FP16);
  REQUIRE(c2.optimizer.type == "Adam");
  REQUIRE(c2.optimizer.lr == 1e-4);
}

TEST_CASE("a zero or negative batch size set after parsing (--micro_batch_size, library callers) is an error",
          "[config]") {
  std::string p = shared_config("ds_config_tiny_zero2_fp16.json");
  ResolveContext rc;
  rc.world_size = 1;
  for (int64_t bad : {0, -2}) {
    Config c = load_config(p);
    c.micro_batch = bad;  // before: a division by zero in the batch rule
    REQUIRE_THROWS_WITH(
        resolve_config(c, rc),
        Catch::Contains("train_micro_batch_size_per_gpu must be a positive integer") && Catch::Contains(p));
    Config g = load_config(p);
    g.grad_accum = bad;
    REQUIRE_THROWS_WITH(resolve_config(g, rc), Catch::Contains("gradient_accumulation_steps must be a positive"));
  }
}

TEST_CASE("DeepSpeed batch derivations", "[config]") {
  ResolveContext rc;
  rc.world_size = 2;
  Config a = parse(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4})");
  resolve_config(a, rc);
  REQUIRE(a.gas == 4);
  Config b = parse(R"({"train_batch_size": 32, "gradient_accumulation_steps": 2})");
  resolve_config(b, rc);
  REQUIRE(b.micro == 8);
  Config c = parse(R"({"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 5})");
  resolve_config(c, rc);
  REQUIRE(c.batch == 30);
  Config d = parse(R"({"train_batch_size": 10})");
  resolve_config(d, rc);
  REQUIRE(d.micro == 5);
  REQUIRE(d.gas == 1);
  Config e = parse(R"({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 3})");
  REQUIRE_THROWS_WITH(resolve_config(e, rc), Catch::Contains("10 != 3 * 1 * 2"));
  Config f = parse(R"({"optimizer": {"type": "Adam"}})");
  REQUIRE_THROWS_WITH(resolve_config(f, rc), Catch::Contains("train_batch_size or train_micro_batch_size_per_gpu"));
  Config g = parse(
      R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": "auto"})");
  resolve_config(g, rc);
  REQUIRE(g.batch == 8);
}

TEST_CASE("unknown keys are errors with a suggestion; known DeepSpeed keys warn", "[config]") {
  REQUIRE_THROWS_WITH(parse(R"({"train_batch_size": 8, "zero_optimization": {"stgae": 2}})"),
                      Catch::Contains("unknown key 'zero_optimization.stgae'") &&
                          Catch::Contains("did you mean 'zero_optimization.stage'"));
  REQUIRE_THROWS_WITH(parse(R"({"train_batch_sise": 8})"), Catch::Contains("did you mean 'train_batch_size'"));
  REQUIRE_THROWS_WITH(parse(R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"betas": [0.9]}}})"),
                      Catch::Contains("optimizer.params.betas"));
  REQUIRE_THROWS_WITH(parse(R"({"zero_optimization": {"stage": 4}})"), Catch::Contains("must be 0, 1, 2 or 3, got 4"));
  REQUIRE_THROWS_WITH(parse(R"({"zero_optimization": {"stage": "two"}})"),
                      Catch::Contains("'zero_optimization.stage' must be an integer"));
  REQUIRE_THROWS_WITH(parse(R"({"scheduler": {"type": "WarmupLr"}})"), Catch::Contains("did you mean \"WarmupLR\""));
  REQUIRE_THROWS_WITH(parse(R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})"),
                      Catch::Contains("cannot both"));
  REQUIRE_THROWS_WITH(parse(R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})"),
                      Catch::Contains("needs stage 3"));
  REQUIRE_THROWS_WITH(parse(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}})"),
                      Catch::Contains("NVMe"));
  Config w = parse(
      R"({"train_batch_size": 8, "tensorboard": {"enabled": true}, "zero_optimization": {"stage": 1, "zero_quantized_weights": false}})");
  REQUIRE(w.warnings.size() == 2);
  REQUIRE_THAT(w.warnings[0], Catch::Contains("tensorboard"));
}

TEST_CASE("JSON syntax errors report line and column; duplicate keys rejected", "[config]") {
  REQUIRE_THROWS_WITH(parse_json_strict("{\n  \"a\": 1,\n  \"b\": ,\n}", "x.json"), Catch::Contains("x.json:3:8"));
  REQUIRE_THROWS_WITH(parse_json_strict("{\"a\": 1,}", "x.json"),
                      Catch::Contains("x.json:1:9") && Catch::Contains("trailing comma"));
  REQUIRE_THROWS_WITH(parse_json_strict("{\"a\": 1, \"a\": 2}", "x.json"),
                      Catch::Contains("x.json:1:10") && Catch::Contains("duplicate key \"a\""));
  REQUIRE_THROWS_WITH(parse_json_strict("{\"a\": \"abc", "x.json"), Catch::Contains("unterminated string"));
  REQUIRE_THROWS_WITH(parse_json_strict("{\"a\": 01}", "x.json"), Catch::Contains("leading zeros"));
  REQUIRE_THROWS_WITH(parse_json_strict("{} x", "x.json"), Catch::Contains("x.json:1:4"));
  nlohmann::json j = parse_json_strict(R"({"s": "\u00e9\n", "n": [1, -2.5e3, 1e9, true, null]})", "x.json");
  REQUIRE(j["s"] == "\xc3\xa9\n");
  REQUIRE(j["n"][1] == -2500.0);
  REQUIRE(j["n"][2].get<double>() == 1e9);
  REQUIRE_THROWS_WITH(load_json_file_strict("/nonexistent/ds.json"), Catch::Contains("/nonexistent/ds.json"));
}

TEST_CASE("optimizer and scheduler values out of range name the key (no NaN or negative lr later)", "[config]") {
  auto err = [](const std::string& text) {
    try {
      parse(text);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  using Catch::Contains;
  const std::pair<const char*, const char*> cases[] = {
      {R"({"optimizer": {"type": "AdamW", "params": {"weight_decay": -3}}})",
       "test.json: 'optimizer.params.weight_decay' must be >= 0"},
      {R"({"optimizer": {"type": "Adam", "params": {"eps": -1e-8}}})", "'optimizer.params.eps' must be >= 0"},
      {R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": -5}}})",
       "'scheduler.params.warmup_num_steps' must be >= 0, got -5"},
      {R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": -0.1}}})",
       "'scheduler.params.warmup_max_lr' must be >= 0"},
      {R"({"scheduler": {"type": "LRRangeTest", "params": {"lr_range_test_step_size": 0}}})",
       "'scheduler.params.lr_range_test_step_size' must be > 0"},
      {R"({"scheduler": {"type": "OneCycle", "params": {"cycle_first_step_size": 0}}})",
       "'scheduler.params.cycle_first_step_size' must be > 0"},
      {R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 100, "cos_min_ratio": 2}}})",
       "'scheduler.params.cos_min_ratio' must lie in [0, 1]"},
      {R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 10, "warmup_num_steps": 10}}})",
       "equals warmup_num_steps (10)"},
  };
  for (const auto& [text, want] : cases) {
    INFO(text);
    CHECK_THAT(err(text), Contains(want));
  }
  // Shorter than the warmup: allowed, as in DeepSpeed, with a warning.
  Config c =
      parse(R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 5, "warmup_num_steps": 10}}})");
  REQUIRE(c.warnings.size() == 1);
  CHECK_THAT(c.warnings[0], Contains("never leaves the warmup"));
  // "auto" total = the run's steps: the schedule checks it when it is built.
  Config a = parse(
      R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": "auto", "warmup_num_steps": 4}}})");
  REQUIRE_THROWS_WITH(LrSchedule(a.scheduler, a.optimizer, 4),
                      Contains("equals warmup_num_steps (4)") && Contains("train for more steps"));
  LrSchedule ok(a.scheduler, a.optimizer, 40);
  CHECK(std::isfinite(ok.at(30).lr));
}

TEST_CASE("DeepSpeed values asking for a behaviour zerorun does not have are warnings, the defaults are quiet",
          "[config]") {
  Config quiet = parse(R"({"zero_optimization": {"stage": 3, "overlap_comm": true, "contiguous_gradients": true,
                           "reduce_scatter": true}, "wall_clock_breakdown": false})");
  REQUIRE(quiet.warnings.empty());
  Config loud = parse(R"({"zero_optimization": {"stage": 3, "overlap_comm": false, "contiguous_gradients": false,
                          "reduce_scatter": false, "stage3_gather_16bit_weights_on_model_save": true},
                          "wall_clock_breakdown": true})");
  REQUIRE(loud.warnings.size() == 5);
  for (const char* k :
       {"'zero_optimization.overlap_comm' false", "'zero_optimization.contiguous_gradients' false",
        "'zero_optimization.reduce_scatter' false",
        "'zero_optimization.stage3_gather_16bit_weights_on_model_save' true", "'wall_clock_breakdown' true"}) {
    bool found = false;
    for (const auto& w : loud.warnings)
      found = found || (w.find(k) != std::string::npos && w.find("no effect") != std::string::npos);
    INFO(k);
    CHECK(found);
  }
}
