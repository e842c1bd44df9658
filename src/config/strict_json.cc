// Recursive-descent JSON parser with line/column errors and duplicate-key detection.
#include "zerorun/strict_json.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>

#include "zerorun/error.h"
#include "zerorun/fsutil.h"

namespace zerorun {
namespace {

class Parser {
 public:
  // hjson: the superset DeepSpeed reads config files with (hjson-py): a UTF-8 byte order mark, comments (#, //,
  // /* */), commas optional at line ends and allowed before a closing bracket, keys without quotes, '...' and
  // '''...''' strings, strings without quotes (to the end of the line), and the root object's braces left out.
  Parser(const std::string& t, const std::string& src, bool hjson) : t_(t), src_(src), hjson_(hjson) {}
  nlohmann::json parse() {
    if (t_.compare(0, 3, "\xef\xbb\xbf") == 0) {
      if (!hjson_) fail("the file starts with a UTF-8 byte order mark (BOM), which JSON does not allow");
      p_ = 3;
    }
    skip_ws();
    nlohmann::json v;
    if (hjson_ && p_ < t_.size() && t_[p_] != '{' && t_[p_] != '[' && root_without_braces())
      v = members(0, '\0');
    else
      v = value(0);
    skip_ws();
    if (p_ < t_.size()) fail("unexpected content after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& msg, size_t at = std::string::npos) {
    if (at == std::string::npos) at = p_;
    // Columns count characters (a UTF-8 sequence is one; a leading byte order mark is none).
    size_t line = 1, col = 1;
    for (size_t i = t_.compare(0, 3, "\xef\xbb\xbf") == 0 && at >= 3 ? 3 : 0; i < at && i < t_.size(); ++i) {
      if (t_[i] == '\n') {
        ++line;
        col = 1;
      } else if ((static_cast<unsigned char>(t_[i]) & 0xc0) != 0x80) {
        ++col;
      }
    }
    ZR_FAIL(src_, ":", line, ":", col, ": ", msg);
  }
  void skip_ws() {
    for (;;) {
      while (p_ < t_.size() && (t_[p_] == ' ' || t_[p_] == '\t' || t_[p_] == '\n' || t_[p_] == '\r')) ++p_;
      if (!hjson_ || p_ >= t_.size()) return;
      if (t_[p_] == '#' || t_.compare(p_, 2, "//") == 0) {
        while (p_ < t_.size() && t_[p_] != '\n') ++p_;
      } else if (t_.compare(p_, 2, "/*") == 0) {
        const size_t at = p_, end = t_.find("*/", p_ + 2);
        if (end == std::string::npos) fail("unterminated /* comment", at);
        p_ = end + 2;
      } else {
        return;
      }
    }
  }
  // Whether a line break (or a comment running to one) comes before the next token: hjson's comma.
  bool newline_ahead() const {
    for (size_t i = p_; i < t_.size(); ++i) {
      const char c = t_[i];
      if (c == '\n') return true;
      if (c == ' ' || c == '\t' || c == '\r') continue;
      return c == '#' || t_.compare(i, 2, "//") == 0;
    }
    return false;
  }
  // A printable description of the byte at `at` for messages: the character itself when it is ASCII or a whole
  // UTF-8 sequence, else its hex value (messages stay valid UTF-8).
  std::string char_at(size_t at) const {
    if (at >= t_.size()) return "end of file";
    const unsigned char c = static_cast<unsigned char>(t_[at]);
    if (c >= 0x20 && c < 0x7f) return std::string("'") + static_cast<char>(c) + "'";
    char buf[16];
    if (c >= 0x80) {
      if (const size_t n = utf8_length(at)) return "'" + t_.substr(at, n) + "'";
      std::snprintf(buf, sizeof buf, "byte 0x%02X (not UTF-8)", c);
    } else {
      std::snprintf(buf, sizeof buf, "control character 0x%02X", c);
    }
    return buf;
  }
  bool root_without_braces() {
    // A key followed by ':' at the start: an object whose braces are left out.
    const size_t save = p_;
    bool ok = true;
    try {
      key();
      skip_ws();
      ok = peek() == ':';
    } catch (const Error&) {
      ok = false;
    }
    p_ = save;
    return ok;
  }
  char peek() { return p_ < t_.size() ? t_[p_] : '\0'; }
  void expect(char c) {
    if (peek() != c) {
      if (p_ >= t_.size()) fail(std::string("unexpected end of file, expected '") + c + "'");
      fail(std::string("expected '") + c + "' but found " + char_at(p_));
    }
    ++p_;
  }
  nlohmann::json value(int depth) {
    if (depth > 256) fail("nesting too deep");
    char c = peek();
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') return string('"');
    if (hjson_) {
      if (t_.compare(p_, 3, "\'\'\'") == 0) return multiline_string();
      if (c == '\'') return string('\'');
      if (p_ < t_.size() && c != ',' && c != ':' && c != ']' && c != '}') return quoteless();
    }
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    if (t_.compare(p_, 4, "true") == 0) return p_ += 4, nlohmann::json(true);
    if (t_.compare(p_, 5, "false") == 0) return p_ += 5, nlohmann::json(false);
    if (t_.compare(p_, 4, "null") == 0) return p_ += 4, nlohmann::json(nullptr);
    if (p_ >= t_.size()) fail("unexpected end of file, expected a value");
    fail("unexpected character " + char_at(p_) + ", expected a value");
  }
  // hjson: a number or true/false/null when only a separator, a comment or the line's end follows it, else a
  // string running to the end of the line (without its trailing blanks).
  nlohmann::json quoteless() {
    const size_t start = p_;
    auto ends_here = [&](size_t i) {
      while (i < t_.size() && (t_[i] == ' ' || t_[i] == '\t' || t_[i] == '\r')) ++i;
      return i >= t_.size() || t_[i] == '\n' || t_[i] == ',' || t_[i] == '}' || t_[i] == ']' || t_[i] == '#' ||
             t_.compare(i, 2, "//") == 0 || t_.compare(i, 2, "/*") == 0;
    };
    for (auto [word, v] : {std::pair<const char*, nlohmann::json>{"true", true}, {"false", false}, {"null", nullptr}}) {
      const size_t n = std::strlen(word);
      if (t_.compare(p_, n, word) == 0 && ends_here(p_ + n)) return p_ += n, v;
    }
    const char c = peek();
    if (c == '-' || (c >= '0' && c <= '9')) {
      try {
        nlohmann::json v = number();
        if (ends_here(p_)) return v;
      } catch (const Error&) {
      }
      p_ = start;
    }
    size_t end = p_;
    while (end < t_.size() && t_[end] != '\n') ++end;
    size_t last = end;
    while (last > p_ && (t_[last - 1] == ' ' || t_[last - 1] == '\t' || t_[last - 1] == '\r')) --last;
    std::string s = t_.substr(p_, last - p_);
    for (size_t i = p_; i < last; ++i) {
      const unsigned char b = static_cast<unsigned char>(t_[i]);
      if (b < 0x20 && b != '\t') fail("control character in string", i);
      if (b >= 0x80) {
        const size_t n = utf8_length(i);
        if (!n) fail("invalid UTF-8 in string (the file must be UTF-8)", i);
        i += n - 1;
      }
    }
    p_ = end;
    return s;
  }
  nlohmann::json multiline_string() {
    const size_t start = p_;
    p_ += 3;
    const size_t end = t_.find("\'\'\'", p_);
    if (end == std::string::npos) fail("unterminated \'\'\' string", start);
    std::string s = t_.substr(p_, end - p_);
    for (size_t i = 0; i < s.size(); ++i)
      if (static_cast<unsigned char>(s[i]) >= 0x80 && !utf8_length(p_ + i))
        fail("invalid UTF-8 in string (the file must be UTF-8)", p_ + i);
    p_ = end + 3;
    // hjson drops the first line break and the indentation of the opening quotes' column.
    if (!s.empty() && s[0] == '\n') s.erase(0, 1);
    if (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }
  std::string key() {
    if (peek() == '"') return string('"').get<std::string>();
    if (hjson_ && peek() == '\'') return string('\'').get<std::string>();
    if (!hjson_) fail(peek() == '}' ? "trailing comma before '}'" : "expected a string key");
    const size_t start = p_;
    while (p_ < t_.size()) {
      const char c = t_[p_];
      if (c == ':' || c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ',' || c == '{' || c == '}' || c == '[' ||
          c == ']')
        break;
      ++p_;
    }
    if (p_ == start)
      fail(p_ >= t_.size() ? "unexpected end of file, expected a key" : "expected a key, found " + char_at(p_));
    for (size_t i = start; i < p_; ++i)
      if (static_cast<unsigned char>(t_[i]) < 0x20 || (static_cast<unsigned char>(t_[i]) >= 0x80 && !utf8_length(i)))
        fail("invalid character in key: " + char_at(i), i);
    return t_.substr(start, p_ - start);
  }
  nlohmann::json object(int depth) {
    expect('{');
    nlohmann::json o = members(depth, '}');
    expect('}');
    return o;
  }
  // Members up to `close` ('}', or '\0' for an hjson root without braces), which is left unread.
  nlohmann::json members(int depth, char close) {
    nlohmann::json o = nlohmann::json::object();
    std::set<std::string> seen;
    skip_ws();
    for (;;) {
      skip_ws();
      if (close ? peek() == close : p_ >= t_.size()) return o;
      size_t key_at = p_;
      std::string k = key();
      if (!seen.insert(k).second) fail("duplicate key \"" + k + "\"", key_at);
      skip_ws();
      expect(':');
      skip_ws();
      o[k] = value(depth + 1);
      const bool line_end = hjson_ && newline_ahead();
      skip_ws();
      if (peek() == ',') {
        ++p_;
        skip_ws();
        if (!hjson_ && peek() == close) fail("trailing comma before '}'");
        continue;
      }
      if (close ? peek() == close : p_ >= t_.size()) return o;
      if (line_end) continue;
      if (close) expect(close);
      fail("expected ',' or a new line between members, found " + char_at(p_));
    }
  }
  nlohmann::json array(int depth) {
    nlohmann::json a = nlohmann::json::array();
    expect('[');
    for (;;) {
      skip_ws();
      if (peek() == ']') return ++p_, a;
      a.push_back(value(depth + 1));
      const bool line_end = hjson_ && newline_ahead();
      skip_ws();
      if (peek() == ',') {
        ++p_;
        skip_ws();
        if (!hjson_ && peek() == ']') fail("trailing comma before ']'");
        continue;
      }
      if (peek() == ']' || line_end) continue;
      expect(']');
    }
  }
  static void utf8(std::string& s, uint32_t cp) {
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else if (cp < 0x800) {
      s += static_cast<char>(0xc0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      s += static_cast<char>(0xe0 | (cp >> 12));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      s += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      s += static_cast<char>(0xf0 | (cp >> 18));
      s += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      s += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }
  // Length of the well-formed UTF-8 sequence at `at` (RFC 3629: no overlong forms, surrogates or values past
  // U+10FFFF), 0 if it is not one.
  size_t utf8_length(size_t at) const {
    auto b = [&](size_t i) { return at + i < t_.size() ? static_cast<unsigned char>(t_[at + i]) : 0u; };
    const unsigned c = b(0);
    size_t n = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    for (size_t i = 1; i < n; ++i)
      if ((b(i) & 0xc0) != 0x80) return 0;
    if ((c == 0xe0 && b(1) < 0xa0) || (c == 0xed && b(1) >= 0xa0) || (c == 0xf0 && b(1) < 0x90) ||
        (c == 0xf4 && b(1) >= 0x90))
      return 0;
    return n;
  }
  uint32_t hex4() {
    if (p_ + 4 > t_.size()) fail("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = t_[p_++];
      v <<= 4;
      if (c >= '0' && c <= '9')
        v |= c - '0';
      else if (c >= 'a' && c <= 'f')
        v |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F')
        v |= c - 'A' + 10;
      else
        fail("bad hex digit in \\u escape");
    }
    return v;
  }
  nlohmann::json string(char quote) {
    size_t start = p_;
    expect(quote);
    std::string s;
    for (;;) {
      if (p_ >= t_.size()) fail("unterminated string", start);
      char c = t_[p_++];
      if (c == quote) break;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in string (unterminated string?)", p_ - 1);
      if (static_cast<unsigned char>(c) >= 0x80) {  // a UTF-8 sequence, copied whole once checked
        const size_t at = p_ - 1, n = utf8_length(at);
        if (!n) fail("invalid UTF-8 in string (JSON text must be UTF-8)", at);
        s.append(t_, at, n);
        p_ = at + n;
        continue;
      }
      if (c != '\\') {
        s += c;
        continue;
      }
      if (p_ >= t_.size()) fail("unterminated string", start);
      char e = t_[p_++];
      switch (e) {
        case '"':
          s += '"';
          break;
        case '\'':
          if (quote != '\'') fail("bad escape '\\''", p_ - 2);
          s += '\'';
          break;
        case '\\':
          s += '\\';
          break;
        case '/':
          s += '/';
          break;
        case 'b':
          s += '\b';
          break;
        case 'f':
          s += '\f';
          break;
        case 'n':
          s += '\n';
          break;
        case 'r':
          s += '\r';
          break;
        case 't':
          s += '\t';
          break;
        case 'u': {
          const size_t esc = p_ - 2;
          uint32_t cp = hex4();
          if (cp >= 0xd800 && cp < 0xdc00 && t_.compare(p_, 2, "\\u") == 0) {
            p_ += 2;
            uint32_t lo = hex4();
            if (lo < 0xdc00 || lo > 0xdfff) fail("\\u escape: high surrogate not followed by a low one", esc);
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
          }
          if (cp >= 0xd800 && cp <= 0xdfff) fail("\\u escape: unpaired surrogate", esc);
          utf8(s, cp);
          break;
        }
        default:
          fail("bad escape '\\' followed by " + char_at(p_ - 1), p_ - 2);
      }
    }
    return s;
  }
  nlohmann::json number() {
    size_t start = p_;
    bool is_float = false;
    if (peek() == '-') ++p_;
    if (!(peek() >= '0' && peek() <= '9')) fail("bad number");
    if (peek() == '0') {
      ++p_;
      if (peek() >= '0' && peek() <= '9') fail("numbers may not have leading zeros", start);
    }
    while (peek() >= '0' && peek() <= '9') ++p_;
    if (peek() == '.') {
      is_float = true;
      ++p_;
      if (!(peek() >= '0' && peek() <= '9')) fail("bad number: digits expected after '.'");
      while (peek() >= '0' && peek() <= '9') ++p_;
    }
    if (peek() == 'e' || peek() == 'E') {
      is_float = true;
      ++p_;
      if (peek() == '+' || peek() == '-') ++p_;
      if (!(peek() >= '0' && peek() <= '9')) fail("bad number: digits expected in exponent");
      while (peek() >= '0' && peek() <= '9') ++p_;
    }
    std::string s = t_.substr(start, p_ - start);
    if (!is_float) {
      try {
        return nlohmann::json(static_cast<int64_t>(std::stoll(s)));
      } catch (...) {
      }
    }
    errno = 0;
    const double v = std::strtod(s.c_str(), nullptr);
    if (errno == ERANGE && std::fabs(v) > 1.0) fail("number out of range: " + s, start);
    return nlohmann::json(v);
  }

  const std::string& t_;
  const std::string& src_;
  bool hjson_;
  size_t p_ = 0;
};

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

nlohmann::json parse_json_strict(const std::string& text, const std::string& source) {
  return Parser(text, source, false).parse();
}

nlohmann::json parse_config_text(const std::string& text, const std::string& source) {
  return Parser(text, source, true).parse();
}

nlohmann::json load_config_file(const std::string& path) {
  return parse_config_text(read_file(path, /*allow_pipe=*/true), path);  // --config <(...) works too
}

nlohmann::json load_json_file_strict(const std::string& path) { return parse_json_strict(read_file(path), path); }

std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::max<size_t>(3, word.size() / 3) + 1;
  for (auto& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best;
}

}  // namespace zerorun
