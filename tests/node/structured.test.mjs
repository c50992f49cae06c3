// structured.test.mjs - the Vercel AI SDK's generateObject and LangChain's
// withStructuredOutput (both its methods: a JSON schema response_format and
// a forced tool call), with zod 4 schemas of what users write (integers
// with bounds, enums, optional and nullable fields, arrays with bounds,
// nested objects, a pattern, uuid and date-time formats), against a real
// `spillway serve` started from config/demo.ini (`make run`'s
// configuration) on a port of its own. Every answer must parse with the
// schema (the SDKs check it too) at temperature 1, several seeds.
// Run by run.sh, which installs the packages.
import { generateObject } from 'ai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { ChatOpenAI } from '@langchain/openai';
import { z } from 'zod';
import { check, failed, startDemoRouter } from './demo_router.mjs';

const router = await startDemoRouter('structured');
const port = router.port;
const base = `http://127.0.0.1:${port}/v1`;

const person = z.object({
  name: z.string().max(24),
  age: z.number().int().min(0).max(150),
  tags: z.array(z.enum(['red', 'green', 'blue'])).max(3),
  nickname: z.string().max(12).optional(),
});
const order = z.object({
  id: z.uuid(),
  created: z.iso.datetime(),
  status: z.enum(['new', 'paid', 'shipped']),
  items: z.array(z.object({
    sku: z.string().regex(/^[A-Z]{3}-[0-9]{3}$/),
    quantity: z.number().int().positive().max(99),
    price: z.number().min(0).max(1000),
  })).min(1).max(3),
  note: z.string().max(40).nullable(),
});
const schemas = { person, order };

try {
  const models = await (await fetch(`${base}/models`)).json();
  const id = models.data[0].id;
  const provider = createOpenAICompatible({ name: 'spillway', baseURL: base,
                                            supportsStructuredOutputs: true });
  for (const [name, schema] of Object.entries(schemas)) {
    for (const seed of [1, 2, 3]) {
      try {
        const r = await generateObject({ model: provider(id), schema, prompt: `A ${name} as JSON`,
                                         maxOutputTokens: 400, temperature: 1, seed });
        check(schema.safeParse(r.object).success,
              `AI SDK generateObject, ${name}, seed ${seed}: ${JSON.stringify(r.object).slice(0, 90)}`);
      } catch (e) {
        check(false, `AI SDK generateObject, ${name}, seed ${seed}: ${e.message}`);
      }
    }
    for (const method of ['jsonSchema', 'functionCalling']) {
      try {
        const llm = new ChatOpenAI({ model: id, apiKey: 'unused', configuration: { baseURL: base },
                                     maxTokens: 400, temperature: 1 });
        const out = await llm.withStructuredOutput(schema, { method, name }).invoke(`A ${name} as JSON`);
        check(schema.safeParse(out).success,
              `LangChain withStructuredOutput (${method}), ${name}: ${JSON.stringify(out).slice(0, 90)}`);
      } catch (e) {
        check(false, `LangChain withStructuredOutput (${method}), ${name}: ${e.message}`);
      }
    }
  }
} finally {
  await router.stop();
}
check(failed() === 0, 'every answer parsed with its schema');
process.exit(failed() ? 1 : 0);
