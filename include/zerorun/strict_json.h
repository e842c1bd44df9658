// A strict JSON reader for user-written files: reports syntax errors as
// file:line:column, rejects duplicate keys (nlohmann silently keeps one),
// and yields an nlohmann::json value.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace zerorun {

// `source` is used in messages (usually the file path).
nlohmann::json parse_json_strict(const std::string& text, const std::string& source);
nlohmann::json load_json_file_strict(const std::string& path);
// Config files as DeepSpeed reads them (hjson-py): JSON plus a UTF-8 BOM, comments (#, //, /* */), trailing and
// line-end-optional commas, unquoted keys, '...' / '''...''' strings, strings without quotes, a root object
// without braces. Errors are file:line:column; duplicate keys are errors (as in DeepSpeed).
nlohmann::json parse_config_text(const std::string& text, const std::string& source);
nlohmann::json load_config_file(const std::string& path);
// Closest candidate within a small edit distance, or "" if none is close.
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace zerorun
