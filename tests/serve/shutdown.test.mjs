// SIGTERM during load. With room to drain (--shutdown-timeout 20): the server stops taking requests (503 or
// refused), every request in flight completes exactly as served alone, and the process exits 0 well within
// the timeout. With too little (--shutdown-timeout 1): what cannot finish is cancelled, each such client gets
// an error (never a silently cut answer), and the process still exits 0 within the timeout (+ slack).
import assert from 'node:assert/strict';
import { deadline, loadOpenAI, metrics, post, run, startServer } from './common.mjs';

deadline(120);
const OpenAI = loadOpenAI();
const MODEL = 'stories260K';
const variants = ['Once upon a time', 'Tom had a big red ball', 'The little boat', 'Max liked to run'].map(
  (prompt, i) => ({ prompt, max_tokens: 300 + 20 * i, ignore_eos: true }));

// Waits until the server has taken requests with `tokens` prompt tokens in all since `m0` (they reached
// its handlers: not just connecting).
async function taken(base, m0, tokens) {
  for (let i = 0; i < 1200; ++i) {  // up to ~30 s: a loaded 2-core CI machine is slow to connect 64 streams
    if ((await metrics(base)).zipage_prompt_tokens_total - m0.zipage_prompt_tokens_total >= tokens) return;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error(`the server never took the requests (${tokens} prompt tokens)`);
}

async function stream(client, body) {
  let text = '', finish = null, error = null;
  try {
    const s = await client.completions.create({ model: MODEL, ...body, stream: true });
    for await (const chunk of s) {
      const c = chunk.choices[0];
      if (!c) continue;
      text += c.text;
      if (c.finish_reason) finish = c.finish_reason;
    }
  } catch (e) {
    error = String(e);
  }
  return { text, finish, error };
}

await run('serve_shutdown_drain', async (servers) => {
  const server = await startServer(['--shutdown-timeout', '20', '--max-num-seqs', '2']);
  servers.push(server);
  const client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'none', maxRetries: 0, timeout: 60000 });
  const alone = [];
  const promptTokens = [];
  for (const v of variants) {
    const r = await client.completions.create({ model: MODEL, ...v, temperature: 0 });
    alone.push(r.choices[0].text);
    promptTokens.push(r.usage.prompt_tokens);
  }
  const m0 = await metrics(server.base);

  const N = 64;
  const pending = Array.from({ length: N }, (_, i) => stream(client, { ...variants[i % 4], temperature: 0 }));
  await taken(server.base, m0, (N / 4) * promptTokens.reduce((a, b) => a + b));
  const before = await metrics(server.base);
  assert.ok(before.zipage_http_requests_in_flight >= 8, `only ${before.zipage_http_requests_in_flight} in flight at SIGTERM`);
  const t0 = performance.now();
  server.proc.kill('SIGTERM');
  await new Promise((r) => setTimeout(r, 50));
  // New work is refused while draining: 503 with an error object, or the connection is refused once stopped.
  try {
    const late = await post(server.base, '/v1/completions', { prompt: 'x', max_tokens: 2 });
    assert.equal(late.status, 503, late.text);
    assert.equal(late.json.error.code, 'shutting_down');
  } catch (e) {
    if (!(e.cause && /ECONNREFUSED|other side closed|ECONNRESET/.test(String(e.cause.code ?? e.cause)))) throw e;
  }
  const results = await Promise.all(pending);
  const { code, signal } = await server.exited;
  const seconds = (performance.now() - t0) / 1000;
  assert.equal(signal, null);
  assert.equal(code, 0, 'exit code after SIGTERM');
  assert.ok(seconds < 20, `exit took ${seconds.toFixed(1)} s (timeout 20 s)`);
  results.forEach((r, i) => {
    assert.equal(r.error, null, `request ${i}: ${r.error}`);
    assert.equal(r.text, alone[i % 4], `request ${i} is not the complete answer`);
    assert.ok(r.finish, `request ${i} has no finish_reason`);
  });
  console.log(`shutdown (drain): ${before.zipage_http_requests_in_flight} of ${N} requests in flight at SIGTERM, all complete; exit 0 after ${seconds.toFixed(2)} s`);
});

await run('serve_shutdown_timeout', async (servers) => {
  const server = await startServer(['--shutdown-timeout', '1', '--max-num-seqs', '2']);
  servers.push(server);
  const client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'none', maxRetries: 0, timeout: 60000 });
  const N = 8;
  const pending = Array.from({ length: N }, (_, i) => stream(client, { prompt: variants[i % 4].prompt, max_tokens: 2000,
                                                                       ignore_eos: true, temperature: 0 }));
  const m0 = { zipage_prompt_tokens_total: 0 };
  await taken(server.base, m0, N * 4);
  const t0 = performance.now();
  server.proc.kill('SIGTERM');
  const results = await Promise.all(pending);
  const { code } = await server.exited;
  const seconds = (performance.now() - t0) / 1000;
  assert.equal(code, 0, 'exit code after SIGTERM');
  assert.ok(seconds < 1 + 4, `exit took ${seconds.toFixed(1)} s (timeout 1 s)`);
  let cancelled = 0;
  results.forEach((r, i) => {
    // Either the whole answer, or an error the client sees: never a stream that just stops.
    if (r.error) ++cancelled;
    else assert.equal(r.finish, 'length', `request ${i} ended without finish_reason or error`);
  });
  assert.ok(cancelled > 0, 'nothing was cancelled: the requests were too short for this test');
  console.log(`shutdown (timeout): ${cancelled} of ${N} requests cancelled with an error to the client; exit 0 after ` +
              `${seconds.toFixed(2)} s`);
});
process.exit(0);
