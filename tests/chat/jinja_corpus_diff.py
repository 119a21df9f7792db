#!/usr/bin/env python3
"""zipage's Jinja interpreter against Python's jinja2 (as transformers renders chat templates) on a set of
templates and random conversations: tools, tool calls, reasoning, content parts, None contents.

    jinja_corpus_diff.py JINJA_RENDER TEMPLATE... [--seed S] [--cases N] [--show K]

TEMPLATE is a .jinja file or a tokenizer_config.json (its chat_template). For each template, renders N
contexts with both and compares: the texts must be identical, and both must fail on the same contexts
(an error on one side only is a difference). Prints one line per template and a summary; exit 1 on any
difference, 77 (skipped) without jinja2.
"""
import argparse
import json
import random
import os
import subprocess
import sys
import tempfile

from hf_jinja import environment

FRAGMENTS = ['hi', 'What is 2+3?', ' spaced ', '\n', 'line\nbreak', '<think>', '</think>', 'reason',
             'The answer is 5.', '', ' ', 'tool out', '<tool_response>', 'émoji 🙂', '\t', '{"a": 1}',
             "it's", '"quoted"', '\\', '[INST]', '<|im_end|>']

TOOLS = [
    {'type': 'function', 'function': {'name': 'get_weather', 'description': 'Get the weather in a city.',
                                      'parameters': {'type': 'object', 'properties': {
                                          'city': {'type': 'string', 'description': 'The city'},
                                          'unit': {'type': 'string', 'enum': ['c', 'f']}},
                                          'required': ['city']}}},
    {'type': 'function', 'function': {'name': 'add', 'description': 'Adds two numbers.',
                                      'parameters': {'type': 'object', 'properties': {
                                          'a': {'type': 'number'}, 'b': {'type': 'integer', 'default': 2}},
                                          'required': ['a', 'b']}}},
]


def text(rng, n=4):
    return ''.join(rng.choice(FRAGMENTS) for _ in range(rng.randint(0, n)))


def tool_call(rng, i):
    args = rng.choice([{'city': text(rng, 2)}, {'a': 1, 'b': 2.5}, {}, {'city': 'Paris', 'unit': 'c'}])
    fn = {'name': rng.choice(['get_weather', 'add']), 'arguments': args if rng.random() < 0.7 else json.dumps(args)}
    call = {'type': 'function', 'function': fn}
    if rng.random() < 0.8:
        call['id'] = f'call_{i}'
    return call


def conversation(rng):
    messages = [{'role': 'system', 'content': text(rng)}] if rng.random() < 0.4 else []
    calls = 0
    for _ in range(rng.randint(1, 6)):
        r = rng.random()
        role = 'user' if r < 0.45 else 'assistant' if r < 0.85 else 'tool' if r < 0.95 else 'system'
        m = {'role': role, 'content': text(rng)}
        if role == 'assistant':
            p = rng.random()
            if p < 0.3:
                m['content'] = rng.choice(['', '\n']) + '<think>' + text(rng) + '</think>' + rng.choice(['', '\n', '\n\n']) + text(rng)
            elif p < 0.45:
                m['reasoning_content'] = text(rng)
            if rng.random() < 0.25:
                m['tool_calls'] = [tool_call(rng, calls + k) for k in range(rng.randint(1, 2))]
                calls += len(m['tool_calls'])
                if rng.random() < 0.4:
                    m['content'] = None if rng.random() < 0.5 else ''
        elif role == 'tool':
            if rng.random() < 0.6:
                m['tool_call_id'] = f'call_{max(calls - 1, 0)}'
            if rng.random() < 0.5:
                m['name'] = 'get_weather'
        elif role == 'user' and rng.random() < 0.15:
            m['content'] = [{'type': 'text', 'text': text(rng)} for _ in range(rng.randint(1, 2))]
        messages.append(m)
    # as transformers' apply_chat_template: tools and documents are always passed (None when absent)
    ctx = {'messages': messages, 'tools': None, 'documents': None, 'add_generation_prompt': rng.random() < 0.7,
           'bos_token': '<s>', 'eos_token': '</s>'}
    if rng.random() < 0.6:
        ctx['enable_thinking'] = rng.random() < 0.5
    if rng.random() < 0.3:
        ctx['tools'] = TOOLS[:rng.randint(1, 2)]
    return ctx


def source_of(path):
    if path.endswith('.json'):
        cfg = json.load(open(path, encoding='utf-8'))
        t = cfg['chat_template']
        if isinstance(t, list):
            t = next(e['template'] for e in t if e.get('name') == 'default')
        return t
    return open(path, encoding='utf-8').read()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('jinja_render')
    ap.add_argument('templates', nargs='+')
    ap.add_argument('--seed', type=int, default=1)
    ap.add_argument('--cases', type=int, default=300)
    ap.add_argument('--show', type=int, default=1, help='differences to print per template')
    a = ap.parse_args()
    env = environment()
    bad = 0
    for path in a.templates:
        source = source_of(path)
        rng = random.Random(a.seed)
        cases = [conversation(rng) for _ in range(a.cases)]
        try:
            template = env.from_string(source)
            theirs = []
            for c in cases:
                try:
                    theirs.append(('text', template.render(**c)))
                except Exception as e:  # noqa: BLE001 - any failure is "an error" to compare
                    theirs.append(('error', f'{type(e).__name__}: {e}'))
        except Exception as e:  # noqa: BLE001
            theirs = [('error', f'parse: {type(e).__name__}: {e}')] * len(cases)
        with tempfile.NamedTemporaryFile('w', suffix='.jinja', encoding='utf-8', delete=False) as f:
            f.write(source)
        try:
            run = subprocess.run([a.jinja_render, f.name],
                                 input='\n'.join(json.dumps(c, ensure_ascii=False) for c in cases) + '\n',
                                 capture_output=True, text=True, encoding='utf-8')
        finally:
            os.unlink(f.name)
        ours = [json.loads(line) for line in run.stdout.splitlines()]
        if run.returncode != 0 or len(ours) != len(cases):
            print(f'{path}: jinja_render failed ({run.returncode}): {run.stderr[-500:]}')
            bad += 1
            continue
        differ = errors_both = shown = 0
        for case, (kind, want), mine in zip(cases, theirs, ours):
            if kind == 'error' and 'error' in mine:
                errors_both += 1
                continue
            if kind == 'text' and mine.get('text') == want:
                continue
            differ += 1
            if shown < a.show:
                shown += 1
                print(f'--- {path}: case {json.dumps(case, ensure_ascii=False)[:600]}')
                print(f'    jinja2: {kind}: {want!r}'[:1500])
                print(f'    zipage: {mine!r}'[:1500])
        status = 'ok' if differ == 0 else 'DIFFER'
        print(f'{status:6} {path}: {a.cases - differ}/{a.cases} agree ({errors_both} errors on both sides)')
        bad += differ != 0
    print(f'{len(a.templates) - bad}/{len(a.templates)} templates agree on every case')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
