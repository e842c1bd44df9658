// Compares zerorun's chat template renders with @huggingface/jinja's (jinja_oracle.mjs).
//   node jinja_compare.mjs ORACLE.jsonl ZERORUN.jsonl
// A case where the oracle raises must raise in zerorun too (the messages may differ).
import fs from 'node:fs';

const lines = (p) => fs.readFileSync(p, 'utf8').split('\n').filter((l) => l.length).map((l) => JSON.parse(l));
const [oracle, ours] = process.argv.slice(2).map(lines);
if (oracle.length !== ours.length) {
  console.log(`chat templates: oracle ${oracle.length} renders, zerorun ${ours.length}`);
  process.exit(1);
}
const per = new Map();
let bad = 0;
for (let i = 0; i < oracle.length; ++i) {
  const a = oracle[i], b = ours[i];
  const s = per.get(a.template) ?? { n: 0, bad: 0, errors: 0 };
  per.set(a.template, s);
  ++s.n;
  if (a.error) ++s.errors;
  const same = a.template === b.template && a.case === b.case && (a.error ? b.error === true : !b.error && a.out === b.out);
  if (same) continue;
  ++s.bad;
  if (bad++ < 5) {
    console.log(`${a.template} case ${a.case} differs:`);
    console.log(`  @huggingface/jinja: ${a.error ? '(raises)' : JSON.stringify(a.out).slice(0, 600)}`);
    console.log(`  zerorun:            ${b.error ? '(raises) ' + b.message : JSON.stringify(b.out).slice(0, 600)}`);
  }
}
for (const [name, s] of per)
  console.log(`${name}: ${s.n} renders (${s.errors} raise): ${s.bad ? s.bad + ' DIFFER' : 'identical'}`);
process.exit(bad ? 1 : 0);
