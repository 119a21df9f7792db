// zipage-serve under load, through the OpenAI client: ZIPAGE_SERVE_LOAD_REQUESTS (default 1000) concurrent
// streaming greedy requests, every tenth cancelled by its client mid-stream, against a KV pool small enough
// to force compression, preemption and swaps (priority scheduling). Every request that is not cancelled must get exactly what the
// same request gets when served alone; at the end /metrics shows no KV block in use. Reports p50/p99 time
// to first token (client side, queueing included) and the wall time.
import assert from 'node:assert/strict';
import { deadline, loadOpenAI, metrics, percentile, run, startServer, waitIdle } from './common.mjs';

const N = Number(process.env.ZIPAGE_SERVE_LOAD_REQUESTS ?? 1000);
deadline(Number(process.env.ZIPAGE_SERVE_LOAD_DEADLINE ?? 240));
const OpenAI = loadOpenAI();
const MODEL = 'stories260K';

const OPENERS = [
  'Once upon a time', 'One day, a little girl', 'Tom had a big red ball', 'The sun was shining and',
  'Lily and Ben went to the park', 'There was a small cat', 'Mom said to Tim', 'A bird sat on a tree',
  'The dog was very happy because', 'Sue found a shiny rock', 'In a big forest there lived', 'Max liked to run',
  'The little boat', 'Anna wanted to bake a cake', 'It was a rainy day and', 'The old man had a garden',
];
const variants = OPENERS.map((prompt, i) => ({ prompt, max_tokens: 40 + 40 * (i % 4) }));  // 40..160 tokens

await run(`serve_load (${N} streaming requests, 10% cancelled)`, async (servers) => {
  // 30 blocks of 16 tokens; a compressed request keeps 32 tokens (2 blocks) + a write block: 16 running
  // requests cannot all fit, so the scheduler preempts (uncompressed requests) and swaps (compressed ones).
  // Priority scheduling, each request more urgent than the ones before it (priority -i) and arriving 2 ms
  // after the previous one, so newcomers keep making long-running (compressed) requests give way.
  const server = await startServer(['--policy', 'zipage', '--budget', '32', '--block-size', '16', '--num-blocks', '30',
                                    '--max-num-seqs', '16', '--scheduling-policy', 'priority', '--max-queue', String(N + 16)]);
  servers.push(server);
  const client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'none', maxRetries: 0, timeout: 120000 });

  // Each variant served alone.
  const alone = [];
  for (const v of variants) {
    const r = await client.completions.create({ model: MODEL, ...v, temperature: 0 });
    alone.push({ text: r.choices[0].text, finish: r.choices[0].finish_reason });
  }
  const m0 = await metrics(server.base);

  const t0 = performance.now();
  const results = await Promise.all(Array.from({ length: N }, async (_, i) => {
    const v = variants[i % variants.length];
    const cancel = i % 10 === 3;
    await new Promise((r) => setTimeout(r, 2 * i));
    const start = performance.now();
    let ttft = null, text = '', finish = null, chunks = 0, aborted = false;
    try {
      const stream = await client.completions.create({ model: MODEL, ...v, temperature: 0, stream: true, priority: -i });
      for await (const chunk of stream) {
        const c = chunk.choices[0];
        if (!c) continue;
        if (c.text && ttft === null) ttft = performance.now() - start;
        text += c.text;
        if (c.finish_reason) finish = c.finish_reason;
        if (cancel && ++chunks >= 2 && !finish) {
          aborted = true;
          stream.controller.abort();
          break;
        }
      }
    } catch (e) {
      if (!aborted) return { i, error: `${e} (${e.cause} / ${e.cause?.cause} / ${e.cause?.cause?.code}) after ${((performance.now() - start) / 1000).toFixed(2)} s, ${text.length} chars` };
    }
    return { i, v: i % variants.length, cancel, aborted, ttft, text, finish };
  }));
  const wall = (performance.now() - t0) / 1000;

  const errors = results.filter((r) => r.error);
  assert.deepEqual(errors, [], `requests failed: ${JSON.stringify(errors.slice(0, 3))}`);
  let checked = 0;
  for (const r of results) {
    if (r.aborted) continue;
    assert.equal(r.text, alone[r.v].text, `request ${r.i} (variant ${r.v}) differs from the same request alone`);
    assert.equal(r.finish, alone[r.v].finish, `request ${r.i}: finish_reason`);
    ++checked;
  }
  const aborted = results.filter((r) => r.aborted).length;
  const m = await waitIdle(server.base, 10000);
  assert.equal(m.zipage_kv_blocks_used, 0);
  const preemptions = m.zipage_preemptions_total - m0.zipage_preemptions_total;
  const swaps = m.zipage_swaps_total - m0.zipage_swaps_total;
  const compressions = m.zipage_compressions_total - m0.zipage_compressions_total;
  const cancelled = m.zipage_request_cancelled_total - m0.zipage_request_cancelled_total;
  assert.ok(compressions > 0, 'no compression happened');
  assert.ok(preemptions + swaps > 0, 'the pool never ran short: no preemption or swap');
  assert.ok(cancelled <= aborted && (aborted === 0 || cancelled > 0), `cancelled ${cancelled}, aborted ${aborted}`);
  const ttfts = results.filter((r) => r.ttft !== null).map((r) => r.ttft);
  const tokens = m.zipage_generation_tokens_total - m0.zipage_generation_tokens_total;
  console.log(`load: ${N} streaming requests, ${aborted} cancelled mid-stream by the client (${cancelled} cancelled in ` +
              `the engine), ${checked} complete and equal to the same request alone`);
  console.log(`load: wall ${wall.toFixed(2)} s, TTFT p50 ${percentile(ttfts, 50).toFixed(0)} ms, p99 ` +
              `${percentile(ttfts, 99).toFixed(0)} ms, ${tokens} tokens generated (${(tokens / wall).toFixed(0)} tok/s)`);
  console.log(`load: compressions ${compressions}, preemptions ${preemptions}, swaps ${swaps}, ` +
              `peak KV blocks ${m.zipage_kv_blocks_peak} of ${m.zipage_kv_blocks_total}, KV blocks in use at the end 0`);
});
process.exit(0);
