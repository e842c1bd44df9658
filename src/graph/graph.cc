// Graph JSON (de)serialisation and whole-graph validation.
#include "zerorun/graph.h"

#include <set>

namespace zerorun {

const Tensor& NodeCtx::param(const std::string& role) const {
  auto it = params.find(role);
  ZR_CHECK(it != params.end(), "node '", node->op, "' has no param role '", role, "'");
  return it->second;
}

Tensor NodeCtx::dparam(const std::string& role) const {
  auto it = dparams.find(role);
  return it == dparams.end() ? Tensor() : it->second;
}

namespace {
std::vector<std::string> str_list(const json& j, const std::string& what) {
  ZR_CHECK(j.is_array(), what, " must be an array of strings");
  std::vector<std::string> r;
  for (auto& e : j) {
    ZR_CHECK(e.is_string(), what, " must be an array of strings");
    r.push_back(e.get<std::string>());
  }
  return r;
}
}  // namespace

Graph Graph::from_json(const json& j) {
  ZR_CHECK(j.is_object(), "graph must be a JSON object");
  Graph g;
  for (const char* k : {"inputs", "blocks", "nodes", "loss"}) ZR_CHECK(j.contains(k), "graph has no '", k, "'");
  ZR_CHECK(j["inputs"].is_array(), "graph 'inputs' must be an array");
  for (auto& ij : j["inputs"]) {
    ZR_CHECK(ij.is_object() && ij.contains("name") && ij.contains("dtype") && ij.contains("shape"),
             "graph input needs name, dtype and shape");
    ZR_CHECK(ij["name"].is_string() && ij["dtype"].is_string(), "graph input name and dtype must be strings");
    InputSpec in;
    in.name = ij["name"].get<std::string>();
    in.dtype = dtype_from_string(ij["dtype"].get<std::string>());
    ZR_CHECK(ij["shape"].is_array(), "input '", in.name, "' shape must be an array");
    for (auto& d : ij["shape"]) {
      const bool symbol =
          d.is_string() && !d.get<std::string>().empty() && d.get<std::string>().find_first_of("0123456789") != 0;
      if (d.is_number_integer() && d.get<int64_t>() >= 1 && d.get<int64_t>() <= (int64_t{1} << 24))
        in.dims.push_back(std::to_string(d.get<int64_t>()));
      else if (symbol)
        in.dims.push_back(d.get<std::string>());
      else
        ZR_FAIL("input '", in.name,
                "' has a dimension that is neither a number in [1, 16777216] nor a symbol: ", d.dump());
    }
    if (ij.contains("optional")) {
      ZR_CHECK(ij["optional"].is_boolean(), "input '", in.name, "' 'optional' must be true or false");
      in.optional = ij["optional"].get<bool>();
    }
    // Data sources give "positions" only for packed documents (graph.h): a graph must not need it.
    ZR_CHECK(in.name != "positions" || in.optional,
             "input 'positions' must be optional (\"optional\": true): only packed documents give it");
    g.inputs.push_back(in);
  }
  g.blocks = str_list(j["blocks"], "graph 'blocks'");
  ZR_CHECK(j["nodes"].is_array(), "graph 'nodes' must be an array");
  size_t idx = 0;
  for (auto& nj : j["nodes"]) {
    std::string where = "graph node " + std::to_string(idx++);
    ZR_CHECK(nj.is_object() && nj.contains("op") && nj["op"].is_string(), where, " has no 'op'");
    Node n;
    n.op = nj["op"].get<std::string>();
    where += " (" + n.op + ")";
    ZR_CHECK(nj.contains("block") && nj["block"].is_string(), where, " has no 'block'");
    n.block = nj["block"].get<std::string>();
    ZR_WITH_CONTEXT(where, n.in = str_list(nj.value("in", json::array()), "'in'"));
    ZR_WITH_CONTEXT(where, n.out = str_list(nj.value("out", json::array()), "'out'"));
    if (nj.contains("params")) {
      ZR_CHECK(nj["params"].is_object(), where, ": 'params' must be an object");
      for (auto& [role, name] : nj["params"].items()) {
        ZR_CHECK(name.is_string(), where, ": param '", role, "' must name a tensor");
        n.params[role] = name.get<std::string>();
      }
    }
    if (nj.contains("attrs")) {
      ZR_CHECK(nj["attrs"].is_object(), where, ": 'attrs' must be an object");
      n.attrs = nj["attrs"];
    }
    g.nodes.push_back(std::move(n));
  }
  ZR_CHECK(j["loss"].is_string(), "graph 'loss' must name a value");
  g.loss = j["loss"].get<std::string>();
  for (auto& [k, v] : j.items())
    if (k != "inputs" && k != "blocks" && k != "nodes" && k != "loss") g.meta[k] = v;
  ZR_CHECK(!g.meta.contains("arch") || g.meta["arch"].is_string(), "graph 'arch' must be a string");
  ZR_CHECK(!g.meta.contains("arch_config") || g.meta["arch_config"].is_object(),
           "graph 'arch_config' must be an object");
  return g;
}

json Graph::to_json() const {
  json j = meta;
  j["inputs"] = json::array();
  for (auto& in : inputs) {
    json shape = json::array();
    for (auto& d : in.dims) {
      bool num = !d.empty() && d.find_first_not_of("0123456789") == std::string::npos;
      if (num)
        shape.push_back(std::stoll(d));
      else
        shape.push_back(d);
    }
    json ij = {{"name", in.name}, {"dtype", dtype_safetensors_name(in.dtype)}, {"shape", shape}};
    if (in.optional) ij["optional"] = true;
    j["inputs"].push_back(ij);
  }
  j["blocks"] = blocks;
  j["nodes"] = json::array();
  for (auto& n : nodes) {
    json nj = {{"op", n.op}, {"block", n.block}, {"in", n.in}, {"out", n.out}};
    if (!n.params.empty()) nj["params"] = n.params;
    if (!n.attrs.empty()) nj["attrs"] = n.attrs;
    j["nodes"].push_back(nj);
  }
  j["loss"] = loss;
  return j;
}

Shape Graph::input_shape(const InputSpec& in, const std::map<std::string, int64_t>& symbols) const {
  Shape s;
  for (auto& d : in.dims) {
    if (!d.empty() && d.find_first_not_of("0123456789") == std::string::npos) {
      s.push_back(std::stoll(d));
    } else {
      auto it = symbols.find(d);
      ZR_CHECK(it != symbols.end(), "input '", in.name, "' uses dimension symbol '", d, "' that is not bound");
      s.push_back(it->second);
    }
  }
  return s;
}

std::set<std::string> Graph::params_read_f32() const {
  std::set<std::string> r;
  for (const Node& n : nodes) {
    const Op& op = op_lookup(n.op);
    for (auto& [role, p] : n.params)
      if (!op.reads_param16_only(role)) r.insert(p);
  }
  return r;
}

std::map<std::string, ValueInfo> Graph::validate(const std::map<std::string, Shape>& param_shapes,
                                                 const std::map<std::string, int64_t>& symbols) const {
  ZR_CHECK(!nodes.empty(), "graph has no nodes");
  ZR_CHECK(!blocks.empty(), "graph has no blocks");
  std::set<std::string> block_set(blocks.begin(), blocks.end());
  ZR_CHECK(block_set.size() == blocks.size(), "graph 'blocks' lists a block twice");
  std::map<std::string, ValueInfo> values;
  for (auto& in : inputs) {
    ZR_CHECK(!values.count(in.name), "graph input '", in.name, "' is declared twice");
    values[in.name] = ValueInfo{input_shape(in, symbols), in.dtype};
  }
  size_t cur_block = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    std::string where = "graph node " + std::to_string(i) + " (" + n.op + " in block '" + n.block + "')";
    // Blocks must appear contiguously and in the declared order.
    size_t b = 0;
    while (b < blocks.size() && blocks[b] != n.block) ++b;
    ZR_CHECK(b < blocks.size(), where, ": block is not listed in 'blocks'");
    ZR_CHECK(b >= cur_block, where, ": nodes of block '", blocks[cur_block], "' and '", n.block,
             "' are interleaved or out of order");
    cur_block = b;
    const Op* op = nullptr;
    ZR_WITH_CONTEXT(where, op = &op_lookup(n.op));
    std::vector<ValueInfo> ins;
    for (auto& v : n.in) {
      auto it = values.find(v);
      ZR_CHECK(it != values.end(), where, ": input '", v, "' is not produced by an earlier node or graph input");
      ins.push_back(it->second);
    }
    std::map<std::string, Shape> ps;
    for (auto& r : op->required_params()) ZR_CHECK(n.params.count(r), where, ": missing param role '", r, "'");
    for (auto& [role, name] : n.params) {
      auto req = op->required_params(), opt = op->optional_params();
      bool known =
          std::find(req.begin(), req.end(), role) != req.end() || std::find(opt.begin(), opt.end(), role) != opt.end();
      ZR_CHECK(known, where, ": unknown param role '", role, "'");
      auto it = param_shapes.find(name);
      ZR_CHECK(it != param_shapes.end(), where, ": param '", role, "' names tensor '", name,
               "' which is not in the file");
      ps[role] = it->second;
    }
    std::vector<ValueInfo> outs;
    ZR_WITH_CONTEXT(where, outs = op->infer(n, ins, ps));
    ZR_CHECK(outs.size() == n.out.size(), where, ": op produces ", outs.size(), " outputs but node names ",
             n.out.size());
    for (size_t k = 0; k < outs.size(); ++k) {
      ZR_CHECK(!values.count(n.out[k]), where, ": value '", n.out[k], "' is produced twice");
      values[n.out[k]] = outs[k];
    }
  }
  auto it = values.find(loss);
  ZR_CHECK(it != values.end(), "graph loss '", loss, "' is not a value of the graph");
  ZR_CHECK(it->second.shape.empty() && it->second.dtype == DType::F32, "graph loss '", loss,
           "' must be an f32 scalar, got ", shape_str(it->second.shape));
  return values;
}

std::vector<std::string> Graph::param_order() const {
  std::vector<std::string> order;
  std::set<std::string> seen;
  for (auto& n : nodes)
    for (auto& [role, name] : n.params)
      if (seen.insert(name).second) order.push_back(name);
  return order;
}

std::vector<std::pair<size_t, size_t>> Graph::block_ranges() const {
  std::vector<std::pair<size_t, size_t>> r(blocks.size(), {0, 0});
  std::vector<bool> seen(blocks.size(), false);
  for (size_t i = 0; i < nodes.size(); ++i) {
    size_t b = std::find(blocks.begin(), blocks.end(), nodes[i].block) - blocks.begin();
    if (b >= blocks.size()) continue;
    if (!seen[b]) r[b].first = i, seen[b] = true;
    r[b].second = i + 1;
  }
  return r;
}

}  // namespace zerorun
