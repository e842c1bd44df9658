// The Jinja subset of zerorun/jinja.h: a lexer to tokens (text, tags, expression tokens), a recursive-descent
// parser to statement and expression trees, and a tree-walking renderer over dynamically typed values.
#include "zerorun/jinja.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>
#include <functional>
#include <map>

#include "zerorun/error.h"
#include "zerorun/platform.h"

namespace zerorun {
namespace {

using ojson = nlohmann::ordered_json;

// ---------------- values ----------------
struct Value;
using List = std::vector<Value>;
struct Dict;
struct Value {
  enum Kind { Undef, None, Bool, Int, Float, Str, Arr, Obj, Fn } k = Undef;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::shared_ptr<List> arr;
  std::shared_ptr<Dict> obj;
  std::shared_ptr<std::function<Value(List&, std::vector<std::pair<std::string, Value>>&)>> fn;

  static Value none() {
    Value v;
    v.k = None;
    return v;
  }
  static Value boolean(bool x) {
    Value v;
    v.k = Bool;
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v;
    v.k = Int;
    v.i = x;
    return v;
  }
  static Value real(double x) {
    Value v;
    v.k = Float;
    v.f = x;
    return v;
  }
  static Value str(std::string x) {
    Value v;
    v.k = Str;
    v.s = std::move(x);
    return v;
  }
  static Value list(List x = {}) {
    Value v;
    v.k = Arr;
    v.arr = std::make_shared<List>(std::move(x));
    return v;
  }
  static Value dict();
  bool is_num() const { return k == Int || k == Float || k == Bool; }
  double num() const { return k == Float ? f : k == Bool ? b : static_cast<double>(i); }
};
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;
  const Value* find(const std::string& key) const {
    for (auto& [k, v] : items)
      if (k == key) return &v;
    return nullptr;
  }
  void set(const std::string& key, Value v) {
    for (auto& [k, x] : items)
      if (k == key) {
        x = std::move(v);
        return;
      }
    items.emplace_back(key, std::move(v));
  }
};
Value Value::dict() {
  Value v;
  v.k = Obj;
  v.obj = std::make_shared<Dict>();
  return v;
}

Value from_json(const ojson& j) {
  switch (j.type()) {
    case ojson::value_t::null:
      return Value::none();
    case ojson::value_t::boolean:
      return Value::boolean(j.get<bool>());
    case ojson::value_t::number_integer:
    case ojson::value_t::number_unsigned:
      return Value::integer(j.get<int64_t>());
    case ojson::value_t::number_float:
      return Value::real(j.get<double>());
    case ojson::value_t::string:
      return Value::str(j.get<std::string>());
    case ojson::value_t::array: {
      Value v = Value::list();
      for (auto& e : j) v.arr->push_back(from_json(e));
      return v;
    }
    case ojson::value_t::object: {
      Value v = Value::dict();
      for (auto it = j.begin(); it != j.end(); ++it) v.obj->items.emplace_back(it.key(), from_json(it.value()));
      return v;
    }
    default:
      return Value();
  }
}

bool truthy(const Value& v) {
  switch (v.k) {
    case Value::Undef:
    case Value::None:
      return false;
    case Value::Bool:
      return v.b;
    case Value::Int:
      return v.i != 0;
    case Value::Float:
      return v.f != 0;
    case Value::Str:
      return !v.s.empty();
    case Value::Arr:
      return !v.arr->empty();
    case Value::Obj:
      return !v.obj->items.empty() || v.obj->is_namespace;
    case Value::Fn:
      return true;
  }
  return false;
}

std::string py_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[32];
  for (int p = 1; p <= 17; ++p) {
    std::snprintf(buf, sizeof buf, "%.*g", p, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  std::string s = buf;
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

std::string json_string(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        o += "\\\"";
        break;
      case '\\':
        o += "\\\\";
        break;
      case '\n':
        o += "\\n";
        break;
      case '\r':
        o += "\\r";
        break;
      case '\t':
        o += "\\t";
        break;
      case '\b':
        o += "\\b";
        break;
      case '\f':
        o += "\\f";
        break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          o += b;
        } else {
          o += static_cast<char>(c);
        }
    }
  }
  return o + "\"";
}

std::string to_json(const Value& v, int indent, int depth) {
  const std::string item_sep = indent ? "," : ", ";
  const std::string pad = indent ? "\n" + std::string(static_cast<size_t>(indent * depth), ' ') : "";
  const std::string child = indent ? pad + std::string(static_cast<size_t>(indent), ' ') : "";
  switch (v.k) {
    case Value::Undef:
    case Value::None:
    case Value::Fn:
      return "null";
    case Value::Bool:
      return v.b ? "true" : "false";
    case Value::Int:
      return std::to_string(v.i);
    case Value::Float: {
      std::string s = py_float(v.f);
      if (s.size() > 2 && s.compare(s.size() - 2, 2, ".0") == 0) s.resize(s.size() - 2);  // JSON.stringify
      return s;
    }
    case Value::Str:
      return json_string(v.s);
    case Value::Arr: {
      if (v.arr->empty()) return "[]";
      std::string o = "[";
      for (size_t i = 0; i < v.arr->size(); ++i)
        o += (i ? item_sep : "") + child + to_json((*v.arr)[i], indent, depth + 1);
      return o + pad + "]";
    }
    case Value::Obj: {
      if (v.obj->items.empty()) return "{}";
      std::string o = "{";
      size_t n = 0;
      for (auto& [k, x] : v.obj->items)
        o += (n++ ? item_sep : "") + child + json_string(k) + ": " + to_json(x, indent, depth + 1);
      return o + pad + "}";
    }
  }
  return "null";
}

std::string repr(const Value& v);
std::string to_str(const Value& v) {
  switch (v.k) {
    case Value::Undef:
      return "";
    case Value::None:
      return "None";
    case Value::Bool:
      return v.b ? "True" : "False";
    case Value::Int:
      return std::to_string(v.i);
    case Value::Float:
      return py_float(v.f);
    case Value::Str:
      return v.s;
    case Value::Arr: {
      std::string o = "[";
      for (size_t i = 0; i < v.arr->size(); ++i) o += (i ? ", " : "") + repr((*v.arr)[i]);
      return o + "]";
    }
    case Value::Obj: {
      std::string o = "{";
      size_t n = 0;
      for (auto& [k, x] : v.obj->items) o += (n++ ? ", " : "") + repr(Value::str(k)) + ": " + repr(x);
      return o + "}";
    }
    case Value::Fn:
      return "<function>";
  }
  return "";
}
std::string repr(const Value& v) {
  if (v.k != Value::Str) return to_str(v);
  const char q = v.s.find('\'') != std::string::npos && v.s.find('"') == std::string::npos ? '"' : '\'';
  std::string o(1, q);
  for (char c : v.s) {
    if (c == q || c == '\\') o += '\\';
    if (c == '\n') {
      o += "\\n";
      continue;
    }
    o += c;
  }
  return o + q;
}

bool equal(const Value& a, const Value& b) {
  if (a.is_num() && b.is_num()) return a.num() == b.num();
  if (a.k != b.k) return false;
  switch (a.k) {
    case Value::Undef:
    case Value::None:
      return true;
    case Value::Str:
      return a.s == b.s;
    case Value::Arr:
      if (a.arr->size() != b.arr->size()) return false;
      for (size_t i = 0; i < a.arr->size(); ++i)
        if (!equal((*a.arr)[i], (*b.arr)[i])) return false;
      return true;
    case Value::Obj:
      if (a.obj->items.size() != b.obj->items.size()) return false;
      for (auto& [k, v] : a.obj->items) {
        const Value* o = b.obj->find(k);
        if (!o || !equal(v, *o)) return false;
      }
      return true;
    default:
      return a.obj == b.obj && a.fn == b.fn;
  }
}

// ---------------- lexer ----------------
enum class T { Text, ExprOpen, ExprClose, StmtOpen, StmtClose, Name, String, Int, Float, Op, End };
struct Tok {
  T t;
  std::string s;
  int line;
};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// As @huggingface/jinja and transformers (trim_blocks, lstrip_blocks, no trailing newline) prepare a template.
std::string preprocess(std::string t) {
  if (!t.empty() && t.back() == '\n') t.pop_back();
  std::string o;
  o.reserve(t.size());
  // lstrip_blocks: spaces and tabs from a line's start up to "{%", "{#" or "{-"
  for (size_t i = 0; i < t.size();) {
    const bool line_start = i == 0 || t[i - 1] == '\n';
    if (line_start) {
      size_t j = i;
      while (j < t.size() && (t[j] == ' ' || t[j] == '\t')) ++j;
      if (j + 1 < t.size() && t[j] == '{' && (t[j + 1] == '%' || t[j + 1] == '#' || t[j + 1] == '-')) i = j;
    }
    const size_t nl = t.find('\n', i);
    const size_t end = nl == std::string::npos ? t.size() : nl + 1;
    o.append(t, i, end - i);
    i = end;
  }
  // trim_blocks: the newline after "%}", "#}" or "-}"
  std::string r;
  r.reserve(o.size());
  for (size_t i = 0; i < o.size(); ++i) {
    r += o[i];
    if (o[i] == '}' && i > 0 && (o[i - 1] == '%' || o[i - 1] == '#' || o[i - 1] == '-') && i + 1 < o.size() &&
        o[i + 1] == '\n')
      ++i;
  }
  return r;
}

class Lexer {
 public:
  Lexer(const std::string& src, const std::string& name) : s_(src), name_(name) {}
  std::vector<Tok> run() {
    bool strip_next = false;
    while (i_ < s_.size()) {
      size_t open = s_.size();
      for (size_t k = i_; k + 1 < s_.size(); ++k)
        if (s_[k] == '{' && (s_[k + 1] == '{' || s_[k + 1] == '%' || s_[k + 1] == '#')) {
          open = k;
          break;
        }
      std::string text = s_.substr(i_, open - i_);
      const int text_line = line_;
      count_lines(i_, open);
      i_ = open;
      bool strip_prev = i_ + 2 < s_.size() && s_[i_ + 2] == '-';
      if (strip_next) {
        size_t k = 0;
        while (k < text.size() && is_space(text[k])) ++k;
        text.erase(0, k);
      }
      if (strip_prev && i_ < s_.size())
        while (!text.empty() && is_space(text.back())) text.pop_back();
      if (!text.empty()) out_.push_back({T::Text, text, text_line});
      strip_next = false;
      if (i_ >= s_.size()) break;
      const char kind = s_[i_ + 1];
      i_ += 2;
      if (strip_prev) ++i_;
      if (kind == '#') {
        const size_t close = s_.find("#}", i_);
        if (close == std::string::npos) fail("unterminated comment");
        strip_next = close > i_ && s_[close - 1] == '-';
        count_lines(i_, close + 2);
        i_ = close + 2;
        continue;
      }
      out_.push_back({kind == '{' ? T::ExprOpen : T::StmtOpen, "", line_});
      strip_next = code(kind == '{' ? '}' : '%');
      out_.push_back({kind == '{' ? T::ExprClose : T::StmtClose, "", line_});
    }
    out_.push_back({T::End, "", line_});
    return std::move(out_);
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { ZR_FAIL(name_, ":", line_, ": ", what); }
  void count_lines(size_t a, size_t b) {
    for (size_t k = a; k < b && k < s_.size(); ++k) line_ += s_[k] == '\n';
  }
  // Expression tokens up to "}}" or "%}"; returns whether the tag ended with '-' (strip the next text).
  bool code(char close) {
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (is_space(c)) {
        line_ += c == '\n';
        ++i_;
        continue;
      }
      if (c == '-' && i_ + 2 < s_.size() && s_[i_ + 1] == close && s_[i_ + 2] == '}') {
        i_ += 3;
        return true;
      }
      if (c == close && i_ + 1 < s_.size() && s_[i_ + 1] == '}') {
        i_ += 2;
        return false;
      }
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t j = i_;
        while (j < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[j])) || s_[j] == '_')) ++j;
        out_.push_back({T::Name, s_.substr(i_, j - i_), line_});
        i_ = j;
        continue;
      }
      if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t j = i_;
        bool fl = false;
        while (j < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[j])) || s_[j] == '_')) ++j;
        if (j + 1 < s_.size() && s_[j] == '.' && std::isdigit(static_cast<unsigned char>(s_[j + 1]))) {
          fl = true;
          ++j;
          while (j < s_.size() && std::isdigit(static_cast<unsigned char>(s_[j]))) ++j;
        }
        if (j < s_.size() && (s_[j] == 'e' || s_[j] == 'E')) {
          size_t k = j + 1;
          if (k < s_.size() && (s_[k] == '+' || s_[k] == '-')) ++k;
          if (k < s_.size() && std::isdigit(static_cast<unsigned char>(s_[k]))) {
            fl = true;
            j = k;
            while (j < s_.size() && std::isdigit(static_cast<unsigned char>(s_[j]))) ++j;
          }
        }
        std::string num = s_.substr(i_, j - i_);
        num.erase(std::remove(num.begin(), num.end(), '_'), num.end());
        out_.push_back({fl ? T::Float : T::Int, num, line_});
        i_ = j;
        continue;
      }
      if (c == '\'' || c == '"') {
        std::string v;
        size_t j = i_ + 1;
        for (;; ++j) {
          if (j >= s_.size()) fail("unterminated string");
          if (s_[j] == c) break;
          if (s_[j] == '\\' && j + 1 < s_.size()) {
            const char e = s_[++j];
            switch (e) {
              case 'n':
                v += '\n';
                break;
              case 't':
                v += '\t';
                break;
              case 'r':
                v += '\r';
                break;
              case 'b':
                v += '\b';
                break;
              case 'f':
                v += '\f';
                break;
              case 'v':
                v += '\v';
                break;
              case '\\':
                v += '\\';
                break;
              case '\'':
                v += '\'';
                break;
              case '"':
                v += '"';
                break;
              default:
                v += '\\';
                v += e;
            }
            continue;
          }
          line_ += s_[j] == '\n';
          v += s_[j];
        }
        out_.push_back({T::String, v, line_});
        i_ = j + 1;
        continue;
      }
      static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                         ">",  "(",  ")",  "[",  "]",  "{",  "}", ",", ".", ":", "|", "="};
      bool found = false;
      for (const char* op : kOps) {
        const size_t n = std::strlen(op);
        if (s_.compare(i_, n, op) == 0) {
          out_.push_back({T::Op, op, line_});
          i_ += n;
          found = true;
          break;
        }
      }
      if (!found) fail(std::string("unexpected character '") + c + "'");
    }
    fail(close == '}' ? "unterminated {{" : "unterminated {%");
  }

  const std::string& s_;
  const std::string& name_;
  size_t i_ = 0;
  int line_ = 1;
  std::vector<Tok> out_;
};

// ---------------- trees ----------------
struct Expr;
using ExprP = std::unique_ptr<Expr>;
struct Expr {
  enum K { Lit, Var, Attr, Index, Slice, Call, Filter, Test, Neg, Bin, And, Or, Not, Cond, ListLit, DictLit } k;
  Value lit;
  std::string name;  // Var/Attr/Filter/Test name, Bin operator
  std::vector<ExprP> kids;
  std::vector<std::pair<std::string, ExprP>> kwargs;
  bool negate = false;
  int line = 0;
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;
struct Stmt {
  enum K { Text, Out, If, For, Set, SetBlock, Macro, Break, Continue, Nop } k;
  std::string text;
  ExprP e, e2, cond;  // Out: e; For: e = iterable, cond; Set: e = value, e2 = target attr obj
  std::vector<std::pair<ExprP, Body>> branches;  // If (a null condition: else)
  std::vector<std::string> names;                // For / Set targets; Macro params
  std::vector<ExprP> defaults;                   // Macro parameter defaults (null: none)
  std::string attr;                              // Set ns.attr
  Body body, else_body;
  int line = 0;
};

class Parser {
 public:
  Parser(std::vector<Tok> toks, const std::string& name) : t_(std::move(toks)), name_(name) {}
  Body parse() {
    Body b = block({});
    if (peek().t != T::End) fail("unexpected {% " + stmt_word() + " %}");
    return b;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { ZR_FAIL(name_, ":", peek().line, ": ", what); }
  const Tok& peek(size_t k = 0) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  bool is_op(const char* op, size_t k = 0) const { return peek(k).t == T::Op && peek(k).s == op; }
  bool is_name(const char* n, size_t k = 0) const { return peek(k).t == T::Name && peek(k).s == n; }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(std::string("expected '") + op + "', got '" + peek().s + "'");
    ++p_;
  }
  std::string expect_name() {
    if (peek().t != T::Name) fail("expected a name, got '" + peek().s + "'");
    return t_[p_++].s;
  }
  void expect(T t, const char* what) {
    if (peek().t != t) fail(std::string("expected ") + what + ", got '" + peek().s + "'");
    ++p_;
  }
  std::string stmt_word() const { return peek().t == T::StmtOpen && peek(1).t == T::Name ? peek(1).s : peek().s; }

  // Statements until a {% word %} in `ends` (left unconsumed: the StmtOpen is the current token).
  Body block(const std::vector<std::string>& ends) {
    Body b;
    for (;;) {
      const Tok& tk = peek();
      if (tk.t == T::End) {
        if (!ends.empty()) fail("missing {% " + ends.back() + " %}");
        return b;
      }
      if (tk.t == T::Text) {
        auto s = std::make_unique<Stmt>();
        s->k = Stmt::Text;
        s->text = tk.s;
        ++p_;
        b.push_back(std::move(s));
      } else if (tk.t == T::ExprOpen) {
        ++p_;
        auto s = std::make_unique<Stmt>();
        s->k = Stmt::Out;
        s->line = tk.line;
        s->e = expr();
        expect(T::ExprClose, "}}");
        b.push_back(std::move(s));
      } else if (tk.t == T::StmtOpen) {
        const std::string w = stmt_word();
        if (std::find(ends.begin(), ends.end(), w) != ends.end()) return b;
        ++p_;
        b.push_back(statement());
      } else {
        fail("unexpected '" + tk.s + "'");
      }
    }
  }
  void close() { expect(T::StmtClose, "%}"); }
  void end_tag(const char* word) {
    expect(T::StmtOpen, "{%");
    if (!is_name(word)) fail(std::string("expected {% ") + word + " %}");
    ++p_;
    close();
  }
  std::unique_ptr<Stmt> statement() {
    auto s = std::make_unique<Stmt>();
    s->line = peek().line;
    const std::string w = expect_name();
    if (w == "if") {
      s->k = Stmt::If;
      ExprP c = expr();
      close();
      for (;;) {
        Body body = block({"elif", "else", "endif"});
        s->branches.emplace_back(std::move(c), std::move(body));
        ++p_;  // {%
        const std::string kw = expect_name();
        if (kw == "elif") {
          c = expr();
          close();
        } else if (kw == "else") {
          close();
          s->branches.emplace_back(nullptr, block({"endif"}));
          end_tag("endif");
          break;
        } else {
          close();
          break;
        }
      }
    } else if (w == "for") {
      s->k = Stmt::For;
      s->names.push_back(expect_name());
      while (is_op(",")) {
        ++p_;
        s->names.push_back(expect_name());
      }
      if (!is_name("in")) fail("expected 'in' in {% for %}");
      ++p_;
      s->e = expr(false);
      if (is_name("if")) {
        ++p_;
        s->cond = expr(false);
      }
      if (is_name("recursive")) fail("recursive loops are not supported");
      close();
      s->body = block({"else", "endfor"});
      if (is_name("else", 1)) {
        p_ += 2;
        close();
        s->else_body = block({"endfor"});
      }
      end_tag("endfor");
    } else if (w == "set") {
      std::string target = expect_name();
      if (is_op(".")) {
        ++p_;
        s->attr = expect_name();
      }
      s->names.push_back(target);
      while (is_op(",")) {
        ++p_;
        s->names.push_back(expect_name());
      }
      if (is_op("=")) {
        ++p_;
        s->k = Stmt::Set;
        s->e = expr();
        close();
      } else {
        s->k = Stmt::SetBlock;
        close();
        s->body = block({"endset"});
        end_tag("endset");
      }
    } else if (w == "macro") {
      s->k = Stmt::Macro;
      s->text = expect_name();
      expect_op("(");
      while (!is_op(")")) {
        s->names.push_back(expect_name());
        if (is_op("=")) {
          ++p_;
          s->defaults.push_back(expr());
        } else {
          s->defaults.push_back(nullptr);
        }
        if (!is_op(")")) expect_op(",");
      }
      ++p_;
      close();
      s->body = block({"endmacro"});
      end_tag("endmacro");
    } else if (w == "break" || w == "continue") {
      s->k = w == "break" ? Stmt::Break : Stmt::Continue;
      close();
    } else if (w == "generation" || w == "endgeneration") {
      s->k = Stmt::Nop;
      close();
    } else {
      --p_;
      fail("unsupported statement {% " + w + " %}");
    }
    return s;
  }

  int64_t int_literal(const std::string& s) const {
    if (s.size() > 18) fail("integer literal " + s + " is too large");
    return std::stoll(s);
  }
  ExprP node(Expr::K k, int line) {
    auto e = std::make_unique<Expr>();
    e->k = k;
    e->line = line;
    return e;
  }
  // expr: or ['if' or ['else' expr]], and a bare tuple "a, b" is not accepted here (only in parentheses)
  ExprP expr(bool with_cond = true) {
    ExprP a = or_expr();
    if (with_cond && is_name("if")) {
      ++p_;
      auto c = node(Expr::Cond, peek().line);
      ExprP cond = or_expr();
      ExprP other;
      if (is_name("else")) {
        ++p_;
        other = expr();
      } else {
        other = node(Expr::Lit, c->line);
      }
      c->kids.push_back(std::move(a));
      c->kids.push_back(std::move(cond));
      c->kids.push_back(std::move(other));
      return c;
    }
    return a;
  }
  ExprP or_expr() {
    ExprP a = and_expr();
    while (is_name("or")) {
      auto n = node(Expr::Or, peek().line);
      ++p_;
      n->kids.push_back(std::move(a));
      n->kids.push_back(and_expr());
      a = std::move(n);
    }
    return a;
  }
  ExprP and_expr() {
    ExprP a = not_expr();
    while (is_name("and")) {
      auto n = node(Expr::And, peek().line);
      ++p_;
      n->kids.push_back(std::move(a));
      n->kids.push_back(not_expr());
      a = std::move(n);
    }
    return a;
  }
  ExprP not_expr() {
    if (is_name("not")) {
      auto n = node(Expr::Not, peek().line);
      ++p_;
      n->kids.push_back(not_expr());
      return n;
    }
    return compare();
  }
  ExprP bin(const std::string& op, ExprP a, ExprP b) {
    auto n = node(Expr::Bin, a->line);
    n->name = op;
    n->kids.push_back(std::move(a));
    n->kids.push_back(std::move(b));
    return n;
  }
  ExprP compare() {
    ExprP a = math1();
    for (;;) {
      if (peek().t == T::Op && (peek().s == "==" || peek().s == "!=" || peek().s == "<" || peek().s == ">" ||
                                peek().s == "<=" || peek().s == ">=")) {
        const std::string op = t_[p_++].s;
        a = bin(op, std::move(a), math1());
      } else if (is_name("in")) {
        ++p_;
        a = bin("in", std::move(a), math1());
      } else if (is_name("not") && is_name("in", 1)) {
        p_ += 2;
        a = bin("not in", std::move(a), math1());
      } else {
        return a;
      }
    }
  }
  ExprP math1() {
    ExprP a = concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = t_[p_++].s;
      a = bin(op, std::move(a), concat());
    }
    return a;
  }
  ExprP concat() {
    ExprP a = math2();
    while (is_op("~")) {
      ++p_;
      a = bin("~", std::move(a), math2());
    }
    return a;
  }
  ExprP math2() {
    ExprP a = power();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = t_[p_++].s;
      a = bin(op, std::move(a), power());
    }
    return a;
  }
  ExprP power() {
    ExprP a = unary();
    while (is_op("**")) {
      ++p_;
      a = bin("**", std::move(a), unary());
    }
    return a;
  }
  ExprP unary() {
    if (is_op("-")) {
      auto n = node(Expr::Neg, peek().line);
      ++p_;
      n->kids.push_back(unary());
      return n;
    }
    if (is_op("+")) {
      ++p_;
      return unary();
    }
    return filters(postfix(primary()));
  }
  void call_args(Expr& n) {  // after '('
    while (!is_op(")")) {
      if (peek().t == T::Name && is_op("=", 1)) {
        std::string k = t_[p_].s;
        p_ += 2;
        n.kwargs.emplace_back(k, expr());
      } else {
        n.kids.push_back(expr());
      }
      if (!is_op(")")) expect_op(",");
    }
    ++p_;
  }
  ExprP postfix(ExprP a) {
    for (;;) {
      if (is_op(".")) {
        ++p_;
        auto n = node(Expr::Attr, peek().line);
        if (peek().t == T::Int) {  // x.0
          n->k = Expr::Index;
          n->kids.push_back(std::move(a));
          auto l = node(Expr::Lit, peek().line);
          l->lit = Value::integer(int_literal(t_[p_++].s));
          n->kids.push_back(std::move(l));
        } else {
          n->name = expect_name();
          n->kids.push_back(std::move(a));
        }
        a = std::move(n);
      } else if (is_op("[")) {
        ++p_;
        auto n = node(Expr::Index, peek().line);
        n->kids.push_back(std::move(a));
        ExprP parts[3];
        int colons = 0;
        while (!is_op("]")) {
          if (is_op(":")) {
            if (++colons > 2) fail("too many ':' in a slice");
            ++p_;
            continue;
          }
          parts[colons] = expr();
        }
        ++p_;
        if (colons) {
          n->k = Expr::Slice;
          for (auto& x : parts) n->kids.push_back(std::move(x));
        } else {
          if (!parts[0]) fail("empty subscript");
          n->kids.push_back(std::move(parts[0]));
        }
        a = std::move(n);
      } else if (is_op("(")) {
        ++p_;
        auto n = node(Expr::Call, a->line);
        n->kids.push_back(std::move(a));
        call_args(*n);
        a = std::move(n);
      } else {
        return a;
      }
    }
  }
  ExprP filters(ExprP a) {
    for (;;) {
      if (is_op("|")) {
        ++p_;
        auto n = node(Expr::Filter, peek().line);
        n->name = expect_name();
        n->kids.push_back(std::move(a));
        if (is_op("(")) {
          ++p_;
          call_args(*n);
        }
        a = std::move(n);
      } else if (is_name("is")) {
        ++p_;
        auto n = node(Expr::Test, peek().line);
        if (is_name("not")) {
          ++p_;
          n->negate = true;
        }
        n->name = expect_name();
        n->kids.push_back(std::move(a));
        if (is_op("(")) {
          ++p_;
          call_args(*n);
        } else if (peek().t == T::String || peek().t == T::Int || peek().t == T::Float ||
                   (peek().t == T::Name && !is_name("and") && !is_name("or") && !is_name("else") && !is_name("if") &&
                    !is_name("in") && !is_name("not") && !is_name("is"))) {
          n->kids.push_back(postfix(primary()));
        }
        a = std::move(n);
      } else {
        return a;
      }
    }
  }
  ExprP primary() {
    const Tok tk = peek();
    auto lit = [&](Value v) {
      auto n = node(Expr::Lit, tk.line);
      n->lit = std::move(v);
      ++p_;
      return n;
    };
    switch (tk.t) {
      case T::String: {
        std::string s = tk.s;
        ++p_;
        while (peek().t == T::String) s += t_[p_++].s;  // "a" "b"
        auto n = node(Expr::Lit, tk.line);
        n->lit = Value::str(s);
        return n;
      }
      case T::Int:
        return lit(Value::integer(int_literal(tk.s)));
      case T::Float:
        return lit(Value::real(std::strtod(tk.s.c_str(), nullptr)));
      case T::Name:
        if (tk.s == "true" || tk.s == "True") return lit(Value::boolean(true));
        if (tk.s == "false" || tk.s == "False") return lit(Value::boolean(false));
        if (tk.s == "none" || tk.s == "None") return lit(Value::none());
        {
          auto n = node(Expr::Var, tk.line);
          n->name = tk.s;
          ++p_;
          return n;
        }
      case T::Op:
        if (tk.s == "(") {
          ++p_;
          ExprP e = expr();
          if (is_op(",")) {  // a tuple
            auto l = node(Expr::ListLit, tk.line);
            l->kids.push_back(std::move(e));
            while (is_op(",")) {
              ++p_;
              if (is_op(")")) break;
              l->kids.push_back(expr());
            }
            e = std::move(l);
          }
          expect_op(")");
          return e;
        }
        if (tk.s == "[") {
          ++p_;
          auto l = node(Expr::ListLit, tk.line);
          while (!is_op("]")) {
            l->kids.push_back(expr());
            if (!is_op("]")) expect_op(",");
          }
          ++p_;
          return l;
        }
        if (tk.s == "{") {
          ++p_;
          auto d = node(Expr::DictLit, tk.line);
          while (!is_op("}")) {
            d->kids.push_back(expr());
            expect_op(":");
            d->kids.push_back(expr());
            if (!is_op("}")) expect_op(",");
          }
          ++p_;
          return d;
        }
        break;
      default:
        break;
    }
    fail("unexpected '" + tk.s + "' in an expression");
  }

  std::vector<Tok> t_;
  size_t p_ = 0;
  const std::string& name_;
};

// ---------------- renderer ----------------
struct LoopSignal {
  bool brk;
};

class Renderer {
 public:
  Renderer(const std::string& name) : name_(name) { frames_.emplace_back(); }
  std::vector<std::map<std::string, Value>> frames_;

  [[noreturn]] void fail(int line, const std::string& what) const { ZR_FAIL(name_, ":", line, ": ", what); }

  Value lookup(const std::string& n) const {
    for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
      auto f = it->find(n);
      if (f != it->end()) return f->second;
    }
    return Value();
  }

  void render(const Body& body, std::string& out) {
    for (auto& s : body) exec(*s, out);
  }

  void exec(const Stmt& s, std::string& out) {
    switch (s.k) {
      case Stmt::Text:
        out += s.text;
        break;
      case Stmt::Out:
        out += to_str(eval(*s.e));
        break;
      case Stmt::Nop:
        break;
      case Stmt::If:
        for (auto& [c, body] : s.branches)
          if (!c || truthy(eval(*c))) {
            render(body, out);
            break;
          }
        break;
      case Stmt::For:
        exec_for(s, out);
        break;
      case Stmt::Set: {
        Value v = eval(*s.e);
        if (!s.attr.empty()) {
          Value ns = lookup(s.names[0]);
          if (ns.k != Value::Obj || !ns.obj->is_namespace)
            fail(s.line, "{% set " + s.names[0] + "." + s.attr + " %}: '" + s.names[0] + "' is not a namespace()");
          ns.obj->set(s.attr, std::move(v));
        } else if (s.names.size() == 1) {
          frames_.back()[s.names[0]] = std::move(v);
        } else {
          if (v.k != Value::Arr || v.arr->size() != s.names.size())
            fail(s.line, "{% set %}: cannot unpack into " + std::to_string(s.names.size()) + " names");
          for (size_t i = 0; i < s.names.size(); ++i) frames_.back()[s.names[i]] = (*v.arr)[i];
        }
        break;
      }
      case Stmt::SetBlock: {
        std::string o;
        render(s.body, o);
        frames_.back()[s.names[0]] = Value::str(o);
        break;
      }
      case Stmt::Macro: {
        const Stmt* m = &s;
        Value fn;
        fn.k = Value::Fn;
        fn.fn = std::make_shared<std::function<Value(List&, std::vector<std::pair<std::string, Value>>&)>>(
            [this, m](List& args, std::vector<std::pair<std::string, Value>>& kw) {
              std::map<std::string, Value> f;
              for (size_t i = 0; i < m->names.size(); ++i) {
                if (i < args.size())
                  f[m->names[i]] = args[i];
                else if (m->defaults[i])
                  f[m->names[i]] = eval(*m->defaults[i]);
                else
                  f[m->names[i]] = Value();
              }
              for (auto& [k, v] : kw) f[k] = v;
              frames_.push_back(std::move(f));
              std::string o;
              try {
                render(m->body, o);
              } catch (...) {
                frames_.pop_back();
                throw;
              }
              frames_.pop_back();
              return Value::str(o);
            });
        frames_.back()[s.text] = fn;
        break;
      }
      case Stmt::Break:
        throw LoopSignal{true};
      case Stmt::Continue:
        throw LoopSignal{false};
    }
  }

  List iterate(const Value& v, int line) {
    switch (v.k) {
      case Value::Arr:
        return *v.arr;
      case Value::Obj: {
        List l;
        for (auto& [k, x] : v.obj->items) l.push_back(Value::str(k));
        return l;
      }
      case Value::Str: {
        List l;
        for (size_t i = 0; i < v.s.size();) {
          size_t n = 1;
          const unsigned char c = static_cast<unsigned char>(v.s[i]);
          if (c >= 0xF0)
            n = 4;
          else if (c >= 0xE0)
            n = 3;
          else if (c >= 0xC0)
            n = 2;
          l.push_back(Value::str(v.s.substr(i, n)));
          i += n;
        }
        return l;
      }
      case Value::Undef:
      case Value::None:
        return {};
      default:
        fail(line, "cannot iterate over " + repr(v));
    }
  }

  void exec_for(const Stmt& s, std::string& out) {
    List items = iterate(eval(*s.e), s.line);
    auto bind = [&](std::map<std::string, Value>& f, const Value& item) {
      if (s.names.size() == 1) {
        f[s.names[0]] = item;
        return;
      }
      if (item.k != Value::Arr || item.arr->size() != s.names.size())
        fail(s.line, "{% for %}: cannot unpack " + repr(item) + " into " + std::to_string(s.names.size()) + " names");
      for (size_t i = 0; i < s.names.size(); ++i) f[s.names[i]] = (*item.arr)[i];
    };
    if (s.cond) {  // `for x in xs if cond`: filtered before the loop variables are counted
      List kept;
      for (auto& item : items) {
        frames_.emplace_back();
        bind(frames_.back(), item);
        const bool keep = truthy(eval(*s.cond));
        frames_.pop_back();
        if (keep) kept.push_back(item);
      }
      items.swap(kept);
    }
    if (items.empty()) {
      render(s.else_body, out);
      return;
    }
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      std::map<std::string, Value> f;
      bind(f, items[static_cast<size_t>(i)]);
      Value loop = Value::dict();
      loop.obj->set("index", Value::integer(i + 1));
      loop.obj->set("index0", Value::integer(i));
      loop.obj->set("revindex", Value::integer(n - i));
      loop.obj->set("revindex0", Value::integer(n - i - 1));
      loop.obj->set("first", Value::boolean(i == 0));
      loop.obj->set("last", Value::boolean(i == n - 1));
      loop.obj->set("length", Value::integer(n));
      loop.obj->set("previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value());
      loop.obj->set("nextitem", i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value());
      f["loop"] = loop;
      frames_.push_back(std::move(f));
      bool brk = false;
      try {
        render(s.body, out);
      } catch (const LoopSignal& sig) {
        brk = sig.brk;
      } catch (...) {
        frames_.pop_back();
        throw;
      }
      frames_.pop_back();
      if (brk) break;
    }
  }

  static int64_t norm_index(int64_t i, int64_t n) { return i < 0 ? i + n : i; }

  Value slice(const Value& v, const Expr& e) {
    int64_t n = v.k == Value::Str   ? static_cast<int64_t>(v.s.size())
                : v.k == Value::Arr ? static_cast<int64_t>(v.arr->size())
                                    : -1;
    if (n < 0) fail(e.line, "cannot slice " + repr(v));
    auto get = [&](int k, bool& given) -> int64_t {
      if (!e.kids[static_cast<size_t>(k)]) {
        given = false;
        return 0;
      }
      Value x = eval(*e.kids[static_cast<size_t>(k)]);
      given = x.k != Value::None && x.k != Value::Undef;
      return given ? static_cast<int64_t>(x.num()) : 0;
    };
    bool hs, he, hp;
    int64_t start = get(1, hs), stop = get(2, he), step = get(3, hp);
    if (!hp) step = 1;
    if (step == 0) fail(e.line, "slice step cannot be zero");
    auto clamp = [&](int64_t x, bool given, int64_t dflt) {
      if (!given) return dflt;
      if (x < 0) x += n;
      if (step > 0) return std::max<int64_t>(0, std::min(x, n));
      return std::max<int64_t>(-1, std::min(x, n - 1));
    };
    start = clamp(start, hs, step > 0 ? 0 : n - 1);
    stop = clamp(stop, he, step > 0 ? n : -1);
    if (v.k == Value::Str) {
      std::string o;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) o += v.s[static_cast<size_t>(i)];
      return Value::str(o);
    }
    Value o = Value::list();
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
      o.arr->push_back((*v.arr)[static_cast<size_t>(i)]);
    return o;
  }

  Value attr(const Value& v, const std::string& name) {
    if (v.k == Value::Obj) {
      if (const Value* x = v.obj->find(name)) return *x;
    }
    return Value();
  }

  Value index(const Value& v, const Value& key, int line) {
    if (v.k == Value::Obj) {
      if (key.k != Value::Str) return Value();
      const Value* x = v.obj->find(key.s);
      return x ? *x : Value();
    }
    if (v.k == Value::Arr || v.k == Value::Str) {
      if (key.k != Value::Int) fail(line, "list and string indices must be integers, got " + repr(key));
      const int64_t n = v.k == Value::Arr ? static_cast<int64_t>(v.arr->size()) : static_cast<int64_t>(v.s.size());
      const int64_t i = norm_index(key.i, n);
      if (i < 0 || i >= n) return Value();
      return v.k == Value::Arr ? (*v.arr)[static_cast<size_t>(i)]
                               : Value::str(std::string(1, v.s[static_cast<size_t>(i)]));
    }
    return Value();
  }

  static std::string strip_chars(const std::string& s, const Value* chars, bool left, bool right) {
    auto in = [&](char c) {
      if (!chars || chars->k == Value::None || chars->k == Value::Undef) return is_space(c);
      return chars->s.find(c) != std::string::npos;
    };
    size_t a = 0, b = s.size();
    if (left)
      while (a < b && in(s[a])) ++a;
    if (right)
      while (b > a && in(s[b - 1])) --b;
    return s.substr(a, b - a);
  }
  static std::string title(const std::string& s) {
    std::string o = s;
    bool start = true;
    for (char& c : o) {
      if (std::isalpha(static_cast<unsigned char>(c))) {
        c = static_cast<char>(start ? std::toupper(static_cast<unsigned char>(c))
                                    : std::tolower(static_cast<unsigned char>(c)));
        start = false;
      } else {
        start = true;
      }
    }
    return o;
  }
  static std::string lower(std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  }
  static std::string upper(std::string s) {
    for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return s;
  }
  static std::string replace(std::string s, const std::string& a, const std::string& b, int64_t count = -1) {
    if (a.empty()) return s;
    std::string o;
    size_t i = 0;
    for (size_t j; count != 0 && (j = s.find(a, i)) != std::string::npos; i = j + a.size(), --count)
      o.append(s, i, j - i).append(b);
    return o.append(s, i, std::string::npos);
  }
  static List split(const std::string& s, const Value* sep, int64_t maxsplit) {
    List l;
    if (!sep || sep->k != Value::Str) {
      size_t i = 0;
      while (i < s.size()) {
        while (i < s.size() && is_space(s[i])) ++i;
        if (i >= s.size()) break;
        if (maxsplit >= 0 && static_cast<int64_t>(l.size()) == maxsplit) {
          l.push_back(Value::str(strip_chars(s.substr(i), nullptr, false, true)));
          break;
        }
        size_t j = i;
        while (j < s.size() && !is_space(s[j])) ++j;
        l.push_back(Value::str(s.substr(i, j - i)));
        i = j;
      }
      return l;
    }
    size_t i = 0;
    for (size_t j;
         (maxsplit < 0 || static_cast<int64_t>(l.size()) < maxsplit) && (j = s.find(sep->s, i)) != std::string::npos;
         i = j + sep->s.size())
      l.push_back(Value::str(s.substr(i, j - i)));
    l.push_back(Value::str(s.substr(i)));
    return l;
  }

  Value method(const Value& obj, const std::string& m, List& a, std::vector<std::pair<std::string, Value>>& kw,
               int line, bool& found) {
    found = true;
    auto arg = [&](size_t i, const char* name) -> const Value* {
      if (i < a.size()) return &a[i];
      for (auto& [k, v] : kw)
        if (k == name) return &v;
      return nullptr;
    };
    if (obj.k == Value::Str) {
      const std::string& s = obj.s;
      if (m == "strip") return Value::str(strip_chars(s, arg(0, "chars"), true, true));
      if (m == "lstrip") return Value::str(strip_chars(s, arg(0, "chars"), true, false));
      if (m == "rstrip") return Value::str(strip_chars(s, arg(0, "chars"), false, true));
      if (m == "upper") return Value::str(upper(s));
      if (m == "lower") return Value::str(lower(s));
      if (m == "title") return Value::str(title(s));
      if (m == "capitalize") return Value::str(s.empty() ? s : upper(s.substr(0, 1)) + lower(s.substr(1)));
      if (m == "startswith" || m == "endswith") {
        const Value* p = arg(0, "prefix");
        if (!p) fail(line, m + "() needs an argument");
        List opts = p->k == Value::Arr ? *p->arr : List{*p};
        for (auto& o : opts) {
          if (o.k != Value::Str) continue;
          if (m == "startswith" ? s.compare(0, o.s.size(), o.s) == 0 && s.size() >= o.s.size()
                                : s.size() >= o.s.size() && s.compare(s.size() - o.s.size(), o.s.size(), o.s) == 0)
            return Value::boolean(true);
        }
        return Value::boolean(false);
      }
      if (m == "split") {
        const Value* ms = arg(1, "maxsplit");
        return Value::list(split(s, arg(0, "sep"), ms ? ms->i : -1));
      }
      if (m == "replace") {
        const Value* c = arg(2, "count");
        if (a.size() < 2) fail(line, "replace() needs two arguments");
        return Value::str(replace(s, to_str(a[0]), to_str(a[1]), c ? c->i : -1));
      }
      if (m == "find") {
        const size_t p = a.empty() ? std::string::npos : s.find(to_str(a[0]));
        return Value::integer(p == std::string::npos ? -1 : static_cast<int64_t>(p));
      }
      if (m == "count") {
        if (a.empty() || a[0].s.empty()) return Value::integer(0);
        int64_t c = 0;
        for (size_t i = 0; (i = s.find(a[0].s, i)) != std::string::npos; i += a[0].s.size()) ++c;
        return Value::integer(c);
      }
      if (m == "join") {
        std::string r;  // s is the separator
        size_t k = 0;
        if (!a.empty())
          for (auto& x : iterate(a[0], line)) r += (k++ ? s : "") + to_str(x);
        return Value::str(r);
      }
      if (m == "splitlines") {
        List l;
        size_t i = 0;
        while (i < s.size()) {
          size_t j = s.find('\n', i);
          if (j == std::string::npos) j = s.size();
          std::string line_s = s.substr(i, j - i);
          if (!line_s.empty() && line_s.back() == '\r') line_s.pop_back();
          l.push_back(Value::str(line_s));
          i = j + 1;
        }
        return Value::list(l);
      }
    } else if (obj.k == Value::Obj) {
      if (m == "items") {
        Value l = Value::list();
        for (auto& [k, v] : obj.obj->items) l.arr->push_back(Value::list({Value::str(k), v}));
        return l;
      }
      if (m == "keys") {
        Value l = Value::list();
        for (auto& [k, v] : obj.obj->items) l.arr->push_back(Value::str(k));
        return l;
      }
      if (m == "values") {
        Value l = Value::list();
        for (auto& [k, v] : obj.obj->items) l.arr->push_back(v);
        return l;
      }
      if (m == "get") {
        if (a.empty()) fail(line, "get() needs a key");
        const Value* x = a[0].k == Value::Str ? obj.obj->find(a[0].s) : nullptr;
        return x ? *x : a.size() > 1 ? a[1] : Value::none();
      }
    } else if (obj.k == Value::Arr) {
      if (m == "append") {
        if (a.empty()) fail(line, "append() needs an argument");
        obj.arr->push_back(a[0]);
        return Value::none();
      }
      if (m == "pop") {
        if (obj.arr->empty()) fail(line, "pop from an empty list");
        int64_t i = a.empty() ? -1 : a[0].i;
        i = norm_index(i, static_cast<int64_t>(obj.arr->size()));
        Value v = (*obj.arr)[static_cast<size_t>(i)];
        obj.arr->erase(obj.arr->begin() + i);
        return v;
      }
      if (m == "index") {
        for (size_t i = 0; i < obj.arr->size(); ++i)
          if (!a.empty() && equal((*obj.arr)[i], a[0])) return Value::integer(static_cast<int64_t>(i));
        fail(line, "index(): value not in list");
      }
    }
    found = false;
    return Value();
  }

  bool contains(const Value& hay, const Value& needle, int line) {
    if (hay.k == Value::Str) {
      if (needle.k != Value::Str) fail(line, "'in <string>' needs a string on the left, got " + repr(needle));
      return hay.s.find(needle.s) != std::string::npos;
    }
    if (hay.k == Value::Arr) {
      for (auto& x : *hay.arr)
        if (equal(x, needle)) return true;
      return false;
    }
    if (hay.k == Value::Obj) return needle.k == Value::Str && hay.obj->find(needle.s);
    if (hay.k == Value::Undef || hay.k == Value::None) return false;
    fail(line, "'in' needs a string, list or mapping on the right, got " + repr(hay));
  }

  Value binop(const std::string& op, const Value& a, const Value& b, int line) {
    if (op == "~") return Value::str(to_str(a) + to_str(b));
    if (op == "==") return Value::boolean(equal(a, b));
    if (op == "!=") return Value::boolean(!equal(a, b));
    if (op == "in") return Value::boolean(contains(b, a, line));
    if (op == "not in") return Value::boolean(!contains(b, a, line));
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      int c;
      if (a.is_num() && b.is_num())
        c = a.num() < b.num() ? -1 : a.num() > b.num() ? 1 : 0;
      else if (a.k == Value::Str && b.k == Value::Str)
        c = a.s.compare(b.s);
      else
        fail(line, "cannot compare " + repr(a) + " " + op + " " + repr(b));
      return Value::boolean(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
    }
    if (op == "+") {
      if (a.k == Value::Arr && b.k == Value::Arr) {
        List l = *a.arr;
        l.insert(l.end(), b.arr->begin(), b.arr->end());
        return Value::list(l);
      }
      if (a.k == Value::Str || b.k == Value::Str) {
        if (a.is_num() || b.is_num() || a.k == Value::Arr || b.k == Value::Arr)
          fail(line, "cannot add " + repr(a) + " and " + repr(b) + " (use ~ or |string)");
        return Value::str(to_str(a) + to_str(b));
      }
    }
    if (op == "*" && ((a.k == Value::Str && b.k == Value::Int) || (a.k == Value::Int && b.k == Value::Str))) {
      const std::string& s = a.k == Value::Str ? a.s : b.s;
      const int64_t times = a.k == Value::Int ? a.i : b.i;
      if (times > 0 && s.size() * static_cast<uint64_t>(times) > (1u << 30))
        fail(line, "string repetition of more than 1 GiB");
      std::string o;
      for (int64_t i = 0; i < (a.k == Value::Int ? a.i : b.i); ++i) o += s;
      return Value::str(o);
    }
    if (!a.is_num() || !b.is_num()) fail(line, "unsupported operands for " + op + ": " + repr(a) + " and " + repr(b));
    const bool ints = a.k != Value::Float && b.k != Value::Float;
    const double x = a.num(), y = b.num();
    auto ai = static_cast<int64_t>(x), bi = static_cast<int64_t>(y);
    if (op == "+") return ints ? Value::integer(ai + bi) : Value::real(x + y);
    if (op == "-") return ints ? Value::integer(ai - bi) : Value::real(x - y);
    if (op == "*") return ints ? Value::integer(ai * bi) : Value::real(x * y);
    if (op == "/") {
      if (y == 0) fail(line, "division by zero");
      return Value::real(x / y);
    }
    if (op == "//" || op == "%") {
      if (y == 0) fail(line, "division by zero");
      if (ints) {
        int64_t q = ai / bi, r = ai % bi;
        if (r != 0 && ((r < 0) != (bi < 0))) --q, r += bi;
        return Value::integer(op == "//" ? q : r);
      }
      const double q = std::floor(x / y);
      return Value::real(op == "//" ? q : x - q * y);
    }
    if (op == "**")
      return ints && bi >= 0 ? Value::integer(static_cast<int64_t>(std::pow(x, y))) : Value::real(std::pow(x, y));
    fail(line, "unknown operator " + op);
  }

  bool test(const std::string& name, const Value& v, List& a, int line) {
    if (name == "defined") return v.k != Value::Undef;
    if (name == "undefined") return v.k == Value::Undef;
    if (name == "none") return v.k == Value::None;
    if (name == "string") return v.k == Value::Str;
    if (name == "number") return v.k == Value::Int || v.k == Value::Float;
    if (name == "integer") return v.k == Value::Int;
    if (name == "float") return v.k == Value::Float;
    if (name == "boolean") return v.k == Value::Bool;
    if (name == "true") return v.k == Value::Bool && v.b;
    if (name == "false") return v.k == Value::Bool && !v.b;
    if (name == "mapping") return v.k == Value::Obj;
    if (name == "iterable") return v.k == Value::Arr || v.k == Value::Obj || v.k == Value::Str;
    if (name == "sequence") return v.k == Value::Arr || v.k == Value::Str || v.k == Value::Obj;
    if (name == "callable") return v.k == Value::Fn;
    if (name == "even" || name == "odd") {
      if (v.k != Value::Int) fail(line, "'" + name + "' test needs an integer");
      return (v.i % 2 == 0) == (name == "even");
    }
    if (name == "divisibleby") return !a.empty() && a[0].num() != 0 && v.k == Value::Int && v.i % a[0].i == 0;
    if (name == "eq" || name == "equalto" || name == "sameas" || name == "==") return !a.empty() && equal(v, a[0]);
    if (name == "ne") return a.empty() || !equal(v, a[0]);
    if (name == "lower") return v.k == Value::Str && lower(v.s) == v.s;
    if (name == "upper") return v.k == Value::Str && upper(v.s) == v.s;
    if (name == "in") return !a.empty() && contains(a[0], v, line);
    fail(line, "unknown test '" + name + "'");
  }

  Value filter(const std::string& name, const Value& v, List& a, std::vector<std::pair<std::string, Value>>& kw,
               int line) {
    auto kwarg = [&](const char* k, size_t pos) -> const Value* {
      for (auto& [n, x] : kw)
        if (n == k) return &x;
      return pos < a.size() ? &a[pos] : nullptr;
    };
    if (name == "trim") return Value::str(strip_chars(to_str(v), kwarg("chars", 0), true, true));
    if (name == "length" || name == "count") {
      if (v.k == Value::Str) {
        int64_t n = 0;
        for (unsigned char c : v.s) n += (c & 0xC0) != 0x80;
        return Value::integer(n);
      }
      if (v.k == Value::Arr) return Value::integer(static_cast<int64_t>(v.arr->size()));
      if (v.k == Value::Obj) return Value::integer(static_cast<int64_t>(v.obj->items.size()));
      if (v.k == Value::Undef) return Value::integer(0);
      fail(line, "length of " + repr(v));
    }
    if (name == "tojson") {
      const Value* ind = kwarg("indent", 0);
      return Value::str(to_json(v, ind && ind->k == Value::Int ? static_cast<int>(ind->i) : 0, 0));
    }
    if (name == "string") return Value::str(to_str(v));
    if (name == "lower") return Value::str(lower(to_str(v)));
    if (name == "upper") return Value::str(upper(to_str(v)));
    if (name == "title") return Value::str(title(to_str(v)));
    if (name == "capitalize") {
      const std::string s = to_str(v);
      return Value::str(s.empty() ? s : upper(s.substr(0, 1)) + lower(s.substr(1)));
    }
    if (name == "safe" || name == "e" || name == "escape") return v;
    if (name == "int")
      return Value::integer(v.k == Value::Str ? std::atoll(v.s.c_str()) : static_cast<int64_t>(v.num()));
    if (name == "float") return Value::real(v.k == Value::Str ? std::atof(v.s.c_str()) : v.num());
    if (name == "abs") return v.k == Value::Int ? Value::integer(std::llabs(v.i)) : Value::real(std::fabs(v.num()));
    if (name == "default" || name == "d") {
      const Value* dflt = kwarg("default_value", 0);
      const Value* boolean = kwarg("boolean", 1);
      const bool use = v.k == Value::Undef || (boolean && truthy(*boolean) && !truthy(v));
      return use ? (dflt ? *dflt : Value::str("")) : v;
    }
    if (name == "first" || name == "last") {
      List l = iterate(v, line);
      if (l.empty()) return Value();
      return name == "first" ? l.front() : l.back();
    }
    if (name == "list") return Value::list(iterate(v, line));
    if (name == "reverse") {
      if (v.k == Value::Str) return Value::str(std::string(v.s.rbegin(), v.s.rend()));
      List l = iterate(v, line);
      std::reverse(l.begin(), l.end());
      return Value::list(l);
    }
    if (name == "join") {
      const Value* sep = kwarg("d", 0);
      const Value* attribute = kwarg("attribute", 1);
      std::string o;
      size_t k = 0;
      for (auto& x : iterate(v, line))
        o += (k++ ? (sep ? to_str(*sep) : "") : "") + to_str(attribute ? attr(x, to_str(*attribute)) : x);
      return Value::str(o);
    }
    if (name == "items") {
      List none;
      std::vector<std::pair<std::string, Value>> nkw;
      bool found;
      if (v.k == Value::Undef) return Value::list();
      return method(v, "items", none, nkw, line, found);
    }
    if (name == "replace") {
      if (a.size() < 2) fail(line, "replace needs two arguments");
      return Value::str(replace(to_str(v), to_str(a[0]), to_str(a[1]), a.size() > 2 ? a[2].i : -1));
    }
    if (name == "indent") {
      const Value* w = kwarg("width", 0);
      const Value* first = kwarg("first", 1);
      const std::string pad = w ? (w->k == Value::Str ? w->s : std::string(static_cast<size_t>(w->i), ' ')) : "    ";
      std::string s = to_str(v), o;
      for (size_t i = 0; i < s.size(); ++i) {
        o += s[i];
        if (s[i] == '\n' && i + 1 < s.size() && s[i + 1] != '\n') o += pad;
      }
      return Value::str(first && truthy(*first) ? pad + o : o);
    }
    if (name == "map") {
      const Value* at = kwarg("attribute", 99);
      List out;
      for (auto& x : iterate(v, line)) {
        if (at) {
          out.push_back(attr(x, to_str(*at)));
        } else {
          if (a.empty()) fail(line, "map needs a filter name or attribute=");
          List rest(a.begin() + 1, a.end());
          std::vector<std::pair<std::string, Value>> nkw;
          out.push_back(filter(to_str(a[0]), x, rest, nkw, line));
        }
      }
      return Value::list(out);
    }
    if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
      const bool by_attr = name == "selectattr" || name == "rejectattr";
      const bool want = name == "select" || name == "selectattr";
      List out;
      for (auto& x : iterate(v, line)) {
        size_t k = 0;
        Value subject = x;
        if (by_attr) {
          if (a.empty()) fail(line, name + " needs an attribute name");
          subject = attr(x, to_str(a[k++]));
        }
        bool ok;
        if (k < a.size()) {
          List targs(a.begin() + static_cast<long>(k) + 1, a.end());
          ok = test(to_str(a[k]), subject, targs, line);
        } else {
          ok = truthy(subject);
        }
        if (ok == want) out.push_back(x);
      }
      return Value::list(out);
    }
    if (name == "unique") {
      List out;
      for (auto& x : iterate(v, line)) {
        bool seen = false;
        for (auto& y : out) seen = seen || equal(x, y);
        if (!seen) out.push_back(x);
      }
      return Value::list(out);
    }
    if (name == "sort") {
      List l = iterate(v, line);
      const Value* at = kwarg("attribute", 99);
      const Value* rev = kwarg("reverse", 0);
      std::stable_sort(l.begin(), l.end(), [&](const Value& x, const Value& y) {
        Value p = at ? attr(x, to_str(*at)) : x, q = at ? attr(y, to_str(*at)) : y;
        return truthy(binop("<", p, q, line));
      });
      if (rev && truthy(*rev)) std::reverse(l.begin(), l.end());
      return Value::list(l);
    }
    if (name == "round") {
      const Value* prec = kwarg("precision", 0);
      const double m = std::pow(10.0, prec ? static_cast<double>(prec->i) : 0.0);
      return Value::real(std::round(v.num() * m) / m);
    }
    if (name == "wordcount") return Value::integer(static_cast<int64_t>(split(to_str(v), nullptr, -1).size()));
    fail(line, "unknown filter '" + name + "'");
  }

  Value call(const Expr& e) {
    const Expr& callee = *e.kids[0];
    List args;
    std::vector<std::pair<std::string, Value>> kw;
    for (size_t i = 1; i < e.kids.size(); ++i) args.push_back(eval(*e.kids[i]));
    for (auto& [k, x] : e.kwargs) kw.emplace_back(k, eval(*x));
    if (callee.k == Expr::Attr) {
      Value obj = eval(*callee.kids[0]);
      if (!(obj.k == Value::Obj && obj.obj->find(callee.name))) {
        bool found;
        Value r = method(obj, callee.name, args, kw, e.line, found);
        if (found) return r;
        if (obj.k != Value::Obj) fail(e.line, "no method " + callee.name + "() on " + repr(obj));
      }
    }
    if (callee.k == Expr::Var && !lookup(callee.name).fn) {
      const std::string& n = callee.name;
      if (n == "raise_exception") fail(e.line, "raise_exception: " + (args.empty() ? "" : to_str(args[0])));
      if (n == "namespace" || n == "dict") {
        Value d = Value::dict();
        d.obj->is_namespace = n == "namespace";
        for (auto& [k, x] : kw) d.obj->set(k, x);
        return d;
      }
      if (n == "range") {
        int64_t a = 0, b = 0, st = 1;
        if (args.size() == 1) b = args[0].i;
        if (args.size() >= 2) a = args[0].i, b = args[1].i;
        if (args.size() >= 3) st = args[2].i;
        if (st == 0) fail(e.line, "range() step cannot be zero");
        if ((b - a) / st > 10000000) fail(e.line, "range() of more than 10000000 numbers");
        Value l = Value::list();
        for (int64_t i = a; st > 0 ? i < b : i > b; i += st) l.arr->push_back(Value::integer(i));
        return l;
      }
      if (n == "strftime_now") {
        char buf[128];
        const std::time_t now = std::time(nullptr);
        std::tm tm{};
        platform::utc_time(now, &tm);
        std::strftime(buf, sizeof buf, args.empty() ? "%Y-%m-%d" : to_str(args[0]).c_str(), &tm);
        return Value::str(buf);
      }
    }
    Value f = eval(callee);
    if (f.k != Value::Fn) fail(e.line, "'" + (callee.k == Expr::Var ? callee.name : callee.name) + "' is not callable");
    return (*f.fn)(args, kw);
  }

  Value eval(const Expr& e) {
    switch (e.k) {
      case Expr::Lit:
        return e.lit;
      case Expr::Var:
        return lookup(e.name);
      case Expr::Attr: {
        Value o = eval(*e.kids[0]);
        return attr(o, e.name);
      }
      case Expr::Index: {
        Value o = eval(*e.kids[0]);
        return index(o, eval(*e.kids[1]), e.line);
      }
      case Expr::Slice:
        return slice(eval(*e.kids[0]), e);
      case Expr::Call:
        return call(e);
      case Expr::Filter: {
        Value v = eval(*e.kids[0]);
        List args;
        std::vector<std::pair<std::string, Value>> kw;
        for (size_t i = 1; i < e.kids.size(); ++i) args.push_back(eval(*e.kids[i]));
        for (auto& [k, x] : e.kwargs) kw.emplace_back(k, eval(*x));
        return filter(e.name, v, args, kw, e.line);
      }
      case Expr::Test: {
        Value v = eval(*e.kids[0]);
        List args;
        for (size_t i = 1; i < e.kids.size(); ++i) args.push_back(eval(*e.kids[i]));
        return Value::boolean(test(e.name, v, args, e.line) != e.negate);
      }
      case Expr::Neg: {
        Value v = eval(*e.kids[0]);
        if (v.k == Value::Int) return Value::integer(-v.i);
        if (v.k == Value::Float) return Value::real(-v.f);
        fail(e.line, "cannot negate " + repr(v));
      }
      case Expr::Bin: {
        Value a = eval(*e.kids[0]);
        return binop(e.name, a, eval(*e.kids[1]), e.line);
      }
      case Expr::And: {
        Value a = eval(*e.kids[0]);
        return truthy(a) ? eval(*e.kids[1]) : a;
      }
      case Expr::Or: {
        Value a = eval(*e.kids[0]);
        return truthy(a) ? a : eval(*e.kids[1]);
      }
      case Expr::Not:
        return Value::boolean(!truthy(eval(*e.kids[0])));
      case Expr::Cond:
        return truthy(eval(*e.kids[1])) ? eval(*e.kids[0]) : eval(*e.kids[2]);
      case Expr::ListLit: {
        Value l = Value::list();
        for (auto& k : e.kids) l.arr->push_back(eval(*k));
        return l;
      }
      case Expr::DictLit: {
        Value d = Value::dict();
        for (size_t i = 0; i + 1 < e.kids.size(); i += 2) d.obj->set(to_str(eval(*e.kids[i])), eval(*e.kids[i + 1]));
        return d;
      }
    }
    return Value();
  }

 private:
  const std::string& name_;
};

}  // namespace

struct JinjaTemplate::Impl {
  std::string source;
  Body body;
};

JinjaTemplate::JinjaTemplate(const std::string& text, const std::string& source) : impl_(std::make_unique<Impl>()) {
  impl_->source = source;
  impl_->body = Parser(Lexer(preprocess(text), impl_->source).run(), impl_->source).parse();
}
JinjaTemplate::~JinjaTemplate() = default;
JinjaTemplate::JinjaTemplate(JinjaTemplate&&) noexcept = default;

std::string JinjaTemplate::render(const nlohmann::ordered_json& context) const {
  Renderer r(impl_->source);
  if (context.is_object())
    for (auto it = context.begin(); it != context.end(); ++it) r.frames_.back()[it.key()] = from_json(it.value());
  std::string out;
  try {
    r.render(impl_->body, out);
  } catch (const LoopSignal&) {
    ZR_FAIL(impl_->source, ": {% break %} or {% continue %} outside a loop");
  }
  return out;
}

}  // namespace zerorun
