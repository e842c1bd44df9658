// Fuzz targets: every parser of user-supplied bytes (model.bin, safetensors, DeepSpeed JSON, hostfiles and
// --include/--exclude, token shards and .npy, checkpoint manifests) run on arbitrary input. The contract checked:
// an input is either accepted or rejected with a zerorun::Error naming the file (or the flag); any other
// exception, a crash, or a sanitizer report is a bug. Shared by the libFuzzer driver (clang, sanitizers) and the
// seeded mutation test ctest runs.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace zerorun::fuzz {

enum class Outcome { Accepted, Rejected };

// The targets: model, safetensors, config, hostfile, tokens, npy, manifest.
const std::vector<std::string>& target_names();

// Runs one input through `target`. Returns whether it was accepted or rejected with a zerorun::Error that names
// what it came from; throws ContractViolation for anything else (another exception type, an error that names
// nothing).
Outcome run(const std::string& target, const uint8_t* data, size_t size);

// The message of the last rejection.
const std::string& last_error();

struct ContractViolation {
  std::string what;
};

// Valid inputs of `target` to mutate from (built in-process: a tiny GPT-2/Llama/MLP model.bin, the repository's
// configs, a saved checkpoint's manifest, ...). `source_dir` is the repository root (for configs/).
std::vector<std::string> seeds(const std::string& target, const std::string& source_dir);

// Per-process scratch directory the targets write their inputs to (removed at exit).
const std::string& scratch_dir();

}  // namespace zerorun::fuzz
