// zipage-serve driven by the official OpenAI Node client: completions and chat completions, streaming and
// not, n > 1, stop strings, logprobs and top_logprobs, frequency and presence penalties, seeds, streamed
// text == non-streamed text.
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

  // Completions logprobs: k > 0: per token an object of the k most likely tokens' texts (and the sampled
  // one's) to their log-probabilities; greedy, the sampled token is the most likely. Streamed == not.
  // Up to vLLM's max_logprobs (20): as many alternatives (fewer where their texts coincide).
  const lp20 = await client.completions.create({ model: MODEL, prompt: PROMPT, max_tokens: 3, temperature: 0, logprobs: 20 });
  for (const alts of lp20.choices[0].logprobs.top_logprobs)
    assert.ok(Object.keys(alts).length > 3 && Object.keys(alts).length <= 21, JSON.stringify(alts));
  const lp3 = await client.completions.create({ model: MODEL, prompt: PROMPT, max_tokens: 12, temperature: 0, logprobs: 3 });
  const l3 = lp3.choices[0].logprobs;
  assert.equal(lp3.choices[0].text, greedy.choices[0].text.slice(0, lp3.choices[0].text.length));
  assert.deepEqual(l3.tokens.slice(0, 10), l.tokens);
  assert.equal(l3.top_logprobs.length, 12);
  for (let i = 0; i < 12; ++i) {
    const alts = Object.values(l3.top_logprobs[i]);
    assert.ok(alts.length >= 1 && alts.length <= 4, JSON.stringify(l3.top_logprobs[i]));  // texts may coincide
    assert.equal(Math.max(...alts), l3.token_logprobs[i], `step ${i}: ${JSON.stringify(l3.top_logprobs[i])}`);
    assert.equal(l3.top_logprobs[i][l3.tokens[i]], l3.token_logprobs[i]);
    assert.ok(alts.reduce((m, x) => m + Math.exp(x), 0) <= 1 + 1e-5);
  }
  const l3s = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
  for await (const chunk of await client.completions.create({ model: MODEL, prompt: PROMPT, max_tokens: 12, temperature: 0,
                                                               logprobs: 3, stream: true }))
    for (const c of chunk.choices) if (c.logprobs) for (const k of Object.keys(l3s)) l3s[k].push(...c.logprobs[k]);
  assert.deepEqual(l3s, l3);
  // With a stop string the stream holds text back, not logprobs: the token texts and offsets still match.
  const lps = await client.completions.create({ model: MODEL, prompt: PROMPT, max_tokens: 40, temperature: 0, logprobs: 1,
                                               stop: 'ly. S' });
  const lpss = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
  let lpsText = '';
  for await (const chunk of await client.completions.create({ model: MODEL, prompt: PROMPT, max_tokens: 40, temperature: 0,
                                                               logprobs: 1, stop: 'ly. S', stream: true }))
    for (const c of chunk.choices) {
      lpsText += c.text;
      if (c.logprobs) for (const k of Object.keys(lpss)) lpss[k].push(...c.logprobs[k]);
    }
  assert.equal(lpsText, lps.choices[0].text);
  assert.deepEqual(lpss, lps.choices[0].logprobs);
  for (let i = 1; i < lpss.tokens.length; ++i)
    assert.equal(lpss.text_offset[i], lpss.text_offset[i - 1] + Buffer.byteLength(lpss.tokens[i - 1]));

  // Chat top_logprobs: k alternatives per token, most likely first, with their bytes; greedy picks the first.
  const chatMsg = [{ role: 'user', content: PROMPT }];
  const ct = await client.chat.completions.create({ model: MODEL, messages: chatMsg, max_tokens: 12, temperature: 0,
                                                   logprobs: true, top_logprobs: 5 });
  const content = ct.choices[0].logprobs.content;
  assert.equal(content.length, 12);
  for (const t of content) {
    assert.equal(t.top_logprobs.length, 5);
    assert.equal(t.top_logprobs[0].logprob, t.logprob);
    assert.equal(t.top_logprobs[0].token, t.token);
    for (let j = 1; j < 5; ++j) assert.ok(t.top_logprobs[j].logprob <= t.top_logprobs[j - 1].logprob);
    for (const a of t.top_logprobs) assert.deepEqual(a.bytes, [...Buffer.from(a.token, 'utf8')]);
  }
  const cts = [];
  for await (const chunk of await client.chat.completions.create({ model: MODEL, messages: chatMsg, max_tokens: 12, temperature: 0,
                                                                   logprobs: true, top_logprobs: 5, stream: true }))
    for (const c of chunk.choices) if (c.logprobs) cts.push(...c.logprobs.content);
  assert.deepEqual(cts, content);
  // top_logprobs 0 with logprobs: empty alternatives.
  const ct0 = await client.chat.completions.create({ model: MODEL, messages: chatMsg, max_tokens: 4, temperature: 0,
                                                    logprobs: true, top_logprobs: 0 });
  assert.ok(ct0.choices[0].logprobs.content.every((t) => t.top_logprobs.length === 0));

  // Frequency and presence penalties (OpenAI's: logit - frequency * count - presence * (count > 0), over the
  // tokens generated so far). 0 changes nothing; greedy under penalties is deterministic, streamed == not,
  // and differs from plain greedy.
  const zero = await client.completions.create({ model: MODEL, prompt: PROMPT, max_tokens: 30, temperature: 0,
                                                 frequency_penalty: 0, presence_penalty: 0 });
  assert.equal(zero.choices[0].text, greedy.choices[0].text);
  const pen = { model: MODEL, prompt: PROMPT, max_tokens: 30, temperature: 0, frequency_penalty: 1.5, presence_penalty: 0.5 };
  const p1 = await client.completions.create(pen);
  assert.notEqual(p1.choices[0].text, greedy.choices[0].text);
  assert.equal((await client.completions.create(pen)).choices[0].text, p1.choices[0].text);
  assert.equal((await collect(await client.completions.create({ ...pen, stream: true }), false)).texts[0], p1.choices[0].text);
  const neg = await client.completions.create({ ...pen, frequency_penalty: -2, presence_penalty: -2 });
  assert.notEqual(neg.choices[0].text, p1.choices[0].text);
  // Each greedy step under penalties chose the best penalised score among the step's 20 most likely tokens,
  // counting the tokens generated before it (by text; stories260K's tokens are ASCII pieces); and positive
  // penalties changed at least one choice (negative ones favour what greedy repeats anyway).
  for (const [fp, pp] of [[0.7, 0.3], [0, 1.2], [-1, -1]]) {
    const r = await client.chat.completions.create({ model: MODEL, messages: chatMsg, max_tokens: 40, temperature: 0,
                                                    frequency_penalty: fp, presence_penalty: pp, logprobs: true, top_logprobs: 20 });
    const counts = new Map();
    const score = (tok, lp) => { const c = counts.get(tok) ?? 0; return lp - fp * c - (c > 0 ? pp : 0); };
    let changed = 0;
    for (const t of r.choices[0].logprobs.content) {
      const mine = score(t.token, t.logprob);
      for (const a of t.top_logprobs) assert.ok(mine >= score(a.token, a.logprob) - 1e-4, `fp ${fp} pp ${pp}: ${t.token} vs ${a.token}`);
      if (t.top_logprobs[0].token !== t.token) ++changed;
      counts.set(t.token, (counts.get(t.token) ?? 0) + 1);
    }
    if (fp > 0 || pp > 0) assert.ok(changed > 0, `fp ${fp} pp ${pp}: no choice changed`);
  }
  // Sampled with penalties: same seed, same text.
  const ps = { model: MODEL, prompt: PROMPT, max_tokens: 40, temperature: 0.9, seed: 7, frequency_penalty: 0.8, presence_penalty: 0.4 };
  assert.equal((await client.completions.create(ps)).choices[0].text, (await client.completions.create(ps)).choices[0].text);

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
                                                       top_logprobs: 2 }),
                       (e) => e.status === 400 && e.param === 'top_logprobs');

  // Errors come back as the client's typed errors.
  await assert.rejects(client.completions.create({ model: 'gpt-4o', prompt: PROMPT, max_tokens: 4 }),
                       (e) => e.status === 404 && e.code === 'model_not_found');
  const wrongKey = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(wrongKey.models.list(), (e) => e.status === 401 && e.code === 'invalid_api_key');

  await waitIdle(server.base);
});
process.exit(0);
