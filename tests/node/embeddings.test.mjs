// embeddings.test.mjs - /v1/embeddings through the SDKs users call it
// with: OpenAI's official package (embeddings.create, which asks for
// base64 unless told otherwise and decodes it, and with encoding_format
// "float"), and the Vercel AI SDK's embed / embedMany over its
// OpenAI-compatible provider, against a real `spillway serve` started from
// config/demo.ini (`make run`'s configuration, whose [model] section says
// pooling = mean) on a port of its own. The vectors must be the model's
// width, of unit length, the same whichever way they were asked for, and
// the same for a text alone as in a batch. Run by run.sh, which installs
// the packages.
import OpenAI from 'openai';
import { embed, embedMany } from 'ai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { check, failed, startDemoRouter } from './demo_router.mjs';

const router = await startDemoRouter('embeddings');
const port = router.port;
const base = `http://127.0.0.1:${port}/v1`;

const WIDTH = 256; // the demo model's (Makefile: --dim 256)
const texts = ['Once upon a time', 'The quick brown fox jumps over the lazy dog.', 'embeddings'];
const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));
const same = (a, b) => a.length === b.length && a.every((x, i) => Math.abs(x - b[i]) <= 1e-6);
const unit = (v) => v.length === WIDTH && Math.abs(norm(v) - 1) < 1e-4;

try {
  const models = await (await fetch(`${base}/models`)).json();
  const id = models.data[0].id;
  const client = new OpenAI({ baseURL: base, apiKey: 'unused' });

  // the SDK's default: base64 on the wire, decoded by the SDK
  const b64 = await client.embeddings.create({ model: id, input: texts });
  check(b64.object === 'list' && b64.data.length === 3 &&
        b64.data.every((d, i) => d.object === 'embedding' && d.index === i && unit(d.embedding)),
        `openai embeddings.create (base64 decoded): 3 unit vectors of ${WIDTH}`);
  check(b64.usage.prompt_tokens > 0 && b64.usage.total_tokens === b64.usage.prompt_tokens,
        `openai embeddings.create: usage ${JSON.stringify(b64.usage)}`);
  const floats = await client.embeddings.create({ model: id, input: texts, encoding_format: 'float' });
  check(floats.data.every((d, i) => same(d.embedding, b64.data[i].embedding)),
        'openai embeddings.create (float): the same vectors as base64');
  const one = await client.embeddings.create({ model: id, input: texts[1], dimensions: WIDTH });
  check(one.data.length === 1 && same(one.data[0].embedding, b64.data[1].embedding),
        'openai embeddings.create, one text: the same vector as in the batch');
  check(!same(b64.data[0].embedding, b64.data[1].embedding), 'different texts, different vectors');
  try {
    await client.embeddings.create({ model: id, input: '' });
    check(false, 'an empty input is refused');
  } catch (e) {
    check(e.status === 400 && e.param === 'input', `an empty input: 400, param input (${e.message})`);
  }
  try {
    await client.embeddings.create({ model: id, input: 'a', dimensions: 8 });
    check(false, 'dimensions other than the width are refused');
  } catch (e) {
    check(e.status === 400 && e.param === 'dimensions', `dimensions 8: 400, param dimensions`);
  }

  // the AI SDK
  const provider = createOpenAICompatible({ name: 'spillway', baseURL: base });
  const many = await embedMany({ model: provider.textEmbeddingModel(id), values: texts });
  check(many.embeddings.length === 3 &&
        many.embeddings.every((v, i) => same(v, b64.data[i].embedding)),
        'AI SDK embedMany: the same vectors as the OpenAI SDK');
  check(many.usage && many.usage.tokens === b64.usage.prompt_tokens,
        `AI SDK embedMany: usage ${JSON.stringify(many.usage)}`);
  const single = await embed({ model: provider.textEmbeddingModel(id), value: texts[2] });
  check(same(single.embedding, b64.data[2].embedding), 'AI SDK embed: the same vector');
} catch (e) {
  check(false, `unexpected: ${e.stack || e.message}`);
} finally {
  await router.stop();
}
check(failed() === 0, 'every embeddings check passed');
process.exit(failed() ? 1 : 0);
