// safetensors reading (validated against the file size) and atomic writing.
#include "zerorun/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "zerorun/fsutil.h"
#include "zerorun/platform.h"

namespace zerorun {

namespace {
constexpr uint64_t kMaxHeader = 100ull << 20;  // 100 MiB
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  for (auto& e : entries)
    if (e.name == name) return &e;
  return nullptr;
}

SafetensorsFile read_safetensors_header(const std::string& path) {
  SafetensorsFile f;
  f.path = path;
  regular_file_size(path);  // a directory, FIFO or device (a symlink to /dev/zero) is an error naming it
  std::ifstream in(platform::to_path(path), std::ios::binary);
  ZR_CHECK(in, path, ": cannot open file");
  in.seekg(0, std::ios::end);
  uint64_t size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  ZR_CHECK(size >= 8, path, ": file is ", size, " bytes, too short for a safetensors header");
  uint64_t hlen = 0;
  unsigned char b[8];
  in.read(reinterpret_cast<char*>(b), 8);
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | b[i];
  ZR_CHECK(hlen <= kMaxHeader, path, ": header length ", hlen, " exceeds the 100 MiB limit (corrupt file?)");
  ZR_CHECK(8 + hlen <= size, path, ": header length ", hlen, " runs past the end of the ", size, "-byte file");
  std::string header(hlen, '\0');
  in.read(header.data(), static_cast<std::streamsize>(hlen));
  ZR_CHECK(in, path, ": could not read the header");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header);
  } catch (const std::exception& e) {
    ZR_FAIL(path, ": header is not valid JSON: ", e.what());
  }
  ZR_CHECK(j.is_object(), path, ": header must be a JSON object");
  f.data_start = 8 + hlen;
  const uint64_t data_size = size - f.data_start;
  for (auto& [name, v] : j.items()) {
    if (name == "__metadata__") {
      ZR_CHECK(v.is_object(), path, ": __metadata__ must be an object");
      for (auto& [k, s] : v.items()) {
        ZR_CHECK(s.is_string(), path, ": __metadata__ value '", k, "' must be a string");
        f.metadata[k] = s.get<std::string>();
      }
      continue;
    }
    std::string where = path + ": tensor '" + name + "'";
    ZR_CHECK(v.is_object() && v.contains("dtype") && v.contains("shape") && v.contains("data_offsets"), where,
             " needs dtype, shape and data_offsets");
    SafetensorsEntry e;
    e.name = name;
    ZR_CHECK(v["dtype"].is_string(), where, ": dtype must be a string");
    ZR_WITH_CONTEXT(where, e.dtype = dtype_from_string(v["dtype"].get<std::string>()));
    ZR_CHECK(v["shape"].is_array(), where, ": shape must be an array");
    for (auto& d : v["shape"]) {
      ZR_CHECK(d.is_number_integer() && d.get<int64_t>() >= 0 && d.get<uint64_t>() <= (uint64_t{1} << 48), where,
               ": shape entries must be integers in [0, 2^48], got ", d.dump());
      e.shape.push_back(d.get<int64_t>());
    }
    auto& off = v["data_offsets"];
    ZR_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned(), where,
             ": data_offsets must be [begin, end]");
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    ZR_CHECK(e.begin <= e.end && e.end <= data_size, where, ": data_offsets [", e.begin, ", ", e.end,
             "] out of range of the ", data_size, "-byte data section (truncated file?)");
    // Elements, saturating past the data section (a corrupt shape must not overflow the product).
    uint64_t numel = 1;
    for (int64_t d : e.shape)
      numel = d == 0 ? 0 : numel > data_size / static_cast<uint64_t>(d) ? data_size + 1 : numel * d;
    if (std::find(e.shape.begin(), e.shape.end(), 0) != e.shape.end()) numel = 0;
    uint64_t want = numel * dtype_size(e.dtype);
    ZR_CHECK(want == e.end - e.begin, where, ": shape ", shape_str(e.shape), " x ", dtype_name(e.dtype), " needs ",
             want, " bytes but data_offsets span ", e.end - e.begin);
    f.entries.push_back(e);
  }
  std::sort(f.entries.begin(), f.entries.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < f.entries.size(); ++i)
    ZR_CHECK(f.entries[i].begin >= f.entries[i - 1].end, path, ": tensors '", f.entries[i - 1].name, "' and '",
             f.entries[i].name, "' overlap");
  return f;
}

void read_safetensors_range(const SafetensorsFile& f, const SafetensorsEntry& e, int64_t first, int64_t count,
                            void* dst) {
  size_t es = dtype_size(e.dtype);
  ZR_CHECK(first >= 0 && count >= 0 && static_cast<uint64_t>((first + count) * es) <= e.end - e.begin, f.path,
           ": read of tensor '", e.name, "' out of range");
  std::ifstream in(platform::to_path(f.path), std::ios::binary);
  ZR_CHECK(in, f.path, ": cannot open file");
  in.seekg(static_cast<std::streamoff>(f.data_start + e.begin + first * es));
  in.read(static_cast<char*>(dst), static_cast<std::streamsize>(count * es));
  ZR_CHECK(in, f.path, ": short read of tensor '", e.name, "' (truncated file?)");
}

void read_safetensors_f32_range(const SafetensorsFile& f, const SafetensorsEntry& e, int64_t first, int64_t count,
                                float* dst) {
  ZR_CHECK(e.dtype == DType::F32 || e.dtype == DType::BF16 || e.dtype == DType::F16, f.path, ": tensor '", e.name,
           "' has dtype ", dtype_name(e.dtype), "; parameters must be F32, BF16 or F16");
  if (e.dtype == DType::F32) {
    read_safetensors_range(f, e, first, count, dst);
    return;
  }
  // The 16-bit values into the upper half of dst, widened front to back: element i's 4 bytes end at or before
  // where the 16-bit element i + 1 starts, so nothing is overwritten before it is read.
  auto* bytes = reinterpret_cast<unsigned char*>(dst);
  unsigned char* src = bytes + 2 * count;
  read_safetensors_range(f, e, first, count, src);
  const bool bf = e.dtype == DType::BF16;
  for (int64_t i = 0; i < count; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    const float v = bf ? bf16_to_f32(h) : f16_to_f32(h);
    std::memcpy(bytes + 4 * i, &v, 4);
  }
}

Tensor read_safetensors_tensor(const SafetensorsFile& f, const SafetensorsEntry& e, MemCategory cat) {
  Tensor t = Tensor::empty(e.shape, e.dtype, cat);
  read_safetensors_range(f, e, 0, t.numel(), t.raw());
  return t;
}

Tensor read_safetensors_f32(const SafetensorsFile& f, const SafetensorsEntry& e, MemCategory cat) {
  ZR_CHECK(e.dtype == DType::F32 || e.dtype == DType::BF16 || e.dtype == DType::F16, f.path, ": tensor '", e.name,
           "' has dtype ", dtype_name(e.dtype), "; parameters must be F32, BF16 or F16");
  Tensor raw = read_safetensors_tensor(f, e, cat);
  if (e.dtype == DType::F32) return raw;
  Tensor t = Tensor::empty(e.shape, DType::F32, cat);
  const uint16_t* src = raw.data<uint16_t>();
  float* dst = t.f32();
  for (int64_t i = 0, n = t.numel(); i < n; ++i)
    dst[i] = e.dtype == DType::BF16 ? bf16_to_f32(src[i]) : f16_to_f32(src[i]);
  return t;
}

namespace {
std::string make_header(const std::vector<SafetensorsStreamWriter::Decl>& decls,
                        const std::map<std::string, std::string>& metadata) {
  nlohmann::json h = nlohmann::json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t off = 0;
  for (auto& d : decls) {
    uint64_t n = static_cast<uint64_t>(shape_numel(d.shape)) * dtype_size(d.dtype);
    h[d.name] = {{"dtype", dtype_safetensors_name(d.dtype)}, {"shape", d.shape}, {"data_offsets", {off, off + n}}};
    off += n;
  }
  std::string header = h.dump();
  while ((header.size() + 8) % 8 != 0) header.push_back(' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header;
}
}  // namespace

SafetensorsStreamWriter::SafetensorsStreamWriter(const std::string& path, const std::vector<Decl>& decls,
                                                 const std::map<std::string, std::string>& metadata)
    : decls_(decls), file_(std::make_unique<AtomicFile>(path)) {
  std::string h = make_header(decls, metadata);
  file_->write(h.data(), h.size());
}

SafetensorsStreamWriter::~SafetensorsStreamWriter() = default;

void SafetensorsStreamWriter::append(const std::string& name, const void* data, size_t bytes) {
  ZR_CHECK(next_ < decls_.size() && decls_[next_].name == name, "safetensors stream: '", name,
           "' appended out of order");
  const Decl& d = decls_[next_];
  const size_t total = static_cast<size_t>(shape_numel(d.shape)) * dtype_size(d.dtype);
  ZR_CHECK(bytes <= total - written_, "safetensors stream: '", name, "' has the wrong byte count");
  file_->write(data, bytes);
  written_ += bytes;
  if (written_ == total) ++next_, written_ = 0;
}

void SafetensorsStreamWriter::commit() {
  ZR_CHECK(next_ == decls_.size(), "safetensors stream: ", decls_.size() - next_, " tensor(s) never (fully) written");
  file_->commit();
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsWriteItem>& items,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::json h = nlohmann::json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t off = 0;
  for (auto& it : items) {
    uint64_t n = it.tensor.nbytes();
    h[it.name] = {{"dtype", dtype_safetensors_name(it.tensor.dtype())},
                  {"shape", it.tensor.shape()},
                  {"data_offsets", {off, off + n}}};
    off += n;
  }
  std::string header = h.dump();
  while ((header.size() + 8) % 8 != 0) header.push_back(' ');
  AtomicFile out(path);
  unsigned char b[8];
  uint64_t hl = header.size();
  for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(hl >> (8 * i));
  out.write(b, 8);
  out.write(header.data(), header.size());
  for (auto& it : items) out.write(it.tensor.raw(), it.tensor.nbytes());
  out.commit();
}

}  // namespace zerorun
