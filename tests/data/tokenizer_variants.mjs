// Derives tokenizer.json variants from the npm packages' files, so the oracle also covers pipeline pieces the
// shipped files do not use: SmolLM's Digits + ByteLevel pre-tokenizer, Mistral v0.3's Metaspace (prepend_scheme
// first, no normalizer), RoBERTa-style ByteLevel add_prefix_space with a template adding tokens before and after,
// added tokens with lstrip / rstrip / normalized, NFD and regex Replace normalizers.
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

t = load('llama3');  // added tokens: lstrip/rstrip specials, a normalized non-special token, regex Replace
const base = 128256;
t.added_tokens.push({ id: base, content: '<|tool|>', single_word: false, lstrip: true, rstrip: true, normalized: false, special: true });
t.added_tokens.push({ id: base + 1, content: ' zerorun', single_word: false, lstrip: false, rstrip: false, normalized: true, special: false });
t.added_tokens.push({ id: base + 2, content: '<ctx>', single_word: false, lstrip: false, rstrip: true, normalized: false, special: false });
t.normalizer = { type: 'Replace', pattern: { Regex: '\\t+' }, content: '    ' };
write('llama3_added', t);
