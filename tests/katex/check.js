// Renders every $$...$$ and $...$ of the Markdown files given as arguments with KaTeX; exit 1 on the first error.
const fs = require("fs");
const katex = require("katex");

function maths(text) {
  const out = [];
  const display = /\$\$([\s\S]+?)\$\$/g;
  let rest = text.replace(display, (_, body) => { out.push([body, true]); return " "; });
  rest = rest.replace(/\\\$/g, " ");
  for (const m of rest.matchAll(/\$([^$\n]+?)\$/g)) out.push([m[1], false]);
  return out;
}

let count = 0;
for (const file of process.argv.slice(2)) {
  for (const [body, displayMode] of maths(fs.readFileSync(file, "utf8"))) {
    try {
      katex.renderToString(body, { throwOnError: true, displayMode, strict: "error" });
      count++;
    } catch (e) {
      console.error(`${file}: ${e.message}\n  in: ${body.slice(0, 200)}`);
      process.exit(1);
    }
  }
}
console.log(`${count} formulas rendered`);
