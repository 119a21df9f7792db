#!/usr/bin/env python3
"""zipage's chat template against the checkpoint's own Jinja template, on random conversations.

    jinja_diff.py RENDER_CHAT TOKENIZER_DIR [--seed S] [--cases N] [--builtin]

Renders each conversation with Python's jinja2 as transformers does (trim_blocks, lstrip_blocks, a
sandbox, raise_exception, tojson) and with zipage (render_chat: the template through zipage's Jinja interpreter, or
with --builtin zipage's built-in format of its family), and compares the texts; both must agree
on which conversations are errors too. Conversations: an optional system message, then 1-5 turns of user,
assistant (half of them with a <think> block, as reasoning models write), tool and mid-conversation system
messages, their contents drawn from fragments that exercise the template's whitespace and tag handling;
add_generation_prompt and enable_thinking drawn per case. Exit 77 (skipped) without jinja2.
"""
import argparse
import json
import random
import subprocess
import sys

from hf_jinja import environment

FRAGMENTS = ['hi', 'What is 2+3?', ' spaced ', '\n', 'line\nbreak', '<think>', '</think>', 'reason',
             'The answer is 5.', '', ' ', 'tool out', '<tool_response>', 'émoji 🙂', '\t', '{"a": 1}']


def template_of(tokenizer_dir):
    cfg = json.load(open(f'{tokenizer_dir}/tokenizer_config.json', encoding='utf-8'))
    return environment().from_string(cfg['chat_template'])


def conversation(rng):
    def text():
        return ''.join(rng.choice(FRAGMENTS) for _ in range(rng.randint(0, 4)))

    messages = [{'role': 'system', 'content': text()}] if rng.random() < 0.4 else []
    for _ in range(rng.randint(1, 5)):
        r = rng.random()
        role = 'user' if r < 0.45 else 'assistant' if r < 0.85 else 'tool' if r < 0.95 else 'system'
        content = text()
        if role == 'assistant' and rng.random() < 0.5:
            content = rng.choice(['', '\n']) + '<think>' + text() + '</think>' + rng.choice(['', '\n', '\n\n']) + text()
        messages.append({'role': role, 'content': content})
    return {'messages': messages, 'add_generation_prompt': rng.random() < 0.7, 'enable_thinking': rng.random() < 0.6}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('render_chat')
    ap.add_argument('tokenizer_dir')
    ap.add_argument('--seed', type=int, default=1)
    ap.add_argument('--cases', type=int, default=3000)
    ap.add_argument('--builtin', action='store_true', help="zipage's built-in format instead of the template")
    a = ap.parse_args()
    template = template_of(a.tokenizer_dir)
    rng = random.Random(a.seed)
    cases = [conversation(rng) for _ in range(a.cases)]
    run = subprocess.run([a.render_chat, a.tokenizer_dir] + (['builtin'] if a.builtin else []), input='\n'.join(json.dumps(c) for c in cases) + '\n',
                         capture_output=True, text=True, encoding='utf-8')
    if run.returncode != 0:
        print(f'render_chat failed ({run.returncode}): {run.stderr}')
        return 1
    ours = [json.loads(line) for line in run.stdout.splitlines()]
    if len(ours) != len(cases):
        print(f'render_chat answered {len(ours)} of {len(cases)} conversations')
        return 1
    differ = errors = 0
    for case, mine in zip(cases, ours):
        try:
            ref = template.render(tools=None, **case)
        except jinja2.exceptions.TemplateError as e:
            ref, why = None, str(e)
        if ref is None or 'error' in mine:
            if (ref is None) != ('error' in mine):
                errors += 1
                if errors <= 3:
                    print('ERROR ON ONE SIDE ONLY:', json.dumps(case, ensure_ascii=False),
                          'jinja:', why if ref is None else 'rendered', 'zipage:', mine.get('error', 'rendered'))
            continue
        if mine['text'] != ref:
            differ += 1
            if differ <= 3:
                print('DIFFERENT:', json.dumps(case, ensure_ascii=False))
                print('  jinja: ', json.dumps(ref, ensure_ascii=False))
                print('  zipage:', json.dumps(mine['text'], ensure_ascii=False))
    print(f'{len(cases)} conversations (seed {a.seed}): {differ} rendered differently, {errors} an error on one side only')
    return 1 if differ or errors else 0


if __name__ == '__main__':
    sys.exit(main())
