// Compares `zerorun prepare`'s documents (zerorun_tokenize_tool --dump) with prepare_oracle.mjs's: identical ids,
// and the masked-in tokens decode to text that holds each expected target (assistant contents, completions) and
// none of the prompt's assistant turns.
//   node prepare_compare.mjs NAME ORACLE.jsonl DUMP.jsonl
import fs from 'node:fs';

const [name, oraclePath, dumpPath] = process.argv.slice(2);
const lines = (p) => fs.readFileSync(p, 'utf8').split('\n').filter((l) => l.length).map((l) => JSON.parse(l));
const oracle = lines(oraclePath), ours = lines(dumpPath);
let bad = 0, targets = 0, tokens = 0;
if (oracle.length !== ours.length) {
  console.log(`${name}: ${oracle.length} records but ${ours.length} documents in the shard`);
  process.exit(1);
}
for (let i = 0; i < oracle.length; ++i) {
  const a = oracle[i], b = ours[i];
  tokens += b.ids.length;
  targets += b.mask.reduce((x, y) => x + y, 0);
  const same = JSON.stringify(a.ids) === JSON.stringify(b.ids);
  const missing = a.targets.filter((t) => !b.targets.includes(t));
  const extra = (a.untargets ?? []).filter((t) => b.targets.includes(t));
  if (same && !missing.length && !extra.length && b.mask[0] === 0) continue;
  ++bad;
  console.log(`${name}: document ${i}: ${same ? '' : 'ids differ from transformers.js; '}` +
              `${missing.length ? 'targets ' + JSON.stringify(b.targets) + ' miss ' + JSON.stringify(missing) : ''}` +
              `${extra.length ? 'targets ' + JSON.stringify(b.targets) + ' hold ' + JSON.stringify(extra) : ''}` +
              `${b.mask[0] === 0 ? '' : ' the first token is a target'}`);
}
console.log(`${name}: ${oracle.length} documents, ${tokens} tokens, ${targets} in the loss: ` +
            `${bad ? bad + ' WRONG' : 'ids identical to transformers.js, targets as expected'}`);
process.exit(bad ? 1 : 0);
