// Unicode tables (generated: unicode_tables.inc) and canonical normalization (NFD, NFC) per UAX #15.
#include "unicode.h"

#include <algorithm>
#include <array>
#include <unordered_map>

namespace zerorun::unicode {
namespace {
#include "unicode_tables.inc"

template <size_t N>
size_t upper_index(const uint32_t (*table)[N], size_t n, uint32_t cp) {  // first row whose key > cp
  size_t lo = 0, hi = n;
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (table[mid][0] <= cp)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

bool in_ranges(const uint32_t (*table)[2], size_t n, uint32_t cp) {
  const size_t i = upper_index(table, n, cp);
  return i > 0 && cp <= table[i - 1][1];
}

struct Latin1 {
  std::array<uint8_t, 256> cat{};
  Latin1() {
    for (uint32_t c = 0; c < 256; ++c) {
      const size_t i = upper_index(kCategoryRuns, std::size(kCategoryRuns), c);
      cat[c] = static_cast<uint8_t>(kCategoryRuns[i - 1][1]);
    }
  }
};
const Latin1 kLatin1;

uint8_t ccc(uint32_t cp) {
  if (cp < 0x300) return 0;
  const size_t i = upper_index(kCombiningClass, std::size(kCombiningClass), cp);
  return i > 0 && kCombiningClass[i - 1][0] == cp ? static_cast<uint8_t>(kCombiningClass[i - 1][1]) : 0;
}

const uint32_t* decomposition(uint32_t cp) {
  if (cp < 0xC0) return nullptr;
  const size_t i = upper_index(kDecomposition, std::size(kDecomposition), cp);
  return i > 0 && kDecomposition[i - 1][0] == cp ? kDecomposition[i - 1] : nullptr;
}

// Hangul syllables compose and decompose arithmetically.
constexpr uint32_t SBase = 0xAC00, LBase = 0x1100, VBase = 0x1161, TBase = 0x11A7, LCount = 19, VCount = 21,
                   TCount = 28, NCount = VCount * TCount, SCount = LCount * NCount;

void decompose(uint32_t cp, std::vector<uint32_t>& out) {
  if (cp >= SBase && cp < SBase + SCount) {
    const uint32_t s = cp - SBase;
    out.push_back(LBase + s / NCount);
    out.push_back(VBase + (s % NCount) / TCount);
    if (s % TCount) out.push_back(TBase + s % TCount);
    return;
  }
  if (const uint32_t* d = decomposition(cp)) {
    decompose(d[1], out);
    if (d[2]) decompose(d[2], out);
    return;
  }
  out.push_back(cp);
}

struct CompositionMap {
  std::unordered_map<uint64_t, uint32_t> m;
  CompositionMap() {
    for (auto& r : kComposition) m[(uint64_t{r[0]} << 32) | r[1]] = r[2];
  }
};

uint32_t compose_pair(uint32_t a, uint32_t b) {  // 0: none
  if (a >= LBase && a < LBase + LCount && b >= VBase && b < VBase + VCount)
    return SBase + ((a - LBase) * VCount + (b - VBase)) * TCount;
  if (a >= SBase && a < SBase + SCount && (a - SBase) % TCount == 0 && b > TBase && b < TBase + TCount)
    return a + (b - TBase);
  static const CompositionMap cm;
  auto it = cm.m.find((uint64_t{a} << 32) | b);
  return it == cm.m.end() ? 0 : it->second;
}

std::vector<uint32_t> decomposed(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) decompose(next_cp(s, i), out);
  // Canonical ordering: a stable sort of each run of non-starters by combining class.
  for (size_t i = 0; i < out.size();) {
    if (!ccc(out[i])) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < out.size() && ccc(out[j])) ++j;
    std::stable_sort(out.begin() + static_cast<long>(i), out.begin() + static_cast<long>(j),
                     [](uint32_t a, uint32_t b) { return ccc(a) < ccc(b); });
    i = j;
  }
  return out;
}

bool nfc_quick_yes(std::string_view s) {
  uint8_t last = 0;
  for (size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      last = 0;
      continue;
    }
    const uint32_t cp = next_cp(s, i);
    const uint8_t c = ccc(cp);
    if (c && last > c) return false;
    if (in_ranges(kNfcQcNotYes, std::size(kNfcQcNotYes), cp)) return false;
    last = c;
  }
  return true;
}

}  // namespace

Category category(uint32_t cp) {
  if (cp < 256) return static_cast<Category>(kLatin1.cat[cp]);
  const size_t i = upper_index(kCategoryRuns, std::size(kCategoryRuns), cp);
  return static_cast<Category>(kCategoryRuns[i - 1][1]);
}

bool is_white_space(uint32_t cp) {
  if (cp < 128) return cp == ' ' || (cp >= 9 && cp <= 13);
  return in_ranges(kWhiteSpace, std::size(kWhiteSpace), cp);
}

char major(Category c) { return kCategoryNames[c][0]; }
const char* category_name(Category c) { return kCategoryNames[c]; }

uint32_t next_cp(std::string_view s, size_t& i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return s[i++];
  const int n = c >= 0xF5 ? -1 : c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC2 ? 1 : -1;
  if (n < 0 || i + static_cast<size_t>(n) >= s.size()) {
    ++i;
    return 0xFFFD;
  }
  uint32_t cp = c & (0x3F >> n);
  for (int k = 1; k <= n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) {
      ++i;
      return 0xFFFD;
    }
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  const uint32_t min = n == 1 ? 0x80 : n == 2 ? 0x800 : 0x10000;
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) {
    ++i;
    return 0xFFFD;
  }
  i += static_cast<size_t>(n) + 1;
  return cp;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::vector<uint32_t> to_cps(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) out.push_back(next_cp(s, i));
  return out;
}

std::string to_utf8(const std::vector<uint32_t>& cps) {
  std::string out;
  out.reserve(cps.size());
  for (uint32_t c : cps) append_utf8(out, c);
  return out;
}

std::string nfd(std::string_view s) {
  bool ascii = true;
  for (char c : s) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  if (ascii) return std::string(s);
  return to_utf8(decomposed(s));
}

std::string nfc(std::string_view s) {
  if (nfc_quick_yes(s)) return std::string(s);
  std::vector<uint32_t> d = decomposed(s);
  // Canonical composition: each character combines with the last starter unless blocked.
  size_t starter = SIZE_MAX, out = 0;
  uint8_t last_ccc = 0;
  for (size_t i = 0; i < d.size(); ++i) {
    const uint32_t cp = d[i];
    const uint8_t c = ccc(cp);
    if (starter != SIZE_MAX && (out == starter + 1 || (last_ccc != 0 && last_ccc < c))) {
      if (const uint32_t comp = compose_pair(d[starter], cp)) {  // not blocked: combine with the starter
        d[starter] = comp;
        continue;
      }
    }
    if (c == 0) {
      starter = out;
      last_ccc = 0;
    } else {
      last_ccc = c;
    }
    d[out++] = cp;
  }
  d.resize(out);
  return to_utf8(d);
}

}  // namespace zerorun::unicode
