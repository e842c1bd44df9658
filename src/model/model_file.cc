// Reading and writing model.bin (safetensors + graph metadata), with every
// fault reported against the file.
#include <cmath>
#include <cstdio>
#include <cstring>

#include "zerorun/fsutil.h"
#include "zerorun/model.h"
#include "zerorun/safetensors.h"

namespace zerorun {

int64_t Model::num_params() const {
  int64_t n = 0;
  for (auto& [k, t] : tensors) n += t.numel();
  return n;
}

std::map<std::string, Shape> Model::param_shapes() const {
  std::map<std::string, Shape> r;
  for (auto& [k, t] : tensors) r[k] = t.shape();
  return r;
}

std::map<std::string, int64_t> graph_symbols(const Graph& g) {
  std::map<std::string, int64_t> syms;
  if (g.meta.contains("symbols")) {
    ZR_CHECK(g.meta["symbols"].is_object(), "graph 'symbols' must be an object");
    for (auto& [k, v] : g.meta["symbols"].items()) {
      ZR_CHECK(v.is_number_integer() && v.get<int64_t>() > 0 && v.get<int64_t>() <= (int64_t{1} << 24),
               "graph symbol '", k, "' must be an integer in [1, 16777216]");
      syms[k] = v.get<int64_t>();
    }
  }
  return syms;
}

std::string graph_hash(const Graph& g) {
  std::string j = g.to_json().dump();
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", crc32_update(0xffffffffu, j.data(), j.size()) ^ 0xffffffffu);
  return buf;
}

std::vector<std::string> check_graph_params(const Graph& g, const std::map<std::string, Shape>& param_shapes) {
  auto syms = graph_symbols(g);
  syms["B"] = 1;
  g.validate(param_shapes, syms);
  std::vector<std::string> order = g.param_order();
  for (auto& [k, shape] : param_shapes) {
    bool used = std::find(order.begin(), order.end(), k) != order.end();
    ZR_CHECK(used, "tensor '", k, "' is not used by any node of the graph");
  }
  return order;
}

void finalize_model(Model& m) {
  m.symbols = graph_symbols(m.graph);
  m.tensor_names = check_graph_params(m.graph, m.param_shapes());
  m.graph_hash = graph_hash(m.graph);
}

// A NaN or Inf weight is a damaged file (or a diverged run's output): an error naming the tensor, before a run
// blames the learning rate.
static void check_finite(const std::string& path, const std::string& name, const Tensor& t) {
  const int64_t n = t.numel();
  const bool f32 = t.dtype() == DType::F32;
  if (!f32 && t.dtype() != DType::BF16 && t.dtype() != DType::F16) return;
  // 16-bit: an all-ones exponent is Inf or NaN.
  const uint16_t mask = t.dtype() == DType::BF16 ? 0x7f80 : 0x7c00;
  for (int64_t i = 0; i < n; ++i) {
    bool ok;
    if (f32) {
      ok = std::isfinite(static_cast<const float*>(t.raw())[i]);
    } else {
      uint16_t b;
      std::memcpy(&b, static_cast<const char*>(t.raw()) + 2 * i, 2);
      ok = (b & mask) != mask;
    }
    ZR_CHECK(ok, path, ": tensor '", name, "' holds a non-finite value (NaN or Inf) at element ", i,
             ": the weights are damaged or come from a run that diverged");
  }
}

Model load_model(const std::string& path) {
  SafetensorsFile f = read_safetensors_header(path);
  auto fmt = f.metadata.find("format");
  ZR_CHECK(fmt != f.metadata.end() && fmt->second == "zerorun.model", path,
           ": not a zerorun model (safetensors __metadata__.format must be \"zerorun.model\"; "
           "use `zerorun init` to create one)");
  auto ver = f.metadata.find("version");
  ZR_CHECK(ver != f.metadata.end() && ver->second == "1", path, ": unsupported model version '",
           ver == f.metadata.end() ? "" : ver->second, "' (this zerorun reads version 1)");
  auto gj = f.metadata.find("graph");
  ZR_CHECK(gj != f.metadata.end(), path, ": __metadata__ has no 'graph'");
  Model m;
  try {
    m.graph = Graph::from_json(json::parse(gj->second));
  } catch (const json::exception& e) {
    ZR_FAIL(path, ": graph metadata is not valid JSON: ", e.what());
  } catch (const Error& e) {
    throw e.with_context(path);
  }
  for (auto& e : f.entries) {
    m.tensors[e.name] = read_safetensors_f32(f, e);
    check_finite(path, e.name, m.tensors[e.name]);
  }
  ZR_WITH_CONTEXT(path, finalize_model(m));
  return m;
}

void save_model(const std::string& path, const Model& m) {
  std::vector<SafetensorsWriteItem> items;
  for (auto& name : m.tensor_names) {
    check_finite(path, name, m.tensors.at(name));  // init, import and merge never write one
    items.push_back({name, m.tensors.at(name)});
  }
  write_safetensors(path, items, {{"format", "zerorun.model"}, {"version", "1"}, {"graph", m.graph.to_json().dump()}});
}

}  // namespace zerorun
