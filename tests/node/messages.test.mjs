// messages.test.mjs - Anthropic's official SDK (@anthropic-ai/sdk) against
// a real `spillway serve` started from config/demo.ini (`make run`'s
// configuration) on a port of its own, with an API key (the SDK sends it
// as x-api-key): messages.create, messages.stream (its text events add up
// to its finalMessage, which equals the answer of create), a tool use with
// tool_choice and the tool_result sent back, messages.countTokens (the
// count create's usage reports), and a refusal the SDK raises as its typed
// error. Run by run.sh, which installs the packages.
import Anthropic from '@anthropic-ai/sdk';
import { check, failed, startDemoRouter } from './demo_router.mjs';

const KEY = 'sdk-messages-key-0001';
const router = await startDemoRouter('messages', `api-keys = ${KEY}`);
const port = router.port;
const baseURL = `http://127.0.0.1:${port}`;

const weather = {
  name: 'get_weather',
  description: 'The current weather in a city',
  input_schema: {
    type: 'object',
    properties: { city: { type: 'string', maxLength: 12 } },
    required: ['city'],
  },
};

try {
  const models = await (await fetch(`${baseURL}/v1/models`,
                                    { headers: { authorization: `Bearer ${KEY}` } })).json();
  const model = models.data[0].id;
  const client = new Anthropic({ apiKey: KEY, baseURL, maxRetries: 0 });
  const ask = { model, max_tokens: 24, temperature: 0, system: 'You tell short stories.',
                messages: [{ role: 'user', content: 'Once upon a time' }] };

  // messages.create
  const msg = await client.messages.create(ask);
  const text = msg.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  check(msg.type === 'message' && msg.role === 'assistant' && msg.id.startsWith('msg_'),
        `create: a Message (${msg.id})`);
  check(text.length > 0, `create: text '${text.slice(0, 40)}'`);
  check(['end_turn', 'max_tokens'].includes(msg.stop_reason), `create: stop_reason ${msg.stop_reason}`);
  check(msg.usage.input_tokens > 0 && msg.usage.output_tokens > 0,
        `create: usage ${JSON.stringify(msg.usage)}`);

  // messages.stream: text events, finalMessage equal to create's answer
  const stream = client.messages.stream(ask);
  let streamed = '';
  stream.on('text', (t) => { streamed += t; });
  const final = await stream.finalMessage();
  const finalText = final.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  check(streamed === text, `stream: the text events add up to create's text`);
  check(finalText === text, `stream: finalMessage's text is create's`);
  check(final.stop_reason === msg.stop_reason, `stream: stop_reason ${final.stop_reason}`);
  check(final.usage.output_tokens === msg.usage.output_tokens &&
        final.usage.input_tokens === msg.usage.input_tokens,
        `stream: usage ${JSON.stringify(final.usage)}`);

  // stop_sequences
  const words = text.trim().split(/\s+/);
  if (words.length >= 3) {
    const stop = ` ${words[2]}`;
    const cut = await client.messages.create({ ...ask, stop_sequences: [stop] });
    check(cut.stop_reason === 'stop_sequence' && cut.stop_sequence === stop,
          `stop_sequences: stop_reason ${cut.stop_reason}, stop_sequence '${cut.stop_sequence}'`);
  }

  // countTokens: the count create's usage reports
  const counted = await client.messages.countTokens({ model, system: ask.system,
                                                      messages: ask.messages });
  check(counted.input_tokens === msg.usage.input_tokens,
        `countTokens: ${counted.input_tokens} = usage.input_tokens ${msg.usage.input_tokens}`);

  // tool use: a forced call, streamed; then its result sent back
  const toolAsk = { model, max_tokens: 64, tools: [weather],
                    tool_choice: { type: 'tool', name: 'get_weather' },
                    messages: [{ role: 'user', content: 'What is the weather in Paris?' }] };
  const callMsg = await client.messages.stream(toolAsk).finalMessage();
  const call = callMsg.content.find((b) => b.type === 'tool_use');
  check(callMsg.stop_reason === 'tool_use' && call && call.name === 'get_weather' &&
        typeof call.input.city === 'string',
        `tool use: ${JSON.stringify(call)}`);
  const reply = await client.messages.create({
    model, max_tokens: 12, tools: [weather],
    messages: [
      ...toolAsk.messages,
      { role: 'assistant', content: callMsg.content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: call.id,
                                  content: '18 C and sunny' }] },
    ],
  });
  check(reply.content.length > 0 && reply.content[0].type === 'text',
        `tool result round trip: ${reply.stop_reason}, '${(reply.content[0]?.text ?? '').slice(0, 30)}'`);
  const countedTools = await client.messages.countTokens({
    model, tools: [weather],
    messages: [
      ...toolAsk.messages,
      { role: 'assistant', content: callMsg.content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: call.id,
                                  content: '18 C and sunny' }] },
    ],
  });
  check(countedTools.input_tokens === reply.usage.input_tokens,
        `countTokens with tools: ${countedTools.input_tokens} = ${reply.usage.input_tokens}`);

  // refusals come back as the SDK's typed errors
  try {
    await client.messages.create({ ...ask, model: 'no-such-model' });
    check(false, 'an unknown model is refused');
  } catch (e) {
    check(e instanceof Anthropic.NotFoundError && e.error?.error?.type === 'not_found_error',
          `an unknown model: ${e.constructor.name} ${e.status}`);
  }
  try {
    await new Anthropic({ apiKey: 'wrong-key-00000', baseURL, maxRetries: 0 }).messages.create(ask);
    check(false, 'a wrong key is refused');
  } catch (e) {
    check(e instanceof Anthropic.AuthenticationError, `a wrong key: ${e.constructor.name} ${e.status}`);
  }
  try {
    await client.messages.create({ ...ask, messages: [{ role: 'user', content: [
      { type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AAAA' } }] }] });
    check(false, 'an image is refused');
  } catch (e) {
    check(e instanceof Anthropic.BadRequestError && /image/.test(e.message),
          `an image: ${e.constructor.name} ${e.status}`);
  }
} catch (e) {
  check(false, `unexpected: ${e.stack ?? e}`);
} finally {
  await router.stop();
}
console.log(failed() ? `${failed()} check(s) failed` : 'all checks passed');
process.exit(failed() ? 1 : 0);
