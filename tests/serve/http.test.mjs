// zipage-serve at the HTTP level and its flags: a port in use, a body without a length, a known route with the
// wrong method, a request larger than the whole queue, flags at the top of their ranges, Prometheus label
// escaping, --seed, the chat-template fields add_generation_prompt / continue_final_message / the developer
// role / tool calls and tools, and --reasoning-parser (on the random Qwen3 checkpoint, which has Qwen3's template),
// a generation_config.json's top_k -1 and max_new_tokens, vLLM's stop_reason, logprobs of NaN logits rows, and
// vLLM's logits processors (logit_bias, allowed_token_ids, bad_words, min_tokens).
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { deadline, metrics, post, run, startServer } from './common.mjs';

deadline(180);
const MODEL = 'stories260K';

// Sends raw bytes and resolves with the status line's code and how long the answer took.
function rawRequest(port, bytes) {
  return new Promise((resolve, reject) => {
    const t0 = Date.now();
    const sock = net.connect(port, '127.0.0.1', () => sock.write(bytes));
    let data = '';
    sock.on('data', (d) => {
      data += d.toString();
      const m = data.match(/^HTTP\/1\.1 (\d+)/);
      if (m && data.includes('\r\n\r\n')) {
        sock.destroy();
        resolve({ status: Number(m[1]), ms: Date.now() - t0, text: data });
      }
    });
    sock.on('error', reject);
    setTimeout(() => { sock.destroy(); reject(new Error(`no answer in 5 s: ${data}`)); }, 5000);
  });
}

// Sends raw bytes and resolves once the server has closed the connection: the status, the time to the close
// and all it sent.
function rawUntilClosed(port, bytes) {
  return new Promise((resolve, reject) => {
    const t0 = Date.now();
    const sock = net.connect(port, '127.0.0.1', () => sock.write(bytes));
    let data = '';
    sock.on('data', (d) => { data += d.toString(); });
    sock.on('end', () => {
      sock.destroy();
      const m = data.match(/^HTTP\/1\.1 (\d+)/);
      resolve({ status: m ? Number(m[1]) : 0, ms: Date.now() - t0, text: data });
    });
    sock.on('error', reject);
    setTimeout(() => { sock.destroy(); reject(new Error(`not answered and closed in 5 s: ${data}`)); }, 5000);
  });
}

// Runs zipage-serve with `args` to its exit (killed after `ms`): its exit code ('still running' if it had to be
// killed) and its stderr.
function serveToExit(args, ms = 20000) {
  const p = spawn(process.env.ZIPAGE_SERVE_BIN, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let err = '';
  p.stderr.on('data', (d) => { err += d.toString(); });
  return new Promise((resolve) => {
    const timer = setTimeout(() => { p.kill('SIGKILL'); resolve({ code: `still running after ${ms} ms`, err }); }, ms);
    p.on('exit', (code) => { clearTimeout(timer); resolve({ code, err }); });
  });
}

await run('serve_http', async (servers) => {
  const server = await startServer(['--max-num-seqs', '2', '--max-queue', '1', '--served-model-name', 'my"model\\x']);
  servers.push(server);
  const base = server.base;

  // A second server on the same port must fail at start, not share the port (httplib's SO_REUSEPORT).
  const second = await serveToExit(['--host', '127.0.0.1', '--port', String(server.port)]);
  const secondLog = second.err;
  assert.equal(second.code, 1, secondLog);
  assert.match(secondLog, new RegExp(`cannot listen on 127\\.0\\.0\\.1:${server.port} \\(in use`));

  // A POST with neither Content-Length nor chunked encoding: 411 at once (not the 30 s read timeout).
  const noLength = await rawRequest(server.port,
    'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\r\n{"prompt": "x"}');
  assert.equal(noLength.status, 411, noLength.text);
  assert.ok(noLength.ms < 3000, `411 took ${noLength.ms} ms`);
  assert.equal((await rawRequest(server.port, 'DELETE /v1/nothing HTTP/1.1\r\nHost: x\r\n\r\n')).status, 404);

  // A declared body above --max-body-bytes (8 MiB) that the client holds back: 413 at once and the connection
  // closed (httplib read the body first: the answer came at the 30 s read timeout). With Expect: 100-continue,
  // 413 instead of the 100 that would ask for the body.
  const head = 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n' +
               'Content-Length: 100000000\r\n';
  for (const expect of ['', 'Expect: 100-continue\r\n']) {
    const tooLarge = await rawUntilClosed(server.port, `${head}${expect}\r\n`);
    assert.equal(tooLarge.status, 413, tooLarge.text);
    assert.ok(tooLarge.ms < 3000, `413 took ${tooLarge.ms} ms`);
    assert.match(tooLarge.text, /Connection: close/);
    assert.match(tooLarge.text,
                 /a request body of 100000000 bytes \(Content-Length\) is more than --max-body-bytes \(8388608\)/);
  }
  // A body above the limit that is sent whole is still answered with the 413, not a reset.
  const sentWhole = await post(base, '/v1/completions', JSON.stringify({ prompt: 'a'.repeat(9 << 20) }));
  assert.equal(sentWhole.status, 413, sentWhole.text);
  assert.equal(sentWhole.json.error.code, 'payload_too_large');

  // A known route with the wrong method: 405 naming the right one.
  const get = await fetch(`${base}/v1/completions`);
  assert.equal(get.status, 405);
  assert.equal(get.headers.get('allow'), 'POST');
  assert.equal((await get.json()).error.code, 'method_not_allowed');
  const postHealth = await post(base, '/health', {});
  assert.equal(postHealth.status, 405, postHealth.text);
  assert.equal((await fetch(`${base}/v1/models`, { method: 'HEAD' })).status, 200);

  // More choices than --max-num-seqs + --max-queue (2 + 1) can ever hold: 400 on 'n', not a 429 to retry.
  const big = await post(base, '/v1/completions', { prompt: 'x', max_tokens: 2, n: 4 });
  assert.equal(big.status, 400, big.text);
  assert.equal(big.json.error.param, 'n');
  assert.match(big.json.error.message, /4 choices .* at most 3 at once/);
  const fits = await post(base, '/v1/completions', { prompt: 'Once upon a time', max_tokens: 2, n: 3 });
  assert.equal(fits.status, 200, fits.text);
  // A priority under the default fcfs scheduling would be ignored: 400, as vLLM (0 is the neutral value).
  const prio = await post(base, '/v1/completions', { prompt: 'x', max_tokens: 2, priority: 3 });
  assert.equal(prio.status, 400, prio.text);
  assert.equal(prio.json.error.param, 'priority');
  assert.equal((await post(base, '/v1/completions', { prompt: 'x', max_tokens: 2, priority: 0 })).status, 200);
  // No max_tokens and no -n: OpenAI's and vLLM's default for a completion, 16 tokens.
  const dflt = await post(base, '/v1/completions', { prompt: 'Once upon a time', ignore_eos: true });
  assert.equal(dflt.json.usage.completion_tokens, 16, dflt.text);

  // Label values escaped as the exposition format says; the histograms carry the model's label too.
  const text = await (await fetch(`${base}/metrics`)).text();
  assert.ok(text.includes('zipage_num_requests_running{model_name="my\\"model\\\\x"} '), text.slice(0, 400));
  assert.match(text, /zipage_e2e_request_latency_seconds_bucket\{model_name="my\\"model\\\\x",le="\+Inf"\} [1-9]\d*\n/);
  assert.match(text, /zipage_e2e_request_latency_seconds_count\{model_name="my\\"model\\\\x"\} [1-9]\d*\n/);
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    assert.match(line, /^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\[\\"n])*",?)*\})? \S+$/, line);
  }
  // A request the engine refuses (a prompt id outside the vocabulary) is a rejection, not accepted prompt tokens.
  const invalid = async () => Number((await (await fetch(`${base}/metrics`)).text())
    .match(/zipage_request_rejected_total\{[^}]*reason="invalid"\} (\d+)/)[1]);
  const m0 = await metrics(base);
  const i0 = await invalid();
  const refused = await post(base, '/v1/completions', { prompt: [[5, 6, 99999]], max_tokens: 2 });
  assert.equal(refused.status, 400, refused.text);
  assert.match(refused.json.error.message, /vocabulary/);
  const m1 = await metrics(base);
  assert.equal(m1.zipage_prompt_tokens_total, m0.zipage_prompt_tokens_total);
  assert.equal(await invalid(), i0 + 1);
});

await run('serve_http_flags', async (servers) => {
  // Flags at the top of their ranges: the queue bound's sum does not overflow into "always full".
  const server = await startServer(['--max-queue', '2147483647', '--max-num-seqs', '2147483647', '--num-blocks', '256']);
  servers.push(server);
  const r = await post(server.base, '/v1/completions', { prompt: 'Once upon a time', max_tokens: 3 });
  assert.equal(r.status, 200, r.text);
  // A pool smaller than the model's context is said at start (vLLM would refuse to start).
  const small = await startServer(['--num-blocks', '64', '--policy', 'full_kv']);
  servers.push(small);
  assert.match(small.log(), /note: the KV pool holds 1024 tokens, fewer than the model's context of 2048/);
  assert.ok(!server.log().includes('note: the KV pool'), server.log());
  // --max-model-len (vLLM's): the context served, reported by /v1/models and enforced per request; no note then.
  const capped = await startServer(['--num-blocks', '64', '--policy', 'full_kv', '--max-model-len', '1024']);
  servers.push(capped);
  assert.ok(!capped.log().includes('note: the KV pool'), capped.log());
  const models = await fetch(`${capped.base}/v1/models`).then((x) => x.json());
  assert.equal(models.data[0].max_model_len, 1024);
  const long = await post(capped.base, '/v1/completions', { prompt: 'Once upon a time', max_tokens: 1024 });
  assert.equal(long.status, 400, long.text);
  assert.match(long.json.error.message, /maximum context length is 1024 tokens/);
  assert.equal((await post(capped.base, '/v1/completions', { prompt: 'Once upon a time', max_tokens: 8 })).status, 200);
  const over = await serveToExit(['--max-model-len', '4096']);
  assert.notEqual(over.code, 0);
  assert.match(over.err, /--max-model-len 4096 is larger than the model's context of 2048 tokens/);
  // --allow-beyond-context lifts the limit (compressed long generation): prompt + output may pass the model's
  // 2,048 tokens, /v1/models still reports the model's context; with --max-model-len that length is the limit,
  // even above the model's.
  const beyond = await startServer(['--allow-beyond-context']);
  servers.push(beyond);
  assert.match(beyond.log(), /context no limit: --allow-beyond-context, the model's is 2048 tokens/);
  assert.equal((await fetch(`${beyond.base}/v1/models`).then((x) => x.json())).data[0].max_model_len, 2048);
  const past = await post(beyond.base, '/v1/completions',
                          { prompt: 'Once upon a time', max_tokens: 2100, ignore_eos: true });
  assert.equal(past.status, 200, past.text);
  assert.equal(past.json.usage.completion_tokens, 2100);
  const refusedPast = await post(server.base, '/v1/completions', { prompt: 'Once upon a time', max_tokens: 2100 });
  assert.equal(refusedPast.status, 400, refusedPast.text);
  const beyondCapped = await startServer(['--allow-beyond-context', '--max-model-len', '4096']);
  servers.push(beyondCapped);
  assert.equal((await fetch(`${beyondCapped.base}/v1/models`).then((x) => x.json())).data[0].max_model_len, 4096);
  const over4096 = await post(beyondCapped.base, '/v1/completions', { prompt: 'Once upon a time', max_tokens: 4096 });
  assert.equal(over4096.status, 400, over4096.text);
  assert.match(over4096.json.error.message, /maximum context length is 4096 tokens/);
  // Out-of-range or non-finite flag values: one line naming the flag and a readable range.
  for (const [flag, value, range] of [['--shutdown-timeout', 'nan', 'not a finite number'],
                                      ['--shutdown-timeout', '1e300', 'in \\[0, 86400\\]'],
                                      ['--max-queue', '-1', 'in \\[0, 2147483647\\]'],
                                      ['--http-threads', '-5', 'in \\[0, 65536\\]'],
                                      ['--max-body-bytes', '0', 'in \\[1, 2\\^40\\]'],
                                      ['--seed', '-1', 'in \\[0, 2\\^64 - 1\\]|not a whole number']]) {
    const { code, err } = await serveToExit([flag, value]);
    assert.equal(code, 2, `${flag} ${value}: ${err}`);
    assert.match(err, new RegExp(`${flag}.*(${range})`), err);
    assert.ok(err.length < 300, `${flag} ${value}: ${err}`);
  }
});

await run('serve_http_seed', async (servers) => {
  // --seed: requests that set no seed draw theirs from a generator seeded with it, so a fresh server answers
  // the same requests alike.
  const texts = [];
  for (let round = 0; round < 2; ++round) {
    const server = await startServer(['--seed', '5', '--temperature', '1']);
    servers.push(server);
    const got = [];
    for (let i = 0; i < 3; ++i) {
      const r = await post(server.base, '/v1/completions', { prompt: 'Once upon a time', max_tokens: 16 });
      assert.equal(r.status, 200, r.text);
      got.push(r.json.choices[0].text);
    }
    texts.push(got);
    await server.stop();
  }
  assert.deepEqual(texts[1], texts[0]);
  assert.ok(new Set(texts[0]).size > 1, `three draws, one text: ${texts[0]}`);
});

await run('serve_http_chat_template', async (servers) => {
  const model = process.env.ZIPAGE_SERVE_CHAT_MODEL;
  assert.ok(model, 'ZIPAGE_SERVE_CHAT_MODEL is not set');
  const server = await startServer(['--model', model]);
  servers.push(server);
  const chat = async (body) => {
    const r = await post(server.base, '/v1/chat/completions', { max_tokens: 2, temperature: 0, ...body });
    return r;
  };
  const prompt = async (body) => {
    const r = await chat(body);
    assert.equal(r.status, 200, r.text);
    return r.json.usage.prompt_tokens;
  };
  const user = [{ role: 'user', content: 'What is 2+3?' }];
  const turn = [...user, { role: 'assistant', content: 'The answer is' }];
  // Qwen3's template: the generation prompt is "<|im_start|>assistant\n" (3 tokens).
  assert.equal(await prompt({ messages: user }) - await prompt({ messages: user, add_generation_prompt: false }), 3);
  // continue_final_message: the last assistant message stays open (no "<|im_end|>\n"), so the model continues it.
  assert.equal(await prompt({ messages: turn, add_generation_prompt: false }) -
               await prompt({ messages: turn, continue_final_message: true, add_generation_prompt: false }), 2);
  assert.equal(await prompt({ messages: turn, continue_final_message: true }),
               await prompt({ messages: turn, continue_final_message: true, add_generation_prompt: false }));
  const both = await chat({ messages: turn, continue_final_message: true, add_generation_prompt: true });
  assert.equal(both.status, 400, both.text);
  assert.equal(both.json.error.param, 'continue_final_message');
  assert.equal((await chat({ messages: user, continue_final_message: true })).status, 400);
  // "developer" is OpenAI's newer name for "system".
  assert.equal(await prompt({ messages: [{ role: 'developer', content: 'Be brief.' }, ...user] }),
               await prompt({ messages: [{ role: 'system', content: 'Be brief.' }, ...user] }));
  // Fields that would change the answer and are not implemented: 400 naming them.
  for (const [extra, param] of [[{ echo: true }, 'echo'], [{ tool_choice: 'required' }, 'tool_choice'],
                                [{ skip_special_tokens: false }, 'skip_special_tokens'],
                                [{ messages: [...user, { role: 'assistant', content: '', tool_calls: [{ id: 'a' }] }] },
                                 'messages']]) {
    const r = await chat({ messages: user, ...extra });
    assert.equal(r.status, 400, `${JSON.stringify(extra)}: ${r.text}`);
    assert.equal(r.json.error.param, param, r.text);
  }
  assert.equal((await chat({ messages: user, tool_choice: 'none' })).status, 200);
  // Tool calls and tool results in the conversation render through the checkpoint's template (Qwen3's writes
  // <tool_call> and <tool_response> blocks); tools render into the prompt with tool_choice "none" and are
  // refused with any choice that would need the answer parsed into tool_calls.
  const toolTurn = [...user, { role: 'assistant', content: '', tool_calls: [{ id: 'c1', type: 'function',
                    function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
                    { role: 'tool', tool_call_id: 'c1', content: '22C' }];
  assert.ok(await prompt({ messages: toolTurn }) > (await prompt({ messages: user })) + 10);
  // OpenAI's clients send a tool-calling turn back with "content": null (or none): the template gets "", as under
  // vLLM (Qwen3's template tests '</think>' in it, which failed on null with a 400).
  const ids = async (messages) => {
    const r = await post(server.base, '/tokenize', { messages });
    assert.equal(r.status, 200, r.text);
    return r.json.tokens;
  };
  const [, call, result] = toolTurn;
  const { content: _, ...callWithoutContent } = call;
  for (const c of [{ ...call, content: null }, callWithoutContent])
    assert.deepEqual(await ids([...user, c, result]), await ids(toolTurn));
  assert.deepEqual(await ids([{ role: 'user', content: null }]), await ids([{ role: 'user', content: '' }]));
  // Text content parts are joined with "\n", empty ones dropped, as vLLM joins them for a string template.
  const parts = ['What is', '', '2+3?'].map((text) => ({ type: 'text', text }));
  assert.deepEqual(await ids([{ role: 'user', content: parts }]),
                   await ids([{ role: 'user', content: 'What is\n2+3?' }]));
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'The weather in a city',
                   parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
  assert.ok(await prompt({ messages: user, tools, tool_choice: 'none' }) > (await prompt({ messages: user })) + 30);
  for (const body of [{ messages: user, tools }, { messages: user, tools, tool_choice: 'auto' },
                      { messages: user, tools: [{ type: 'function' }], tool_choice: 'none' }]) {
    const r = await chat(body);
    assert.equal(r.status, 400, r.text);
    assert.equal(r.json.error.param, body.tools[0].function ? 'tool_choice' : 'tools', r.text);
  }

  // /tokenize with messages: the ids /v1/chat/completions feeds (its usage counts them), the same options.
  for (const body of [{ messages: user }, { messages: turn, continue_final_message: true, add_generation_prompt: false },
                      { messages: user, chat_template_kwargs: { enable_thinking: false } }]) {
    const t = await post(server.base, '/tokenize', body);
    assert.equal(t.status, 200, t.text);
    assert.equal(t.json.count, await prompt(body), JSON.stringify(body));
    assert.equal(t.json.tokens.length, t.json.count);
  }
  const t = await post(server.base, '/tokenize', { messages: user, return_token_strs: true });
  assert.equal(t.json.token_strs[0], '<|im_start|>');  // the vocabulary's own strings
  assert.equal(t.json.token_strs.length, t.json.count);
  assert.equal((await post(server.base, '/detokenize', { tokens: t.json.tokens })).json.prompt,
               '<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n');
  // Ids of the model's padded vocabulary (151,669 tokenizer ids of 151,936) decode to nothing, as when generated
  // (they were refused, though a completion's prompt takes them); past the model's vocabulary: 400.
  const padded = await post(server.base, '/detokenize', { tokens: [t.json.tokens[0], 151700] });
  assert.equal(padded.status, 200, padded.text);
  assert.equal(padded.json.prompt, '<|im_start|>');
  const past = await post(server.base, '/detokenize', { tokens: [151936] });
  assert.equal(past.status, 400, past.text);
  assert.equal(past.json.error.param, 'tokens');
});

await run('serve_http_tokenize', async (servers) => {
  const server = await startServer([]);
  servers.push(server);
  const tok = (body) => post(server.base, '/tokenize', body);
  const detok = (body) => post(server.base, '/detokenize', body);
  // A prompt: BOS first by default (as the completions route feeds it), without it on request; text back.
  const a = await tok({ model: MODEL, prompt: 'Once upon a time' });
  assert.equal(a.status, 200, a.text);
  assert.equal(a.json.count, a.json.tokens.length);
  assert.equal(a.json.token_strs, null);
  assert.equal(a.json.tokens[0], 1);  // stories260K's BOS
  const c = await post(server.base, '/v1/completions', { prompt: 'Once upon a time', max_tokens: 1 });
  assert.equal(c.json.usage.prompt_tokens, a.json.count);
  const plain = await tok({ prompt: 'Once upon a time', add_special_tokens: false });
  assert.deepEqual(plain.json.tokens, a.json.tokens.slice(1));
  // The completions route honours add_special_tokens as /tokenize does (it was read by /tokenize only).
  const noBos = await post(server.base, '/v1/completions', { prompt: 'Once upon a time', max_tokens: 1,
                                                             add_special_tokens: false });
  assert.equal(noBos.json.usage.prompt_tokens, plain.json.count, noBos.text);
  assert.ok(a.json.max_model_len > 0);
  const strs = await tok({ prompt: 'Once upon a time', return_token_strs: true });
  assert.equal(strs.json.token_strs.length, strs.json.count);
  assert.equal(strs.json.token_strs[1], '\u2581Once');  // a SentencePiece piece, as the vocabulary spells it
  const back = await detok({ model: MODEL, tokens: plain.json.tokens });
  assert.equal(back.status, 200, back.text);
  assert.equal(back.json.prompt, 'Once upon a time');
  // Bad input: 400 naming the field; another model: 404; the wrong method: 405.
  for (const [route, body, param] of [['/tokenize', {}, 'prompt'], ['/tokenize', { prompt: 'a', messages: [] }, 'prompt'],
                                      ['/tokenize', { prompt: 7 }, 'prompt'], ['/detokenize', {}, 'tokens'],
                                      ['/detokenize', { tokens: [1, -2] }, 'tokens'],
                                      ['/detokenize', { tokens: [100000] }, 'tokens'],
                                      ['/detokenize', { tokens: 'abc' }, 'tokens']]) {
    const r = await post(server.base, route, body);
    assert.equal(r.status, 400, `${route} ${JSON.stringify(body)}: ${r.text}`);
    assert.equal(r.json.error.param, param, r.text);
  }
  assert.equal((await tok({ model: 'other', prompt: 'a' })).status, 404);
  const get = await fetch(`${server.base}/tokenize`);
  assert.equal(get.status, 405);
  assert.equal(get.headers.get('allow'), 'POST');
  // The chat form needs a chat template, which stories260K has not: a 400 that says so.
  const chat = await tok({ messages: [{ role: 'user', content: 'hi' }] });
  assert.equal(chat.status, 400, chat.text);
});

await run('serve_http_reasoning_parser', async (servers) => {
  const model = process.env.ZIPAGE_SERVE_CHAT_MODEL;
  assert.ok(model, 'ZIPAGE_SERVE_CHAT_MODEL is not set');
  const plain = await startServer(['--model', model]);
  servers.push(plain);
  const parsed = await startServer(['--model', model, '--reasoning-parser', 'deepseek_r1']);
  servers.push(parsed);
  const chat = async (server, body) => {
    const r = await post(server.base, '/v1/chat/completions', { max_tokens: 12, temperature: 0, ...body });
    assert.equal(r.status, 200, r.text);
    return r;
  };
  // The prompt ends inside a <think> block (an assistant turn continued from "<think>\n", as DeepSeek-R1's
  // template opens one): the answer is reasoning up to a </think>, content after it.
  const body = { messages: [{ role: 'user', content: 'What is 2+3?' }, { role: 'assistant', content: '<think>\nLet me' }],
                 continue_final_message: true, add_generation_prompt: false };
  const text = (await chat(plain, body)).json.choices[0].message.content;
  const m = (await chat(parsed, body)).json.choices[0].message;
  const close = text.indexOf('</think>');
  assert.equal(m.reasoning_content, close < 0 ? text : text.slice(0, close));
  assert.equal(m.content, close < 0 ? null : (text.slice(close + 8) || null));
  // Streamed: the reasoning_content and content deltas add up to the same split.
  const s = await chat(parsed, { ...body, stream: true });
  let reasoning = '', content = '';
  for (const line of s.text.split('\n')) {
    if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
    const d = JSON.parse(line.slice(6)).choices[0]?.delta ?? {};
    reasoning += d.reasoning_content ?? '';
    content += d.content ?? '';
  }
  assert.equal(reasoning, m.reasoning_content);
  assert.equal(content, m.content ?? '');
  // include_reasoning false (vLLM's): the same content, no reasoning_content, streamed or not.
  const hidden = (await chat(parsed, { ...body, include_reasoning: false })).json.choices[0].message;
  assert.equal(hidden.reasoning_content, null);
  assert.equal(hidden.content, m.content);
  const hs = await chat(parsed, { ...body, include_reasoning: false, stream: true });
  assert.doesNotMatch(hs.text, /reasoning_content/);
  // A prompt whose template closed the block (Qwen3 with thinking off): the answer is content, as without the parser.
  const off = { messages: [{ role: 'user', content: 'Hi' }], chat_template_kwargs: { enable_thinking: false } };
  const want = (await chat(plain, off)).json.choices[0].message.content;
  const got = (await chat(parsed, off)).json.choices[0].message;
  if (!want.startsWith('<think>')) {
    assert.equal(got.content, want || null);
    assert.equal(got.reasoning_content, null);
  }
  // The flag takes vLLM's parser names only.
  const bad = await serveToExit(['--model', model, '--reasoning-parser', 'nope'], 10000);
  assert.notEqual(bad.code, 0);
  assert.match(bad.err, /reasoning-parser/);
});

await run('serve_http_tool_calls', async (servers) => {
  const model = process.env.ZIPAGE_SERVE_CHAT_MODEL;
  assert.ok(model, 'ZIPAGE_SERVE_CHAT_MODEL is not set');
  const tools = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object',
                   properties: { city: { type: 'string' } } } } }];
  const body = { messages: [{ role: 'user', content: 'Weather in Paris?' }], tools, max_tokens: 12, temperature: 0 };
  // Every parser: tool_choice "auto" (OpenAI's default with tools) is accepted; the random model's answer holds
  // no call, so it comes back as content (the parsers themselves: tests/unit/test_tool_call_parser.cpp), and
  // streamed, the content deltas and tool_calls deltas add up to the same message.
  for (const parser of ['hermes', 'llama3_json', 'llama4_json', 'mistral', 'pythonic']) {
    const server = await startServer(['--model', model, '--enable-auto-tool-choice', '--tool-call-parser', parser]);
    servers.push(server);
    const r = await post(server.base, '/v1/chat/completions', body);
    assert.equal(r.status, 200, r.text);
    const m = r.json.choices[0].message;
    const calls = m.tool_calls ?? [];
    assert.equal(r.json.choices[0].finish_reason, calls.length ? 'tool_calls' : 'length', parser);
    const s = await post(server.base, '/v1/chat/completions', { ...body, stream: true });
    assert.equal(s.status, 200, s.text);
    let content = '';
    const streamed = [];
    let finish = null;
    for (const line of s.text.split('\n')) {
      if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
      const choice = JSON.parse(line.slice(6)).choices[0];
      content += choice?.delta?.content ?? '';
      streamed.push(...(choice?.delta?.tool_calls ?? []).map((c) => c.function));
      finish = choice?.finish_reason ?? finish;
    }
    assert.equal(content, m.content ?? '', parser);
    assert.deepEqual(streamed, calls.map((c) => c.function), parser);
    assert.equal(finish, r.json.choices[0].finish_reason, parser);
    // "required" and named functions would need constrained decoding: refused by name.
    for (const tool_choice of ['required', { type: 'function', function: { name: 'get_weather' } }]) {
      const bad = await post(server.base, '/v1/chat/completions', { ...body, tool_choice });
      assert.equal(bad.status, 400, bad.text);
      assert.equal(bad.json.error.param, 'tool_choice');
    }
    await server.stop();
  }
  // A call forced by a guide (the random model writes none), n = 2, with the reasoning parser too and thinking off:
  // every call id is distinct across the choices (a client keys tool results by id), and the stream sends no
  // empty content deltas while the call's text is held back.
  const both = await startServer(['--model', model, '--enable-auto-tool-choice', '--tool-call-parser', 'hermes',
                                  '--reasoning-parser', 'qwen3']);
  servers.push(both);
  const forced = { ...body, n: 2, max_tokens: 40, chat_template_kwargs: { enable_thinking: false },
                   guided_regex: '<tool_call>\\{"name": "get_weather", "arguments": \\{\\}\\}</tool_call>' };
  const fr = await post(both.base, '/v1/chat/completions', forced);
  assert.equal(fr.status, 200, fr.text);
  const ids = fr.json.choices.flatMap((c) => (c.message.tool_calls ?? []).map((t) => t.id));
  assert.equal(ids.length, 2, fr.text);
  assert.equal(new Set(ids).size, 2, fr.text);
  const fs2 = await post(both.base, '/v1/chat/completions', { ...forced, stream: true });
  const deltas = fs2.text.split('\n').filter((l) => l.startsWith('data: {'))
    .flatMap((l) => JSON.parse(l.slice(6)).choices).map((c) => c.delta);
  const streamedIds = deltas.flatMap((d) => (d.tool_calls ?? []).map((t) => t.id));
  assert.equal(new Set(streamedIds).size, 2, fs2.text);
  assert.equal(deltas.filter((d) => !d.role && !d.tool_calls && d.content === '').length, 0, fs2.text);
  await both.stop();
  // Without the flags, "auto" with tools is refused with a message naming the flags and the parsers.
  const plain = await startServer(['--model', model]);
  servers.push(plain);
  const refused = await post(plain.base, '/v1/chat/completions', body);
  assert.equal(refused.status, 400, refused.text);
  assert.equal(refused.json.error.param, 'tool_choice');
  assert.match(refused.json.error.message, /--enable-auto-tool-choice --tool-call-parser NAME \(hermes, llama3_json, llama4_json, mistral, pythonic\)/);
  // --enable-auto-tool-choice needs a parser.
  const alone = await serveToExit(['--model', model, '--enable-auto-tool-choice'], 10000);
  assert.notEqual(alone.code, 0);
  assert.match(alone.err, /tool-call-parser/);
  // An unknown parser is refused at the flags, before any model loads (the model path does not exist), with
  // the names that are known.
  const unknown = await serveToExit(['--model', '/nonexistent/model', '--enable-auto-tool-choice', '--tool-call-parser',
                                     'llama3'], 10000);
  assert.notEqual(unknown.code, 0);
  assert.match(unknown.err, /--tool-call-parser.*unknown tool-call parser 'llama3'; supported: hermes, llama3_json, llama4_json, mistral, pythonic/);
  assert.doesNotMatch(unknown.err, /nonexistent/);
});

// How logprobs name tokens. A guide makes stories260K write characters it has no piece for, so they come out as
// byte tokens (<0xF0> ...): the sampled token's text (a lone byte reads U+FFFD) is among its step's alternatives, and
// no object repeats a key (a repeated key loses an alternative in every JSON parser); chat's bytes are each token's
// own. return_tokens_as_token_ids names them "token_id:N"; continuous_usage_stats puts usage in every chunk.
await run('serve_http_logprobs_names', async (servers) => {
  const server = await startServer([]);
  servers.push(server);
  const body = { prompt: 'x', max_tokens: 16, temperature: 0, guided_regex: 'a\u00e9\u{1F600}\u65e5', logprobs: 20 };
  const r = await post(server.base, '/v1/completions', body);
  assert.equal(r.status, 200, r.text);
  const lp = r.json.choices[0].logprobs;
  lp.tokens.forEach((t, i) => assert.ok(t in lp.top_logprobs[i], `${t} not among ${JSON.stringify(lp.top_logprobs[i])}`));
  assert.ok(lp.tokens.includes('\ufffd'), r.text);  // byte tokens were sampled
  const rawTops = r.text.slice(r.text.indexOf('"top_logprobs":[') + 16, r.text.indexOf('],"text_offset"'));
  for (const obj of rawTops.split('},{')) {
    const keys = [...obj.matchAll(/"((?:[^"\\]|\\.)*)":-?[0-9]/g)].map((m) => m[1]);
    assert.equal(new Set(keys).size, keys.length, obj);
  }
  const asIds = await post(server.base, '/v1/completions', { ...body, return_tokens_as_token_ids: true });
  const ids = asIds.json.choices[0].logprobs;
  assert.ok(ids.tokens.every((t) => /^token_id:[0-9]+$/.test(t)), asIds.text);
  assert.ok(ids.top_logprobs.every((top) => Object.keys(top).every((t) => /^token_id:[0-9]+$/.test(t))), asIds.text);
  assert.equal(ids.tokens.length, lp.tokens.length);
  // Chat: each entry's bytes are its token's own (none empty but the closing EOS's), and they add up to the answer's
  // UTF-8.
  const plain = await startServer(['--chat-template', 'plain']);
  servers.push(plain);
  const { prompt, logprobs, ...rest } = body;
  const c = await post(plain.base, '/v1/chat/completions', { ...rest, messages: [{ role: 'user', content: prompt }],
                                                             logprobs: true, top_logprobs: 3 });
  assert.equal(c.status, 200, c.text);
  const content = c.json.choices[0].logprobs.content;
  assert.equal(c.json.choices[0].finish_reason, 'stop', c.text);
  assert.ok(content.slice(0, -1).every((e) => e.bytes.length > 0), c.text);
  assert.ok(content.some((e) => e.token === '\ufffd' && e.bytes.length === 1), c.text);
  assert.deepEqual(Buffer.from(content.flatMap((e) => e.bytes)), Buffer.from(c.json.choices[0].message.content), c.text);
  // continuous_usage_stats: every chunk carries the usage so far, growing to the final count.
  const s = await post(server.base, '/v1/completions', { prompt: 'Once', max_tokens: 6, temperature: 0, stream: true,
                                                        stream_options: { include_usage: true, continuous_usage_stats: true } });
  const chunks = s.text.split('\n').filter((l) => l.startsWith('data: {')).map((l) => JSON.parse(l.slice(6)));
  assert.ok(chunks.length >= 2, s.text);
  const counts = chunks.map((c) => c.usage?.completion_tokens);
  assert.ok(counts.every((n, i) => Number.isInteger(n) && n >= 1 && (i === 0 || n >= counts[i - 1])), s.text);
  assert.equal(counts.at(-1), 6, s.text);
  assert.ok(chunks.every((c) => c.usage.prompt_tokens === chunks[0].usage.prompt_tokens), s.text);
});

await run('serve_http_ignore_eos', async (servers) => {
  // A base Qwen3 (config eos <|endoftext|>) that always emits the tokenizer's end of turn <|im_end|>: the server
  // stops at it as vLLM stops at the generation config's eos ids, except for a request with ignore_eos.
  const model = process.env.ZIPAGE_SERVE_EOT_MODEL;
  assert.ok(model, 'ZIPAGE_SERVE_EOT_MODEL is not set');
  const server = await startServer(['--model', model]);
  servers.push(server);
  const complete = (extra) => post(server.base, '/v1/completions',
                                   { prompt: 'Hello', max_tokens: 5, temperature: 0, ...extra });
  const stops = await complete({});
  assert.equal(stops.status, 200, stops.text);
  assert.equal(stops.json.usage.completion_tokens, 1);
  assert.equal(stops.json.choices[0].finish_reason, 'stop');
  const past = await complete({ ignore_eos: true });
  assert.equal(past.status, 200, past.text);
  assert.equal(past.json.usage.completion_tokens, 5);
  assert.equal(past.json.choices[0].finish_reason, 'length');
  // A stop id the request names still stops it under ignore_eos.
  const named = await complete({ ignore_eos: true, stop_token_ids: [151645] });
  assert.equal(named.json.usage.completion_tokens, 1);
  // vLLM's stop_reason: null for the model's own EOS (vLLM's eos_token_id is the tokenizer's, <|im_end|> here,
  // although it is not the config's), null for length; the id when the request names it under ignore_eos.
  assert.ok('stop_reason' in stops.json.choices[0], stops.text);
  assert.equal(stops.json.choices[0].stop_reason, null);
  assert.equal(past.json.choices[0].stop_reason, null);
  assert.equal(named.json.choices[0].stop_reason, 151645);
});

await run('serve_http_stop_token_text', async (servers) => {
  // A choice that ends on one of its stop_token_ids leaves that token's text out (vLLM's default; it was kept),
  // streamed or not; include_stop_str_in_output keeps it (it was a 400). The token itself is still counted and,
  // with logprobs, listed.
  const server = await startServer([]);
  servers.push(server);
  const base = server.base;
  const little = await post(base, '/tokenize', { prompt: 'little', add_special_tokens: false });
  assert.equal(little.json.count, 1, little.text);
  const complete = (extra) => post(base, '/v1/completions',
                                   { prompt: 'Once upon a time', max_tokens: 12, temperature: 0, ...extra });
  const whole = await complete({});
  const at = whole.json.choices[0].text.indexOf(' little');
  assert.ok(at > 0, whole.text);
  for (const include of [false, true]) {
    const extra = { stop_token_ids: little.json.tokens, include_stop_str_in_output: include };
    const want = whole.json.choices[0].text.slice(0, include ? at + ' little'.length : at);
    const plain = await complete({ ...extra, logprobs: 0 });
    assert.equal(plain.status, 200, plain.text);
    assert.equal(plain.json.choices[0].text, want);
    assert.equal(plain.json.choices[0].finish_reason, 'stop');
    assert.equal(plain.json.choices[0].logprobs.tokens.at(-1), ' little');
    assert.equal(plain.json.usage.completion_tokens, plain.json.choices[0].logprobs.tokens.length);
    const res = await fetch(`${base}/v1/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ prompt: 'Once upon a time', max_tokens: 12, temperature: 0, stream: true, ...extra }) });
    let streamed = '';
    for (const line of (await res.text()).split('\n')) {
      if (!line.startsWith('data: {')) continue;
      for (const c of JSON.parse(line.slice(6)).choices) streamed += c.text;
    }
    assert.equal(streamed, want);
  }
  // A stop string stays in the text with include_stop_str_in_output (vLLM's), what follows it cut.
  const kept = await complete({ stop: ['ittle'], include_stop_str_in_output: true });
  assert.equal(kept.json.choices[0].text, whole.json.choices[0].text.slice(0, at + ' little'.length));
});

// The parsed data chunks of a streamed request.
async function streamChunks(base, route, body) {
  const res = await fetch(`${base}${route}`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ ...body, stream: true }) });
  assert.equal(res.status, 200);
  const chunks = [];
  for (const line of (await res.text()).split('\n'))
    if (line.startsWith('data: {')) chunks.push(JSON.parse(line.slice(6)));
  return chunks;
}

await run('serve_http_stop_reason', async (servers) => {
  // vLLM's stop_reason on every choice, completions and chat: the stop string or the stop token id that ended it,
  // null for length (and for the model's EOS: serve_http_ignore_eos). The field was missing. Streamed, as vLLM
  // writes its chunks: completions (every field written) have it null in every chunk but the one with the
  // finish_reason; chat (exclude_unset) has no stop_reason key before that chunk (it had a null one), and that
  // chunk carries the last delta.
  const server = await startServer(['--chat-template', 'plain']);
  servers.push(server);
  const base = server.base;
  const little = await post(base, '/tokenize', { prompt: 'little', add_special_tokens: false });
  assert.equal(little.json.count, 1, little.text);
  const cases = [
    { extra: { max_tokens: 5 }, finish: 'length', want: null },
    { extra: { max_tokens: 100, stop: ['no such text', 'Lily'] }, finish: 'stop', want: 'Lily' },
    { extra: { max_tokens: 12, stop_token_ids: little.json.tokens }, finish: 'stop', want: little.json.tokens[0] },
  ];
  const requests = [
    ['/v1/completions', { prompt: 'Once upon a time' }],
    ['/v1/chat/completions', { messages: [{ role: 'user', content: 'Once upon a time' }] }],
  ];
  for (const { extra, finish, want } of cases) {
    for (const [route, input] of requests) {
      const body = { ...input, temperature: 0, ...extra };
      const what = `${route} ${JSON.stringify(extra)}`;
      const r = await post(base, route, body);
      assert.equal(r.status, 200, r.text);
      const choice = r.json.choices[0];
      assert.equal(choice.finish_reason, finish, what);
      assert.ok('stop_reason' in choice, `${what}: ${r.text}`);
      assert.equal(choice.stop_reason, want, what);
      // vLLM's field order: ..., finish_reason, stop_reason.
      const keys = Object.keys(choice);
      assert.equal(keys.indexOf('stop_reason'), keys.indexOf('finish_reason') + 1, what);
      const chunks = await streamChunks(base, route, body);
      const choices = chunks.flatMap((c) => c.choices);
      const last = choices.filter((c) => c.finish_reason !== null);
      assert.equal(last.length, 1, what);
      assert.equal(last[0].finish_reason, finish, what);
      assert.ok('stop_reason' in last[0], `${what}: ${JSON.stringify(chunks)}`);
      assert.equal(last[0].stop_reason, want, what);
      // (A completion may come whole in its last chunk; a chat always has its role chunk before it.)
      const earlier = choices.filter((c) => c.finish_reason === null);
      const seen = `${what}: ${JSON.stringify(chunks)}`;
      if (route === '/v1/completions') {
        assert.ok(earlier.every((c) => 'stop_reason' in c && c.stop_reason === null), seen);
      } else {
        assert.ok(earlier.length > 0, seen);
        assert.ok(earlier.every((c) => !('stop_reason' in c)), seen);
        // The last token's text comes with finish_reason, as vLLM sends it (not in a chunk of its own followed by
        // an empty delta), and the streamed text is the whole answer's.
        if (finish === 'length') assert.ok(last[0].delta.content?.length > 0, seen);
        const streamed = choices.map((c) => c.delta.content ?? '').join('');
        assert.equal(streamed, choice.message.content, seen);
      }
    }
  }
});

await run('serve_http_nan_logprobs', async (servers) => {
  // A checkpoint whose every logits row is NaN (its final norm's weights are NaN): each sampled token's
  // log-probability is NaN. Such entries were dropped, so the logprobs lists were shorter than the tokens; every
  // token now has its entry, the NaN written as -9999 (as vLLM clamps logprobs), so the JSON stays valid.
  const model = process.env.ZIPAGE_SERVE_CHAT_MODEL;
  assert.ok(model, 'ZIPAGE_SERVE_CHAT_MODEL is not set');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'zipage-nan-logits-'));
  try {
    for (const f of fs.readdirSync(model)) fs.copyFileSync(path.join(model, f), path.join(dir, f));
    // model.safetensors: an 8-byte header length, the JSON header, then the tensors' bytes.
    const file = path.join(dir, 'model.safetensors');
    const bytes = fs.readFileSync(file);
    const n = Number(bytes.readBigUInt64LE(0));
    const norm = JSON.parse(bytes.subarray(8, 8 + n).toString())['model.norm.weight'];
    assert.equal(norm.dtype, 'BF16');
    for (let at = 8 + n + norm.data_offsets[0]; at < 8 + n + norm.data_offsets[1]; at += 2)
      bytes.writeUInt16LE(0x7fc0, at);  // a BF16 NaN
    fs.writeFileSync(file, bytes);
    const server = await startServer(['--model', dir]);
    servers.push(server);
    const tokens = 4;
    const sampling = { max_tokens: tokens, temperature: 0, ignore_eos: true };
    const all9999 = (values) => values.length > 0 && values.every((v) => v === -9999);

    const c = await post(server.base, '/v1/completions', { prompt: 'hi', logprobs: 2, ...sampling });
    assert.equal(c.status, 200, c.text);
    assert.equal(c.json.usage.completion_tokens, tokens);
    const lp = c.json.choices[0].logprobs;
    for (const key of ['tokens', 'token_logprobs', 'top_logprobs', 'text_offset'])
      assert.equal(lp[key].length, tokens, `${key}: ${c.text}`);
    assert.ok(all9999(lp.token_logprobs), c.text);
    assert.ok(lp.top_logprobs.every((top) => all9999(Object.values(top))), c.text);

    const messages = [{ role: 'user', content: 'hi' }];
    const chat = await post(server.base, '/v1/chat/completions',
                            { messages, logprobs: true, top_logprobs: 2, ...sampling });
    assert.equal(chat.status, 200, chat.text);
    const content = chat.json.choices[0].logprobs.content;
    assert.equal(content.length, tokens, chat.text);
    assert.ok(all9999(content.map((e) => e.logprob)), chat.text);
    assert.ok(content.every((e) => e.top_logprobs.length === 2 && all9999(e.top_logprobs.map((t) => t.logprob))));

    const chunks = await streamChunks(server.base, '/v1/completions', { prompt: 'hi', logprobs: 0, ...sampling });
    const streamed = chunks.flatMap((ch) => ch.choices).flatMap((ch) => ch.logprobs?.token_logprobs ?? []);
    assert.equal(streamed.length, tokens, JSON.stringify(chunks));
    assert.ok(all9999(streamed));
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

await run('serve_http_generation_config', async (servers) => {
  // A generation_config.json as vLLM users write it: top_k -1 is vLLM's "off" (it was refused at start), and
  // max_new_tokens is the length of a chat that sets no max_tokens (vLLM's default max_tokens; it was ignored:
  // the chat ran to the context). A completion keeps OpenAI's 16, as in vLLM; -n overrides both.
  const model = process.env.ZIPAGE_SERVE_CHAT_MODEL;
  assert.ok(model, 'ZIPAGE_SERVE_CHAT_MODEL is not set');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'zipage-generation-config-'));
  try {
    fs.writeFileSync(path.join(dir, 'generation_config.json'), JSON.stringify({ top_k: -1, max_new_tokens: 3 }));
    const server = await startServer(['--model', model, '--generation-config', dir]);
    servers.push(server);
    assert.match(server.log(), /top-k 0 \(checkpoint: -1 = off\)/);
    assert.match(server.log(), /; default max-tokens: chat 3 \(checkpoint max_new_tokens\), completion 16 \(default\)/);
    const messages = [{ role: 'user', content: 'hi' }];
    const tokens = async (route, body) => {
      const r = await post(server.base, route, { ignore_eos: true, ...body });
      assert.equal(r.status, 200, r.text);
      return r.json.usage.completion_tokens;
    };
    assert.equal(await tokens('/v1/chat/completions', { messages }), 3);
    assert.equal(await tokens('/v1/chat/completions', { messages, max_tokens: 5, top_k: -1 }), 5);
    assert.equal(await tokens('/v1/chat/completions', { messages, max_completion_tokens: 2, top_k: 0 }), 2);
    assert.equal(await tokens('/v1/completions', { prompt: 'hi' }), 16);
    const below = await post(server.base, '/v1/chat/completions', { messages, top_k: -2 });
    assert.equal(below.status, 400, below.text);
    assert.equal(below.json.error.param, 'top_k');
    const flagged = await startServer(['--model', model, '--generation-config', dir, '-n', '4']);
    servers.push(flagged);
    assert.match(flagged.log(), /; default max-tokens 4 \(flag\)/);
    const chat = await post(flagged.base, '/v1/chat/completions', { messages, ignore_eos: true });
    assert.equal(chat.json.usage.completion_tokens, 4, chat.text);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

await run('serve_http_logits_processors', async (servers) => {
  // vLLM's logit_bias, allowed_token_ids, bad_words and min_tokens change what is sampled (they were a 400 "not
  // supported"); bad values are a 400 naming the field. stories260K's greedy text from 'Once upon a time' is
  // ", there was a little girl named Lily. She loved to play outside in the park. ..."
  const server = await startServer(['--chat-template', 'plain']);
  servers.push(server);
  const base = server.base;
  const ids = async (text) => (await post(base, '/tokenize', { prompt: text, add_special_tokens: false })).json.tokens;
  const [there] = await ids('there');
  const complete = async (extra) => {
    const body = { prompt: 'Once upon a time', temperature: 0, max_tokens: 12, ...extra };
    const r = await post(base, '/v1/completions', body);
    assert.equal(r.status, 200, `${JSON.stringify(extra)}: ${r.text}`);
    return r.json;
  };
  const plain = await complete({});
  assert.match(plain.choices[0].text, /^, there was a little girl named Lily/);

  // logit_bias: OpenAI's {"token id": bias}, added before greedy's argmax; a bias past 100 is clamped, as vLLM.
  const banned = await complete({ logit_bias: { [there]: -100 } });
  assert.doesNotMatch(banned.choices[0].text, /^, there/);
  for (const bias of [100, 1000]) {
    const forced = await complete({ logit_bias: { [String(there)]: bias }, max_tokens: 3 });
    assert.equal(forced.choices[0].text, ' there there there', JSON.stringify(forced));
  }
  const messages = [{ role: 'user', content: 'Once upon a time' }];
  const chat = await post(base, '/v1/chat/completions',
                          { messages, temperature: 0, max_tokens: 2, logit_bias: { [there]: 100 } });
  assert.equal(chat.status, 200, chat.text);
  assert.equal(chat.json.choices[0].message.content, ' there there', chat.text);
  // The reported log-probabilities stay the model's: the forced token is far from certain under it.
  const lp = await complete({ logit_bias: { [there]: 100 }, max_tokens: 2, logprobs: 1 });
  assert.ok(lp.choices[0].logprobs.token_logprobs[0] < -1, JSON.stringify(lp.choices[0].logprobs));

  // allowed_token_ids: every sampled token is one of them (sampled, not only greedy).
  const allowed = await ids('there was a little');
  const words = new Set(['there', 'was', 'a', 'little']);
  for (const seed of [1, 2, 3]) {
    const r = await complete({ allowed_token_ids: allowed, temperature: 1, seed, ignore_eos: true, max_tokens: 10 });
    assert.equal(r.usage.completion_tokens, 10);
    assert.ok(r.choices[0].text.trim().split(/\s+/).every((w) => words.has(w)), r.choices[0].text);
  }

  // min_tokens: EOS (stories260K's is id 2) and stop_token_ids cannot be sampled before it, even when a bias
  // makes them the greedy token; stop strings are not looked for before it either. Streamed too.
  const eos = await complete({ logit_bias: { 2: 100 } });
  assert.equal(eos.usage.completion_tokens, 1, JSON.stringify(eos));
  const late = await complete({ logit_bias: { 2: 100 }, min_tokens: 4 });
  assert.equal(late.usage.completion_tokens, 5, JSON.stringify(late));
  assert.equal(late.choices[0].finish_reason, 'stop');
  assert.equal(late.choices[0].stop_reason, null);
  const stopToken = await complete({ logit_bias: { [there]: 100 }, stop_token_ids: [there], min_tokens: 3 });
  assert.equal(stopToken.usage.completion_tokens, 4, JSON.stringify(stopToken));
  assert.equal(stopToken.choices[0].stop_reason, there);
  const stopString = await complete({ stop: ['Lily'], max_tokens: 30 });
  assert.equal(stopString.choices[0].text, ', there was a little girl named ');
  const pastMin = await complete({ stop: ['Lily'], max_tokens: 30, min_tokens: 12 });
  assert.match(pastMin.choices[0].text, /^, there was a little girl named Lily\./);
  const chunks = await streamChunks(base, '/v1/completions', { prompt: 'Once upon a time', temperature: 0,
                                                                max_tokens: 12, logit_bias: { 2: 100 }, min_tokens: 4,
                                                                stream_options: { include_usage: true } });
  const usage = chunks.find((c) => c.usage)?.usage;
  const finish = chunks.flatMap((c) => c.choices).filter((c) => c.finish_reason !== null);
  assert.equal(finish.length, 1, JSON.stringify(chunks));
  assert.equal(finish[0].finish_reason, 'stop');
  assert.equal(usage?.completion_tokens, 5, JSON.stringify(chunks));

  // bad_words: a one-token word is never sampled; a longer one ("girl": three tokens) not after its others.
  const noThere = await complete({ bad_words: ['there'], max_tokens: 20 });
  assert.ok(!/\bthere\b/.test(noThere.choices[0].text), noThere.choices[0].text);
  assert.equal((await ids('girl')).length, 3);
  const noGirl = await complete({ bad_words: [' girl'] });
  assert.match(noGirl.choices[0].text, /^, there was a little /);
  assert.doesNotMatch(noGirl.choices[0].text, /^, there was a little girl/);

  // Bad values: a 400 naming the field (ids outside the 512-token vocabulary too, as vLLM).
  const bad = [
    [{ logit_bias: [1] }, 'logit_bias'],
    [{ logit_bias: { x: 1 } }, 'logit_bias'],
    [{ logit_bias: { '1.5': 1 } }, 'logit_bias'],
    [{ logit_bias: { 5: 'high' } }, 'logit_bias'],
    [{ logit_bias: { 512: 1 } }, 'logit_bias'],
    [{ logit_bias: { '-1': 1 } }, 'logit_bias'],
    [{ allowed_token_ids: [] }, 'allowed_token_ids'],
    [{ allowed_token_ids: [5, 512] }, 'allowed_token_ids'],
    [{ allowed_token_ids: [-1] }, 'allowed_token_ids'],
    [{ allowed_token_ids: 5 }, 'allowed_token_ids'],
    [{ bad_words: 'there' }, 'bad_words'],
    [{ bad_words: [''] }, 'bad_words'],
    [{ bad_words: ['  '] }, 'bad_words'],
    [{ bad_words: [5] }, 'bad_words'],
    [{ min_tokens: -1 }, 'min_tokens'],
    [{ min_tokens: 1.5 }, 'min_tokens'],
    [{ min_tokens: 13 }, 'min_tokens'],  // above max_tokens (12)
    [{ min_tokens: 17, max_tokens: undefined }, 'min_tokens'],  // above the default max_tokens (16)
  ];
  for (const [extra, param] of bad) {
    const r = await post(base, '/v1/completions', { prompt: 'Once upon a time', max_tokens: 12, ...extra });
    assert.equal(r.status, 400, `${JSON.stringify(extra)}: ${r.text}`);
    assert.equal(r.json.error.param, param, `${JSON.stringify(extra)}: ${r.text}`);
  }
  const neutral = await complete({ logit_bias: {}, bad_words: [], min_tokens: 0, allowed_token_ids: null });
  assert.equal(neutral.choices[0].text, plain.choices[0].text);
});

await run('serve_http_min_tokens_end_of_turn', async (servers) => {
  // A base Qwen3 that always emits the tokenizer's end of turn <|im_end|> (not its config's eos): min_tokens
  // masks it as vLLM masks the generation config's eos ids, so the choice has min_tokens tokens before it.
  const model = process.env.ZIPAGE_SERVE_EOT_MODEL;
  assert.ok(model, 'ZIPAGE_SERVE_EOT_MODEL is not set');
  const server = await startServer(['--model', model]);
  servers.push(server);
  const r = await post(server.base, '/v1/completions',
                       { prompt: 'Hello', max_tokens: 8, temperature: 0, min_tokens: 3 });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.usage.completion_tokens, 4, r.text);
  assert.equal(r.json.choices[0].finish_reason, 'stop');
});
