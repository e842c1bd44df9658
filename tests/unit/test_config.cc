// DeepSpeed config parsing: the shared seed configs, the batch rule and its
// exact message, "auto" resolution, unknown keys, JSON syntax errors.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>

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

TEST_CASE("unknown keys in a block are errors with a suggestion; at the top level warnings; known DeepSpeed keys warn",
          "[config]") {
  REQUIRE_THROWS_WITH(parse(R"({"train_batch_size": 8, "zero_optimization": {"stgae": 2}})"),
                      Catch::Contains("unknown key 'zero_optimization.stgae'") &&
                          Catch::Contains("did you mean 'zero_optimization.stage'"));
  // DeepSpeed ignores top-level keys it does not know: a warning naming each, with a suggestion.
  Config top = parse(R"({"train_batch_sise": 8, "comms_config": {"verbose": false}, "monitor_config": {}})");
  REQUIRE(top.warnings.size() == 3);
  CHECK_THAT(top.warnings[0], Catch::Contains("unknown top-level key 'comms_config' ignored"));
  CHECK_THAT(top.warnings[1], Catch::Contains("unknown top-level key 'monitor_config' ignored"));
  CHECK_THAT(top.warnings[2],
             Catch::Contains("'train_batch_sise'") && Catch::Contains("did you mean 'train_batch_size'"));
  // Blocks DeepSpeed reads key by key (optimizer and scheduler outside params, activation_checkpointing) ignore
  // other keys there too; their params (an optimizer's or scheduler's arguments) stay strict.
  Config blk = parse(
      R"({"optimizer": {"type": "AdamW", "param": {}}, "activation_checkpointing": {"partition_activation": true}})");
  REQUIRE(blk.warnings.size() == 2);
  CHECK_THAT(blk.warnings[0], Catch::Contains("unknown key 'optimizer.param' ignored") &&
                                  Catch::Contains("did you mean 'optimizer.params'"));
  CHECK_THAT(blk.warnings[1], Catch::Contains("did you mean 'activation_checkpointing.partition_activations'"));
  REQUIRE_THROWS_WITH(parse(R"({"optimizer": {"type": "AdamW", "params": {"lrr": 1}}})"),
                      Catch::Contains("unknown key 'optimizer.params.lrr'"));
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
  // offload_param to NVMe (ZeRO-Infinity): its keys read; nvme_path required; other devices named.
  Config pn = parse(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/x",
      "buffer_count": 3, "buffer_size": 1e6, "max_in_cpu": 5e5}}})");
  CHECK(pn.zero.offload_param.device == "nvme");
  CHECK(pn.zero.offload_param.nvme_path == "/x");
  CHECK(pn.zero.offload_param.buffer_count == 3);
  CHECK(pn.zero.offload_param.buffer_size == 1000000);
  CHECK(pn.zero.offload_param.max_in_cpu == 500000);
  REQUIRE_THROWS_WITH(parse(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}})"),
                      Catch::Contains("'zero_optimization.offload_param.nvme_path'"));
  REQUIRE_THROWS_WITH(parse(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "disk"}}})"),
                      Catch::Contains("'zero_optimization.offload_param.device' \"disk\" is not supported"));
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
      {R"({"scheduler": {"type": "OneCycle", "params": {"cycle_max_lr": 0.1}}})",
       "OneCycle needs 'scheduler.params.cycle_min_lr'"},
      {R"({"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10}}})",
       "needs 'scheduler.params.total_num_steps'"},
  };
  for (const auto& [text, want] : cases) {
    INFO(text);
    CHECK_THAT(err(text), Contains(want));
  }
  // Shorter than the warmup: allowed, as in DeepSpeed, with a warning.
  Config c =
      parse(R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 5, "warmup_num_steps": 10}}})");
  REQUIRE(c.warnings.size() == 1);
  CHECK_THAT(c.warnings[0], Contains("total_num_steps 5 < warmup_num_steps 10"));
  // total == warmup runs, as in DeepSpeed 0.19.5 (the cosine phase is at its floor at once), also with "auto".
  Config e =
      parse(R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 10, "warmup_num_steps": 10}}})");
  CHECK(std::isfinite(LrSchedule(e.scheduler, e.optimizer, 10).at(20).lr));
  Config a = parse(
      R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": "auto", "warmup_num_steps": 4}}})");
  LrSchedule ok(a.scheduler, a.optimizer, 4);
  CHECK(std::isfinite(ok.at(30).lr));
  // An unknown warmup_type warms up logarithmically with a warning (DeepSpeed does the same).
  Config w = parse(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cosine"}}})");
  REQUIRE(w.warnings.size() == 1);
  CHECK_THAT(w.warnings[0], Contains("\"cosine\" is neither"));
  // DeepSpeed's optimizers reject max_grad_norm: the message says what to use instead.
  CHECK_THAT(err(R"({"optimizer": {"type": "Adam", "params": {"lr": 3e-5, "max_grad_norm": 1.0}}})"),
             Contains("'optimizer.params.max_grad_norm'") && Contains("\"gradient_clipping\": 1.0"));
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

namespace {
bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!n || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xc0) != 0x80) return false;
    i += n;
  }
  return true;
}
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
bool has_note(const Config& c, const std::string& what) {
  for (const auto& n : c.notes)
    if (n.find(what) != std::string::npos) return true;
  return false;
}
}  // namespace

TEST_CASE("config files are read as DeepSpeed reads them (hjson): comments, trailing commas, BOM", "[config]") {
  const std::string text =
      "\xef\xbb\xbf// a BOM, then comments of every kind\n"
      "{\n"
      "  # hash comment\n"
      "  \"train_batch_size\": 8, /* block\n comment */\n"
      "  zero_optimization: {stage: 2, reduce_bucket_size: 5e8,},  // unquoted keys, trailing comma\n"
      "  'optimizer': {'type': 'AdamW', params: {lr: 1e-4\n betas: [0.9, 0.95,]\n}}\n"
      "  scheduler: {type: WarmupLR\n    params: {warmup_num_steps: auto\n}}\n"
      "}\n";
  const nlohmann::json j = parse_config_text(text, "h.json");
  CHECK(j["train_batch_size"] == 8);
  CHECK(j["zero_optimization"]["reduce_bucket_size"].get<double>() == 5e8);
  CHECK(j["optimizer"]["params"]["lr"].get<double>() == 1e-4);
  CHECK(j["optimizer"]["params"]["betas"].size() == 2);
  CHECK(j["scheduler"]["type"] == "WarmupLR");  // a quoteless string
  CHECK(j["scheduler"]["params"]["warmup_num_steps"] == "auto");
  Config c = parse_config(j, "h.json");
  CHECK(c.zero.stage == 2);
  // The root's braces may be left out; triple-quoted strings.
  const nlohmann::json r = parse_config_text("train_batch_size: 4\nnote: \'\'\'\n  two\n  lines\'\'\'\n", "r.json");
  CHECK(r["train_batch_size"] == 4);
  CHECK(r["note"] == "  two\n  lines");
  // Errors keep file:line:column; duplicates stay errors (DeepSpeed raises on them too).
  CHECK_THAT(error_of([] { parse_config_text("{\n  # c\n  \"a\": 1,\n  \"a\": 2\n}", "d.json"); }),
             Catch::Contains("d.json:4:3") && Catch::Contains("duplicate key \"a\""));
  CHECK_THAT(error_of([] { parse_config_text("{\n  \"a\": [1, 2\n  \"b\": 3\n}", "e.json"); }),
             Catch::Contains("e.json:3:"));
  CHECK_THAT(error_of([] { parse_config_text("{\"a\": 1 /* never closed", "f.json"); }),
             Catch::Contains("f.json:1:9") && Catch::Contains("unterminated /* comment"));
  // Messages are valid UTF-8 whatever the input bytes: a BOM where strict JSON is read, a stray byte.
  const std::string bom = error_of([] { parse_json_strict("\xef\xbb\xbf{}", "m.json"); });
  CHECK_THAT(bom, Catch::Contains("m.json:1:1") && Catch::Contains("byte order mark"));
  CHECK(valid_utf8(bom));
  for (const std::string bad : {std::string("{\"a\": \xff}"), std::string("{\"a\": 1 \xe2\x82}"),
                                std::string("{\"a\": 1 \xc3\xa9}"), std::string("{\xef\xbb\xbf}")}) {
    const std::string e1 = error_of([&] { parse_json_strict(bad, "u.json"); });
    const std::string e2 = error_of([&] { parse_config_text(bad, "u.json"); });
    INFO(e1 << " | " << e2);
    CHECK(!e1.empty());
    CHECK(valid_utf8(e1));
    CHECK(valid_utf8(e2));
  }
  // A file through load_config (the path DeepSpeed configs take).
  const std::string path = (std::filesystem::temp_directory_path() / "zr_hjson_test.json").string();
  { std::ofstream(path) << "\xef\xbb\xbf{\"train_micro_batch_size_per_gpu\": 2, // micro\n}\n"; }
  CHECK(load_config(path).micro_batch == 2);
  std::filesystem::remove(path);
}

TEST_CASE("DeepSpeed's aliases and legacy spellings map as DeepSpeed maps them", "[config]") {
  // "bfloat16" is bf16's old name; "bf16" wins when both are given (with a warning).
  Config b = parse(R"({"train_batch_size": 2, "bfloat16": {"enabled": true}})");
  CHECK(b.bf16_enabled == "true");
  CHECK(has_note(b, "'bfloat16' read as 'bf16'"));
  Config bb = parse(R"({"bf16": {"enabled": false}, "bfloat16": {"enabled": true}})");
  CHECK(bb.bf16_enabled == "false");
  REQUIRE(bb.warnings.size() == 1);
  CHECK_THAT(bb.warnings[0], Catch::Contains("'bfloat16' is ignored"));
  // ZeRO fields without the stage3_ prefix.
  Config z = parse(R"({"zero_optimization": {"stage": 3, "prefetch_bucket_size": 123, "param_persistence_threshold": 7,
                       "max_live_parameters": 0, "max_reuse_distance": 0, "gather_16bit_weights_on_model_save": true}})");
  CHECK(*z.zero.stage3_prefetch_bucket_size == 123);
  CHECK(*z.zero.stage3_param_persistence_threshold == 7);
  CHECK(z.zero.stage3_max_live_parameters == 0);
  CHECK(z.zero.stage3_max_reuse_distance == 0);
  CHECK(z.zero.stage3_gather_16bit_weights_on_model_save);
  CHECK(
      has_note(z, "'zero_optimization.prefetch_bucket_size' read as 'zero_optimization.stage3_prefetch_bucket_size'"));
  CHECK_THAT(
      error_of([] { parse(R"({"zero_optimization": {"max_live_parameters": 1, "stage3_max_live_parameters": 2}})"); }),
      Catch::Contains("are the same setting"));
  // cpu_offload (deprecated) = offload_optimizer on the cpu; cpu_offload_param = offload_param.
  Config o = parse(R"({"zero_optimization": {"stage": 3, "cpu_offload": true, "cpu_offload_param": true,
                       "cpu_offload_use_pin_memory": true}})");
  CHECK(o.zero.offload_optimizer.device == "cpu");
  CHECK(o.zero.offload_param.device == "cpu");
  CHECK(parse(R"({"zero_optimization": {"stage": 2, "cpu_offload": false}})").zero.offload_optimizer.device == "none");
  CHECK_THAT(
      error_of([] {
        parse(R"({"zero_optimization": {"stage": 2, "cpu_offload": true, "offload_optimizer": {"device": "cpu"}}})");
      }),
      Catch::Contains("cannot be given together"));
  CHECK(parse(R"({"zero_optimization": {"stage3_gather_fp16_weights_on_model_save": true}})")
            .zero.stage3_gather_16bit_weights_on_model_save);
  // The deprecated boolean form of zero_optimization.
  Config zb = parse(R"({"zero_optimization": true})");
  CHECK(zb.zero.stage == 1);
  // Sizes DeepSpeed accepts at 0 (Field(ge=0)); negatives stay errors.
  Config zero = parse(R"({"zero_optimization": {"stage": 3, "reduce_bucket_size": 0, "stage3_prefetch_bucket_size": 0,
                          "stage3_param_persistence_threshold": 0, "sub_group_size": 0}})");
  CHECK(*zero.zero.reduce_bucket_size == 0);
  CHECK(*zero.zero.stage3_prefetch_bucket_size == 0);
  CHECK_THAT(error_of([] { parse(R"({"zero_optimization": {"reduce_bucket_size": -1}})"); }),
             Catch::Contains("'zero_optimization.reduce_bucket_size' must be >= 0, got -1"));
  // A key zerorun ignores, with a value DeepSpeed rejects; the bfloat16 block forbids extra keys as bf16 does.
  CHECK_THAT(error_of([] { parse(R"({"communication_data_type": "bfp16"})"); }),
             Catch::Contains("'communication_data_type' \"bfp16\" is not a data type DeepSpeed supports"));
  CHECK(parse(R"({"communication_data_type": "BF16"})").warnings.size() == 1);
  CHECK_THAT(error_of([] { parse(R"({"bfloat16": {"enabled": true, "loss_scale": 1.0}})"); }),
             Catch::Contains("unknown key 'bfloat16.loss_scale'"));
}

TEST_CASE("every \"auto\" is resolved and noted with the value and why", "[config]") {
  Config c = parse(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
      "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
      "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
      "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                    "warmup_num_steps": "auto", "total_num_steps": "auto"}},
      "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
      "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                            "stage3_param_persistence_threshold": "auto", "sub_group_size": "auto",
                            "stage3_gather_16bit_weights_on_model_save": "auto", "overlap_comm": "auto"}})");
  CHECK(c.gradient_clipping == 1.0);  // the HF Trainer's max_grad_norm, not "no clipping"
  CHECK(!c.zero.stage3_gather_16bit_weights_on_model_save);
  c.micro_batch = 4;  // --micro_batch_size
  c.train.steps = 50;
  ResolveContext rc;
  rc.world_size = 2;
  rc.hidden = 16;
  resolve_config(c, rc);
  CHECK(c.batch == 8);
  CHECK(c.scheduler.params["total_num_steps"] == 50);
  CHECK(c.scheduler.params["warmup_max_lr"].get<double>() == c.optimizer.lr);
  for (const char* k : {"'gradient_clipping' \"auto\" -> 1.0",
                        "'optimizer.params.lr' \"auto\" -> 0.001",
                        "'optimizer.params.betas' \"auto\"",
                        "'optimizer.params.eps' \"auto\"",
                        "'optimizer.params.weight_decay' \"auto\"",
                        "'train_batch_size' \"auto\" -> 8",
                        "'train_micro_batch_size_per_gpu' \"auto\" -> 4",
                        "'gradient_accumulation_steps' \"auto\" -> 1",
                        "'bf16.enabled' \"auto\" -> false (training on the CPU)",
                        "'fp16.enabled' \"auto\" -> false",
                        "'zero_optimization.reduce_bucket_size' \"auto\" -> 256 (hidden^2",
                        "'zero_optimization.stage3_prefetch_bucket_size' \"auto\" -> 230",
                        "'zero_optimization.stage3_param_persistence_threshold' \"auto\" -> 160",
                        "'zero_optimization.sub_group_size' \"auto\"",
                        "'zero_optimization.stage3_gather_16bit_weights_on_model_save' \"auto\" -> false",
                        "'zero_optimization.overlap_comm' \"auto\" -> true",
                        "'scheduler.params.total_num_steps' \"auto\" -> 50 (the run's steps)",
                        "'scheduler.params.warmup_max_lr' \"auto\" -> 0.001",
                        "'scheduler.params.warmup_num_steps'",
                        "'scheduler.params.warmup_min_lr' \"auto\" -> 0"}) {
    INFO(k);
    CHECK(has_note(c, k));
  }
  // All three batch keys "auto" and no --micro_batch_size: the HF Trainer's default micro batch, 8.
  Config h = parse(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
                       "gradient_accumulation_steps": "auto"})");
  resolve_config(h, rc);
  CHECK(h.micro == 8);
  CHECK(h.batch == 16);
  CHECK(has_note(h, "'train_micro_batch_size_per_gpu' \"auto\" -> 8 (the HF Trainer's default"));
  Config none = parse(R"({"gradient_accumulation_steps": 2})");
  CHECK_THAT(error_of([&] { resolve_config(none, rc); }), Catch::Contains("pass --micro_batch_size N"));
  // OneCycle with momentum sets Adam's beta2 to 0.99, as DeepSpeed's does; with SGD it cycles nothing (warning).
  Config oc = parse(R"({"optimizer": {"type": "Adam", "params": {"betas": [0.9, 0.999]}},
      "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.1, "cycle_max_lr": 1}}})");
  CHECK(oc.optimizer.beta2 == 0.99);
  CHECK(has_note(oc, "beta2 0.999 -> 0.99"));
  Config sgd = parse(R"({"optimizer": {"type": "SGD", "params": {"momentum": 0.5}},
      "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.1, "cycle_max_lr": 1}}})");
  REQUIRE(sgd.warnings.size() == 1);
  CHECK_THAT(sgd.warnings[0], Catch::Contains("cycle_momentum is off with SGD"));
  CHECK(!LrSchedule(sgd.scheduler, sgd.optimizer, 10).at(3).beta1);
}

TEST_CASE("hjson errors count columns in characters, after a BOM", "[config]") {
  CHECK_THAT(error_of([] { parse_config_text("\xef\xbb\xbf{\"\xc3\xa9\": 1, \"\xc3\xa9\": 2}", "c.json"); }),
             Catch::Contains("c.json:1:10: duplicate key"));
  CHECK_THAT(error_of([] { parse_json_strict("{\"\xc3\xa9\": 1 2}", "c.json"); }),
             Catch::Contains("c.json:1:9: expected '}' but found '2'"));
}
