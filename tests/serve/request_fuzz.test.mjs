// zipage-serve on randomised requests: valid completions and chat bodies with a few fields replaced by values
// of random types and ranges (null, booleans, numbers out of range or not finite, strings, lists, objects) or
// removed, some streamed. Every answer must be a 200 with a well-formed body (n choices, a known finish reason,
// usage adding up; for a stream, data lines ending in [DONE]) or a 4xx with OpenAI's error object naming a
// parameter; never a 5xx or a dropped connection, and the server serves a plain request afterwards.
// ZIPAGE_SERVE_FUZZ_SEED and ZIPAGE_SERVE_FUZZ_REQUESTS (default 1 and 600) pick other or more requests.
import assert from 'node:assert/strict';
import { deadline, post, run, startServer } from './common.mjs';

deadline(240);
let state = Number(process.env.ZIPAGE_SERVE_FUZZ_SEED || 1);
const random = () => {
  state = (state * 1103515245 + 12345) % 2147483648;
  return state / 2147483648;
};
const pick = (list) => list[Math.floor(random() * list.length)];
const VALUES = [null, true, false, 0, -1, 1, 2, 2.5, -1e9, 1e30, 2147483648, 99999999, -0.5, '', 'x', '1', 'Once upon',
  '\u0000', '日本', [], [1, 2], ['a', 'b'], [''], [null], [[1, 2], [3]], [{}], {}, { a: 1 }, { include_usage: true }];
const FIELDS = ['model', 'prompt', 'messages', 'max_tokens', 'max_completion_tokens', 'temperature', 'top_p', 'top_k',
  'min_p', 'repetition_penalty', 'frequency_penalty', 'presence_penalty', 'logprobs', 'top_logprobs', 'seed', 'stop',
  'stop_token_ids', 'n', 'ignore_eos', 'stream', 'stream_options', 'priority', 'chat_template_kwargs', 'echo',
  'best_of', 'user', 'logit_bias', 'suffix', 'add_generation_prompt', 'continue_final_message', 'tool_choice',
  'skip_special_tokens', 'allowed_token_ids', 'bad_words', 'min_tokens'];
// ZIPAGE_SERVE_FUZZ_MODEL: another model to serve (e.g. a checkpoint with a chat template, so that chat requests
// reach the template); its served name is the directory's or file's name.
const MODEL_PATH = process.env.ZIPAGE_SERVE_FUZZ_MODEL || '';
const MODEL = MODEL_PATH ? MODEL_PATH.replace(/\/+$/, '').split('/').pop().replace(/\.gguf$/, '') : 'stories260K';
const FINISH = ['stop', 'length'];

function request(chat) {
  const b = { model: MODEL, max_tokens: 8 };
  if (chat) b.messages = [{ role: 'user', content: 'Once upon a time' }];
  if (chat && random() < 0.3) b.messages.push({ role: pick(['assistant', 'system', 'developer', 'tool']), content: pick(['The', '', '<think>x</think>y']) });
  else b.prompt = 'Once upon a time';
  for (let k = Math.floor(random() * 4); k > 0; --k) {
    const f = pick(FIELDS);
    if (random() < 0.15) delete b[f];
    else b[f] = pick(VALUES);
  }
  if (chat && random() < 0.3) b.messages = [{ role: pick(['user', 'system', 'assistant', 'tool', 1, null]), content: pick(VALUES) }];
  return b;
}

function checkBody(b, json, chat) {
  const n = Number.isInteger(b.n) ? b.n : 1;
  // A list of strings or of token-id lists is several prompts; a list of token ids is one.
  const many = !chat && Array.isArray(b.prompt) && b.prompt.length > 0 && typeof b.prompt[0] !== 'number';
  assert.equal(json.choices.length, n * (many ? b.prompt.length : 1), JSON.stringify(b));
  for (const c of json.choices) {
    assert.ok(FINISH.includes(c.finish_reason), JSON.stringify(c));
    assert.equal(typeof (chat ? c.message.content : c.text), 'string');
  }
  const u = json.usage;
  assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);
}

function checkStream(text) {
  const lines = text.split('\n').filter((l) => l.startsWith('data: '));
  assert.ok(lines.length >= 2, text.slice(0, 300));
  assert.equal(lines[lines.length - 1], 'data: [DONE]', text.slice(-300));
  for (const l of lines.slice(0, -1)) {
    const j = JSON.parse(l.slice(6));
    assert.ok(j.choices !== undefined || j.error !== undefined, l);
  }
}

await run('serve_request_fuzz', async (servers) => {
  const server = await startServer(MODEL_PATH ? ['--model', MODEL_PATH] : []);
  servers.push(server);
  const counts = {};
  for (let i = 0; i < Number(process.env.ZIPAGE_SERVE_FUZZ_REQUESTS || 600); ++i) {
    const chat = random() < 0.5;
    const b = request(chat);
    const r = await post(server.base, chat ? '/v1/chat/completions' : '/v1/completions', JSON.stringify(b));
    counts[r.status] = (counts[r.status] || 0) + 1;
    const what = `${r.status} for ${JSON.stringify(b)}: ${r.text.slice(0, 300)}`;
    assert.ok(r.status === 200 || (r.status >= 400 && r.status < 500), what);
    if (r.status !== 200) {
      assert.ok(r.json && r.json.error && typeof r.json.error.message === 'string' && r.json.error.message.length > 0, what);
      continue;
    }
    if (b.stream === true) checkStream(r.text);
    else checkBody(b, r.json, chat);
  }
  assert.ok((counts[200] || 0) > 0 && (counts[400] || 0) > 0, JSON.stringify(counts));
  const ok = await post(server.base, '/v1/completions', { model: MODEL, prompt: 'Once upon a time', max_tokens: 5 });
  assert.equal(ok.status, 200, ok.text);
  console.log(`statuses ${JSON.stringify(counts)}`);
});
