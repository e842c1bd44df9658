// Compares zerorun's tokenizer output with transformers.js's (tokenizer_oracle.mjs), line by line.
//   node tokenizer_compare.mjs NAME DOCS.jsonl ORACLE.jsonl ZERORUN.jsonl
// Prints each mismatching document (the first 5 in full) and exits 1 when any differs.
import fs from 'node:fs';

const [name, docsPath, oraclePath, oursPath] = process.argv.slice(2);
const lines = (p) => fs.readFileSync(p, 'utf8').split('\n').filter((l) => l.length).map((l) => JSON.parse(l));
const docs = lines(docsPath), oracle = lines(oraclePath), ours = lines(oursPath);
if (oracle.length !== docs.length || ours.length !== docs.length) {
  console.log(`${name}: ${docs.length} documents, oracle ${oracle.length} lines, zerorun ${ours.length} lines`);
  process.exit(1);
}
let bad = { ids: 0, plain: 0, decoded: 0, streamed: 0 }, shown = 0, tokens = 0;
for (let i = 0; i < docs.length; ++i) {
  tokens += oracle[i].ids.length;
  if (ours[i].stream_differs !== undefined) {  // zerorun's DecodeStream, token by token, vs its decode
    ++bad.streamed;
    if (shown++ < 5) console.log(`${name}: document ${i}: streamed ${JSON.stringify(ours[i].stream_differs).slice(0, 200)}`);
  }
  for (const k of ['ids', 'plain', 'decoded']) {
    const a = JSON.stringify(oracle[i][k]), b = JSON.stringify(ours[i][k]);
    if (a === b) continue;
    ++bad[k];
    if (shown++ < 5) {
      console.log(`${name}: document ${i} ${JSON.stringify(docs[i]).slice(0, 200)}: ${k} differ`);
      console.log(`  transformers.js: ${a.slice(0, 400)}`);
      console.log(`  zerorun:         ${b.slice(0, 400)}`);
    }
  }
}
const total = bad.ids + bad.plain + bad.decoded + bad.streamed;
console.log(`${name}: ${docs.length} documents, ${tokens} tokens: ${total ? 'MISMATCH' : 'identical'} ` +
            `(ids ${bad.ids}, without special tokens ${bad.plain}, decoded ${bad.decoded}, streamed ${bad.streamed} differ)`);
process.exit(total ? 1 : 0);
