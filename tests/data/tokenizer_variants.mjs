// Derives tokenizer.json variants from the npm packages' files, so the oracle also covers pipeline pieces the
// shipped files do not use: SmolLM's Digits + ByteLevel pre-tokenizer, Mistral v0.3's Metaspace (prepend_scheme
// first, no normalizer), RoBERTa-style ByteLevel add_prefix_space with a template adding tokens before and after,
// added tokens with lstrip / rstrip / normalized, NFD and regex Replace normalizers, and the pre-tokenizer regexes
// of o200k-style (Phi-4, GPT-4o) and DeepSeek-V3-style tokenizers over GPT-2's vocabulary.
//   node tokenizer_variants.mjs NPM_MODELS_DIR OUT_DIR   (NPM_MODELS_DIR: node_modules/@lenml)
import fs from 'node:fs';
import path from 'node:path';

const [lenml, outDir] = process.argv.slice(2);
const load = (m) => JSON.parse(fs.readFileSync(path.join(lenml, `tokenizer-${m}`, 'models', 'tokenizer.json'), 'utf8'));
const write = (name, tj) => {
  const d = path.join(outDir, name);
  fs.mkdirSync(d, { recursive: true });
  fs.writeFileSync(path.join(d, 'tokenizer.json'), JSON.stringify(tj));
  fs.writeFileSync(path.join(d, 'tokenizer_config.json'), JSON.stringify({ clean_up_tokenization_spaces: false }));
};

let t = load('gpt2');  // SmolLM-style: digits one by one before the byte-level split
t.pre_tokenizer = { type: 'Sequence', pretokenizers: [{ type: 'Digits', individual_digits: true },
  { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true }] };
write('smollm_like', t);

t = load('gpt2');  // RoBERTa-style prefix space, NFD, and a template around the sequence
t.normalizer = { type: 'NFD' };
t.pre_tokenizer.add_prefix_space = true;
t.post_processor = { type: 'TemplateProcessing',
  single: [{ SpecialToken: { id: '<|endoftext|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
           { SpecialToken: { id: '<|endoftext|>', type_id: 0 } }],
  pair: [], special_tokens: { '<|endoftext|>': { id: '<|endoftext|>', ids: [50256], tokens: ['<|endoftext|>'] } } };
write('gpt2_prefix_space', t);

t = load('llama2');  // Mistral v0.3-style: no normalizer, Metaspace adds the prefix to the first section only
t.normalizer = null;
t.pre_tokenizer = { type: 'Metaspace', replacement: '\u2581', prepend_scheme: 'first', split: false };
t.added_tokens.push({ id: 32000, content: '[INST]', single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });
t.added_tokens.push({ id: 32001, content: '[/INST]', single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });
write('mistral_v03_like', t);

const byteLevelNoRegex = { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false };
t = load('gpt2');  // o200k-style split: case classes, an optional contraction suffix, \p{N}{1,3}
t.pre_tokenizer = { type: 'Sequence', pretokenizers: [{ type: 'Split', invert: false, behavior: 'Isolated', pattern: {
  Regex: "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|" +
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|" +
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" } }, byteLevelNoRegex] };
write('o200k_like', t);

t = load('gpt2');  // DeepSeek-V3-style: several Splits, CJK ranges, escaped punctuation in a class
t.pre_tokenizer = { type: 'Sequence', pretokenizers: [
  { type: 'Split', pattern: { Regex: '\\p{N}{1,3}' }, behavior: 'Isolated', invert: false },
  { type: 'Split', pattern: { Regex: '[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+' }, behavior: 'Isolated', invert: false },
  { type: 'Split', pattern: { Regex: "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" },
    behavior: 'Isolated', invert: false },
  byteLevelNoRegex] };
write('deepseek_like', t);

t = load('llama3');  // added tokens: lstrip/rstrip specials, a normalized non-special token, regex Replace
const base = 128256;
t.added_tokens.push({ id: base, content: '<|tool|>', single_word: false, lstrip: true, rstrip: true, normalized: false, special: true });
t.added_tokens.push({ id: base + 1, content: ' zerorun', single_word: false, lstrip: false, rstrip: false, normalized: true, special: false });
t.added_tokens.push({ id: base + 2, content: '<ctx>', single_word: false, lstrip: false, rstrip: true, normalized: false, special: false });
t.normalizer = { type: 'Replace', pattern: { Regex: '\\t+' }, content: '    ' };
write('llama3_added', t);
