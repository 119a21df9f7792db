#!/usr/bin/env python3
"""Random texts for llama.cpp's tokenizer (run.sh): N lines of stories260K-like fragments, whitespace runs,
punctuation, digits, accents, CJK, emoji and the vocabulary's special-token spellings, one per line with
backslash escapes (\\n, \\\\), as llama_golden tokenize reads them. With `qwen`, fragments for a byte-level BPE
vocabulary instead: code, digit runs, contractions in any case, CJK, emoji, and Qwen's added tokens (control ones,
which only a special parse matches, and <think>-style user-defined ones, which always match).
  token_lines.py SEED N [qwen]"""
import random
import sys

FRAGMENTS = ['Once', ' upon', ' a', ' time', ',', '.', '!', '?', ' ', '  ', '   ', '\n', '\n\n', '\t', 'Lily', 'said',
             '"', "'", "can't", '123', '4', '0.5', 'é', 'ü', 'ñ', '中文', '日本', '🙂', 'the', 'The', 'THE', '-', '_', '(',
             ')', '<s>', '</s>', '<unk>', 'café', 'naïve', ' x', 'x ', '\u00a0', '\u200b', 'ǅ', '\\']
QWEN = ['Hello', ' world', 'def', ' f(x):', '\n    return', ' x', '**', '2', '12345', '3.14', "'s", "'T", "'RE", " I've",
        ' 你好', '世界', '。', 'こんにちは', '🙂', '🚀', '\u200d', 'é', 'e\u0301', '  ', '\t', '\n', '\n\n', ' \n', '!!', '...',
        '<|im_start|>', '<|im_end|>', '<|endoftext|>', '<think>', '</think>', '<tool_call>', '<|fim_prefix|>', '<|im_',
        'user', 'assistant', '$', '\\frac', '{', '}', '\u00a0', 'Ǆ', 'ß', 'İ', '-', '—', ' ', 'A', 'zz']
if len(sys.argv) > 3 and sys.argv[3] == 'qwen':
    FRAGMENTS = QWEN
rng = random.Random(int(sys.argv[1]))
for _ in range(int(sys.argv[2])):
    text = ''.join(rng.choice(FRAGMENTS) for _ in range(rng.randint(0, 10)))
    print(text.replace('\\', '\\\\').replace('\n', '\\n'))
