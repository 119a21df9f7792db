# The FP8 KV cache's per (token, KV head) scale in smaller formats than today's fp32 (docs/fp8.md, "Smaller scales"):
# head vectors quantised to E4M3 (e4m3fn: round to nearest even, subnormals m * 2^-9, saturating at 448) with the
# scale amax / 448 kept exactly (fp32, today), rounded to bf16 or fp16, or raised to a power of two (one byte: an
# exponent). Prints the relative RMS error of the dequantised vectors for three kinds of head vector.
#   /usr/bin/python3 scripts/emulate_kv_scale_formats.py
import numpy as np

rng = np.random.default_rng(0)
ROWS, D = 20000, 128


def e4m3(x):
    a = np.abs(x)
    e = np.maximum(np.floor(np.log2(np.maximum(a, 1e-30))), -6)  # below 2^-6 the subnormal spacing 2^-9
    step = 2.0 ** (e - 3)                                          # 3 mantissa bits
    return np.sign(x) * np.minimum(np.round(a / step) * step, 448.0)  # np.round: half to even


def to_bf16(x):
    b = x.astype(np.float32).view(np.uint32)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)  # round to nearest even
    return b.view(np.float32).astype(np.float64)


SCALES = {
    "fp32 (today)": lambda s: s,
    "bf16": to_bf16,
    "fp16": lambda s: s.astype(np.float16).astype(np.float64),
    "power of two (1 byte)": lambda s: 2.0 ** np.ceil(np.log2(s)),
}

VECTORS = {
    "N(0,1)": lambda: rng.standard_normal((ROWS, D)),
    "Student t, 3 dof": lambda: rng.standard_t(3, (ROWS, D)),
    "one channel 20x": lambda: np.concatenate([rng.standard_normal((ROWS, D - 1)), 20 * rng.standard_normal((ROWS, 1))], 1),
}


def rel_rms(v, scale_format):
    s = scale_format(np.abs(v).max(axis=1, keepdims=True) / 448.0)
    deq = e4m3(v / s) * s
    return np.sqrt(((deq - v) ** 2).sum() / (v ** 2).sum())


print("| head vectors | " + " | ".join(SCALES) + " |")
print("|---|" + "---:|" * len(SCALES))
for name, make in VECTORS.items():
    v = make()
    print(f"| {name} | " + " | ".join(f"{100 * rel_rms(v, f):.2f}%" for f in SCALES.values()) + " |")
