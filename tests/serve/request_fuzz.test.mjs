// zipage-serve on randomised requests: valid completions and chat bodies with a few fields replaced by values
// of random types and ranges (null, booleans, numbers out of range or not finite, strings, lists, objects) or
// removed, some streamed. Every answer must be a 200 with a well-formed body (n choices, a known finish reason,
// usage adding up; for a stream, data lines ending in [DONE]) or a 4xx with OpenAI's error object naming a
// parameter; never a 5xx or a dropped connection, and the server serves a plain request afterwards. About a third
// of the requests carry a structured-output field (guided_*, structured_outputs, response_format; served and refused
// forms): a served one that finished by itself satisfies its constraint.
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
  'skip_special_tokens', 'allowed_token_ids', 'bad_words', 'min_tokens', 'guided_json', 'guided_regex', 'guided_choice',
  'guided_grammar', 'structured_outputs', 'response_format'];
// Structured outputs: [field, value, check] with values the server serves and values it must refuse (check null).
// A served request whose text ended by itself (finish_reason "stop") and carried nothing else that shapes the text
// (STRUCTURE_NEUTRAL fields only) must satisfy check(text).
const json = (f) => (t) => { try { return f(JSON.parse(t)); } catch { return false; } };
const matches = (re) => (t) => re.test(t);
const STRUCTURED = [
  ['guided_regex', '[a-c]{1,3}', matches(/^[a-c]{1,3}$/)],
  ['guided_regex', '(ab|cd)+', matches(/^(ab|cd)+$/)],
  ['guided_regex', '\\d{2}', matches(/^[0-9]{2}$/)],
  ['guided_regex', '(', null], ['guided_regex', 'a{100000}', null], ['guided_regex', '(?=a)b', null],
  ['guided_choice', ['yes', 'no'], (t) => t === 'yes' || t === 'no'],
  ['guided_choice', ['日本', 'x'], (t) => t === '日本' || t === 'x'],
  ['guided_choice', [], null], ['guided_choice', ['a', 1], null],
  ['guided_json', { type: 'string', maxLength: 3 }, json((v) => typeof v === 'string' && [...v].length <= 3)],
  ['guided_json', '{"type": "integer", "minimum": 3, "maximum": 7}', json((v) => Number.isInteger(v) && v >= 3 && v <= 7)],
  ['guided_json', { type: 'object', properties: { a: { type: 'integer' } }, required: ['a'] },
    json((v) => v !== null && typeof v === 'object' && Number.isInteger(v.a))],
  ['guided_json', { type: 'array', items: { type: 'boolean' }, maxItems: 2 },
    json((v) => Array.isArray(v) && v.length <= 2 && v.every((x) => typeof x === 'boolean'))],
  ['guided_json', { enum: ['x', 1, null] }, json((v) => v === 'x' || v === 1 || v === null)],
  ['guided_json', { type: 'number', multipleOf: 0.5, minimum: 0, maximum: 2 },
    json((v) => typeof v === 'number' && Number.isInteger(v * 2) && v >= 0 && v <= 2)],
  ['guided_json', { $ref: '#/nope' }, null], ['guided_json', { type: 'object', additionalProperties: { type: 'string' } }, null],
  ['guided_json', '{"type": ', null], ['guided_json', { type: 'integer', minimum: 5, maximum: 1 }, null],
  ['guided_grammar', 'root ::= "a" | "b" root', matches(/^b*a$/)],
  ['guided_grammar', 'root ::= [0-9] [0-9]?', matches(/^[0-9]{1,2}$/)],
  ['guided_grammar', 'root ::= ', null], ['guided_grammar', 'x ::= "y"', null],
  ['structured_outputs', { regex: '[ab]+' }, matches(/^[ab]+$/)],
  ['structured_outputs', { choice: ['x', 'y'] }, (t) => t === 'x' || t === 'y'],
  ['structured_outputs', { json: { type: 'boolean' } }, json((v) => typeof v === 'boolean')],
  ['structured_outputs', { grammar: 'root ::= "z"' }, (t) => t === 'z'],
  ['structured_outputs', { structural_tag: { type: 'structural_tag', format: { type: 'const_string', value: 'hi' } } },
    (t) => t === 'hi'],
  ['structured_outputs', { structural_tag: '{"structures": [{"begin": "<a>", "schema": {"type": "integer"}, "end": "</a>"}], "triggers": ["<a>"]}' },
    (t) => { const m = t.match(/<a>(.*?)<\/a>/gs) || []; return m.every((x) => /^<a>\s*-?[0-9]+\s*<\/a>$/s.test(x)); }],
  ['structured_outputs', { regex: '[ab]+', choice: ['a'] }, null], ['structured_outputs', { regex: '(' }, null],
  ['structured_outputs', { json: { type: 'string', format: 'date' } }, json((v) => typeof v === 'string')],
  ['response_format', { type: 'json_object' }, json((v) => v !== null && typeof v === 'object' && !Array.isArray(v))],
  ['response_format', { type: 'json_schema', json_schema: { name: 'n', schema: { type: 'integer' } } }, json(Number.isInteger)],
  ['response_format', { type: 'structural_tag', format: { type: 'regex', pattern: '[xy]{2}' } }, matches(/^[xy]{2}$/)],
  ['response_format', { type: 'text' }, null], ['response_format', { type: 'json_schema' }, null],
  ['response_format', { type: 'foo' }, null],
];
const STRUCTURE_NEUTRAL = new Set(['model', 'prompt', 'messages', 'max_tokens', 'max_completion_tokens', 'temperature',
  'top_p', 'top_k', 'min_p', 'seed', 'n', 'repetition_penalty', 'frequency_penalty', 'presence_penalty', 'priority',
  'user', 'logprobs', 'top_logprobs', 'stream_options']);
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
  let check = null;
  if (random() < 0.35) {
    const [field, value, conforms] = pick(STRUCTURED);
    b[field] = value;
    if (b.max_tokens === 8) b.max_tokens = 32;  // room to finish a structure
    check = conforms && Object.keys(b).every((k) => k === field || STRUCTURE_NEUTRAL.has(k)) ? conforms : null;
  }
  return { b, check };
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
    const { b, check } = request(chat);
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
    if (check && b.stream !== true) {
      for (const c of r.json.choices) {
        if (c.finish_reason !== 'stop') continue;
        const text = chat ? c.message.content : c.text;
        assert.ok(check(text), `structured output broken: ${JSON.stringify(text)} for ${JSON.stringify(b)}`);
        counts.conforming = (counts.conforming || 0) + 1;
      }
    }
  }
  assert.ok((counts[200] || 0) > 0 && (counts[400] || 0) > 0, JSON.stringify(counts));
  const ok = await post(server.base, '/v1/completions', { model: MODEL, prompt: 'Once upon a time', max_tokens: 5 });
  assert.equal(ok.status, 200, ok.text);
  console.log(`statuses ${JSON.stringify(counts)}`);
});
