// Unicode support for the tokenizer (src/data only): UTF-8, general categories, White_Space and NFC/NFD,
// from tables generated out of the Unicode Character Database (cmake/gen_unicode_tables.py).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace zerorun::unicode {

// General categories, in the generated table's order.
enum Category : uint8_t {
  Cn,
  Lu,
  Ll,
  Lt,
  Lm,
  Lo,
  Mn,
  Mc,
  Me,
  Nd,
  Nl,
  No,
  Pc,
  Pd,
  Ps,
  Pe,
  Pi,
  Pf,
  Po,
  Sm,
  Sc,
  Sk,
  So,
  Zs,
  Zl,
  Zp,
  Cc,
  Cf,
  Cs,
  Co,
  kNumCategories
};

Category category(uint32_t cp);
bool is_white_space(uint32_t cp);
// The major class letter of a category: 'L', 'M', 'N', 'P', 'S', 'Z' or 'C'.
char major(Category c);
const char* category_name(Category c);

// Decodes one code point at s[i], advancing i. Invalid bytes decode as U+FFFD, one byte each.
uint32_t next_cp(std::string_view s, size_t& i);
void append_utf8(std::string& out, uint32_t cp);
std::vector<uint32_t> to_cps(std::string_view s);
std::string to_utf8(const std::vector<uint32_t>& cps);

std::string nfc(std::string_view s);
std::string nfd(std::string_view s);

}  // namespace zerorun::unicode
