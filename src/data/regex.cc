// Backtracking regex over code points (see regex.h): a parser to a tree, compiled to a small program of
// CHAR / CLASS / SPLIT / JMP / LOOK instructions run with an explicit backtracking stack.
#include "regex.h"

#include <array>
#include <cstring>

#include "unicode.h"
#include "zerorun/error.h"

namespace zerorun {
namespace {

using unicode::Category;

struct CharClass {
  bool negated = false;
  bool ci = false;                                    // ASCII case-insensitive
  std::vector<std::pair<uint32_t, uint32_t>> ranges;  // inclusive
  uint32_t cats = 0, not_cats = 0;                    // \p{..} and \P{..} as category bit sets
  bool ws = false, not_ws = false;                    // \s and \S
  std::array<uint64_t, 2> ascii{};                    // precomputed membership of 0..127

  bool raw(uint32_t cp) const {
    for (auto& r : ranges)
      if (cp >= r.first && cp <= r.second) return true;
    if (cats || not_cats) {
      const uint32_t bit = 1u << unicode::category(cp);
      if ((cats & bit) || (not_cats && !(not_cats & bit))) return true;
    }
    if (ws || not_ws) {
      const bool w = unicode::is_white_space(cp);
      if ((ws && w) || (not_ws && !w)) return true;
    }
    return false;
  }
  bool slow(uint32_t cp) const {
    bool m = raw(cp);
    if (!m && ci && cp < 128 && ((cp | 32) >= 'a' && (cp | 32) <= 'z')) m = raw(cp ^ 32);
    return m != negated;
  }
  void finish() {
    for (uint32_t c = 0; c < 128; ++c)
      if (slow(c)) ascii[c >> 6] |= uint64_t{1} << (c & 63);
  }
  bool match(uint32_t cp) const { return cp < 128 ? (ascii[cp >> 6] >> (cp & 63)) & 1 : slow(cp); }
};

enum class N { Empty, Char, Class, Any, Cat, Alt, Repeat, Look, Bol, Eol };
struct Node {
  N kind = N::Empty;
  uint32_t cp = 0;
  bool ci = false;
  int cls = -1;
  std::vector<Node> kids;
  int min = 0, max = 0;  // max -1: unbounded
  bool greedy = true, negate = false;
};

enum Op : uint8_t { CHAR, CHARI, CLASS, ANY, SPLIT, JMP, LOOK, BOL, EOL, MATCH };
struct Inst {
  Op op;
  bool negate = false;
  uint32_t a = 0, b = 0;  // CHAR: a = cp; CLASS: a = class; SPLIT: a preferred, b other; JMP: a; LOOK: a = program
};

uint32_t cat_bits(const std::string& name, const std::string& pattern, size_t at) {
  static const std::pair<const char*, const char*> kLong[] = {{"Letter", "L"},
                                                              {"Mark", "M"},
                                                              {"Number", "N"},
                                                              {"Punctuation", "P"},
                                                              {"Symbol", "S"},
                                                              {"Separator", "Z"},
                                                              {"Other", "C"},
                                                              {"Uppercase_Letter", "Lu"},
                                                              {"Lowercase_Letter", "Ll"},
                                                              {"Decimal_Number", "Nd"},
                                                              {"Space_Separator", "Zs"},
                                                              {"Control", "Cc"}};
  std::string n = name;
  for (auto& [l, s] : kLong)
    if (n == l) n = s;
  uint32_t bits = 0;
  for (int c = 0; c < unicode::kNumCategories; ++c) {
    const char* cn = unicode::category_name(static_cast<Category>(c));
    if ((n.size() == 1 && cn[0] == n[0]) || n == cn) bits |= 1u << c;
  }
  if (n == "L&" || n == "LC") bits = (1u << unicode::Lu) | (1u << unicode::Ll) | (1u << unicode::Lt);
  ZR_CHECK(bits, "regex '", pattern, "': unknown Unicode property \\p{", name, "} at offset ", at);
  return bits;
}

class Parser {
 public:
  Parser(const std::string& p, std::vector<CharClass>& classes) : p_(p), cps_(unicode::to_cps(p)), classes_(classes) {}

  Node parse() {
    Node n = alt(false);
    if (i_ < cps_.size()) fail("unbalanced ')'");
    return n;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    ZR_FAIL("regex '", p_, "': ", what, " at offset ", i_, " (code points)");
  }
  bool eat(uint32_t c) {
    if (i_ < cps_.size() && cps_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool at_end() const { return i_ >= cps_.size(); }
  uint32_t peek(size_t k = 0) const { return i_ + k < cps_.size() ? cps_[i_ + k] : 0; }

  Node alt(bool ci) {
    Node a;
    a.kind = N::Alt;
    a.kids.push_back(seq(ci));
    while (eat('|')) a.kids.push_back(seq(ci));
    return a.kids.size() == 1 ? std::move(a.kids[0]) : a;
  }
  Node seq(bool ci) {
    Node s;
    s.kind = N::Cat;
    while (!at_end() && peek() != '|' && peek() != ')') s.kids.push_back(quantified(ci));
    return s;
  }
  static bool nullable(const Node& n) {
    switch (n.kind) {
      case N::Empty:
      case N::Look:
      case N::Bol:
      case N::Eol:
        return true;
      case N::Cat:
        for (auto& k : n.kids)
          if (!nullable(k)) return false;
        return true;
      case N::Alt:
        for (auto& k : n.kids)
          if (nullable(k)) return true;
        return false;
      case N::Repeat:
        return n.min == 0 || nullable(n.kids[0]);
      default:
        return false;
    }
  }
  bool number(int& v) {
    if (at_end() || peek() < '0' || peek() > '9') return false;
    v = 0;
    while (!at_end() && peek() >= '0' && peek() <= '9') {
      v = v * 10 + static_cast<int>(cps_[i_++] - '0');
      if (v > 1000) fail("repetition count above 1000");
    }
    return true;
  }
  Node quantified(bool ci) {
    Node atom_n = atom(ci);
    for (;;) {
      int mn, mx;
      const size_t save = i_;
      if (eat('?')) {
        mn = 0, mx = 1;
      } else if (eat('*')) {
        mn = 0, mx = -1;
      } else if (eat('+')) {
        mn = 1, mx = -1;
      } else if (peek() == '{') {
        ++i_;
        if (!number(mn)) {  // a literal '{'
          i_ = save;
          return atom_n;
        }
        mx = mn;
        if (eat(',')) {
          if (!number(mx)) mx = -1;
        }
        if (!eat('}')) fail("unterminated {n,m}");
        if (mx >= 0 && mx < mn) fail("{n,m} with m < n");
      } else {
        return atom_n;
      }
      if (atom_n.kind == N::Bol || atom_n.kind == N::Eol || atom_n.kind == N::Look)
        fail("quantifier after an assertion");
      if (mx < 0 && nullable(atom_n)) fail("unbounded repetition of something that can match empty (unsupported)");
      Node r;
      r.kind = N::Repeat;
      r.min = mn;
      r.max = mx;
      r.greedy = !eat('?');
      if (eat('+')) fail("possessive quantifiers are not supported");
      r.kids.push_back(std::move(atom_n));
      atom_n = std::move(r);
    }
  }
  uint32_t hex(size_t digits_max, bool braced) {
    uint32_t v = 0;
    size_t k = 0;
    while (k < digits_max && !at_end() && std::isxdigit(static_cast<int>(peek() < 128 ? peek() : 0))) {
      const uint32_t c = cps_[i_++];
      v = v * 16 + (c <= '9' ? c - '0' : (c | 32) - 'a' + 10);
      ++k;
    }
    if (!k || (braced && !eat('}'))) fail("bad hex escape");
    if (v > 0x10FFFF) fail("code point above U+10FFFF");
    return v;
  }
  // An escape after '\': adds to `cls` when it is a set, else returns true with `cp` set.
  bool escape(CharClass& cls, uint32_t& cp) {
    if (at_end()) fail("trailing backslash");
    const uint32_t c = cps_[i_++];
    switch (c) {
      case 's':
        cls.ws = true;
        return false;
      case 'S':
        cls.not_ws = true;
        return false;
      case 'd':
        cls.cats |= 1u << unicode::Nd;
        return false;
      case 'D':
        cls.not_cats |= 1u << unicode::Nd;
        return false;
      case 'w':
        cls.cats |= cat_bits("L", p_, i_) | cat_bits("M", p_, i_) | (1u << unicode::Nd) | (1u << unicode::Pc);
        return false;
      case 'W':
        cls.not_cats |= cat_bits("L", p_, i_) | cat_bits("M", p_, i_) | (1u << unicode::Nd) | (1u << unicode::Pc);
        return false;
      case 'p':
      case 'P': {
        std::string name;
        const size_t at = i_;
        if (eat('{')) {
          while (!at_end() && peek() != '}') unicode::append_utf8(name, cps_[i_++]);
          if (!eat('}')) fail("unterminated \\p{");
        } else if (!at_end()) {
          unicode::append_utf8(name, cps_[i_++]);
        }
        (c == 'p' ? cls.cats : cls.not_cats) |= cat_bits(name, p_, at);
        return false;
      }
      case 'n':
        cp = '\n';
        return true;
      case 'r':
        cp = '\r';
        return true;
      case 't':
        cp = '\t';
        return true;
      case 'f':
        cp = '\f';
        return true;
      case 'v':
        cp = '\v';
        return true;
      case '0':
        cp = 0;
        return true;
      case 'x':
        cp = eat('{') ? hex(8, true) : hex(2, false);
        return true;
      case 'u':
        cp = hex(4, false);
        return true;
      default:
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
          fail(std::string("unsupported escape \\") + static_cast<char>(c));
        cp = c;
        return true;
    }
  }
  Node class_node(CharClass cls, bool ci) {
    cls.ci = ci;
    cls.finish();
    Node n;
    n.kind = N::Class;
    n.cls = static_cast<int>(classes_.size());
    classes_.push_back(std::move(cls));
    return n;
  }
  Node bracket(bool ci) {
    CharClass cls;
    cls.negated = eat('^');
    bool first = true;
    while (!at_end() && (first || peek() != ']')) {
      first = false;
      uint32_t lo;
      if (eat('\\')) {
        if (!escape(cls, lo)) continue;
      } else if (peek() == '[') {
        fail("nested classes are not supported");
      } else {
        lo = cps_[i_++];
      }
      uint32_t hi = lo;
      if (peek() == '-' && peek(1) != ']' && i_ + 1 < cps_.size()) {
        ++i_;
        if (eat('\\')) {
          CharClass tmp;
          if (!escape(tmp, hi)) fail("a set in a class range");
        } else {
          hi = cps_[i_++];
        }
        if (hi < lo) fail("class range out of order");
      }
      cls.ranges.push_back({lo, hi});
    }
    if (!eat(']')) fail("unterminated [");
    return class_node(std::move(cls), ci);
  }
  Node atom(bool ci) {
    const uint32_t c = cps_[i_++];
    Node n;
    switch (c) {
      case '(': {
        bool ci_in = ci;
        if (eat('?')) {
          if (eat(':')) {
          } else if (eat('=') || eat('!')) {
            n.kind = N::Look;
            n.negate = cps_[i_ - 1] == '!';
            n.kids.push_back(alt(ci));
            if (!eat(')')) fail("unterminated (");
            return n;
          } else if (peek() == 'i' || peek() == '-') {
            bool on = true;
            while (!at_end() && peek() != ':' && peek() != ')') {
              const uint32_t f = cps_[i_++];
              if (f == '-')
                on = false;
              else if (f == 'i')
                ci_in = on;
              else
                fail("unsupported group flag");
            }
            if (eat(')')) fail("flags without a group ((?i) alone) are not supported");
            if (!eat(':')) fail("unterminated group flags");
          } else {
            fail("unsupported group kind (?" + std::string(1, static_cast<char>(peek())) + "...)");
          }
        }
        n = alt(ci_in);
        if (!eat(')')) fail("unterminated (");
        return n;
      }
      case '[':
        return bracket(ci);
      case '.':
        n.kind = N::Any;
        return n;
      case '^':
        n.kind = N::Bol;
        return n;
      case '$':
        n.kind = N::Eol;
        return n;
      case '\\': {
        CharClass cls;
        uint32_t cp;
        if (!escape(cls, cp)) return class_node(std::move(cls), ci);
        n.kind = N::Char;
        n.cp = cp;
        n.ci = ci;
        return n;
      }
      case ')':
      case '*':
      case '+':
      case '?':
        --i_;
        fail("nothing to repeat or unbalanced ')'");
      default:
        n.kind = N::Char;
        n.cp = c;
        n.ci = ci;
        return n;
    }
  }

  const std::string& p_;
  std::vector<uint32_t> cps_;
  size_t i_ = 0;
  std::vector<CharClass>& classes_;
};

}  // namespace

struct Regex::Impl {
  std::string pattern;
  std::vector<CharClass> classes;
  std::vector<std::vector<Inst>> progs;  // 0: the pattern; others: lookahead bodies

  uint32_t emit(std::vector<Inst>& c, Inst in) {
    c.push_back(in);
    return static_cast<uint32_t>(c.size() - 1);
  }
  void compile(const Node& n, std::vector<Inst>& c) {
    switch (n.kind) {
      case N::Empty:
        break;
      case N::Char:
        if (n.ci && n.cp < 128 && (n.cp | 32) >= 'a' && (n.cp | 32) <= 'z')
          emit(c, {CHARI, false, n.cp | 32, 0});
        else
          emit(c, {CHAR, false, n.cp, 0});
        break;
      case N::Class:
        emit(c, {CLASS, false, static_cast<uint32_t>(n.cls), 0});
        break;
      case N::Any:
        emit(c, {ANY, false, 0, 0});
        break;
      case N::Bol:
        emit(c, {BOL, false, 0, 0});
        break;
      case N::Eol:
        emit(c, {EOL, false, 0, 0});
        break;
      case N::Cat:
        for (auto& k : n.kids) compile(k, c);
        break;
      case N::Alt: {
        std::vector<uint32_t> jumps;
        for (size_t k = 0; k < n.kids.size(); ++k) {
          if (k + 1 < n.kids.size()) {
            const uint32_t s = emit(c, {SPLIT, false, 0, 0});
            c[s].a = s + 1;
            compile(n.kids[k], c);
            jumps.push_back(emit(c, {JMP, false, 0, 0}));
            c[s].b = static_cast<uint32_t>(c.size());
          } else {
            compile(n.kids[k], c);
          }
        }
        for (uint32_t j : jumps) c[j].a = static_cast<uint32_t>(c.size());
        break;
      }
      case N::Repeat: {
        const Node& body = n.kids[0];
        for (int k = 0; k < n.min; ++k) compile(body, c);
        auto split = [&](uint32_t s, uint32_t take, uint32_t skip) {
          c[s].a = n.greedy ? take : skip;
          c[s].b = n.greedy ? skip : take;
        };
        if (n.max < 0) {  // L: SPLIT body, out; body; JMP L
          const uint32_t s = emit(c, {SPLIT, false, 0, 0});
          compile(body, c);
          emit(c, {JMP, false, s, 0});
          split(s, s + 1, static_cast<uint32_t>(c.size()));
        } else {
          std::vector<uint32_t> splits;
          for (int k = n.min; k < n.max; ++k) {
            splits.push_back(emit(c, {SPLIT, false, 0, 0}));
            compile(body, c);
          }
          for (uint32_t s : splits) split(s, s + 1, static_cast<uint32_t>(c.size()));
        }
        break;
      }
      case N::Look: {
        std::vector<Inst> sub;
        compile(n.kids[0], sub);
        sub.push_back({MATCH, false, 0, 0});
        progs.push_back(std::move(sub));
        emit(c, {LOOK, n.negate, static_cast<uint32_t>(progs.size() - 1), 0});
        break;
      }
    }
  }

  // Anchored match of program `p` at `start`; the end of the match in `end`. `st` is the caller's backtracking
  // stack (one a find_all call: no thread_local object with a destructor, which MinGW's thread exit mishandles).
  using Stack = std::vector<std::pair<uint32_t, size_t>>;
  bool run(uint32_t p, const uint32_t* t, size_t n, size_t start, size_t& end, Stack& st) const {
    const size_t base = st.size();
    st.push_back({0, start});
    const Inst* code = progs[p].data();
    bool found = false;
    while (st.size() > base) {
      uint32_t pc = st.back().first;
      size_t i = st.back().second;
      st.pop_back();
      for (;;) {
        const Inst& in = code[pc];
        bool ok = true;
        switch (in.op) {
          case CHAR:
            ok = i < n && t[i] == in.a;
            ++i;
            break;
          case CHARI:
            ok = i < n && t[i] < 128 && (t[i] | 32) == in.a;
            ++i;
            break;
          case CLASS:
            ok = i < n && classes[in.a].match(t[i]);
            ++i;
            break;
          case ANY:
            ok = i < n && t[i] != '\n';
            ++i;
            break;
          case SPLIT:
            st.push_back({in.b, i});
            pc = in.a;
            continue;
          case JMP:
            pc = in.a;
            continue;
          case BOL:
            ok = i == 0;
            break;
          case EOL:
            ok = i == n;
            break;
          case LOOK: {
            size_t e;
            ok = run(in.a, t, n, i, e, st) != in.negate;
            break;
          }
          case MATCH:
            end = i;
            found = true;
            break;
        }
        if (found || !ok) break;
        ++pc;
      }
      if (found) break;
    }
    st.resize(base);
    return found;
  }
};

Regex::Regex(const std::string& pattern) : impl_(std::make_unique<Impl>()) {
  impl_->pattern = pattern;
  Node root = Parser(pattern, impl_->classes).parse();
  impl_->progs.emplace_back();
  std::vector<Inst> main;
  impl_->compile(root, main);
  main.push_back({MATCH, false, 0, 0});
  impl_->progs[0] = std::move(main);
}
Regex::~Regex() = default;
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;
const std::string& Regex::pattern() const { return impl_->pattern; }

std::vector<std::pair<size_t, size_t>> Regex::find_all(const std::vector<uint32_t>& text) const {
  std::vector<std::pair<size_t, size_t>> out;
  const size_t n = text.size();
  Impl::Stack st;
  for (size_t i = 0; i < n;) {
    size_t end;
    if (impl_->run(0, text.data(), n, i, end, st) && end > i) {
      out.push_back({i, end});
      i = end;
    } else {
      ++i;
    }
  }
  return out;
}

}  // namespace zerorun
