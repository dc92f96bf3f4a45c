"""numpy's exponential stream in pure Python, bit for bit.

`numpy.random.default_rng(seed).exponential(scale, size)` is four published algorithms in a row:
SeedSequence(seed) (numpy's hash-mixing of the seed's 32-bit words into a 4-word pool, then
into 4 uint64 words) -> PCG64 (O'Neill's 128-bit LCG with the XSL-RR output) -> the standard
exponential by Marsaglia & Tsang's ziggurat (256 layers, 53-bit draws) -> times scale.
Poisson arrivals need only that, and importing numpy is a quarter of a short replay's start-up
(numpy.random alone 3 %), so this module rebuilds the same stream (tests/workload/
test_exponential.py compares it with numpy over many seeds, scales and lengths, tail and
rejection branches included).

The ziggurat tables are derived below from their defining formulas, in 128-bit fixed point:
derived in doubles, a few hundred entries differ from numpy's in the last bit, which changes
draws.
"""

from __future__ import annotations

import math
import operator
from functools import cache
from typing import Iterator

_M32 = 0xFFFFFFFF
_M64 = (1 << 64) - 1
_M128 = (1 << 128) - 1

# SeedSequence's hash constants (numpy.random.bit_generator; after Melissa O'Neill's seed_seq_fe).
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875  # mixing the seed into the pool
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED  # drawing the state words from the pool
_MIX_MULT_L, _MIX_MULT_R = 0xCA01F9DD, 0x4973F715
_POOL_SIZE = 4

# PCG64: the 128-bit LCG multiplier (PCG_DEFAULT_MULTIPLIER_128).
_PCG_MULT = 0x2360ED051FC65DA44385DF649FCCF645

# The ziggurat's right edge for 256 layers: the r at which the layer recursion below ends at
# x = 0 (Marsaglia & Tsang 2000 give 7.69711747013104972; more digits: the tables need them).
_ZIGGURAT_R = "7.6971174701310497140446280481"
_TAIL_START = float(_ZIGGURAT_R)  # r as a double (7.69711747013104972): where a tail draw starts
_TO_UNIT = 1.0 / 9007199254740992.0  # 2**-53: 53 random bits -> a double in [0, 1)


def _seed_words(seed: int) -> list[int]:
    """SeedSequence(seed).generate_state(4, uint64) for an int seed (no spawn key)."""
    seed = operator.index(seed)  # an int, or numpy's integers as numpy takes them
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    entropy = [0] if seed == 0 else []
    while seed > 0:  # the seed's 32-bit words, least significant first
        entropy.append(seed & _M32)
        seed >>= 32
    hash_const = _INIT_A

    def hashmix(value: int) -> int:
        nonlocal hash_const
        value ^= hash_const
        hash_const = (hash_const * _MULT_A) & _M32
        value = (value * hash_const) & _M32
        return value ^ (value >> 16)

    def mix(x: int, y: int) -> int:
        result = (_MIX_MULT_L * x - _MIX_MULT_R * y) & _M32
        return result ^ (result >> 16)

    pool = [hashmix(entropy[i] if i < len(entropy) else 0) for i in range(_POOL_SIZE)]
    for src in range(_POOL_SIZE):  # every pool word into every other
        for dst in range(_POOL_SIZE):
            if src != dst:
                pool[dst] = mix(pool[dst], hashmix(pool[src]))
    for word in entropy[_POOL_SIZE:]:  # seed words beyond the pool's four
        for dst in range(_POOL_SIZE):
            pool[dst] = mix(pool[dst], hashmix(word))
    hash_const = _INIT_B
    words32 = []
    for i in range(8):  # 4 uint64 words = 8 uint32, cycling over the pool
        value = pool[i % _POOL_SIZE] ^ hash_const
        hash_const = (hash_const * _MULT_B) & _M32
        value = (value * hash_const) & _M32
        words32.append(value ^ (value >> 16))
    return [words32[2 * i] | (words32[2 * i + 1] << 32) for i in range(4)]  # little-endian pairs


def _pcg64_start(seed: int) -> tuple[int, int]:
    """PCG64's (state, increment) after seeding: words 0,1 are the initial state, 2,3 the
    stream (high word first), set as pcg_setseq_128_srandom_r does."""
    w = _seed_words(seed)
    init_state, init_seq = (w[0] << 64) | w[1], (w[2] << 64) | w[3]
    inc = ((init_seq << 1) | 1) & _M128
    state = inc  # from state 0, one step
    state = ((state + init_state) * _PCG_MULT + inc) & _M128  # add the initial state, one more step
    return state, inc


def _xsl_rr(state: int) -> int:
    """PCG's 64-bit output of a 128-bit state: high xor low word, rotated right by the top 6 bits."""
    word = ((state >> 64) ^ state) & _M64
    rot = state >> 122
    return ((word >> rot) | (word << (-rot & 63))) & _M64


# The tables are derived in fixed point: ints scaled by 2**128 (~38 digits; 21 are needed).
_P = 128
_ONE = 1 << _P


def _fixed_ln2() -> int:
    """ln 2 = 2 atanh(1/3) = 2 sum_k 3^-(2k+1) / (2k+1), in fixed point."""
    total, power, k = 0, _ONE // 3, 0
    while power:
        total += power // (2 * k + 1)
        power //= 9
        k += 1
    return 2 * total


def _fixed_exp(z: int, ln2: int) -> int:
    """e^z in fixed point: z = n ln2 + t with t in [0, ln2), e^t = (e^(t/64))^64 with e^(t/64)
    by its Taylor series (~14 terms to 2**-128), times 2^n."""
    n = z // ln2
    t = (z - n * ln2) >> 6
    total = term = _ONE
    k = 1
    while term:
        term = (term * t >> _P) // k
        total += term
        k += 1
    for _ in range(6):
        total = total * total >> _P
    return total << n if n >= 0 else total >> -n


def _fixed_neg_ln(y: int, ln2: int) -> int:
    """-ln y in fixed point, for y in (0, 1]: z0 = -ln y in doubles, then one correction,
    -ln y = z0 - ln(1 + d) with 1 + d = y e^z0 (d ~ 1e-16, so ln(1 + d) = d within 1e-32)."""
    z0 = int(-math.log(y / _ONE) * 2.0**_P)  # exact: a double times a power of two
    d = y * _fixed_exp(z0, ln2) // _ONE - _ONE
    return z0 - d


@cache
def ziggurat_tables() -> tuple[list[int], list[float], list[float]]:
    """(k, w, f) of the exponential ziggurat with 256 layers of equal area v = (r + 1) e^-r.

    x[255] = r and, going up, e^-x[i] = v / x[i+1] + e^-x[i+1] (layer i+1 has area v);
    layer 0 is the base strip (width r + 1: the tail counted in). A 53-bit draw u in layer i
    gives x = u * w[i]; it is accepted at once when u < k[i] (x under the layer above:
    k[i] = 2**53 x[i-1] / x[i], and k[1] = 0 as x[0] = 0); f[i] = e^-x[i] bounds the wedge
    test. In fixed point: doubles are not enough (see the module docstring); ~1 ms, once."""
    ln2 = _fixed_ln2()
    whole, frac = _ZIGGURAT_R.split(".")
    r = int(whole + frac) * _ONE // 10 ** len(frac)
    x = [0] * 256
    f = [_ONE] * 256  # e^-x[i]; f[0] = 1 (x[0] = 0)
    x[255], f[255] = r, _ONE * _ONE // _fixed_exp(r, ln2)
    v = (r + _ONE) * f[255] // _ONE
    for i in range(254, 0, -1):
        f[i] = v * _ONE // x[i + 1] + f[i + 1]
        x[i] = _fixed_neg_ln(f[i], ln2)
    to_double = _ONE << 53  # fixed point / 2**53 -> double (int / int rounds correctly)
    k = [(r << 53) // (r + _ONE), 0] + [(x[i - 1] << 53) // x[i] for i in range(2, 256)]
    w = [(r + _ONE) / to_double] + [x[i] / to_double for i in range(1, 256)]
    return k, w, [fi / _ONE for fi in f]


def standard_exponentials(seed: int) -> Iterator[float]:
    """numpy.random.default_rng(seed).standard_exponential()'s stream, one draw at a time
    (numpy's exponential(scale) is scale times each)."""
    state, inc = _pcg64_start(seed)
    k, w, f = ziggurat_tables()
    mult, m128 = _PCG_MULT, _M128
    while True:
        state = (state * mult + inc) & m128
        bits = _xsl_rr(state) >> 3
        layer = bits & 0xFF
        bits >>= 8
        x = bits * w[layer]
        if bits < k[layer]:  # inside the layer above's width: ~99 % of draws
            yield x
            continue
        state = (state * mult + inc) & m128
        u = (_xsl_rr(state) >> 11) * _TO_UNIT
        if layer == 0:  # the tail beyond r (1 - u: never log(0))
            yield _TAIL_START - math.log1p(-u)
        elif (f[layer - 1] - f[layer]) * u + f[layer] < math.exp(-x):  # under the curve in the wedge
            yield x
        # else rejected: draw again
