// The safetensors container (u64 header length, JSON header, raw bytes):
// used for model.bin, checkpoint shards and merged weights. Reading is
// bounds-checked; writing is atomic (temp file, fsync, rename).
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "zerorun/tensor.h"

namespace zerorun {

struct SafetensorsEntry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data section
};

struct SafetensorsFile {
  std::string path;
  std::map<std::string, std::string> metadata;
  std::vector<SafetensorsEntry> entries;  // in offset order
  uint64_t data_start = 0;                // file offset of the data section
  const SafetensorsEntry* find(const std::string& name) const;
};

// Parses and validates the header only (no tensor bytes are read).
SafetensorsFile read_safetensors_header(const std::string& path);
// Reads one tensor's bytes into a new tensor of its stored dtype.
Tensor read_safetensors_tensor(const SafetensorsFile& f, const SafetensorsEntry& e,
                               MemCategory cat = MemCategory::Buffers);
// An F32, BF16 or F16 tensor as f32 (other dtypes: an error naming the file and tensor).
Tensor read_safetensors_f32(const SafetensorsFile& f, const SafetensorsEntry& e,
                            MemCategory cat = MemCategory::Buffers);
// Reads `count` elements starting at element `first` of a tensor (streaming).
void read_safetensors_range(const SafetensorsFile& f, const SafetensorsEntry& e, int64_t first, int64_t count,
                            void* dst);
// The same range of an F32, BF16 or F16 tensor as f32 (16-bit values widened in place in dst).
void read_safetensors_f32_range(const SafetensorsFile& f, const SafetensorsEntry& e, int64_t first, int64_t count,
                                float* dst);

struct SafetensorsWriteItem {
  std::string name;
  Tensor tensor;
};
// Writes atomically: `path`.tmp, fsync, rename over `path`.
void write_safetensors(const std::string& path, const std::vector<SafetensorsWriteItem>& items,
                       const std::map<std::string, std::string>& metadata);

// Streaming writer: the header is written from the declared entries, then
// each tensor's bytes are appended in declaration order (peak memory stays
// at one tensor). Atomic like write_safetensors.
class SafetensorsStreamWriter {
 public:
  struct Decl {
    std::string name;
    DType dtype;
    Shape shape;
  };
  SafetensorsStreamWriter(const std::string& path, const std::vector<Decl>& decls,
                          const std::map<std::string, std::string>& metadata);
  ~SafetensorsStreamWriter();
  // The next bytes of the current tensor (declaration order): all of it at once, or in parts that add up to it.
  void append(const std::string& name, const void* data, size_t bytes);
  void commit();

 private:
  std::vector<Decl> decls_;
  size_t next_ = 0, written_ = 0;
  std::unique_ptr<class AtomicFile> file_;
};

}  // namespace zerorun
