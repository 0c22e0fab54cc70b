// contracts/asyncapi.yaml through the AsyncAPI parser (@asyncapi/parser, with the file's own
// directory as the base of its $refs: the JSON Schemas of contracts/schemas/, draft 2020-12).
// Exit 1 on any error, and on warnings too: the document is generated, so a warning is the
// generator's bug.
import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { createRequire } from "node:module";

const [parserDir, documentPath] = process.argv.slice(2);
const require = createRequire(resolve(parserDir, "package.json"));
const { Parser, fromFile } = require("@asyncapi/parser");

// The payloads' JSON Schemas are draft 2020-12 (what msgspec writes), declared as such
// (schemaFormat application/schema+json;version=draft-2020-12); the parser has no schema
// parser of its own for that dialect (its JSON Schema one is draft-07's). This one checks
// each payload schema against the 2020-12 meta-schema (ajv's) and hands it on as it is.
const Ajv2020 = require("ajv/dist/2020").default;
const jsonSchema2020 = {
  getMimeTypes: () => ["schema", "schema+json", "schema+yaml"].map(
    (type) => `application/${type};version=draft-2020-12`,
  ),
  async validate(input) {
    const ajv = new Ajv2020({ strict: false, validateFormats: false });
    if (ajv.validateSchema(input.data)) {
      return [];
    }
    return (ajv.errors ?? []).map((e) => ({
      message: `not a draft 2020-12 schema: ${e.message}`,
      path: [...input.path, ...e.instancePath.split("/").filter(Boolean)],
    }));
  },
  async parse(input) {
    return input.data;
  },
};

const parser = new Parser({ schemaParsers: [jsonSchema2020] });
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
