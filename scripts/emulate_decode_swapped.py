# Emulates decode_swapped.cuh lane by lane: the same index expressions as the kernel (fragments of mma.m16n8k16,
# the P^T exchange in 4 shuffles, the d permutation of O^T, the 4-warp epilogue), in float64 without the fp16 / FP8
# roundings or the V-scale exponents, against a reference attention. A model check of the layout, not of the CUDA
# code: run it after changing an index in the kernel.  /usr/bin/python3 scripts/emulate_decode_swapped.py
import numpy as np
rng = np.random.default_rng(1)
D, TILE = 128, 64

def mma(c, a, b):  # c[lane][4] += A.B from m16n8k16 fragments (pairs as tuples)
    A = np.zeros((16, 16)); B = np.zeros((16, 8))
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        A[g][2*t:2*t+2] = a[lane][0]; A[g+8][2*t:2*t+2] = a[lane][1]
        A[g][2*t+8:2*t+10] = a[lane][2]; A[g+8][2*t+8:2*t+10] = a[lane][3]
        B[2*t:2*t+2, g] = b[lane][0]; B[2*t+8:2*t+10, g] = b[lane][1]
    C = A @ B
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        c[lane][0] += C[g][2*t]; c[lane][1] += C[g][2*t+1]; c[lane][2] += C[g+8][2*t]; c[lane][3] += C[g+8][2*t+1]

def conv4(codes):  # e4m3x4_to_f16x4: 4 consecutive codes -> (lo pair, hi pair)
    return (codes[0], codes[1]), (codes[2], codes[3])

def perm(r0, r1, sel):  # __byte_perm of two 4-code words
    b = list(r0) + list(r1)
    return [b[(sel >> (4 * i)) & 7] for i in range(4)]

def kbase(t, c, i):  # first d of K codes r[i] of chunk c (and of qb[4c + i]) for lane t
    return 32 * t + 16 * c + 4 * i

def run(group, length, scale=1 / np.sqrt(128)):
    q = rng.standard_normal((group, D))
    kc = rng.standard_normal((length, D)); vc = rng.standard_normal((length, D))
    ks = rng.uniform(0.5, 2, length); vsc = rng.uniform(0.5, 2, length)
    # reference
    S = (q @ (kc * ks[:, None]).T) * scale
    P = np.exp(S - S.max(1, keepdims=True)); P /= P.sum(1, keepdims=True)
    ref = P @ (vc * vsc[:, None])
    Q = np.zeros((8, D)); Q[:group] = q
    ntiles = (length + TILE - 1) // TILE
    warps = []
    for warp in range(4):
        m = [[-np.inf] * 2 for _ in range(32)]; l = [[0.0] * 2 for _ in range(32)]
        o = [[[0.0] * 4 for _ in range(8)] for _ in range(32)]
        for it in range(ntiles):
            ts = it * TILE
            if ts + warp * 16 >= length: continue
            def K(row, d):
                tok = ts + row
                return kc[tok][d] if tok < length else 0.0
            def V(row, d):
                tok = ts + row
                return vc[tok][d] if tok < length else 0.0
            def scl(arr, row):
                tok = ts + row
                return arr[tok] if tok < length else 0.0
            s = [[0.0] * 4 for _ in range(32)]
            for c in range(2):
                for i in range(4):
                    a = []; b = []
                    for lane in range(32):
                        g, t = lane >> 2, lane & 3
                        base = kbase(t, c, i)
                        r0 = [K(warp * 16 + g, base + e) for e in range(4)]
                        r1 = [K(warp * 16 + g + 8, base + e) for e in range(4)]
                        lo0, hi0 = conv4(r0); lo1, hi1 = conv4(r1)
                        a.append([lo0, lo1, hi0, hi1])
                        kk = 4 * c + i  # qb[kk]: d = kbase(t, kk // 4, kk % 4) + {0,1} | {2,3} of head g
                        qd = kbase(t, kk // 4, kk % 4)
                        b.append([(Q[g][qd], Q[g][qd+1]), (Q[g][qd+2], Q[g][qd+3])])
                    mma(s, a, b)
            pp = []; corr = [[0, 0] for _ in range(32)]; vsn = []
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                tok0 = ts + warp * 16 + g
                k0 = scl(ks, warp * 16 + g) * scale; k1 = scl(ks, warp * 16 + g + 8) * scale
                s[lane][0] = s[lane][0] * k0 if tok0 < length else -np.inf
                s[lane][1] = s[lane][1] * k0 if tok0 < length else -np.inf
                s[lane][2] = s[lane][2] * k1 if tok0 + 8 < length else -np.inf
                s[lane][3] = s[lane][3] * k1 if tok0 + 8 < length else -np.inf
            for h in range(2):  # max over lanes of equal t
                mx = [max(s[lane][h], s[lane][h + 2]) for lane in range(32)]
                for off in (4, 8, 16): mx = [max(mx[x], mx[x ^ off]) for x in range(32)]
                for lane in range(32):
                    mn = max(m[lane][h], mx[lane]); base = 0.0 if mn == -np.inf else mn
                    corr[lane][h] = np.exp(m[lane][h] - base) if m[lane][h] != -np.inf else 0.0
                    m[lane][h] = mn
                    s[lane][h] = np.exp(s[lane][h] - base) if s[lane][h] != -np.inf else 0.0
                    s[lane][h + 2] = np.exp(s[lane][h + 2] - base) if s[lane][h + 2] != -np.inf else 0.0
                    l[lane][h] = l[lane][h] * corr[lane][h] + s[lane][h] + s[lane][h + 2]
            for lane in range(32):
                g = lane >> 2
                for i in range(8):
                    o[lane][i][0] *= corr[lane][0]; o[lane][i][2] *= corr[lane][0]
                    o[lane][i][1] *= corr[lane][1]; o[lane][i][3] *= corr[lane][1]
                v0 = scl(vsc, warp * 16 + g); v1 = scl(vsc, warp * 16 + g + 8)
                pp.append([s[lane][0] * v0, s[lane][1] * v0, s[lane][2] * v1, s[lane][3] * v1])
            recv = [[0] * 4 for _ in range(32)]
            for j in range(4):
                send = [pp[x][2 * (j >> 1) + (((x >> 2) + j) & 1)] for x in range(32)]
                for lane in range(32):
                    g, t = lane >> 2, lane & 3
                    recv[lane][j] = send[4 * (2 * t + ((g + j) & 1)) + (g >> 1)]
            pb = []
            for lane in range(32):
                g = lane >> 2; r = recv[lane]
                pb.append([(r[1], r[0]), (r[3], r[2])] if g & 1 else [(r[0], r[1]), (r[2], r[3])])
            # PV
            rows = {}
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                rows[lane] = [[[V(warp * 16 + 2 * t + (k & 1) + 8 * (k >> 1), 16 * g + 4 * w + e) for e in range(4)]
                               for w in range(4)] for k in range(4)]
            for wp in range(2):
                tops = {}; bots = {}
                for lane in range(32):
                    r = rows[lane]; top = []; bot = []
                    for h in range(2):
                        w = wp + 2 * h
                        lo, hi = conv4(perm(r[0][w], r[1][w], 0x5140)); lo2, hi2 = conv4(perm(r[0][w], r[1][w], 0x7362))
                        top.append([lo, hi, lo2, hi2])
                        lo, hi = conv4(perm(r[2][w], r[3][w], 0x5140)); lo2, hi2 = conv4(perm(r[2][w], r[3][w], 0x7362))
                        bot.append([lo, hi, lo2, hi2])
                    tops[lane] = top; bots[lane] = bot
                for e in range(4):
                    a = [[tops[x][0][e], tops[x][1][e], bots[x][0][e], bots[x][1][e]] for x in range(32)]
                    cc = [o[x][4 * wp + e] for x in range(32)]
                    mma(cc, a, [pb[x] for x in range(32)])
        warps.append((m, l, o))
    # epilogue
    so = np.zeros((4, 8, D)); sm = np.full((4, 8), -np.inf); sl = np.zeros((4, 8))
    for w, (m, l, o) in enumerate(warps):
        lt = [[sum(l[x2][h] for x2 in range(32) if (x2 & 3) == (x & 3)) for h in range(2)] for x in range(32)]
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            if g == 0:
                sm[w][2*t], sm[w][2*t+1] = m[lane]; sl[w][2*t], sl[w][2*t+1] = lt[lane]
            for h in range(2):
                for i in range(8):
                    so[w][2*t+h][16*g + i] = o[lane][i][h]; so[w][2*t+h][16*g + 8 + i] = o[lane][i][h + 2]
    out = np.zeros((group, D))
    for h in range(group):
        mt = sm[:, h].max(); base = 0 if mt == -np.inf else mt
        wt = np.array([np.exp(sm[w][h] - base) if sm[w][h] != -np.inf else 0 for w in range(4)])
        lt = (sl[:, h] * wt).sum()
        out[h] = (so[:, h, :] * wt[:, None]).sum(0) / lt
    return np.abs(out - ref).max()

for group, length in [(4, 100), (8, 64), (1, 1), (7, 130), (2, 200), (4, 17)]:
    err = run(group, length)
    print(f"group {group} len {length}: max |out - ref| = {err:.2e}")
    assert err < 1e-9
print("ok")
