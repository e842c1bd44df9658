// zero::plan(): exhaustive checks over world sizes, alignments and layouts.
#include <catch2/catch.hpp>
#include <limits>

#include "zerorun/rng.h"
#include "zerorun/zero_plan.h"

using namespace zerorun;
using namespace zerorun::zero;

namespace {
void check_invariants(const Plan& p, const std::vector<ParamInput>& in) {
  // Groups tile the flat buffer; paddings are aligned multiples of world.
  int64_t off = 0, total = 0;
  for (auto& g : p.groups) {
    REQUIRE(g.offset == off);
    REQUIRE(g.padded % (p.world * p.align) == 0);
    REQUIRE(g.padded >= g.numel);
    REQUIRE(g.padded - g.numel < p.world * p.align + (g.numel == 0 ? p.world * p.align : 0));
    REQUIRE(g.shard * p.world == g.padded);
    REQUIRE(g.shard % p.align == 0);
    off += g.padded;
    total += g.numel;
  }
  REQUIRE(p.padded == off);
  REQUIRE(p.total == total);
  // Params are contiguous, in order, inside their group, non-overlapping.
  for (size_t i = 0; i < in.size(); ++i) {
    const ParamSlot& s = p.params[i];
    REQUIRE(s.name == in[i].name);
    REQUIRE(s.numel == in[i].numel);
    const Group& g = p.groups[static_cast<size_t>(s.group)];
    REQUIRE(s.offset >= g.offset);
    REQUIRE(s.offset + s.numel <= g.offset + g.numel);
  }
  // Every element of every param is owned by exactly one rank.
  for (size_t i = 0; i < in.size(); ++i) {
    int64_t covered = 0, expect_begin = 0;
    for (int r = 0; r < p.world; ++r) {
      Range o = p.param_owned(static_cast<int>(i), r);
      if (o.empty()) continue;
      REQUIRE(o.begin == expect_begin);  // rank order = element order
      expect_begin = o.end;
      covered += o.size();
    }
    REQUIRE(covered == in[i].numel);
  }
  // All ranks own the same amount.
  for (int r = 0; r < p.world; ++r) {
    int64_t n = 0;
    for (size_t g = 0; g < p.groups.size(); ++g) n += p.owned(static_cast<int>(g), r).size();
    REQUIRE(n == p.shard_numel());
  }
}
}  // namespace

TEST_CASE("plan: exhaustive small layouts, world 1..8, odd sizes, tiny tensors", "[zero]") {
  Rng rng(42);
  for (int world = 1; world <= 8; ++world)
    for (int64_t align : {1, 2, 4, 16})
      for (int trial = 0; trial < 30; ++trial) {
        std::vector<ParamInput> in;
        int groups = 1 + static_cast<int>(rng.next() % 4);
        for (int g = 0; g < groups; ++g) {
          int n = static_cast<int>(rng.next() % 4);  // groups may be empty of params
          if (n == 0 && g == 0) n = 1;
          for (int k = 0; k < n; ++k) {
            int64_t sz = static_cast<int64_t>(rng.next() % 3 == 0 ? rng.next() % 3 : rng.next() % 200);
            in.push_back({"p" + std::to_string(in.size()), sz, g});
          }
          if (n == 0) in.push_back({"e" + std::to_string(in.size()), 0, g});
        }
        INFO("world " << world << " align " << align << " trial " << trial);
        check_invariants(plan(in, world, align), in);
      }
}

TEST_CASE("plan: known layout", "[zero]") {
  // Two groups: [5, 3] and [1]; world 3, align 2 -> unit 6.
  Plan p = plan({{"a", 5, 0}, {"b", 3, 0}, {"c", 1, 1}}, 3, 2);
  REQUIRE(p.groups.size() == 2);
  REQUIRE(p.groups[0].padded == 12);
  REQUIRE(p.groups[0].shard == 4);
  REQUIRE(p.groups[1].offset == 12);
  REQUIRE(p.groups[1].padded == 6);
  REQUIRE(p.padded == 18);
  REQUIRE(p.params[1].offset == 5);
  REQUIRE(p.param_owned(0, 0).begin == 0);
  REQUIRE(p.param_owned(0, 0).end == 4);
  REQUIRE(p.param_owned(0, 1).begin == 4);
  REQUIRE(p.param_owned(0, 1).end == 5);
  REQUIRE(p.param_owned(1, 1).begin == 0);
  REQUIRE(p.param_owned(1, 1).end == 3);
  REQUIRE(p.param_owned(1, 2).empty());
  REQUIRE(p.param_owned(2, 0).end == 1);
  REQUIRE(p.param_owned(2, 1).empty());
  REQUIRE(p.shard_numel() == 6);
}

TEST_CASE("plan: bad input is rejected", "[zero]") {
  REQUIRE_THROWS_WITH(plan({{"a", 1, 0}}, 0, 1), Catch::Contains("world size"));
  REQUIRE_THROWS_WITH(plan({{"a", 1, 0}, {"a", 2, 0}}, 2, 1), Catch::Contains("listed twice"));
  REQUIRE_THROWS_WITH(plan({{"a", 1, 1}}, 2, 1), Catch::Contains("out of order"));
  REQUIRE_THROWS_WITH(plan({{"a", -1, 0}}, 2, 1), Catch::Contains("negative"));
}

TEST_CASE("bucket layout: blocks, bucket size, tied weights, blocks without parameters", "[zero]") {
  using zero::ParamUse;
  // embed: wte; h.0: a (60), b (50), c (10); h.1: none; head: ln (5), then wte again (tied), then extra (7).
  std::vector<ParamUse> uses = {{0, "wte", 100}, {1, "a", 60},    {1, "b", 50},   {1, "c", 10},
                                {3, "ln", 5},    {3, "wte", 100}, {3, "extra", 7}};
  zero::BucketLayout L = zero::bucket_layout(uses, 4, 100);
  std::vector<std::pair<std::string, int>> got;
  for (auto& p : L.params) got.push_back({p.name, p.group});
  // a + b > 100: b starts a group; c joins it; the tied use of wte does not move "extra" out of ln's group.
  REQUIRE(got ==
          std::vector<std::pair<std::string, int>>{{"wte", 0}, {"a", 1}, {"b", 2}, {"c", 2}, {"ln", 3}, {"extra", 3}});
  REQUIRE(L.block_groups == std::vector<std::vector<int>>{{0}, {1, 2}, {}, {0, 3}});
  REQUIRE(L.ready_block == std::vector<int>{0, 1, 1, 3});  // wte's grads are complete after block 0's backward
  // One bucket a block without a size limit; a parameter larger than the bucket is a group of its own.
  REQUIRE(zero::bucket_layout(uses, 4, std::numeric_limits<int64_t>::max()).num_groups() == 3);
  REQUIRE(zero::bucket_layout(uses, 4, 1).num_groups() == 6);
  REQUIRE_THROWS_WITH(zero::bucket_layout({{2, "x", 1}, {1, "y", 1}}, 3, 10), Catch::Contains("'y' used in block 1"));
  REQUIRE_THROWS_WITH(zero::bucket_layout({{3, "x", 1}}, 3, 10), Catch::Contains("of 3"));
}
