#!/usr/bin/env python3
"""Joins llama_golden tokenize's output with its input lines as JSON lines (run.sh).

    token_jsonl.py LINES NAME=IDS [NAME=IDS ...]

LINES: the texts as llama_golden reads them (one per line, \\n for a newline, \\\\ for a backslash); each IDS file:
its token ids, one line of space-separated ids per text. Prints {"text": ..., NAME: [ids], ...} per text."""
import json
import sys


def unescape(t):  # as llama_golden reads a line: \\n is a newline, \\x is x
    out, k = [], 0
    while k < len(t):
        if t[k] == '\\' and k + 1 < len(t):
            out.append('\n' if t[k + 1] == 'n' else t[k + 1])
            k += 2
        else:
            out.append(t[k])
            k += 1
    return ''.join(out)


texts = [l.rstrip('\n') for l in open(sys.argv[1], encoding='utf-8')]
columns = []
for arg in sys.argv[2:]:
    name, path = arg.split('=', 1)
    ids = [l.split() for l in open(path)]
    assert len(ids) == len(texts), f'{path}: {len(ids)} lines for {len(texts)} texts'
    columns.append((name, ids))
for k, t in enumerate(texts):
    row = {'text': unescape(t)}
    for name, ids in columns:
        row[name] = [int(x) for x in ids[k]]
    print(json.dumps(row, ensure_ascii=False))
