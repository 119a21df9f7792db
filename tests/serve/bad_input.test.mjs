// zipage-serve on bad input: malformed JSON, wrong types, out-of-range values, a prompt longer than the
// context, an unknown model, a missing or wrong API key, an oversized body, a full queue -> the right status
// and OpenAI's error object; and the server keeps serving. Slow clients (connected, silent for a while, or
// sending a request in pieces) are answered, and do not hold up the others. Raw HTTP (fetch), so malformed
// bodies get through.
import assert from 'node:assert/strict';
import net from 'node:net';
import { deadline, metrics, post, run, startServer, waitIdle, waitMetrics } from './common.mjs';

deadline(90);
const KEY = { Authorization: 'Bearer test-key' };
const MODEL = 'stories260K';

function isErrorObject(r, status, param) {
  assert.equal(r.status, status, `status ${r.status}, body ${r.text}`);
  assert.ok(r.json && r.json.error, `no error object: ${r.text}`);
  const e = r.json.error;
  for (const k of ['message', 'type', 'param', 'code']) assert.ok(k in e, `error object without '${k}': ${r.text}`);
  assert.equal(typeof e.message, 'string');
  assert.ok(e.message.length > 0);
  if (param !== undefined) assert.equal(e.param, param, r.text);
  return e;
}

await run('serve_bad_input', async (servers) => {
  const server = await startServer(['--api-key', 'test-key', '--max-body-bytes', '65536']);
  servers.push(server);
  const base = server.base;
  const ok = async () => {
    const r = await post(base, '/v1/completions', { model: MODEL, prompt: 'Once upon a time', max_tokens: 5 }, KEY);
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.choices[0].finish_reason, 'length');
  };

  // Malformed JSON, a body that is not an object.
  isErrorObject(await post(base, '/v1/completions', '{"prompt": "Once', KEY), 400);
  isErrorObject(await post(base, '/v1/completions', '[1, 2]', KEY), 400);
  isErrorObject(await post(base, '/v1/completions', '', KEY), 400);
  isErrorObject(await post(base, '/v1/chat/completions', '{"messages": [}', KEY), 400);
  // Bytes that are not UTF-8 (in the prompt, in a field zipage-serve does not read) and a message that quotes a
  // value cut inside a character: a 400 as for any malformed JSON (the parser's message quoted the byte, and writing
  // that message threw: a 500).
  for (const raw of ['{"prompt": "hi\xff", "max_tokens": 2}', '{"prompt": "hi", "user": "\xc3"}']) {
    const res = await fetch(`${base}/v1/completions`, { method: 'POST', body: Buffer.from(raw, 'latin1'),
                                                        headers: { 'Content-Type': 'application/json', ...KEY } });
    const text = await res.text();
    isErrorObject({ status: res.status, text, json: JSON.parse(text) }, 400);
  }
  isErrorObject(await post(base, '/v1/completions', { prompt: 'x', temperature: '\u00e9'.repeat(30) }, KEY), 400,
                'temperature');
  await ok();

  // Wrong types and out-of-range values, each naming its field.
  const cases = [
    [{ prompt: 'x', temperature: 'hot' }, 'temperature'],
    [{ prompt: 'x', temperature: -1 }, 'temperature'],
    [{ prompt: 'x', top_p: 0 }, 'top_p'],
    [{ prompt: 'x', top_p: 1.5 }, 'top_p'],
    [{ prompt: 'x', top_k: 'all' }, 'top_k'],
    [{ prompt: 'x', min_p: 2 }, 'min_p'],
    [{ prompt: 'x', max_tokens: -5 }, 'max_tokens'],
    [{ prompt: 'x', max_tokens: 0 }, 'max_tokens'],
    [{ prompt: 'x', max_tokens: 2.5 }, 'max_tokens'],
    [{ prompt: 'x', max_completion_tokens: '10' }, 'max_completion_tokens'],
    [{ prompt: 'x', n: 0 }, 'n'],
    [{ prompt: 'x', n: true }, 'n'],
    [{ prompt: 'x', seed: 'abc' }, 'seed'],
    [{ prompt: 'x', stop: 5 }, 'stop'],
    [{ prompt: 'x', stop: ['ok', ''] }, 'stop'],
    [{ prompt: 'x', stream: 'yes' }, 'stream'],
    [{ prompt: 'x', stream_options: { include_usage: true } }, 'stream_options'],
    [{ prompt: 'x', stream: true, stream_options: { continuous_usage_stats: true } }, 'stream_options'],
    [{ prompt: 'x', add_special_tokens: 'no' }, 'add_special_tokens'],
    [{ prompt: 'x', return_tokens_as_token_ids: 1 }, 'return_tokens_as_token_ids'],
    [{ prompt: 'x', frequency_penalty: 2.5 }, 'frequency_penalty'],
    [{ prompt: 'x', frequency_penalty: 'high' }, 'frequency_penalty'],
    [{ prompt: 'x', presence_penalty: 3 }, 'presence_penalty'],
    [{ prompt: 'x', presence_penalty: -2.01 }, 'presence_penalty'],
    [{ prompt: 'x', logprobs: 21 }, 'logprobs'],
    [{ prompt: 'x', logprobs: -1 }, 'logprobs'],
    [{ prompt: 'x', logprobs: true }, 'logprobs'],
    [{ prompt: 'x', echo: true }, 'echo'],
    [{ prompt: 5 }, 'prompt'],
    [{ prompt: [] }, 'prompt'],
    [{ prompt: [{ text: 'x' }] }, 'prompt'],
    [{ prompt: [1, 'a'] }, 'prompt'],
    [{}, 'prompt'],
    [{ model: 7, prompt: 'x' }, 'model'],
    [{ prompt: [5000000000] }, 'prompt'],  // not a token id at all (it used to wrap around)
    [{ prompt: 'x', max_tokens: 2147483648 }, 'max_tokens'],
    [{ prompt: 'x', stop_token_ids: 3 }, 'stop_token_ids'],
    [{ prompt: 'x', stop_token_ids: [-1] }, 'stop_token_ids'],
    [{ prompt: 'x', stop_token_ids: [1.5] }, 'stop_token_ids'],
    // Fields that would change the output and are not implemented: refused, not ignored.
    [{ prompt: 'x', logit_bias: { 5: 'x' } }, 'logit_bias'],  // (served since 2026-12-06: bad values refused)
    [{ prompt: 'x', min_tokens: 17 }, 'min_tokens'],  // above the default max_tokens
    [{ prompt: 'x', suffix: ' end' }, 'suffix'],
    [{ prompt: 'x', response_format: { type: 'json' } }, 'response_format'],  // (json_object, json_schema are served)
    [{ prompt: 'x', use_beam_search: true }, 'use_beam_search'],
    [{ prompt: 'x', include_stop_str_in_output: 'yes' }, 'include_stop_str_in_output'],  // (true is served)
    // GBNF grammars are served (since 2026-12-06 evening); bad ones name the field.
    [{ prompt: 'x', guided_grammar: 'start ::= "a"' }, 'guided_grammar'],  // no root rule
    [{ prompt: 'x', guided_grammar: 'root ::= "a" b' }, 'guided_grammar'],  // an undefined rule
    [{ prompt: 'x', guided_grammar: 5 }, 'guided_grammar'],
    [{ prompt: 'x', guided_grammar: 'root ::= root "a" | "b"' }, 'guided_grammar'],  // left recursion
    [{ prompt: 'x', guided_grammar: 'root ::= "a"', guided_regex: 'a' }, 'guided_grammar'],
    // JSON schemas are served (since 2026-12-06); bad or unsupported ones name the field.
    [{ prompt: 'x', guided_json: { type: 'object', patternProperties: { a: {} } } }, 'guided_json'],
    [{ prompt: 'x', guided_json: '{"type": "object",' }, 'guided_json'],  // a string that is not JSON
    [{ prompt: 'x', guided_json: 5 }, 'guided_json'],
    [{ prompt: 'x', guided_json: { $defs: { n: { properties: { n: { $ref: '#/$defs/n' } }, required: ['n'] } },
                                  $ref: '#/$defs/n' } },
     'guided_json'],  // a recursion that never ends (an optional one is served since 2026-12-07)
    [{ prompt: 'x', guided_json: { type: 'object' }, guided_regex: 'a' }, 'guided_json'],
    [{ prompt: 'x', guided_json: { type: 'string' }, guided_whitespace_pattern: '(a' }, 'guided_json'],
    [{ prompt: 'x', structured_outputs: { json: { type: 'array', items: { not: {} } } } }, 'structured_outputs.json'],
    [{ prompt: 'x', structured_outputs: { json_object: 'yes' } }, 'structured_outputs.json_object'],
    // Structural tags are served (since 2026-12-06 night); malformed or unsupported ones name the field.
    [{ prompt: 'x', structured_outputs: { structural_tag: '{}' } }, 'structured_outputs.structural_tag'],  // no format
    [{ prompt: 'x', structured_outputs: { structural_tag: '{"structures": [' } }, 'structured_outputs.structural_tag'],
    [{ prompt: 'x', structured_outputs: { structural_tag: 5 } }, 'structured_outputs.structural_tag'],
    [{ prompt: 'x', structured_outputs: { structural_tag: { structures: [{ begin: '<a>', schema: {}, end: '</a>' }],
                                                           triggers: ['['] } } },
     'structured_outputs.structural_tag'],  // a begin that starts with no trigger
    [{ prompt: 'x', structured_outputs: { structural_tag: { structures: [{ begin: '<a>', end: '</a>' }],
                                                           triggers: ['<'] } } },
     'structured_outputs.structural_tag'],  // no schema
    [{ prompt: 'x', structured_outputs: { structural_tag: { format: { type: 'nope' } } } },
     'structured_outputs.structural_tag'],
    [{ prompt: 'x', structured_outputs: { structural_tag: { format: { type: 'token', token: 1 } } } },
     'structured_outputs.structural_tag'],  // token-level
    [{ prompt: 'x', structured_outputs: { structural_tag: '{"format": {"type": "const_string", "value": "a"}}' },
       guided_regex: 'a' }, 'structured_outputs.structural_tag'],
    [{ prompt: 'x', response_format: { type: 'structural_tag' } }, 'response_format'],  // neither format nor structures
    [{ prompt: 'x', response_format: { type: 'structural_tag', format: { type: 'sequence', elements: [] } } },
     'response_format'],
    // Structured outputs: guided_choice and guided_regex are served; bad ones, and what is not, name the field.
    [{ prompt: 'x', guided_choice: [] }, 'guided_choice'],
    [{ prompt: 'x', guided_choice: 'yes' }, 'guided_choice'],
    [{ prompt: 'x', guided_choice: ['yes', 5] }, 'guided_choice'],
    [{ prompt: 'x', guided_choice: ['yes', ''] }, 'guided_choice'],
    [{ prompt: 'x', guided_regex: 7 }, 'guided_regex'],
    [{ prompt: 'x', guided_regex: '(a)\\1' }, 'guided_regex'],  // a backreference
    [{ prompt: 'x', guided_regex: 'a(?=b)' }, 'guided_regex'],  // lookahead
    [{ prompt: 'x', guided_regex: '(ab' }, 'guided_regex'],
    [{ prompt: 'x', guided_choice: ['a'], guided_regex: 'a' }, 'guided_regex'],
    [{ prompt: 'x', guided_choice: ['a'], allowed_token_ids: [5] }, 'guided_choice'],
    [{ prompt: 'x', structured_outputs: 'a' }, 'structured_outputs'],
    [{ prompt: 'x', structured_outputs: { grammar: 'root ::= [' } }, 'structured_outputs.grammar'],
    [{ prompt: 'x', structured_outputs: { regex: '\\bword' } }, 'structured_outputs.regex'],
    [{ prompt: 'x', structured_outputs: { choice: [] } }, 'structured_outputs.choice'],
    [{ prompt: 'x', structured_outputs: { colour: 'red' } }, 'structured_outputs.colour'],
    [{ prompt: 'x', structured_outputs: { choice: ['a'] }, guided_choice: ['b'] }, 'structured_outputs.choice'],
    [{ prompt: 'x', allowed_token_ids: [] }, 'allowed_token_ids'],
    [{ prompt: 'x', bad_words: [''] }, 'bad_words'],
    [{ prompt: 'x', prompt_logprobs: 1 }, 'prompt_logprobs'],
  ];
  for (const [body, param] of cases) isErrorObject(await post(base, '/v1/completions', { model: MODEL, ...body }, KEY), 400, param);
  // A structural tag's error says what and where.
  for (const [tag, what] of [[{ format: { type: 'token', token: 1 } }, /format: format type "token" is token-level/],
                             [{ structures: [{ begin: '<a>', schema: {}, end: '>' }], triggers: ['['] },
                              /structures\[0\]\.begin "<a>" starts with none of the triggers/],
                             [{ format: { type: 'sequence', elements: [{ type: 'nope' }] } },
                              /format\.elements\[0\]: unknown format type "nope"/]]) {
    const r = await post(base, '/v1/completions',
                         { model: MODEL, prompt: 'x', structured_outputs: { structural_tag: tag } }, KEY);
    assert.match(isErrorObject(r, 400, 'structured_outputs.structural_tag').message, what);
  }
  const chatCases = [
    [{ messages: 'hi' }, 'messages'],
    [{ messages: [] }, 'messages'],
    [{ messages: [{ content: 'no role' }] }, 'messages'],
    [{ messages: [{ role: 'user', content: 5 }] }, 'messages'],
    [{ messages: [{ role: 'user', content: 'x' }], logprobs: 'yes' }, 'logprobs'],
    [{ messages: [{ role: 'user', content: 'x' }], logprobs: true, top_logprobs: 21 }, 'top_logprobs'],
    [{ messages: [{ role: 'user', content: 'x' }], logprobs: true, top_logprobs: 1.5 }, 'top_logprobs'],
    [{ messages: [{ role: 'user', content: 'x' }], top_logprobs: 3 }, 'top_logprobs'],  // needs logprobs: true
    [{ messages: [{ role: 'user', content: 'x' }], frequency_penalty: -3 }, 'frequency_penalty'],
    // tools need tool_choice "none" (zipage-serve parses no tool calls); a malformed tool is named as such
    [{ messages: [{ role: 'user', content: 'x' }], tools: [{ type: 'function', function: { name: 'f' } }] }, 'tool_choice'],
    [{ messages: [{ role: 'user', content: 'x' }], tools: [{ type: 'function' }], tool_choice: 'none' }, 'tools'],
    [{ messages: [{ role: 'user', content: 'x' }], response_format: { type: 'json_schema' } }, 'response_format'],
    [{ messages: [{ role: 'user', content: 'x' }], response_format: { type: 'yaml' } }, 'response_format'],
    [{ messages: [{ role: 'user', content: 'x' }],
       response_format: { type: 'json_schema',
                          json_schema: { name: 'n', schema: { type: 'array', uniqueItems: true } } } },
     'response_format'],
    [{ messages: [{ role: 'user', content: 'x' }], response_format: { type: 'json_object' }, guided_choice: ['a'] },
     'response_format'],
    [{ messages: [{ role: 'user', content: 'x' }], guided_json: { type: 'object', if: {} } }, 'guided_json'],
    [{ messages: [{ role: 'user', content: 'x' }], guided_regex: '(?<=a)b' }, 'guided_regex'],
    // vLLM too refuses a template sent with the request unless started with --trust-request-chat-template
    [{ messages: [{ role: 'user', content: 'x' }], chat_template: '{{ messages }}' }, 'chat_template'],
    [{ messages: [{ role: 'user', content: 'x' }], include_reasoning: 'no' }, 'include_reasoning'],
  ];
  for (const [body, param] of chatCases) isErrorObject(await post(base, '/v1/chat/completions', { model: MODEL, ...body }, KEY), 400, param);
  // No chat template and no --chat-template plain: a clear 400.
  const nt = isErrorObject(await post(base, '/v1/chat/completions', { model: MODEL, messages: [{ role: 'user', content: 'x' }] }, KEY), 400);
  assert.equal(nt.code, 'no_chat_template');
  await ok();

  // What those fields' neutral values ask for is what zipage-serve does: accepted. stop_token_ids (vLLM's) is
  // honoured: with every id of the 512-token vocabulary listed, the first token ends the choice.
  for (const extra of [{ logit_bias: {} }, { min_tokens: 0 }, { suffix: '' }, { response_format: { type: 'text' } },
                       { use_beam_search: false }, { tools: [] }, { stop_token_ids: [] }, { user: 'someone' }]) {
    const r = await post(base, '/v1/completions', { model: MODEL, prompt: 'Once upon a time', max_tokens: 5, ...extra }, KEY);
    assert.equal(r.status, 200, `${JSON.stringify(extra)}: ${r.text}`);
    assert.equal(r.json.choices[0].finish_reason, 'length', JSON.stringify(extra));
  }
  const all = Array.from({ length: 512 }, (_, i) => i);
  const stopped = await post(base, '/v1/completions', { model: MODEL, prompt: 'Once upon a time', max_tokens: 5, stop_token_ids: all }, KEY);
  assert.equal(stopped.status, 200, stopped.text);
  assert.equal(stopped.json.choices[0].finish_reason, 'stop', stopped.text);
  assert.equal(stopped.json.usage.completion_tokens, 1, stopped.text);
  await ok();

  // A prompt longer than the context (2,048 tokens), and one whose max_tokens would pass it.
  const long = 'Once upon a time there was a dog. '.repeat(300);
  const e1 = isErrorObject(await post(base, '/v1/completions', { model: MODEL, prompt: long, max_tokens: 4 }, KEY), 400, 'prompt');
  assert.match(e1.message, /maximum context length is 2048 tokens/);
  isErrorObject(await post(base, '/v1/completions', { model: MODEL, prompt: 'x', max_tokens: 5000 }, KEY), 400, 'max_tokens');

  // Unknown model: 404 model_not_found; unknown route: 404.
  assert.equal(isErrorObject(await post(base, '/v1/completions', { model: 'gpt-4o', prompt: 'x' }, KEY), 404, 'model').code, 'model_not_found');
  isErrorObject(await post(base, '/v1/nothing', { prompt: 'x' }, KEY), 404);

  // API key: missing or wrong -> 401 on the API routes; /health and /metrics need none.
  for (const headers of [{}, { Authorization: 'Bearer nope' }, { Authorization: 'test-key' }]) {
    assert.equal(isErrorObject(await post(base, '/v1/completions', { model: MODEL, prompt: 'x' }, headers), 401).code, 'invalid_api_key');
    const m = await fetch(`${base}/v1/models`, { headers });
    assert.equal(m.status, 401);
  }
  assert.equal((await fetch(`${base}/v1/models`, { headers: KEY })).status, 200);
  assert.equal((await fetch(`${base}/health`)).status, 200);
  assert.equal((await fetch(`${base}/metrics`)).status, 200);

  // An oversized body (--max-body-bytes 65536): 413 with an error object.
  const big = JSON.stringify({ model: MODEL, prompt: 'a'.repeat(100000) });
  isErrorObject(await post(base, '/v1/completions', big, KEY), 413);

  // Slow clients. The listener defers accept until a request's first bytes arrive (TCP_DEFER_ACCEPT): a
  // client that connects and stays silent, then writes its request in two pieces, is still answered, and
  // requests on other connections go on meanwhile.
  const slow = await new Promise((resolve, reject) => {
    const sock = net.connect(server.port, '127.0.0.1');
    let reply = '';
    sock.on('data', (d) => { reply += d.toString(); });
    sock.on('end', () => resolve(reply));
    sock.on('error', reject);
    sock.on('connect', async () => {
      await new Promise((r) => setTimeout(r, 1500));
      sock.write('GET /health HTTP/1.1\r\nHost: x\r\n');
      await ok();  // another client, served while this one is half-way through its request
      await new Promise((r) => setTimeout(r, 300));
      sock.write('\r\n');
    });
  });
  assert.match(slow, /^HTTP\/1\.1 200 /, slow);
  assert.match(slow, /"status":"ok"/, slow);

  // Unknown fields are ignored.
  const r = await post(base, '/v1/completions', { model: MODEL, prompt: 'Once upon a time', max_tokens: 3, user: 'u',
                                                  logit_bias: {}, suffix: null, whatever: [1] }, KEY);
  assert.equal(r.status, 200, r.text);
  await ok();
  const m = await waitIdle(base);
  assert.ok(m.zipage_request_rejected_total >= 0);
});

// The bounded queue: --max-num-seqs 2 --max-queue 1 takes 3 choices; the 4th gets 429, and a client that
// disconnects frees its place (and its KV blocks) at once: queued or running, streaming or not.
await run('serve_queue_bound', async (servers) => {
  const server = await startServer(['--max-num-seqs', '2', '--max-queue', '1']);
  servers.push(server);
  const base = server.base;
  const controllers = [];
  const streams = [];
  for (let i = 0; i < 3; ++i) {
    const ac = new AbortController();
    controllers.push(ac);
    const res = await fetch(`${base}/v1/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, signal: ac.signal,
      body: JSON.stringify({ prompt: 'Once upon a time', max_tokens: 2000, ignore_eos: true, stream: true }),
    });
    assert.equal(res.status, 200);
    streams.push(res);
  }
  const full = await post(base, '/v1/completions', { prompt: 'x', max_tokens: 2 });
  assert.equal(isErrorObject(full, 429).code, 'queue_full');
  assert.equal((await post(base, '/v1/completions', { prompt: 'x', max_tokens: 2, n: 2 })).status, 429);
  // /metrics shows the engine's counters as of its last step, so conditions on them are waited for.
  const waitFor = (pred, what) => waitMetrics(base, pred, what);
  const before = await waitFor((m) => m.zipage_num_requests_waiting === 1 && m.zipage_num_requests_running === 2,
                                   'the third stream is not queued behind the two running');
  assert.ok(before.zipage_kv_blocks_used > 0);

  // A queued request gets no tokens, so only the hang-up watch can notice its client leave.
  // Seen while both running requests still run (2,000 tokens each: over a second), the cancelled one was
  // cancelled in the queue; without the watch it would be cancelled only once it ran, a failed write later.
  controllers[2].abort();
  let m = await waitFor((m) => m.zipage_request_cancelled_total === 1 && m.zipage_num_requests_waiting === 0,
                            'a queued stream whose client left was not cancelled');
  assert.equal(m.zipage_num_requests_running, 2, 'the queued stream was cancelled only after it ran');
  // The same for a non-streaming request: nothing is written to its socket until it finishes.
  const ac = new AbortController();
  const pending = fetch(`${base}/v1/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, signal: ac.signal,
    body: JSON.stringify({ prompt: 'Once upon a time', max_tokens: 2000, ignore_eos: true }),
  }).catch((e) => e);
  await waitFor((m) => m.zipage_num_requests_waiting === 1, 'the non-streaming request was not queued');
  ac.abort();
  assert.equal((await pending).name, 'AbortError');
  m = await waitFor((m) => m.zipage_request_cancelled_total === 2 && m.zipage_num_requests_waiting === 0,
                        'a queued non-streaming request whose client left was not cancelled');
  assert.equal(m.zipage_num_requests_running, 2, 'the queued non-streaming request was cancelled only after it ran');

  controllers[0].abort();
  controllers[1].abort();
  const after = await waitIdle(base, 5000);
  assert.equal(after.zipage_kv_blocks_used, 0);
  assert.equal(after.zipage_request_cancelled_total, 4);
  const again = await post(base, '/v1/completions', { prompt: 'Once upon a time', max_tokens: 3 });
  assert.equal(again.status, 200, again.text);
});
process.exit(0);
