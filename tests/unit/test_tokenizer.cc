// Tokenizer pieces without npm (tests/data/*_oracle.sh compare whole tokenizers and templates with
// transformers.js and @huggingface/jinja): the regex engine, Unicode tables and normalization, small
// tokenizer.json files written here (byte-level BPE; SentencePiece-style with byte fallback), errors, the
// zerorun shard format and the Jinja subset.
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "src/data/regex.h"
#include "src/data/unicode.h"
#include "zerorun/data.h"
#include "zerorun/error.h"
#include "zerorun/jinja.h"
#include "zerorun/tokenizer.h"

using namespace zerorun;
using Catch::Matchers::Contains;

namespace {

std::vector<std::string> matches(const std::string& pattern, const std::string& text) {
  Regex re(pattern);
  const auto cps = unicode::to_cps(text);
  std::vector<std::string> out;
  for (auto [a, b] : re.find_all(cps))
    out.push_back(unicode::to_utf8(
        std::vector<uint32_t>(cps.begin() + static_cast<long>(a), cps.begin() + static_cast<long>(b))));
  return out;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("regex: the GPT-2 and Llama 3 pre-tokenizer patterns split as the reference engines do", "[tokenizer]") {
  const std::string gpt2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
  CHECK(matches(gpt2, "Hello world's 123  end!!\n") ==
        std::vector<std::string>{"Hello", " world", "'s", " 123", " ", " end", "!!", "\n"});
  CHECK(matches(gpt2, "日本語 text") == std::vector<std::string>{"日本語", " text"});
  const std::string llama3 =
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
      "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  CHECK(matches(llama3, "I'M 12345 ok\n\n  x") ==
        std::vector<std::string>{"I", "'M", " ", "123", "45", " ok", "\n\n", " ", " x"});
  CHECK(matches("a{2,3}?", "aaaa") == std::vector<std::string>{"aa", "aa"});
  CHECK(matches("[^a-c\\d]+", "abxy12zc") == std::vector<std::string>{"xy", "z"});
  CHECK(matches("\\p{Lu}\\p{Ll}*", "HelloWorld") == std::vector<std::string>{"Hello", "World"});
  CHECK(matches("x(?=y)|z", "xyxz") == std::vector<std::string>{"x", "z"});
  CHECK(matches("^a|b$", "aab") == std::vector<std::string>{"a", "b"});
  CHECK_THAT(error_of([] { Regex("(a"); }), Contains("regex '(a': unterminated ("));
  CHECK_THAT(error_of([] { Regex("\\p{Bogus}"); }), Contains("unknown Unicode property \\p{Bogus}"));
  CHECK_THAT(error_of([] { Regex("(?<=a)b"); }), Contains("unsupported group kind"));
  CHECK_THAT(error_of([] { Regex("(a*)*"); }), Contains("can match empty"));
}

TEST_CASE("unicode: categories, White_Space, UTF-8 and NFC/NFD", "[tokenizer]") {
  CHECK(unicode::category('A') == unicode::Lu);
  CHECK(unicode::category(0x65E5) == unicode::Lo);  // 日
  CHECK(unicode::category(0x0661) == unicode::Nd);  // Arabic-Indic one
  CHECK(unicode::category(0x1F600) == unicode::So);
  CHECK(unicode::category(0x0301) == unicode::Mn);
  CHECK(unicode::category(0x10FFFF) == unicode::Cn);
  CHECK(unicode::is_white_space(0x3000));
  CHECK(unicode::is_white_space(0x85));
  CHECK_FALSE(unicode::is_white_space(0x200B));
  CHECK(unicode::nfc("cafe\xCC\x81") == "caf\xC3\xA9");  // e + combining acute -> é
  CHECK(unicode::nfd("caf\xC3\xA9") == "cafe\xCC\x81");
  CHECK(unicode::nfc("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8") == "\xEA\xB0\x81");  // Hangul L V T -> 각
  CHECK(unicode::nfc("a\xCC\xA3\xCC\x87") == "\xE1\xBA\xA1\xCC\x87");             // canonical order, then compose
  CHECK(unicode::nfc("\xE2\x84\xAB") == "\xC3\x85");                              // Angstrom sign -> Å (singleton)
  size_t i = 0;
  CHECK(unicode::next_cp("\xF0\x9F\x98\x80", i) == 0x1F600);
  i = 0;
  CHECK(unicode::next_cp("\xC0\x80", i) == 0xFFFD);  // overlong
  CHECK(i == 1);
}

namespace {

// A byte-level BPE over the alphabet of "hello world" (GPT-2 style), with a special token and a BOS template.
std::string byte_level_json(bool ignore_merges = false) {
  nlohmann::json vocab = nlohmann::json::object();
  int id = 0;
  for (const char* t : {"h", "e", "l", "o", "\xC4\xA0", "w", "r", "d", "he", "ll", "hell", "hello", "\xC4\xA0w", "or",
                        "\xC4\xA0wor", "ld", "\xC4\xA0world", "!"})
    vocab[t] = id++;
  nlohmann::json j = {
      {"version", "1.0"},
      {"added_tokens",
       {{{"id", 18},
         {"content", "<|end|>"},
         {"special", true},
         {"lstrip", false},
         {"rstrip", true},
         {"normalized", false}},
        {{"id", 19}, {"content", "<s>"}, {"special", true}, {"normalized", false}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single",
         {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {19}}, {"tokens", {"<s>"}}}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"ignore_merges", ignore_merges},
        {"merges", {"h e", "l l", "he ll", "hell o", "\xC4\xA0 w", "o r", "\xC4\xA0w or", "l d", "\xC4\xA0wor ld"}}}}};
  return j.dump();
}

}  // namespace

TEST_CASE("tokenizer: byte-level BPE, added tokens with rstrip, template processing, decode", "[tokenizer]") {
  const Tokenizer t = Tokenizer::from_json(byte_level_json(), "bl.json");
  CHECK(t.encode("hello world", false) == std::vector<int32_t>{11, 16});
  CHECK(t.encode("hello world") == std::vector<int32_t>{19, 11, 16});
  // rstrip: the spaces after <|end|> are dropped; the token is matched inside words.
  CHECK(t.encode("hello<|end|>   world!", false) == std::vector<int32_t>{11, 18, 5, 13, 15, 17});
  CHECK(t.decode({19, 11, 16, 18}) == "<s>hello world<|end|>");
  CHECK(t.decode({19, 11, 16, 18}, true) == "hello world");
  // Ids beyond the tokenizer (a model's padded vocabulary) decode to nothing, as HF tokenizers does; so does a
  // streamed decode.
  CHECK(t.decode({11, 1000, 16, -1}) == "hello world");
  DecodeStream ds(t, true);
  std::string streamed;
  for (int32_t id : {11, 5000, 16}) streamed += ds.push(id);
  CHECK(streamed == "hello world");
  CHECK(t.token_to_id("<|end|>") == 18);
  CHECK(t.id_to_token(16) == "\xC4\xA0world");
  CHECK(t.vocab_size() == 20);
  CHECK(t.is_special(19));
  CHECK_FALSE(t.is_special(3));
  // encode_batch = encode one by one, on any number of threads.
  std::vector<std::string> docs;
  for (int i = 0; i < 100; ++i) docs.push_back(i % 3 ? "hello world!" : "world<|end|> hello");
  const auto batch = t.encode_batch(docs, true, 3);
  for (size_t i = 0; i < docs.size(); ++i) CHECK(batch[i] == t.encode(docs[i]));
  // Many short-lived threads encoding at once, as prepare's batches start them: the word caches and the regex
  // stacks live in no thread_local object (MinGW's runtime crashed at thread exit destroying them; the wine run of
  // this test is the Windows check).
  const std::vector<int32_t> want = t.encode("world<|end|> hello");
  std::atomic<int> wrong{0};
  for (int round = 0; round < 20; ++round) {
    std::vector<std::thread> pool;
    for (int k = 0; k < 8; ++k)
      pool.emplace_back([&] {
        if (t.encode("world<|end|> hello") != want) ++wrong;
      });
    for (auto& th : pool) th.join();
  }
  CHECK(wrong == 0);
}

TEST_CASE("tokenizer: SentencePiece-style BPE with byte fallback and fuse_unk", "[tokenizer]") {
  nlohmann::json vocab = {{"<unk>", 0},
                          {"<s>", 1},
                          {"\xE2\x96\x81", 2},
                          {"a", 3},
                          {"b", 4},
                          {"\xE2\x96\x81"
                           "a",
                           5},
                          {"ab", 6}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    vocab[name] = 7 + b;
  }
  nlohmann::json j = {
      {"added_tokens",
       {{{"id", 0}, {"content", "<unk>"}, {"special", true}}, {{"id", 1}, {"content", "<s>"}, {"special", true}}}},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}},
          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}}}}},
      {"pre_tokenizer", nullptr},
      {"post_processor", nullptr},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}},
          {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"unk_token", "<unk>"},
        {"byte_fallback", true},
        {"fuse_unk", true},
        {"merges", {"\xE2\x96\x81 a", "a b"}}}}};
  const Tokenizer t = Tokenizer::from_json(j.dump());
  // "▁ab é": ▁a then b (▁a ranks first), ▁, then é as its two UTF-8 bytes.
  CHECK(t.encode("ab \xC3\xA9", false) == std::vector<int32_t>{5, 4, 2, 7 + 0xC3, 7 + 0xA9});
  CHECK(t.decode(t.encode("ab \xC3\xA9", false)) == "ab \xC3\xA9");
  {  // token by token: the first byte of é waits for the second
    DecodeStream stream(t);
    std::vector<std::string> pieces;
    for (int32_t id : t.encode("ab \xC3\xA9", false)) pieces.push_back(stream.push(id));
    CHECK(pieces == std::vector<std::string>{"a", "b", " ", "", "\xC3\xA9"});
  }
  j["model"]["byte_fallback"] = false;
  const Tokenizer u = Tokenizer::from_json(j.dump());
  CHECK(u.encode("a\xC3\xA9\xC3\xA9", false) ==
        std::vector<int32_t>{5, 0});  // two unknown characters fuse into one <unk>
}

TEST_CASE("tokenizer: errors name the file and the key", "[tokenizer]") {
  CHECK_THAT(error_of([] { Tokenizer::from_json("{", "x.json"); }), Contains("x.json: not valid JSON"));
  CHECK_THAT(error_of([] { Tokenizer::from_json(R"({"model": {"type": "Unigram", "vocab": []}})", "u.json"); }),
             Contains("u.json: model.type 'Unigram' is not supported"));
  auto j = nlohmann::json::parse(byte_level_json());
  j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {{{"type", "Punctuation"}}}}};
  CHECK_THAT(error_of([&] { Tokenizer::from_json(j.dump(), "p.json"); }),
             Contains("p.json: pre_tokenizer.pretokenizers[0]: pre-tokenizer type 'Punctuation' is not supported"));
  j = nlohmann::json::parse(byte_level_json());
  j["model"]["merges"].push_back("q z");
  CHECK_THAT(error_of([&] { Tokenizer::from_json(j.dump(), "m.json"); }),
             Contains("m.json: model.merges[9] ('q', 'z'): a part or the merged token is not in model.vocab"));
  j = nlohmann::json::parse(byte_level_json());
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "[a-"}}}, {"behavior", "Isolated"}};
  CHECK_THAT(error_of([&] { Tokenizer::from_json(j.dump(), "r.json"); }),
             Contains("r.json: pre_tokenizer (Split): regex '[a-'"));
  CHECK_THAT(error_of([] { Tokenizer::load("/nonexistent-dir-zr"); }), Contains("/nonexistent-dir-zr"));
}

TEST_CASE("zerorun shards: round trip, llm.c still read, corrupt files named", "[tokenizer][data]") {
  const std::string path = "/tmp/zr_shard_test_" + std::to_string(std::random_device{}()) + ".bin";
  TokenShard s;
  s.tokens = {1, 70000, 3, 4, 5};
  s.loss_mask = {0, 1, 1, 0, 1};
  s.doc_starts = {0, 3, 5};
  s.vocab_size = 80000;
  write_zerorun_shard(path, s);
  const TokenShard r = read_token_shard(path);
  CHECK(r.tokens == s.tokens);
  CHECK(r.loss_mask == s.loss_mask);
  CHECK(r.doc_starts == s.doc_starts);
  CHECK(r.vocab_size == 80000);
  CHECK(load_token_files(path) == std::vector<uint32_t>(s.tokens.begin(), s.tokens.end()));
  {  // truncate: the size check names the file
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(path, std::ios::binary | std::ios::trunc)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size() - 3));
  }
  CHECK_THAT(error_of([&] { read_token_shard(path); }),
             Contains(path + ": header says 5 tokens of 4 bytes with a loss mask"));
  write_zerorun_shard(path, s);
  const std::string path2 = path + ".llmc.bin";
  write_token_shard(path2, {7, 8});
  const TokenShard both = load_token_shards(path + "," + path2);  // documents and mask offset into the whole
  CHECK(both.tokens == std::vector<uint32_t>{1, 70000, 3, 4, 5, 7, 8});
  CHECK(both.loss_mask == std::vector<uint8_t>{0, 1, 1, 0, 1, 1, 1});
  CHECK(both.doc_starts == std::vector<int64_t>{0, 3, 5, 7});
  {  // windows of 3: targets ignored where the mask is 0, positions restart at each document
    auto src = make_masked_token_source(path + "," + path2, 3, 80000);
    auto b = src->batch(0, 2);
    auto v = [](const Tensor& t) { return std::vector<int32_t>(t.i32(), t.i32() + t.numel()); };
    CHECK(v(b.at("tokens")) == std::vector<int32_t>{1, 70000, 3, 4, 5, 7});
    CHECK(v(b.at("targets")) == std::vector<int32_t>{70000, 3, -100, 5, -100, 8});
    CHECK(v(b.at("positions")) == std::vector<int32_t>{0, 1, 2, 0, 1, 0});
  }
  {  // one document a row: padded, no targets past a document's end or where the mask is 0
    auto src = make_padded_document_source(path + "," + path2, 4, 80000, 0);
    auto b = src->batch(1, 3);  // documents 1, 2, 0
    auto v = [](const Tensor& t) { return std::vector<int32_t>(t.i32(), t.i32() + t.numel()); };
    CHECK(v(b.at("tokens")) == std::vector<int32_t>{4, 5, 0, 0, 7, 8, 0, 0, 1, 70000, 3, 0});
    CHECK(v(b.at("targets")) == std::vector<int32_t>{5, -100, -100, -100, 8, -100, -100, -100, 70000, 3, -100, -100});
    CHECK(v(b.at("positions")) == std::vector<int32_t>{0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3});
    CHECK_THAT(error_of([&] { make_padded_document_source(path, 4, 80000, 90000); }), Contains("the padding id 90000"));
  }
  std::remove(path2.c_str());
  write_token_shard(path, {7, 8, 9});  // llm.c
  const TokenShard l = read_token_shard(path);
  CHECK(l.tokens == std::vector<uint32_t>{7, 8, 9});
  CHECK(l.loss_mask.empty());
  std::remove(path.c_str());
}

TEST_CASE("jinja: statements, expressions, filters, whitespace control and errors with lines", "[tokenizer][jinja]") {
  auto render = [](const std::string& t, const nlohmann::ordered_json& ctx = nlohmann::ordered_json::object()) {
    return JinjaTemplate(t, "t.jinja").render(ctx);
  };
  CHECK(render("{% for x in xs %}{{ loop.index }}:{{ x }}{% if not loop.last %}, {% endif %}{% endfor %}",
               {{"xs", {"a", "b", "c"}}}) == "1:a, 2:b, 3:c");
  CHECK(
      render("{%- set ns = namespace(n=0) %}{% for x in xs if x > 1 %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }}",
             {{"xs", {1, 2, 3}}}) == "5");
  CHECK(render("{{ 'a,b,,c'.split(',') | length }} {{ '  x  '|trim }} {{ 'ab'[::-1] }} {{ [1,2,3][1:] }}") ==
        "4 x ba [2, 3]");
  CHECK(render("{{ d | tojson }}", {{"d", {{"k", "v\n"}, {"n", {1, 2.5, nullptr, true}}}}}) ==
        R"({"k": "v\n", "n": [1, 2.5, null, true]})");
  CHECK(render("{% if x is defined %}d{% else %}u{% endif %}{{ y is none }}{{ 7 // 2 }}{{ 7 % 3 }}{{ 'a' ~ 1 }}",
               {{"y", nullptr}}) == "uTrue31a1");
  CHECK(render("  {% if true %}\n  yes\n  {% endif %}\nend\n") == "  yes\nend");  // trim_blocks + lstrip_blocks
  CHECK(render("a  {{- ' b ' -}}  c") == "a b c");
  CHECK(
      render(
          "{% macro greet(name, p='!') %}hi {{ name }}{{ p }}{% endmacro %}{{ greet('x') }} {{ greet('y', p='?') }}") ==
      "hi x! hi y?");
  CHECK(render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {{"d", {{"a", 1}, {"b", 2}}}}) == "a=1;b=2;");
  CHECK(render("{{ xs | selectattr('r', 'equalto', 'u') | map(attribute='c') | join('|') }}",
               {{"xs", {{{"r", "u"}, {"c", "1"}}, {{"r", "a"}, {"c", "2"}}, {{"r", "u"}, {"c", "3"}}}}}) == "1|3");
  CHECK(render("{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}") == "012");
  CHECK_THAT(error_of([&] { render("line1\n{{ raise_exception('roles must alternate') }}"); }),
             Contains("t.jinja:2: raise_exception: roles must alternate"));
  CHECK_THAT(error_of([&] { render("{% if x %}\n\n{% endfor %}"); }), Contains("t.jinja:"));
  CHECK_THAT(error_of([&] { render("{{ x | nosuchfilter }}"); }), Contains("unknown filter 'nosuchfilter'"));
  CHECK_THAT(error_of([&] { render("{% for x in y %}"); }), Contains("missing {% endfor %}"));
}

TEST_CASE("tokenizer training: byte-level BPE learnt from text loads and compresses it", "[tokenizer]") {
  const std::string dir = "/tmp/zr_bpe_train_" + std::to_string(std::random_device{}());
  const std::string text = dir + ".txt";
  {
    std::ofstream f(text);
    for (int i = 0; i < 50; ++i) f << "the cat sat on the mat; the hat is on the cat. ";
  }
  TokenizerTrainOptions o;
  o.inputs = {text};
  o.out_dir = dir;
  o.vocab_size = 1000;  // more than the text has pairs for: stops when every word is one token
  const int64_t n = train_bpe_tokenizer(o);
  CHECK(n > 257);
  CHECK(n < 300);
  const Tokenizer t = Tokenizer::load(dir);
  CHECK(t.vocab_size() == n);
  CHECK(t.token_to_id("<|endoftext|>") == 0);
  CHECK(t.eos_id() == 0);
  const auto ids = t.encode("the cat sat on the mat", false);
  CHECK(ids.size() == 6);  // every word became one token
  CHECK(t.decode(ids) == "the cat sat on the mat");
  CHECK(t.encode("z\xC3\xA9!", false).size() == 4);  // unseen bytes still encode, one token each
  o.vocab_size = 100;
  CHECK_THAT(error_of([&] { train_bpe_tokenizer(o); }), Contains("--vocab_size 100 is below the 257 ids"));
  std::remove(text.c_str());
  std::remove((dir + "/tokenizer.json").c_str());
  std::remove((dir + "/tokenizer_config.json").c_str());
  std::remove(dir.c_str());
}
