// Oracle for zerorun's tokenizer: transformers.js (@huggingface/transformers) encodes and decodes the corpus
// with a real tokenizer.json. Usage:
//   node tokenizer_oracle.mjs MODEL_DIR CORPUS.jsonl DOCS_OUT.jsonl ORACLE_OUT.jsonl
// DOCS_OUT gets the documents (the corpus, then every added token inside text); ORACLE_OUT one line a document:
// {"ids": [...add_special_tokens], "plain": [...without], "decoded": decode(plain)}.
import fs from 'node:fs';
import path from 'node:path';
import { AutoTokenizer, env } from '@huggingface/transformers';

const [modelDir, corpus, docsOut, oracleOut] = process.argv.slice(2);
env.allowRemoteModels = false;
env.localModelPath = path.dirname(path.resolve(modelDir)) + '/';
const tok = await AutoTokenizer.from_pretrained(path.basename(path.resolve(modelDir)));
const tj = JSON.parse(fs.readFileSync(path.join(modelDir, 'tokenizer.json'), 'utf8'));

const docs = fs.readFileSync(corpus, 'utf8').split('\n').filter((l) => l.length).map((l) => JSON.parse(l));
const added = tj.added_tokens.map((t) => t.content);
// Every added token inside text, at the start, at the end and between spaces (lstrip/rstrip).
for (const t of added) docs.push(`x${t}y`, `${t} starts`, `ends ${t}`, `a  ${t}  b\n`);
docs.push(added.slice(0, 64).join(' mid '));

const out = [];
for (const d of docs) {
  const plain = Array.from(tok.encode(d, { add_special_tokens: false }));
  out.push(JSON.stringify({ ids: Array.from(tok.encode(d, { add_special_tokens: true })), plain,
                            decoded: plain.length ? tok.decode(plain) : '' }));
}
fs.writeFileSync(docsOut, docs.map((d) => JSON.stringify(d)).join('\n') + '\n');
fs.writeFileSync(oracleOut, out.join('\n') + '\n');
console.log(`${path.basename(modelDir)}: ${docs.length} documents (${added.length} added tokens)`);
