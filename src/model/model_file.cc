// Reading and writing model.bin (safetensors + graph metadata; weights f32, bf16 or f16), with every fault
// reported against the file. open_model reads the header only: training reads each rank's ranges (read_f32).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "zerorun/fsutil.h"
#include "zerorun/model.h"
#include "zerorun/safetensors.h"

namespace zerorun {

int64_t Model::num_params() const {
  int64_t n = 0;
  for (auto& [k, s] : shapes) n += shape_numel(s);
  return n;
}

const Shape& Model::shape(const std::string& name) const {
  auto it = shapes.find(name);
  ZR_CHECK(it != shapes.end(), "model has no parameter '", name, "'");
  return it->second;
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
  if (!m.tensors.empty()) {
    m.shapes.clear();
    for (auto& [k, t] : m.tensors) m.shapes[k] = t.shape();
  }
  m.symbols = graph_symbols(m.graph);
  m.tensor_names = check_graph_params(m.graph, m.param_shapes());
  m.graph_hash = graph_hash(m.graph);
}

// A NaN or Inf weight is a damaged file (or a diverged run's output): an error naming the tensor, before a run
// blames the learning rate. `first`: the index of values[0] in the tensor.
static void check_finite(const std::string& path, const std::string& name, const float* values, int64_t n,
                         int64_t first = 0) {
  for (int64_t i = 0; i < n; ++i)
    ZR_CHECK(std::isfinite(values[i]), path, ": tensor '", name, "' holds a non-finite value (NaN or Inf) at element ",
             first + i, ": the weights are damaged or come from a run that diverged");
}

void Model::read_f32(const std::string& name, int64_t first, int64_t count, float* dst) const {
  const int64_t n = numel(name);
  ZR_CHECK(first >= 0 && count >= 0 && first + count <= n, "read of elements [", first, ", ", first + count,
           ") of parameter '", name, "' of ", n);
  if (count == 0) return;
  auto t = tensors.find(name);
  if (t != tensors.end()) {
    std::copy_n(t->second.f32() + first, count, dst);
    return;
  }
  ZR_CHECK(file != nullptr, "parameter '", name, "' has no weights (a model built for its shapes only)");
  const SafetensorsEntry* e = file->find(name);
  ZR_CHECK(e != nullptr, file->path, ": has no tensor '", name, "'");
  read_safetensors_f32_range(*file, *e, first, count, dst);
  check_finite(file->path, name, dst, count, first);
}

static Model open_header(const std::string& path, SafetensorsFile f) {
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
  int64_t wide = 0, bf = 0, half = 0;  // bytes by dtype: the file's dtype is its widest
  for (auto& e : f.entries) {
    ZR_CHECK(e.dtype == DType::F32 || e.dtype == DType::BF16 || e.dtype == DType::F16, path, ": tensor '", e.name,
             "' has dtype ", dtype_name(e.dtype), "; parameters must be F32, BF16 or F16");
    m.shapes[e.name] = e.shape;
    (e.dtype == DType::F32 ? wide : e.dtype == DType::BF16 ? bf : half) += 1;
  }
  m.dtype = wide || (bf && half) ? DType::F32 : bf ? DType::BF16 : half ? DType::F16 : DType::F32;
  m.file = std::make_shared<const SafetensorsFile>(std::move(f));
  return m;
}

Model open_model(const std::string& path) {
  Model m = open_header(path, read_safetensors_header(path));
  ZR_WITH_CONTEXT(path, finalize_model(m));
  return m;
}

Model load_model(const std::string& path) {
  Model m = open_header(path, read_safetensors_header(path));
  for (auto& e : m.file->entries) {
    Tensor t = Tensor::empty(e.shape, DType::F32, MemCategory::Buffers);
    m.read_f32(e.name, 0, t.numel(), t.f32());
    m.tensors[e.name] = t;
  }
  m.file.reset();
  ZR_WITH_CONTEXT(path, finalize_model(m));
  return m;
}

void save_model(const std::string& path, const Model& m) {
  const DType dt = m.dtype;
  ZR_CHECK(dt == DType::F32 || dt == DType::BF16 || dt == DType::F16, path,
           ": model weights are f32, bf16 or f16, not ", dtype_name(dt));
  std::vector<SafetensorsStreamWriter::Decl> decls;
  for (auto& name : m.tensor_names) decls.push_back({name, dt, m.shape(name)});
  SafetensorsStreamWriter w(path, decls,
                            {{"format", "zerorun.model"}, {"version", "1"}, {"graph", m.graph.to_json().dump()}});
  constexpr int64_t kChunk = int64_t{1} << 20;  // elements a write: an opened model is never held whole
  std::vector<float> buf;
  std::vector<uint16_t> half;
  for (auto& name : m.tensor_names) {
    const int64_t n = m.numel(name);
    if (n == 0) w.append(name, nullptr, 0);
    for (int64_t at = 0; at < n; at += kChunk) {
      const int64_t k = std::min(kChunk, n - at);
      buf.resize(static_cast<size_t>(k));
      m.read_f32(name, at, k, buf.data());
      check_finite(path, name, buf.data(), k, at);  // init, import and merge never write one
      if (dt == DType::F32) {
        w.append(name, buf.data(), static_cast<size_t>(k) * 4);
        continue;
      }
      half.resize(static_cast<size_t>(k));
      for (int64_t i = 0; i < k; ++i) {
        const float v = buf[static_cast<size_t>(i)];
        half[static_cast<size_t>(i)] = dt == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
        const float back =
            dt == DType::BF16 ? bf16_to_f32(half[static_cast<size_t>(i)]) : f16_to_f32(half[static_cast<size_t>(i)]);
        ZR_CHECK(std::isfinite(back), path, ": tensor '", name, "' element ", at + i, " = ", v, " does not fit in ",
                 dtype_name(dt), " (largest f16 value: 65504); save it as f32 or bf16");
      }
      w.append(name, half.data(), static_cast<size_t>(k) * 2);
    }
  }
  w.commit();
}

}  // namespace zerorun
