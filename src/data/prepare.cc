// `zerorun prepare`: documents (text files, JSONL records) -> token shards with a loss mask and document starts.
// Batches of documents are tokenized on all cores and written in input order, so the shards are the same for any
// thread count.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "zerorun/data.h"
#include "zerorun/error.h"
#include "zerorun/fsutil.h"
#include "zerorun/platform.h"
#include "zerorun/jinja.h"
#include "zerorun/tokenizer.h"

namespace zerorun {
namespace {

using ojson = nlohmann::ordered_json;

struct Record {
  std::string text;   // a JSON line, or a whole text file
  std::string where;  // file:line
  bool json = false;
};

struct DocOut {
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  std::string error;
};

bool ends_with(const std::string& s, const std::string& x) {
  return s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
}

std::vector<std::string> expand_inputs(const std::vector<std::string>& specs) {
  std::vector<std::string> out;
  for (const std::string& spec : specs) {
    const std::vector<std::string> found = platform::glob(spec);
    out.insert(out.end(), found.begin(), found.end());
    ZR_CHECK(!found.empty(), "prepare: no file matches '", spec, "'");
  }
  for (auto& f : out)
    ZR_CHECK(!is_directory(f), "prepare: ", f, " is a directory (give the files in it, e.g. '", f, "/*.jsonl')");
  return out;
}

class Preparer {
 public:
  Preparer(const PrepareOptions& o) : o_(o), tok_(Tokenizer::load(o.tokenizer)) {
    std::string tpl = tok_.chat_template();
    std::string src = o.tokenizer + " (chat_template)";
    if (!o.chat_template.empty()) {
      tpl = read_file(o.chat_template);
      src = o.chat_template;
    }
    if (!tpl.empty()) template_ = std::make_unique<JinjaTemplate>(tpl, src);
    ZR_CHECK(o.train_on == "completions" || o.train_on == "all", "--train_on must be completions or all, got '",
             o.train_on, "'");
    ZR_CHECK(o.format == "zerorun" || o.format == "llmc", "--format must be zerorun or llmc, got '", o.format, "'");
    ZR_CHECK(o.format != "llmc" || tok_.vocab_size() <= 65536, "--format llmc stores uint16 tokens, but ", o.tokenizer,
             " has ", tok_.vocab_size(), " tokens: use --format zerorun (uint32 tokens)");
    ZR_CHECK(o.shard_tokens >= 1, "--shard_tokens must be >= 1");
  }

  // Encodes `text` cut at `cuts` (sorted offsets, each switching the mask on or off, starting off) without the
  // post-processor's tokens, as transformers' apply_chat_template(tokenize=True) does.
  void encode_spans(const std::string& text, const std::vector<std::pair<size_t, size_t>>& spans, DocOut& d) const {
    size_t at = 0;
    auto piece = [&](size_t a, size_t b, uint8_t m) {
      if (b <= a) return;
      auto ids = tok_.encode(std::string_view(text).substr(a, b - a), false);
      d.ids.insert(d.ids.end(), ids.begin(), ids.end());
      d.mask.insert(d.mask.end(), ids.size(), m);
    };
    for (auto [a, b] : spans) {
      piece(at, a, 0);
      piece(a, b, 1);
      at = b;
    }
    piece(at, text.size(), 0);
  }

  void add_eos(DocOut& d) const {
    if (o_.eos && tok_.eos_id() >= 0 && (d.ids.empty() || d.ids.back() != tok_.eos_id())) {
      d.ids.push_back(tok_.eos_id());
      d.mask.push_back(1);
    }
  }

  // The record's other keys (tools, documents, ...) are template variables too.
  std::string render(const ojson& messages, bool gen, const ojson& record) const {
    ojson ctx = {{"messages", messages},
                 {"add_generation_prompt", gen},
                 {"bos_token", tok_.bos_token()},
                 {"eos_token", tok_.eos_token()}};
    for (auto it = record.begin(); it != record.end(); ++it)
      if (!ctx.contains(it.key()) && it.key() != "prompt" && it.key() != "completion") ctx[it.key()] = it.value();
    return template_->render(ctx);
  }

  // A conversation; with train_on completions, the assistant turns from message `first_target` on are targets.
  void chat(const ojson& messages, const ojson& record, const std::string& where, DocOut& d,
            size_t first_target = 0) const {
    ZR_CHECK(template_, where, ": a \"messages\" record needs a chat template, and ", o_.tokenizer,
             " has none (tokenizer_config.json's chat_template or chat_template.jinja): give --chat_template FILE");
    ZR_CHECK(messages.is_array() && !messages.empty(), where, ": \"messages\" must be a non-empty list");
    for (size_t i = 0; i < messages.size(); ++i) {
      const ojson& m = messages[i];
      ZR_CHECK(m.is_object() && m.contains("role") && m["role"].is_string() && m.contains("content"), where,
               ": messages[", i, "] needs \"role\" (a string) and \"content\"");
    }
    std::string full;
    ZR_WITH_CONTEXT(where, full = render(messages, false, record));
    std::vector<std::pair<size_t, size_t>> spans;
    if (o_.train_on == "completions") {
      size_t searched = 0;
      for (size_t i = 0; i < messages.size(); ++i) {
        if (messages[i]["role"] != "assistant" || i < first_target) continue;
        // An assistant turn starts where the render of the conversation before it, with the generation prompt,
        // ends (when that is a prefix of the whole render), else where its content appears (after any reasoning
        // block: templates may drop the reasoning of earlier turns). It ends with the first end-of-turn marker
        // after its start (the EOS token, <|im_end|>, <|eot_id|>, <end_of_turn>, <|end|>), or where the render of
        // the conversation up to it ends.
        const ojson before(messages.begin(), messages.begin() + static_cast<long>(i));
        const ojson upto(messages.begin(), messages.begin() + static_cast<long>(i) + 1);
        std::string p, f;
        ZR_WITH_CONTEXT(where, p = render(before, true, record));
        ZR_WITH_CONTEXT(where, f = render(upto, false, record));
        size_t pos = std::string::npos;
        const bool prefix = f.compare(0, p.size(), p) == 0 && full.compare(0, f.size(), f) == 0;
        if (full.compare(0, p.size(), p) == 0 && p.size() >= searched) {
          pos = p.size();
        } else if (messages[i]["content"].is_string()) {
          std::string content = messages[i]["content"].get<std::string>();
          const size_t think = content.rfind("</think>");
          if (think != std::string::npos) content = content.substr(think + 8);
          const size_t a = content.find_first_not_of(" \t\n\r"), b = content.find_last_not_of(" \t\n\r");
          if (a != std::string::npos) pos = full.find(content.substr(a, b - a + 1), searched);
        }
        ZR_CHECK(pos != std::string::npos, where, ": messages[", i,
                 "]: cannot find this assistant turn in the chat template's render; use --train_on all");
        size_t end = std::string::npos;
        for (const std::string& m : {tok_.eos_token(), std::string("<|im_end|>"), std::string("<|eot_id|>"),
                                     std::string("<end_of_turn>"), std::string("<|end|>")}) {
          const size_t at = m.empty() ? std::string::npos : full.find(m, pos);
          if (at != std::string::npos && (end == std::string::npos || at + m.size() < end)) end = at + m.size();
        }
        if (prefix && pos == p.size() && (end == std::string::npos || end > f.size())) end = f.size();
        if (end == std::string::npos) {
          ZR_CHECK(i + 1 == messages.size(), where, ": messages[", i,
                   "]: cannot find where this assistant turn ends in the chat template's render; use --train_on all");
          end = full.size();
        }
        spans.push_back({pos, end});
        searched = end;
      }
    } else {
      spans.push_back({0, full.size()});
    }
    encode_spans(full, spans, d);
  }

  DocOut process(const Record& r) const {
    DocOut d;
    try {
      if (!r.json) {
        d.ids = tok_.encode(r.text, true);
        d.mask.assign(d.ids.size(), 1);
        add_eos(d);
        return d;
      }
      ojson j;
      try {
        j = ojson::parse(r.text);
      } catch (const ojson::exception& e) {
        ZR_FAIL(r.where, ": not valid JSON: ", e.what());
      }
      ZR_CHECK(j.is_object(), r.where, ": a record must be a JSON object");
      if (j.contains("messages")) {
        chat(j["messages"], j, r.where, d);
      } else if (j.contains("prompt") && j.contains("completion") && j["prompt"].is_array() &&
                 j["completion"].is_array()) {  // conversational prompt-completion (as TRL writes it)
        ojson messages = j["prompt"];
        for (const ojson& m : j["completion"]) messages.push_back(m);
        chat(messages, j, r.where, d, j["prompt"].size());
      } else if (j.contains("prompt") || j.contains("completion")) {
        ZR_CHECK(
            j.contains("prompt") && j["prompt"].is_string() && j.contains("completion") && j["completion"].is_string(),
            r.where,
            ": a prompt-completion record needs \"prompt\" and \"completion\" strings (or two lists of messages)");
        d.ids = tok_.encode(j["prompt"].get<std::string>(), true);
        d.mask.assign(d.ids.size(), o_.train_on == "all" ? 1 : 0);
        auto c = tok_.encode(j["completion"].get<std::string>(), false);
        d.ids.insert(d.ids.end(), c.begin(), c.end());
        d.mask.insert(d.mask.end(), c.size(), 1);
        add_eos(d);
      } else if (j.contains("text")) {
        ZR_CHECK(j["text"].is_string(), r.where, ": \"text\" must be a string");
        d.ids = tok_.encode(j["text"].get<std::string>(), true);
        d.mask.assign(d.ids.size(), 1);
        add_eos(d);
      } else {
        ZR_FAIL(
            r.where, ": a record needs \"text\", \"messages\" or \"prompt\" + \"completion\" (keys here: ",
            [&] {
              std::string k;
              for (auto it = j.begin(); it != j.end(); ++it) k += (k.empty() ? "" : ", ") + it.key();
              return k.empty() ? std::string("none") : k;
            }(),
            ")");
      }
    } catch (const Error& e) {
      d.error = e.what();
    }
    return d;
  }

  PrepareResult run() {
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<std::string> files = expand_inputs(o_.inputs);
    int64_t total = 0;
    for (auto& f : files) {
      std::ifstream in(platform::to_path(f), std::ios::binary | std::ios::ate);
      ZR_CHECK(in, "prepare: cannot open ", f);
      total += static_cast<int64_t>(in.tellg());
    }
    const int threads =
        o_.threads > 0 ? o_.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    std::vector<Record> batch;
    size_t batch_bytes = 0;
    int64_t done_bytes = 0;
    auto last_print = std::chrono::steady_clock::now() - std::chrono::seconds(10);
    const bool tty = platform::stderr_is_terminal();
    auto progress = [&](bool final) {
      if (!o_.progress) return;
      const auto now = std::chrono::steady_clock::now();
      if (!final && now - last_print < std::chrono::milliseconds(tty ? 200 : 5000)) return;
      last_print = now;
      const double s = std::chrono::duration<double>(now - t0).count();
      const double frac = total ? static_cast<double>(done_bytes) / static_cast<double>(total) : 1.0;
      const int width = 30, fill = static_cast<int>(frac * width);
      std::fprintf(stderr, "%s[prepare] [%s%s] %5.1f%% %lld docs %lld tokens %.1f MB/s%s", tty ? "\r" : "",
                   std::string(static_cast<size_t>(fill), '#').c_str(),
                   std::string(static_cast<size_t>(width - fill), '.').c_str(), 100 * frac,
                   static_cast<long long>(res_.documents), static_cast<long long>(res_.tokens),
                   s > 0 ? static_cast<double>(done_bytes) / 1e6 / s : 0.0, tty && !final ? "" : "\n");
      std::fflush(stderr);
    };
    auto flush_batch = [&] {
      std::vector<DocOut> outs(batch.size());
      std::atomic<size_t> next{0};
      auto work = [&] {
        for (size_t i; (i = next.fetch_add(1)) < batch.size();) outs[i] = process(batch[i]);
      };
      std::vector<std::thread> pool;
      for (int k = 1; k < threads && static_cast<size_t>(k) < batch.size(); ++k) pool.emplace_back(work);
      work();
      for (auto& t : pool) t.join();
      for (size_t i = 0; i < batch.size(); ++i) {
        if (!outs[i].error.empty()) throw Error(outs[i].error);
        add_document(outs[i]);
        done_bytes += static_cast<int64_t>(batch[i].text.size()) + (batch[i].json ? 1 : 0);
      }
      batch.clear();
      batch_bytes = 0;
      progress(false);
    };
    auto push = [&](Record r) {
      batch_bytes += r.text.size();
      batch.push_back(std::move(r));
      if (batch.size() >= 8192 || batch_bytes >= (8u << 20)) flush_batch();
    };
    for (const std::string& f : files) {
      const bool jsonl = ends_with(f, ".jsonl") || ends_with(f, ".json") || ends_with(f, ".ndjson");
      if (!jsonl) {
        push({read_file(f), f, false});
        continue;
      }
      std::ifstream in(platform::to_path(f), std::ios::binary);
      ZR_CHECK(in, "prepare: cannot open ", f);
      int64_t line = 0;
      for (std::string l; std::getline(in, l);) {
        ++line;
        if (l.find_first_not_of(" \t\r") == std::string::npos) {
          done_bytes += static_cast<int64_t>(l.size()) + 1;
          continue;
        }
        push({std::move(l), f + ":" + std::to_string(line), true});
      }
    }
    flush_batch();
    flush_shard(train_, false);
    flush_shard(val_, true);
    res_.bytes_in = total;
    res_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    done_bytes = total;
    progress(true);
    ZR_CHECK(res_.documents > 0, "prepare: no documents in ", o_.inputs.size() == 1 ? o_.inputs[0] : "the inputs");
    return res_;
  }

 private:
  struct Pending {
    TokenShard shard;
    int index = 0;
    bool any_masked = false, prompt_masked = false;
  };

  void add_document(const DocOut& d) {
    Pending& p = res_.documents < o_.val_docs ? val_ : train_;
    ++res_.documents;
    if (p.shard.doc_starts.empty()) p.shard.doc_starts.push_back(0);
    for (size_t i = 0; i < d.ids.size(); ++i) {
      // A document's first token is never a target: nothing of the document comes before it (as transformers'
      // DataCollatorWithFlattening labels packed sequences).
      const uint8_t m = i == 0 ? 0 : d.mask[i];
      p.shard.tokens.push_back(static_cast<uint32_t>(d.ids[i]));
      p.shard.loss_mask.push_back(m);
      p.any_masked = p.any_masked || !m;
      if (i > 0 && !m) p.prompt_masked = true;
      res_.target_tokens += m;
    }
    res_.tokens += static_cast<int64_t>(d.ids.size());
    p.shard.doc_starts.push_back(static_cast<int64_t>(p.shard.tokens.size()));
    if (static_cast<int64_t>(p.shard.tokens.size()) >= o_.shard_tokens) flush_shard(p, &p == &val_);
  }

  void flush_shard(Pending& p, bool val) {
    if (p.shard.tokens.empty()) return;
    char suffix[32];
    std::snprintf(suffix, sizeof suffix, "_%06d.bin", p.index++);
    const std::string path = o_.out + (val ? "_val" : "") + suffix;
    const size_t slash = path.find_last_of('/');
    if (slash != std::string::npos && slash > 0) make_dirs(path.substr(0, slash));
    if (o_.format == "llmc") {
      write_token_shard(path, std::vector<uint16_t>(p.shard.tokens.begin(), p.shard.tokens.end()));
      if (p.prompt_masked) masks_dropped_ = true;
    } else {
      p.shard.vocab_size = tok_.vocab_size();
      if (!p.any_masked) p.shard.loss_mask.clear();
      write_zerorun_shard(path, p.shard);
    }
    res_.shards.push_back(path);
    p.shard = TokenShard();
    p.any_masked = p.prompt_masked = false;
  }

 public:
  bool masks_dropped_ = false;

 private:
  const PrepareOptions& o_;
  Tokenizer tok_;
  std::unique_ptr<JinjaTemplate> template_;
  Pending train_, val_;
  PrepareResult res_;
};

}  // namespace

PrepareResult prepare_data(const PrepareOptions& o) {
  ZR_CHECK(!o.inputs.empty(), "prepare: no input files given");
  ZR_CHECK(!o.tokenizer.empty(), "prepare: --tokenizer is required (a tokenizer.json or a model directory)");
  Preparer p(o);
  PrepareResult r = p.run();
  if (p.masks_dropped_)
    std::fprintf(stderr,
                 "[prepare] note: --format llmc carries no loss mask; prompt and user tokens will be trained on "
                 "(use --format zerorun to keep the mask)\n");
  return r;
}

}  // namespace zerorun
