// zipage-serve's structured outputs: guided_choice, guided_regex, guided_json and guided_grammar (and vLLM's newer
// spelling, structured_outputs {choice} / {regex} / {json} / {json_object} / {grammar} / {structural_tag}, and
// OpenAI's response_format json_schema / json_object / structural_tag) on /v1/completions (stories260K) and
// /v1/chat/completions (the random Qwen3 checkpoint, Qwen3's chat template, with and without a reasoning parser;
// with one and thinking on, the guide starts after </think>):
// every choice's text is one of the choices / matches the regex as a whole / parses as JSON that the schema
// describes / has a structure wherever a trigger occurs, and ends with finish_reason "stop". The 400s for what is
// not served are in bad_input.test.mjs.
import assert from 'node:assert/strict';
import { deadline, post, run, startServer } from './common.mjs';

deadline(240);

const CHOICES = ['happy', 'sad', 'a big red ball', 'Lily'];
const REGEXES = [['(cat|dog)s? [0-9]{1,3}', /^(cat|dog)s? [0-9]{1,3}$/],
                 ['[a-z]{2,6}( [a-z]{2,6}){0,2}\\.', /^[a-z]{2,6}( [a-z]{2,6}){0,2}\.$/],
                 ['"[^"]{1,12}"', /^"[^"]{1,12}"$/]];

function streamed(text) {
  let out = '';
  let finish = null;
  for (const line of text.split('\n')) {
    if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
    const c = JSON.parse(line.slice(6)).choices[0];
    if (!c) continue;
    out += c.text ?? c.delta?.content ?? '';
    if (c.finish_reason) finish = c.finish_reason;
  }
  return { out, finish };
}

await run('serve_guided', async (servers) => {
  const server = await startServer([]);
  servers.push(server);
  const complete = async (body) => {
    const r = await post(server.base, '/v1/completions', { prompt: 'Once upon a time', max_tokens: 48, ...body });
    assert.equal(r.status, 200, r.text);
    return r.json.choices;
  };
  const seen = new Set();
  for (const temperature of [0, 0.8, 1.5]) {
    for (const seed of [1, 2]) {
      for (const spelling of [{ guided_choice: CHOICES }, { structured_outputs: { choice: CHOICES } }]) {
        const choices = await complete({ temperature, seed, n: 2, ...spelling });
        for (const c of choices) {
          assert.ok(CHOICES.includes(c.text), `${JSON.stringify(c.text)} is not a choice`);
          assert.equal(c.finish_reason, 'stop', JSON.stringify(c));
          seen.add(c.text);
        }
      }
      for (const [re, check] of REGEXES) {
        for (const spelling of [{ guided_regex: re }, { structured_outputs: { regex: re } }]) {
          const [c] = await complete({ temperature, seed, ...spelling });
          assert.ok(check.test(c.text), `${JSON.stringify(c.text)} does not match ${re}`);
          assert.equal(c.finish_reason, 'stop', JSON.stringify(c));
          seen.add(c.text);
        }
      }
    }
  }
  assert.ok(seen.size > 4, [...seen].join(' | '));
  // GBNF grammars (guided_grammar, structured_outputs.grammar): every output is a sentence the grammar derives.
  const GRAMMAR = 'root ::= "The " animal " was " mood ("." | " and " mood ".")\n' +
                  'animal ::= "cat" | "dog" | "little " animal\nmood ::= [a-z]{3,8}';
  const sentence = /^The (little ){0,5}(cat|dog) was [a-z]{3,8}(\.| and [a-z]{3,8}\.)$/;
  for (const temperature of [0, 1.0]) {
    for (const spelling of [{ guided_grammar: GRAMMAR }, { structured_outputs: { grammar: GRAMMAR } }]) {
      const [c] = await complete({ temperature, seed: 3, ...spelling });
      assert.ok(sentence.test(c.text), `${JSON.stringify(c.text)} is not a sentence of the grammar`);
      assert.equal(c.finish_reason, 'stop', JSON.stringify(c));
    }
  }
  // JSON schemas, in each spelling: every output parses and has what the schema says (a bounded schema, so that
  // every output ends within max_tokens).
  const schema = { type: 'object', properties: { name: { type: 'string', minLength: 1, maxLength: 8 },
                                                 mood: { enum: ['happy', 'sad'] },
                                                 pets: { type: 'array', items: { type: 'boolean' }, maxItems: 2 } },
                   required: ['name', 'mood'] };
  const jsonSpellings = [{ guided_json: schema }, { guided_json: JSON.stringify(schema) },
                         { structured_outputs: { json: schema, whitespace_pattern: '' } },
                         { response_format: { type: 'json_schema',
                                              json_schema: { name: 'x', schema, strict: true } } }];
  const jsonSeen = new Set();
  for (const [i, spelling] of jsonSpellings.entries()) {
    for (const temperature of [0, 1.2]) {
      const [c] = await complete({ temperature, seed: i, max_tokens: 96, ...spelling });
      assert.equal(c.finish_reason, 'stop', JSON.stringify(c));
      const v = JSON.parse(c.text);
      assert.deepEqual(Object.keys(v).filter((k) => k !== 'pets'), ['name', 'mood'], c.text);  // in declared order
      if (spelling.structured_outputs) assert.ok(c.text.startsWith('{"name":"'), c.text);  // no whitespace at all
      assert.ok(typeof v.name === 'string' && v.name.length >= 1 && [...v.name].length <= 8, c.text);
      assert.ok(['happy', 'sad'].includes(v.mood), c.text);
      if ('pets' in v) assert.ok(v.pets.length <= 2 && v.pets.every((p) => typeof p === 'boolean'), c.text);
      jsonSeen.add(c.text);
    }
  }
  assert.ok(jsonSeen.size > 1, [...jsonSeen].join(' | '));
  // Recursion (a pushdown guide since 2026-12-07): a grammar whose rule nests, and a recursive $ref (a list of any
  // length); every finished output is a sentence, every cut one a prefix of one.
  const NESTED = 'root ::= "The " thing " was happy."\nthing ::= "cat" | "dog" | "(" thing " and " thing ")"';
  const nestedPrefix = /^The [(catdogn )]*/;
  for (const seed of [0, 1, 2]) {
    const [c] = await complete({ temperature: 1, seed, max_tokens: 48, guided_grammar: NESTED });
    if (c.finish_reason === 'stop') {
      assert.ok(/^The [(catdogn )]+ was happy\.$/.test(c.text), JSON.stringify(c.text));
      let depth = 0;
      for (const ch of c.text) depth += ch === '(' ? 1 : ch === ')' ? -1 : 0;
      assert.equal(depth, 0, c.text);
    } else {
      assert.ok(nestedPrefix.test(c.text), JSON.stringify(c));
    }
  }
  const list = { $defs: { node: { type: 'object', properties: { v: { type: 'integer' },
                                                                next: { anyOf: [{ $ref: '#/$defs/node' },
                                                                                { type: 'null' }] } },
                                  required: ['v', 'next'] } }, $ref: '#/$defs/node' };
  for (const seed of [0, 1]) {
    const [c] = await complete({ temperature: 1, seed, max_tokens: 96, guided_json: list });
    if (c.finish_reason !== 'stop') continue;  // a long list: cut by max_tokens
    for (let v = JSON.parse(c.text); v !== null; v = v.next) assert.ok(Number.isInteger(v.v), c.text);
  }
  // json_object: any JSON object (stories260K answers {} in a few tokens).
  for (const spelling of [{ response_format: { type: 'json_object' } },
                          { structured_outputs: { json_object: true } }]) {
    for (const seed of [0, 1]) {
      const [c] = await complete({ temperature: 1, seed, max_tokens: 64, ...spelling });
      assert.equal(c.finish_reason, 'stop', JSON.stringify(c));
      const v = JSON.parse(c.text);
      assert.ok(typeof v === 'object' && v !== null && !Array.isArray(v), c.text);
    }
  }
  // Structural tags, the legacy form (vLLM's structured_outputs.structural_tag as JSON text or as an object, and
  // response_format): free text, but wherever " was" occurs (stories260K writes it often), ` was "happy"!` or
  // ` was "sad"!` follows; an output ends (EOS) only outside a structure, or max_tokens cuts it.
  const legacy = { triggers: [' was'], structures: [{ begin: ' was ', schema: { enum: ['happy', 'sad'] }, end: '!' }] };
  const legacySpellings = [{ structured_outputs: { structural_tag: JSON.stringify(legacy) } },
                           { structured_outputs: { structural_tag: legacy } },
                           { response_format: { type: 'structural_tag', ...legacy } }];
  let structures = 0;
  for (const [i, spelling] of legacySpellings.entries()) {
    for (const temperature of [0, 1.0]) {
      const [c] = await complete({ temperature, seed: i, max_tokens: 40, ...spelling });
      assert.ok(['stop', 'length'].includes(c.finish_reason), JSON.stringify(c));
      for (let at = c.text.indexOf(' was'); at >= 0; at = c.text.indexOf(' was', at + 1)) {
        const rest = c.text.slice(at);
        const whole = rest.startsWith(' was "happy"!') || rest.startsWith(' was "sad"!');
        assert.ok(whole || (c.finish_reason === 'length' && rest.length < 13), `${JSON.stringify(c.text)}: ${rest}`);
        if (whole) structures += 1;
      }
    }
  }
  assert.ok(structures > 2, `only ${structures} structures`);
  // The format form (xgrammar's structural tag): exactly one tag between two fixed strings.
  const format = { type: 'sequence', elements: [
    { type: 'const_string', value: 'The ' },
    { type: 'triggered_tags', triggers: ['<'], at_least_one: true, stop_after_first: true, tags: [
      { type: 'tag', begin: '<mood>', content: { type: 'json_schema', json_schema: { enum: ['happy', 'sad'] } },
        end: '</mood>' },
      { type: 'tag', begin: '<name>', end: '</name>',
        content: { type: 'json_schema', json_schema: { type: 'string', minLength: 1, maxLength: 6 } } }] },
    { type: 'const_string', value: '.' }] };
  const oneTag = (text) => {
    const m = /^The <(mood|name)>(.*)<\/\1>\.$/s.exec(text);
    assert.ok(m, `${JSON.stringify(text)} is not one tag`);
    const v = JSON.parse(m[2]);
    if (m[1] === 'mood') assert.ok(['happy', 'sad'].includes(v), text);
    else assert.ok(typeof v === 'string' && [...v].length >= 1 && [...v].length <= 6, text);
  };
  const formatSpellings = [
    { structured_outputs: { structural_tag: JSON.stringify({ type: 'structural_tag', format }) } },
    { response_format: { type: 'structural_tag', format } }];
  for (const [i, spelling] of formatSpellings.entries()) {
    for (const temperature of [0, 1.5]) {
      const [c] = await complete({ temperature, seed: i, max_tokens: 64, ...spelling });
      assert.equal(c.finish_reason, 'stop', JSON.stringify(c));
      oneTag(c.text);
    }
  }
  // Streamed: the pieces add up to a whole choice.
  const s = await post(server.base, '/v1/completions',
                       { prompt: 'Once upon a time', max_tokens: 48, temperature: 1, seed: 3, stream: true,
                         guided_choice: CHOICES });
  assert.equal(s.status, 200, s.text);
  const { out, finish } = streamed(s.text);
  assert.ok(CHOICES.includes(out), out);
  assert.equal(finish, 'stop');
  // A guided request beside unguided ones leaves theirs as they were.
  const plain = { prompt: 'Once upon a time', max_tokens: 12, temperature: 0 };
  const [alone] = await complete(plain);
  const [mixed, guided] = await Promise.all([complete(plain), complete({ ...plain, guided_choice: ['yes', 'no'] })]);
  assert.equal(mixed[0].text, alone.text);
  assert.ok(['yes', 'no'].includes(guided[0].text), guided[0].text);
});

await run('serve_guided_chat', async (servers) => {
  const model = process.env.ZIPAGE_SERVE_CHAT_MODEL;
  assert.ok(model, 'ZIPAGE_SERVE_CHAT_MODEL is not set');
  const plain = await startServer(['--model', model]);
  servers.push(plain);
  const parsed = await startServer(['--model', model, '--reasoning-parser', 'qwen3']);
  servers.push(parsed);
  const messages = [{ role: 'user', content: 'Is the sky blue?' }];
  // The parsed server's requests turn thinking off: the prompt closes the <think> block, so the guide starts at the
  // first token there too (with thinking on it starts after </think>: serve_guided_reasoning below).
  const off = { chat_template_kwargs: { enable_thinking: false } };
  for (const server of [plain, parsed]) {
    const extra = server === parsed ? off : {};
    for (const seed of [0, 1, 2]) {
      const r = await post(server.base, '/v1/chat/completions',
                           { messages, max_tokens: 24, temperature: 1, seed, guided_choice: ['yes', 'no', 'maybe'],
                             ...extra });
      assert.equal(r.status, 200, r.text);
      const m = r.json.choices[0].message;
      assert.ok(['yes', 'no', 'maybe'].includes(m.content), r.text);
      assert.ok(!m.reasoning_content, r.text);  // the guided output is the content, never reasoning
      assert.equal(r.json.choices[0].finish_reason, 'stop', r.text);
      const g = await post(server.base, '/v1/chat/completions', { messages, max_tokens: 24, temperature: 1, seed,
                                                                  structured_outputs: { regex: '[0-9]{2}' }, ...extra });
      assert.equal(g.status, 200, g.text);
      assert.match(g.json.choices[0].message.content, /^[0-9]{2}$/, g.text);
    }
    // A structural tag as the response_format: the content is the whole tag, never reasoning.
    const t = await post(server.base, '/v1/chat/completions', {
      messages, max_tokens: 40, temperature: 1, seed: 0, ...extra,
      response_format: { type: 'structural_tag', format: { type: 'tag', begin: '<answer>', end: '</answer>',
                                                           content: { type: 'regex', pattern: '(yes|no)' } } } });
    assert.equal(t.status, 200, t.text);
    assert.match(t.json.choices[0].message.content, /^<answer>(yes|no)<\/answer>$/, t.text);
    assert.ok(!t.json.choices[0].message.reasoning_content, t.text);
    assert.equal(t.json.choices[0].finish_reason, 'stop', t.text);
  }
});

// With --reasoning-parser and thinking on, a guided answer may think first (vLLM: structured output constrains the
// content): the first token may be <think> besides the guide's, the block is free, the guide reads what follows
// </think>. The random model is steered with logit_bias: <think> (151667) first, then </think> (151668) at once
// (inside the block every token may come); after it the bias is void (the guide allows no </think>).
await run('serve_guided_reasoning', async (servers) => {
  const model = process.env.ZIPAGE_SERVE_CHAT_MODEL;
  const parsed = await startServer(['--model', model, '--reasoning-parser', 'qwen3']);
  servers.push(parsed);
  const messages = [{ role: 'user', content: 'Is the sky blue?' }];
  const bias = { 151667: 50, 151668: 100 };
  for (const seed of [0, 1]) {
    const r = await post(parsed.base, '/v1/chat/completions', { messages, max_tokens: 24, temperature: 1, seed,
                                                                 logit_bias: bias, guided_choice: ['yes', 'no'] });
    assert.equal(r.status, 200, r.text);
    const m = r.json.choices[0].message;
    assert.equal(m.reasoning_content, '', r.text);  // <think></think>: opened and closed, then the guided content
    assert.ok(['yes', 'no'].includes(m.content), r.text);
    assert.equal(r.json.choices[0].finish_reason, 'stop', r.text);
    // Streamed: the same split.
    const s = await post(parsed.base, '/v1/chat/completions', { messages, max_tokens: 24, temperature: 1, seed,
                                                                 logit_bias: bias, stream: true,
                                                                 structured_outputs: { regex: '[0-9]{2}' } });
    assert.equal(s.status, 200, s.text);
    let content = '';
    for (const line of s.text.split('\n').filter((l) => l.startsWith('data: {'))) {
      const d = JSON.parse(line.slice(6)).choices[0]?.delta ?? {};
      content += d.content ?? '';
    }
    assert.match(content, /^[0-9]{2}$/, s.text);
  }
  // Without the bias toward </think> the block stays open to max_tokens: all reasoning, no content, cut by length;
  // the guide never saw a token.
  const open = await post(parsed.base, '/v1/chat/completions', { messages, max_tokens: 8, temperature: 1, seed: 0,
                                                                  logit_bias: { 151667: 100 },
                                                                  guided_choice: ['yes', 'no'] });
  assert.equal(open.status, 200, open.text);
  assert.equal(open.json.choices[0].finish_reason, 'length', open.text);
  assert.equal(open.json.choices[0].message.content, null, open.text);
  assert.ok(open.json.choices[0].message.reasoning_content.length > 0, open.text);
});
