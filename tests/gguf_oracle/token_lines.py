#!/usr/bin/env python3
"""Random texts for llama.cpp's tokenizer (run.sh): N lines of stories260K-like fragments, whitespace runs,
punctuation, digits, accents, CJK, emoji and the vocabulary's special-token spellings, one per line with
backslash escapes (\\n, \\\\), as llama_golden tokenize reads them.  token_lines.py SEED N"""
import random
import sys

FRAGMENTS = ['Once', ' upon', ' a', ' time', ',', '.', '!', '?', ' ', '  ', '   ', '\n', '\n\n', '\t', 'Lily', 'said',
             '"', "'", "can't", '123', '4', '0.5', 'é', 'ü', 'ñ', '中文', '日本', '🙂', 'the', 'The', 'THE', '-', '_', '(',
             ')', '<s>', '</s>', '<unk>', 'café', 'naïve', ' x', 'x ', '\u00a0', '\u200b', 'ǅ', '\\']
rng = random.Random(int(sys.argv[1]))
for _ in range(int(sys.argv[2])):
    text = ''.join(rng.choice(FRAGMENTS) for _ in range(rng.randint(0, 10)))
    print(text.replace('\\', '\\\\').replace('\n', '\\n'))
