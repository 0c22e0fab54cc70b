// contracts/asyncapi.yaml through the AsyncAPI parser (@asyncapi/parser, with the file's own
// directory as the base of its $refs: the JSON Schemas of contracts/schemas/). Exit 1 on any
// error, and on warnings too: the document is generated, so a warning is the generator's bug.
import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { createRequire } from "node:module";

const [parserDir, documentPath] = process.argv.slice(2);
const require = createRequire(resolve(parserDir, "package.json"));
const { Parser, fromFile } = require("@asyncapi/parser");

const parser = new Parser();
const { document, diagnostics } = await fromFile(parser, resolve(documentPath)).parse();
const serious = diagnostics.filter((d) => d.severity <= 1);
for (const d of diagnostics) {
  const where = d.path && d.path.length ? ` at ${d.path.join(".")}` : "";
  console.error(`${["error", "warning", "info", "hint"][d.severity]} ${d.code}${where}: ${d.message}`);
}
if (!document || serious.length) {
  process.exit(1);
}
const channels = document.channels().all().map((c) => c.address());
const messages = document.messages().all().map((m) => `${m.id()} (${Object.keys(m.payload()?.properties() ?? {}).length} fields)`);
console.log(`asyncapi: ${documentPath} parses (AsyncAPI ${document.version()}): channels ${channels.join(", ")}; messages ${messages.join(", ")}`);
