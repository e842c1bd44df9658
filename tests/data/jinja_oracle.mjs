// Oracle for zerorun's Jinja subset: @huggingface/jinja renders each chat template with each context.
//   node jinja_oracle.mjs CASES.json OUT.jsonl NAME=TEMPLATE_FILE_OR_TOKENIZER_CONFIG...
// One output line a (template, case): {"template": NAME, "case": i, "out": text} or {"..., "error": true}.
import fs from 'node:fs';
import { Template } from '@huggingface/jinja';

const [casesPath, outPath, ...specs] = process.argv.slice(2);
const cases = JSON.parse(fs.readFileSync(casesPath, 'utf8'));
const lines = [];
for (const spec of specs) {
  const [name, file] = spec.split('=');
  let text = fs.readFileSync(file, 'utf8');
  if (file.endsWith('.json')) text = JSON.parse(text).chat_template;
  const tpl = new Template(text);
  cases.forEach((c, i) => {
    try {
      lines.push(JSON.stringify({ template: name, case: i, out: tpl.render(c) }));
    } catch (e) {
      lines.push(JSON.stringify({ template: name, case: i, error: true }));
    }
  });
}
fs.writeFileSync(outPath, lines.join('\n') + '\n');
