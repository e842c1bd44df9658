// Recursive-descent JSON parser with line/column errors and duplicate-key detection.
#include "zerorun/strict_json.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <set>

#include "zerorun/error.h"
#include "zerorun/fsutil.h"

namespace zerorun {
namespace {

class Parser {
 public:
  Parser(const std::string& t, const std::string& src) : t_(t), src_(src) {}
  nlohmann::json parse() {
    skip_ws();
    nlohmann::json v = value(0);
    skip_ws();
    if (p_ < t_.size()) fail("unexpected content after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& msg, size_t at = std::string::npos) {
    if (at == std::string::npos) at = p_;
    size_t line = 1, col = 1;
    for (size_t i = 0; i < at && i < t_.size(); ++i) {
      if (t_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    ZR_FAIL(src_, ":", line, ":", col, ": ", msg);
  }
  void skip_ws() {
    while (p_ < t_.size() && (t_[p_] == ' ' || t_[p_] == '\t' || t_[p_] == '\n' || t_[p_] == '\r')) ++p_;
  }
  char peek() { return p_ < t_.size() ? t_[p_] : '\0'; }
  void expect(char c) {
    if (peek() != c) {
      if (p_ >= t_.size()) fail(std::string("unexpected end of file, expected '") + c + "'");
      fail(std::string("expected '") + c + "' but found '" + t_[p_] + "'");
    }
    ++p_;
  }
  nlohmann::json value(int depth) {
    if (depth > 256) fail("nesting too deep");
    char c = peek();
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') return string();
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    if (t_.compare(p_, 4, "true") == 0) return p_ += 4, nlohmann::json(true);
    if (t_.compare(p_, 5, "false") == 0) return p_ += 5, nlohmann::json(false);
    if (t_.compare(p_, 4, "null") == 0) return p_ += 4, nlohmann::json(nullptr);
    if (p_ >= t_.size()) fail("unexpected end of file, expected a value");
    fail(std::string("unexpected character '") + c + "', expected a value");
  }
  nlohmann::json object(int depth) {
    nlohmann::json o = nlohmann::json::object();
    std::set<std::string> seen;
    expect('{');
    skip_ws();
    if (peek() == '}') return ++p_, o;
    for (;;) {
      skip_ws();
      size_t key_at = p_;
      if (peek() != '"') fail(peek() == '}' ? "trailing comma before '}'" : "expected a string key");
      std::string k = string().get<std::string>();
      if (!seen.insert(k).second) fail("duplicate key \"" + k + "\"", key_at);
      skip_ws();
      expect(':');
      skip_ws();
      o[k] = value(depth + 1);
      skip_ws();
      if (peek() == ',') {
        ++p_;
        continue;
      }
      expect('}');
      return o;
    }
  }
  nlohmann::json array(int depth) {
    nlohmann::json a = nlohmann::json::array();
    expect('[');
    skip_ws();
    if (peek() == ']') return ++p_, a;
    for (;;) {
      skip_ws();
      if (peek() == ']') fail("trailing comma before ']'");
      a.push_back(value(depth + 1));
      skip_ws();
      if (peek() == ',') {
        ++p_;
        continue;
      }
      expect(']');
      return a;
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
  nlohmann::json string() {
    size_t start = p_;
    expect('"');
    std::string s;
    for (;;) {
      if (p_ >= t_.size()) fail("unterminated string", start);
      char c = t_[p_++];
      if (c == '"') break;
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
          fail(std::string("bad escape '\\") + e + "'", p_ - 2);
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
  return Parser(text, source).parse();
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
