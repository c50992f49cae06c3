// Writes the zod 4 fixtures of tests/data/schemas (z.toJSONSchema of typical
// schemas), one file per schema. Run once by hand where zod 4 is installed
// (the files are committed; no test runs this):
//   NODE_PATH=DIR/node_modules node tests/data/schemas/zod4.mjs tests/data/schemas
import { writeFileSync } from "node:fs";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const { z } = require("zod");

const address = z.object({
  street: z.string(),
  city: z.string().min(1).max(40),
  zip: z.string().regex(/^[0-9]{5}$/).optional(),
});

const user = z.object({
  id: z.uuid(),
  name: z.string().min(1).max(50),
  age: z.number().int().min(0).max(150),
  score: z.number().min(0).max(1),
  email: z.email(),
  created: z.iso.datetime(),
  birthday: z.iso.date().optional(),
  role: z.enum(["admin", "user", "guest"]),
  address,
  nickname: z.string().nullable(),
  tags: z.record(z.string(), z.number().int()),
  point: z.tuple([z.number(), z.number()]),
  active: z.boolean().default(true),
});

const cat = z.object({ kind: z.literal("cat"), lives: z.number().int().min(1).max(9) });
const dog = z.object({ kind: z.literal("dog"), good: z.boolean() });
const pets = z.object({
  pet: z.discriminatedUnion("kind", [cat, dog]),
  others: z.array(z.union([cat, dog])).max(3),
  id: z.union([z.string(), z.number().int()]),
  level: z.number().int().min(1).max(5).default(3),
  step: z.number().int().multipleOf(5),
  ratio: z.number().positive().lt(10),
});

const category = z.object({
  name: z.string(),
  get subcategories() {
    return z.array(category);
  },
});

const event = z.object({
  at: z.iso.time(),
  when: z.iso.datetime({ offset: true }),
  host: z.ipv4(),
  host6: z.ipv6().optional(),
  site: z.url(),
  code: z.string().regex(/^[A-Z]{2}-\d{3,5}$/),
  count: z.number().int().nonnegative(),
  attendees: z.array(z.object({ name: z.string().max(20), email: z.email() })).min(1).max(2),
  meta: z.record(z.string(), z.union([z.string(), z.number(), z.null()])).optional(),
});

// z.iso.duration() writes a pattern with lookaheads: a file of its own.
const duration = z.object({ took: z.iso.duration() });

const schemas = { user, pets, category, event, duration };
const out = process.argv[2];
for (const [name, s] of Object.entries(schemas)) {
  writeFileSync(`${out}/zod4-${name}.json`, JSON.stringify(z.toJSONSchema(s), null, 1) + "\n");
}
console.log("zod", require("zod/package.json").version);
