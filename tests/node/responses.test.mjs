// responses.test.mjs - OpenAI's official package (`openai`) calling the
// Responses API of a real `spillway serve` started from config/demo.ini
// (`make run`'s configuration) on a port of its own: client.responses.create
// whole and streamed, client.responses.stream (the SDK's accumulating
// stream) when the package has it, a function tool with its
// function_call_output sent back (in the input, and by
// previous_response_id, the Agents SDK's way), previous_response_id for a
// conversation, retrieve and delete. What the SDK parses and accumulates
// must agree with what the server sent. Run by run.sh, which installs the
// packages.
import OpenAI from 'openai';
import { check, failed, startDemoRouter } from './demo_router.mjs';

const router = await startDemoRouter('responses');
const port = router.port;

const weather = {
  type: 'function',
  name: 'get_weather',
  description: 'The weather in a city',
  parameters: {
    type: 'object',
    properties: { city: { type: 'string', maxLength: 12 } },
    required: ['city'],
    additionalProperties: false,
  },
  strict: true,
};

async function step(what, fn) {
  try {
    await fn();
  } catch (e) {
    check(false, `${what}: ${e.stack || e.message}`);
  }
}

try {
  const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'unused' });
  const models = await client.models.list();
  const model = models.data[0].id;

  let first;
  await step('responses.create', async () => {
    first = await client.responses.create({ model, instructions: 'Tell stories.',
                                            input: 'Once upon a time', max_output_tokens: 16,
                                            temperature: 0 });
    check(first.object === 'response' && first.id.startsWith('resp_'),
          `responses.create: a Response (${first.id}, ${first.status})`);
    check(typeof first.output_text === 'string' && first.output_text.length > 0,
          `responses.create: output_text ${JSON.stringify(first.output_text.slice(0, 40))}`);
    check(first.usage.total_tokens === first.usage.input_tokens + first.usage.output_tokens &&
          first.usage.output_tokens > 0, 'responses.create: usage');
    check(['completed', 'incomplete'].includes(first.status), `status ${first.status}`);
  });

  await step('responses.create stream', async () => {
    const events = await client.responses.create({ model, instructions: 'Tell stories.',
                                                   input: 'Once upon a time',
                                                   max_output_tokens: 16, temperature: 0,
                                                   stream: true });
    let text = '', last = -1, ordered = true, created = 0, final = null;
    for await (const ev of events) {
      ordered = ordered && ev.sequence_number === last + 1;
      last = ev.sequence_number;
      if (ev.type === 'response.created') created++;
      if (ev.type === 'response.output_text.delta') text += ev.delta;
      if (ev.type === 'response.completed' || ev.type === 'response.incomplete') final = ev.response;
    }
    check(ordered && created === 1, `stream: ${last + 1} events in order, one response.created`);
    check(final !== null, 'stream: a final event');
    check(text === first.output_text, 'stream: the deltas add up to the whole answer');
  });

  if (typeof client.responses.stream === 'function') {
    await step('responses.stream', async () => {
      const stream = client.responses.stream({ model, instructions: 'Tell stories.',
                                               input: 'Once upon a time', max_output_tokens: 16,
                                               temperature: 0 });
      let deltas = '';
      stream.on('response.output_text.delta', (ev) => { deltas += ev.delta; });
      const r = await stream.finalResponse();
      check(r.output_text === first.output_text && deltas === first.output_text,
            'responses.stream: the accumulated response is the whole answer');
    });
  }

  await step('function tool round trip', async () => {
    const r = await client.responses.create({ model, input: 'Weather in Paris?', tools: [weather],
                                              tool_choice: { type: 'function', name: 'get_weather' },
                                              max_output_tokens: 200, temperature: 1 });
    const call = r.output.find((i) => i.type === 'function_call');
    check(call && call.name === 'get_weather' && call.call_id.startsWith('call_'),
          `function_call item ${JSON.stringify(call)}`);
    const args = JSON.parse(call.arguments);
    check(typeof args.city === 'string' && Object.keys(args).length === 1,
          `arguments satisfy the schema: ${call.arguments}`);
    // the output sent back in the input, with the call item as it came
    // (both computed whole, cache_prompt false: a prefix taken from the
    // cache, whose blocks an earlier answer's decode computed, may round
    // differently from a prefill, and flip a near tie of this tiny model)
    const back = await client.responses.create({
      model, tools: [weather], tool_choice: 'none', max_output_tokens: 12, temperature: 0,
      cache_prompt: false,
      input: [{ role: 'user', content: 'Weather in Paris?' }, call,
              { type: 'function_call_output', call_id: call.call_id, output: 'sunny, 21 C' }],
    });
    check(back.output_text.length > 0,
          `function_call_output in the input: answered (${back.status})`);
    // and by previous_response_id, as the Agents SDK sends it
    const chained = await client.responses.create({
      model, previous_response_id: r.id, tools: [weather], tool_choice: 'none',
      max_output_tokens: 12, temperature: 0, cache_prompt: false,
      input: [{ type: 'function_call_output', call_id: call.call_id, output: 'sunny, 21 C' }],
    });
    check(chained.previous_response_id === r.id && chained.output_text.length > 0,
          'function_call_output by previous_response_id: answered');
    check(chained.usage.input_tokens === back.usage.input_tokens &&
          chained.output_text === back.output_text,
          'the chained conversation is the one sent whole');
    // streamed, the call's arguments arrive as deltas
    const events = await client.responses.create({ model, input: 'Weather in Rome?',
                                                   tools: [weather], tool_choice: 'required',
                                                   max_output_tokens: 200, stream: true });
    let argDeltas = '', doneArgs = null;
    for await (const ev of events) {
      if (ev.type === 'response.function_call_arguments.delta') argDeltas += ev.delta;
      if (ev.type === 'response.function_call_arguments.done') doneArgs = ev.arguments;
    }
    check(doneArgs !== null && argDeltas === doneArgs && JSON.parse(doneArgs).city !== undefined,
          `streamed call arguments ${doneArgs}`);
  });

  await step('previous_response_id, retrieve, delete', async () => {
    const next = await client.responses.create({ model, previous_response_id: first.id,
                                                 input: 'Go on', max_output_tokens: 8 });
    check(next.previous_response_id === first.id && next.usage.input_tokens > first.usage.input_tokens,
          'previous_response_id: the conversation goes on');
    const got = await client.responses.retrieve(first.id);
    check(got.id === first.id && got.output_text === first.output_text, 'responses.retrieve');
    await client.responses.delete(first.id);
    let gone = false;
    try {
      await client.responses.retrieve(first.id);
    } catch (e) {
      gone = e.status === 404;
    }
    check(gone, 'responses.delete: retrieve is then 404');
    const unstored = await client.responses.create({ model, input: 'x', max_output_tokens: 2,
                                                     store: false });
    let refused = false;
    try {
      await client.responses.create({ model, previous_response_id: unstored.id, input: 'y' });
    } catch (e) {
      refused = e.status === 404;
    }
    check(refused, 'store: false is not kept (previous_response_id 404)');
  });
} finally {
  await router.stop();
}
check(failed() === 0, 'every Responses API call behaved');
process.exit(failed() ? 1 : 0);
