// Oracle for `zerorun prepare`: the ids transformers.js gives each record of a JSONL file, as zerorun prepare
// builds a document: messages -> apply_chat_template(tokenize) ; prompt + completion -> encode(prompt) +
// encode(completion, no special tokens) + EOS ; text -> encode(text) + EOS. Also the text each document must
// train on (the assistant contents, the completion, the text), and text it must not train on.
//   node prepare_oracle.mjs MODEL_DIR RECORDS.jsonl OUT.jsonl
import fs from 'node:fs';
import path from 'node:path';
import { AutoTokenizer, env } from '@huggingface/transformers';

const [modelDir, recordsPath, outPath] = process.argv.slice(2);
env.allowRemoteModels = false;
env.localModelPath = path.dirname(path.resolve(modelDir)) + '/';
const tok = await AutoTokenizer.from_pretrained(path.basename(path.resolve(modelDir)));
const cfg = JSON.parse(fs.readFileSync(path.join(modelDir, 'tokenizer_config.json'), 'utf8'));
const eosTok = typeof cfg.eos_token === 'string' ? cfg.eos_token : cfg.eos_token?.content;
const eos = eosTok ? tok.convert_tokens_to_ids(eosTok) : undefined;
const out = [];
for (const line of fs.readFileSync(recordsPath, 'utf8').split('\n')) {
  if (!line.trim()) continue;
  const r = JSON.parse(line);
  let ids, targets, untargets = [];
  if (r.messages) {
    const enc = tok.apply_chat_template(r.messages, { tokenize: true, return_tensor: false, tools: r.tools });
    ids = Array.from(enc.input_ids ?? enc);
    targets = r.messages.filter((m) => m.role === 'assistant').map((m) => m.content.split('</think>').pop().trim());
  } else if (Array.isArray(r.prompt)) {  // conversational prompt-completion: only the completion's turns train
    const enc = tok.apply_chat_template([...r.prompt, ...r.completion], { tokenize: true, return_tensor: false });
    ids = Array.from(enc.input_ids ?? enc);
    targets = r.completion.map((m) => m.content);
    untargets = r.prompt.filter((m) => m.role === 'assistant').map((m) => m.content);
  } else if (r.prompt !== undefined) {
    ids = [...tok.encode(r.prompt), ...tok.encode(r.completion, { add_special_tokens: false })];
    if (eos !== undefined) ids.push(eos);
    targets = [r.completion];
  } else {
    ids = [...tok.encode(r.text)];
    if (eos !== undefined) ids.push(eos);
    targets = [tok.decode(ids.slice(1, eos !== undefined ? -1 : undefined))];  // the first token is never a target
  }
  out.push(JSON.stringify({ ids, targets, untargets }));
}
fs.writeFileSync(outPath, out.join('\n') + '\n');
