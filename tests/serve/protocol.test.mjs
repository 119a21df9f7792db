// zipage-serve driven by the official OpenAI Node client: completions and chat completions, streaming and
// not, n > 1, stop strings, logprobs, seeds, streamed text == non-streamed text.
import assert from 'node:assert/strict';
import { deadline, loadOpenAI, run, startServer, waitIdle } from './common.mjs';

deadline(90);
const OpenAI = loadOpenAI();
const MODEL = 'stories260K';
const PROMPT = 'Once upon a time';
// zipage_generate_golden: the bundled model's greedy continuation.
const GOLDEN = ', there was a little girl named Lily. She loved to play outside in the park.';

async function collect(stream, chat) {
  const texts = {};
  const finish = {};
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    ++chunks;
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      const piece = chat ? (c.delta?.content ?? '') : c.text;
      texts[c.index] = (texts[c.index] ?? '') + piece;
      if (c.finish_reason) finish[c.index] = c.finish_reason;
    }
  }
  return { texts, finish, usage, chunks };
}

await run('serve_openai_protocol', async (servers) => {
  const server = await startServer(['--api-key', 'test-key', '--chat-template', 'plain']);
  servers.push(server);
  const client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'test-key', maxRetries: 0, timeout: 30000 });

  const models = await client.models.list();
  assert.deepEqual(models.data.map((m) => m.id), [MODEL]);

  // Greedy, non-streaming: the golden text, usage, finish_reason.
  const greedy = await client.completions.create({ model: MODEL, prompt: PROMPT, max_tokens: 30, temperature: 0 });
  assert.equal(greedy.object, 'text_completion');
  assert.ok(greedy.choices[0].text.startsWith(GOLDEN.slice(0, 60)), `greedy text: ${JSON.stringify(greedy.choices[0].text)}`);
  assert.equal(greedy.choices[0].finish_reason, 'length');
  assert.deepEqual(greedy.usage, { prompt_tokens: 5, completion_tokens: 30, total_tokens: 35 });

  // Streaming greedy == non-streaming greedy; usage chunk with stream_options.include_usage.
  const sg = await collect(await client.completions.create({ model: MODEL, prompt: PROMPT, max_tokens: 30, temperature: 0,
                                                             stream: true, stream_options: { include_usage: true } }), false);
  assert.equal(sg.texts[0], greedy.choices[0].text);
  assert.equal(sg.finish[0], 'length');
  assert.deepEqual(sg.usage, greedy.usage);

  // Seeds: same seed -> same text; streamed == non-streamed for the same seed; another seed differs.
  const sampled = { model: MODEL, prompt: PROMPT, max_tokens: 48, temperature: 1.0, top_p: 0.95, seed: 1234 };
  const a = await client.completions.create(sampled);
  const b = await client.completions.create(sampled);
  assert.equal(a.choices[0].text, b.choices[0].text);
  const s = await collect(await client.completions.create({ ...sampled, stream: true }), false);
  assert.equal(s.texts[0], a.choices[0].text);
  const other = await client.completions.create({ ...sampled, seed: 99 });
  assert.notEqual(other.choices[0].text, a.choices[0].text);

  // n > 1: n choices, indexed, seeded per choice; streamed choices == non-streamed ones.
  const multi = await client.completions.create({ ...sampled, n: 4 });
  assert.equal(multi.choices.length, 4);
  assert.deepEqual(multi.choices.map((c) => c.index), [0, 1, 2, 3]);
  assert.equal(multi.choices[0].text, a.choices[0].text);  // choice j uses seed + j
  assert.ok(new Set(multi.choices.map((c) => c.text)).size > 1, 'n = 4 sampled choices are all the same');
  assert.equal(multi.usage.prompt_tokens, 5);
  assert.ok(multi.usage.completion_tokens > 4 && multi.usage.completion_tokens <= 4 * 48);
  const ms = await collect(await client.completions.create({ ...sampled, n: 4, stream: true }), false);
  for (let i = 0; i < 4; ++i) assert.equal(ms.texts[i], multi.choices[i].text, `choice ${i}`);

  // A list of prompts: one choice per prompt (x n).
  const two = await client.completions.create({ model: MODEL, prompt: [PROMPT, 'The dog'], max_tokens: 8, temperature: 0, n: 2 });
  assert.equal(two.choices.length, 4);
  assert.equal(two.choices[0].text, two.choices[1].text);
  assert.equal(two.choices[0].text, greedy.choices[0].text.slice(0, two.choices[0].text.length));

  // Stop strings: cut before the stop string, finish_reason stop; the same when streamed (held back).
  for (const stop of ['Lily', [' girl', 'park'], 'ly. S']) {
    const want = GOLDEN.slice(0, Math.min(...[stop].flat().map((x) => GOLDEN.indexOf(x))));
    const r = await client.completions.create({ model: MODEL, prompt: PROMPT, max_tokens: 40, temperature: 0, stop });
    assert.equal(r.choices[0].text, want, `stop ${JSON.stringify(stop)}`);
    assert.equal(r.choices[0].finish_reason, 'stop');
    const rs = await collect(await client.completions.create({ model: MODEL, prompt: PROMPT, max_tokens: 40, temperature: 0,
                                                               stop, stream: true }), false);
    assert.equal(rs.texts[0], want, `streamed, stop ${JSON.stringify(stop)}`);
    assert.equal(rs.finish[0], 'stop');
  }

  // logprobs (completions: 0 = the sampled token's log-probability only).
  const lp = await client.completions.create({ model: MODEL, prompt: PROMPT, max_tokens: 10, temperature: 0, logprobs: 0 });
  const l = lp.choices[0].logprobs;
  assert.equal(l.tokens.length, 10);
  assert.equal(l.token_logprobs.length, 10);
  assert.ok(l.token_logprobs.every((x) => x <= 0 && x > -50), JSON.stringify(l.token_logprobs));
  assert.equal(l.tokens.join(''), lp.choices[0].text);
  await assert.rejects(client.completions.create({ model: MODEL, prompt: PROMPT, max_tokens: 4, logprobs: 3 }),
                       (e) => e.status === 400 && e.param === 'logprobs');

  // Chat completions (--chat-template plain: the messages' contents as plain text).
  const chat = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: PROMPT }],
                                                     max_completion_tokens: 30, temperature: 0 });
  assert.equal(chat.object, 'chat.completion');
  assert.equal(chat.choices[0].message.role, 'assistant');
  assert.equal(chat.choices[0].message.content, greedy.choices[0].text);
  const cs = await collect(await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: PROMPT }],
                                                                 max_tokens: 30, temperature: 0, stream: true,
                                                                 stream_options: { include_usage: true } }), true);
  assert.equal(cs.texts[0], chat.choices[0].message.content);
  assert.equal(cs.finish[0], 'length');
  assert.equal(cs.usage.completion_tokens, 30);
  const cn = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: PROMPT }],
                                                   max_tokens: 32, temperature: 0.8, seed: 5, n: 3, logprobs: true });
  assert.equal(cn.choices.length, 3);
  for (const c of cn.choices) {
    assert.ok(c.logprobs.content.length > 0);
    assert.equal(c.logprobs.content.map((t) => t.token).join(''), c.message.content);
  }
  const cns = await collect(await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: PROMPT }],
                                                                  max_tokens: 32, temperature: 0.8, seed: 5, n: 3, stream: true }), true);
  for (let i = 0; i < 3; ++i) assert.equal(cns.texts[i], cn.choices[i].message.content, `chat choice ${i}`);
  await assert.rejects(client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: PROMPT }],
                                                       logprobs: true, top_logprobs: 2 }),
                       (e) => e.status === 400 && e.param === 'top_logprobs');

  // Errors come back as the client's typed errors.
  await assert.rejects(client.completions.create({ model: 'gpt-4o', prompt: PROMPT, max_tokens: 4 }),
                       (e) => e.status === 404 && e.code === 'model_not_found');
  const wrongKey = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(wrongKey.models.list(), (e) => e.status === 401 && e.code === 'invalid_api_key');

  await waitIdle(server.base);
});
process.exit(0);
