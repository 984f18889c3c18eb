/*
 * cactus_native.c - implementation of cactus_native.h (read the header first: it defines V, k, p, q, h,
 * drafted / accepted / residual / bonus and AL).
 *
 * Sections:
 *   1. RNG            xoshiro256** seeded by splitmix64
 *   2. Validation     argument and distribution checks shared by the entry points
 *   3. Workspace      how the caller's float scratch is carved into typed regions
 *   4. Selection      O(V) radix selection of a prefix of the order (value desc, token id asc)
 *   5. Warp           top-k -> top-p -> min-p -> temperature (llama.cpp's default order)
 *   6. Sampling       weight lists and the one inverse-CDF draw (last-index guard)
 *   7. Cactus gamma   Taylor (paper) and exact (binary-KL root) solvers
 *   8. Verification   one draft-verify step for every cg_method
 *
 * Rules: Y. Hao, L. Mou, "Cactus: Accelerating Auto-Regressive Decoding with Constrained Acceptance
 * Speculative Sampling", ICLR 2026, arXiv:2604.04987 (Cactus); Leviathan et al. 2023 and Chen et al.
 * 2023 (SpS); Cai et al. 2024 and vLLM (typical acceptance).
 *
 * Floating point: probabilities are stored as float32; sums, ratios and the Cactus target are
 * computed in double. Every sum that decides a draw (sampling, residual, acceptance) is sequential
 * in token-id order and skips zero terms (adding +0.0 is exact, so it equals the plain sequential
 * sum a reference computes with cumsum); only softmax normalisers use four lanes. Built with
 * -std=c11, GCC does not contract a*b-c into an FMA, so, given the same q, the decisions match a
 * NumPy reference operation for operation. The V-long loops are written branch-free, in integer
 * key space where float NaN semantics would block vectorisation.
 */
#include "cactus_native.h"

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h> /* qsort (sorts in place, allocates nothing) */
#include <string.h> /* memcpy, memset */

/* ================================================================================================
 * 1. RNG
 * ============================================================================================= */

/* splitmix64 (Steele, Lea, Flood 2014): expands one 64-bit seed into the xoshiro state. */
static uint64_t splitmix64_next(uint64_t *x)
{
    uint64_t z = (*x += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

static inline uint64_t rotl64(uint64_t x, int s) { return (x << s) | (x >> (64 - s)); }

/* xoshiro256** 1.0 (Blackman, Vigna 2018). */
static inline uint64_t xoshiro_next(cg_rng *rng)
{
    uint64_t *s = rng->s;
    const uint64_t result = rotl64(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return result;
}

void cg_rng_seed(cg_rng *rng, uint64_t seed)
{
    if (!rng) {
        return;
    }
    uint64_t x = seed;
    for (int i = 0; i < 4; ++i) {
        rng->s[i] = splitmix64_next(&x); /* never all zero: splitmix64 is a bijection of a counter */
    }
}

double cg_rng_uniform(cg_rng *rng)
{
    if (!rng) {
        return NAN; /* no generator: a NaN makes the misuse visible instead of a fake draw */
    }
    /* top 53 bits -> k * 2^-53, k in [0, 2^53): exactly representable, so the result is in [0, 1) */
    return (double)(xoshiro_next(rng) >> 11) * 0x1.0p-53;
}

/* ================================================================================================
 * 2. Validation
 * ============================================================================================= */

static cg_status check_sampler_params(const cg_sampler_params *sp)
{
    if (!sp) {
        return CG_ERR_BAD_ARGUMENT;
    }
    if (isnan(sp->temperature) || sp->top_k < 0) {
        return CG_ERR_BAD_ARGUMENT;
    }
    /* written so that NaN fails: top_p in (0, 1], min_p in [0, 1] */
    if (!(sp->top_p > 0.0f && sp->top_p <= 1.0f) || !(sp->min_p >= 0.0f && sp->min_p <= 1.0f)) {
        return CG_ERR_BAD_ARGUMENT;
    }
    return CG_OK;
}

static cg_status check_accept_params(const cg_accept_params *ap)
{
    if (!ap) {
        return CG_ERR_BAD_ARGUMENT;
    }
    if (ap->method < CG_METHOD_SPS || ap->method > CG_METHOD_GREEDY) {
        return CG_ERR_BAD_ARGUMENT;
    }
    if (ap->solver != CG_SOLVER_TAYLOR && ap->solver != CG_SOLVER_EXACT) {
        return CG_ERR_BAD_ARGUMENT;
    }
    /* written so that NaN fails; delta = +inf is allowed (gamma = 1 whenever q[n] > 0) */
    if (!(ap->delta >= 0.0) || !(ap->typical_epsilon >= 0.0) || !(ap->typical_alpha >= 0.0)) {
        return CG_ERR_BAD_ARGUMENT;
    }
    if (ap->accept_top_k < 1) {
        return CG_ERR_BAD_ARGUMENT;
    }
    if ((ap->budget != CG_BUDGET_TARGET && ap->budget != CG_BUDGET_OUTPUT)
        || (ap->output_kl != 0 && ap->output_kl != 1)) {
        return CG_ERR_BAD_ARGUMENT;
    }
    return CG_OK;
}

/* A probability row (need not be normalised): every entry finite and >= 0, at least one > 0.
 * Checked on the bit patterns u so that the loop vectorises: a float is finite and >= 0 iff
 * u <= 0x7F7FFFFF (sign clear, exponent not all ones) or it is -0.0 (u = 0x80000000); it is > 0
 * iff 0 < u <= 0x7F7FFFFF. NaN, +-inf and negatives all fail. */
static cg_status check_prob_row(const float *p, int32_t n)
{
    uint32_t bad = 0;
    uint32_t any_positive = 0;
    for (int32_t i = 0; i < n; ++i) {
        uint32_t u;
        memcpy(&u, &p[i], sizeof u);
        bad |= (u > UINT32_C(0x7F7FFFFF)) & (u != UINT32_C(0x80000000));
        any_positive |= (u - 1u) < UINT32_C(0x7F7FFFFF);
    }
    return (bad || !any_positive) ? CG_ERR_BAD_DISTRIBUTION : CG_OK;
}

/* ================================================================================================
 * 3. Workspace
 *
 * The caller passes float scratch of cg_workspace_size(V) floats. It is untyped scratch (allocate it
 * with malloc / numpy, do not pass a declared float array): it is carved into the regions below,
 * each only ever accessed through its own type within a call. Layout, in floats:
 *   [0, 1)                    slack to reach 8-byte alignment
 *   pairs  uint64 [V]         2V floats   (order key, token id) of selected candidates
 *   wts    double [V]         2V          weights of the row being drawn from (section 6)
 *   mass   double [BINS]      2*BINS      radix histogram: weight per bin
 *   cnt    uint32 [BINS]      BINS        radix histogram: count per bin
 *   idx    int32  [V]         V           candidate / undecided token ids during a selection; during
 *                                         a draw, the token ids matching wts (the two uses never
 *                                         overlap in time: a draw starts after the last selection)
 *   bmax   float  [V/BLOCK]   ceil(V/64)  maximum logit of each block of 64 consecutive ids
 *   q      float  [V]         V           cg_verify: the warped verifier distribution at a position
 *   ml     float  [V]         V           a logits row with the disallowed tokens set to -inf (only
 *                                         when an allowed-token mask is given; section 5)
 *   [.., +1)                  slack to realign to 8 bytes
 *   law    cg_draft_entry [V+2]  8V + 16  the rejectable drafts and their sums (section 9)
 * ============================================================================================= */

#define CG_BINS 2048 /* 2^11: the widest radix digit */
#define CG_BLOCK 64  /* ids per block for the block maxima used by top-k */

/* One rejectable draft of the emitted-law computation (section 9). */
typedef struct {
    double s;  /* the target's scale off the drafted token, (1 - gamma) / (1 - q[n]) */
    double m;  /* the rejected mass p[n] - gamma, then the residual weight m / Z */
    double a;  /* bucket / suffix sums (section 9) */
    double b;
} cg_draft_entry;

typedef struct {
    uint64_t *pairs;
    double *wts;
    double *mass;
    uint32_t *cnt;
    int32_t *idx;
    float *bmax;
    float *q;
    float *ml;
    cg_draft_entry *law;
} cg_ws;

static inline int32_t n_blocks(int32_t n) { return (int32_t)(((int64_t)n + CG_BLOCK - 1) / CG_BLOCK); }

int64_t cg_workspace_size(int32_t n_vocab)
{
    if (n_vocab < 1) {
        return 0;
    }
    const int64_t v = n_vocab;
    return 1 + 2 * v + 2 * v + 2 * CG_BINS + CG_BINS + v + n_blocks(n_vocab) + v + v
           + 1 + 8 * (v + 2);
}

static cg_ws ws_carve(float *work, int32_t n_vocab)
{
    const size_t v = (size_t)n_vocab;
    uintptr_t base = (uintptr_t)work;
    base = (base + 7u) & ~(uintptr_t)7u; /* a float pointer is 4-aligned, so this skips 0 or 1 float */
    cg_ws ws;
    ws.pairs = (uint64_t *)base;
    ws.wts = (double *)(ws.pairs + v);
    ws.mass = ws.wts + v;
    ws.cnt = (uint32_t *)(ws.mass + CG_BINS);
    ws.idx = (int32_t *)(ws.cnt + CG_BINS);
    ws.bmax = (float *)(ws.idx + v);
    ws.q = ws.bmax + n_blocks(n_vocab);
    ws.ml = ws.q + v;
    /* bmax + q + ml may be an odd number of floats: realign to 8 bytes (one float of slack) */
    ws.law = (cg_draft_entry *)(((uintptr_t)(ws.ml + v) + 7u) & ~(uintptr_t)7u);
    return ws;
}

/* ================================================================================================
 * 4. Selection
 *
 * The warps and the top-k acceptance all keep a prefix of one order: value descending, ties by
 * token id ascending. We select such a prefix in O(n) with a three-level MSD radix partition on an
 * order-preserving 32-bit key (digits of 11, 11 and 10 bits), then sort only the selected prefix.
 * ============================================================================================= */

#define CG_SMALL 32 /* undecided sets this small are finished by insertion sort */

/* Order-preserving map float -> uint32 (a < b  <=>  key(a) < key(b)): negative floats get all bits
 * flipped, non-negative ones the sign bit set. -0.0f is folded into +0.0f so that floats that compare
 * equal get equal keys (ties then go by token id). NaN never reaches here (rejected before). */
static inline uint32_t order_key(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if (u == UINT32_C(0x80000000)) {
        u = 0;
    }
    return (u & UINT32_C(0x80000000)) ? ~u : (u | UINT32_C(0x80000000));
}

/* Pack (key, id) so that ascending uint64 order is (key descending, token id ascending). */
static inline uint64_t pair_of(uint32_t key, int32_t id)
{
    return ((uint64_t)(~key) << 32) | (uint32_t)id;
}

static inline int32_t pair_id(uint64_t pr) { return (int32_t)(uint32_t)pr; }

/* Insertion sort, ascending; O(m + inversions), so O(m) on already sorted input. */
static void sort_pairs_insertion(uint64_t *a, int32_t m)
{
    for (int32_t i = 1; i < m; ++i) {
        const uint64_t x = a[i];
        int32_t j = i - 1;
        while (j >= 0 && a[j] > x) {
            a[j + 1] = a[j];
            --j;
        }
        a[j + 1] = x;
    }
}

static int cmp_u64(const void *a, const void *b)
{
    const uint64_t x = *(const uint64_t *)a;
    const uint64_t y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Sort selected pairs into (value desc, id asc): O(m log m). */
static void sort_pairs(uint64_t *a, int32_t m)
{
    if (m <= CG_SMALL) {
        sort_pairs_insertion(a, m);
    } else {
        qsort(a, (size_t)m, sizeof *a, cmp_u64);
    }
}

/* The last selected element in the order (value desc, id asc): the largest pair. m >= 1. */
static uint64_t last_pair(const uint64_t *a, int32_t m)
{
    uint64_t last = a[0];
    for (int32_t j = 1; j < m; ++j) {
        last = a[j] > last ? a[j] : last;
    }
    return last;
}

/*
 * Select the shortest prefix P of the candidates, in the order (vals desc, id asc), whose cumulative
 * weight reaches `target`:  sum_{i in P} w_i >= target  (w_i = w[i], or 1 when w is NULL: then P is
 * the top-`target` set). Candidates: the ids ws->idx[0 .. n) when `from_idx` (ascending, finite
 * values), else {i in [0, n): vals[i] > -inf}. If the total weight stays below the target (only
 * rounding can do that for top-p), every candidate is kept.
 * Writes P to ws->pairs[0 .. return value) as pair_of(key, id), in no particular order.
 * Cost: two passes over the candidates, then passes over ever smaller undecided sets.
 */
static int32_t select_prefix(const float *vals, const float *w, int32_t n, int from_idx,
                             double target, const cg_ws *ws)
{
    const int shifts[3] = {21, 10, 0};
    const uint32_t masks[3] = {0x7FFu, 0x7FFu, 0x3FFu};
    uint64_t *out = ws->pairs;
    int32_t *idx = ws->idx; /* undecided ids, kept in ascending id order by stable compaction */
    uint32_t *cnt = ws->cnt;
    double *mass = ws->mass;
    int32_t n_out = 0;
    int32_t m = n;

    if (!from_idx && n <= CG_SMALL) { /* tiny input: straight to the finish */
        m = 0;
        for (int32_t i = 0; i < n; ++i) {
            if (vals[i] > -INFINITY) {
                idx[m++] = i;
            }
        }
        from_idx = 1;
    }
    for (int level = 0; level < 3; ++level) {
        if ((level > 0 || from_idx) && m <= CG_SMALL) {
            break;
        }
        const int sh = shifts[level];
        const uint32_t mask = masks[level];
        const uint32_t nb = mask + 1;
        const int implicit = level == 0 && !from_idx; /* iterate [0, n) directly, skipping -inf */
        const int32_t len = implicit ? n : m;
        memset(cnt, 0, nb * sizeof *cnt);
        if (w) {
            for (uint32_t b = 0; b < nb; ++b) {
                mass[b] = 0.0;
            }
        }
        /* histogram of this digit over the undecided set */
        for (int32_t j = 0; j < len; ++j) {
            const int32_t i = implicit ? j : idx[j];
            const float x = vals[i];
            if (implicit && x == -INFINITY) {
                continue;
            }
            const uint32_t b = (order_key(x) >> sh) & mask;
            cnt[b]++;
            if (w) {
                mass[b] += (double)w[i];
            }
        }
        /* walk bins from the largest values down to the bin where the target is reached */
        double cum = 0.0;
        int64_t bstar = -1;
        for (int64_t b = (int64_t)nb - 1; b >= 0; --b) {
            if (cnt[b] == 0) {
                continue;
            }
            const double wb = w ? mass[b] : (double)cnt[b];
            if (cum + wb >= target) {
                bstar = b;
                break;
            }
            cum += wb;
        }
        /* bins above bstar are kept whole; bin bstar stays undecided with the remaining target;
         * bstar < 0 (total below target, by rounding): keep every undecided candidate */
        const int keep_all = bstar < 0;
        const uint32_t keep_above = keep_all ? 0u : (uint32_t)bstar;
        target -= cum; /* > 0: cum < target held when the walk stopped */
        int32_t m2 = 0;
        for (int32_t j = 0; j < len; ++j) {
            const int32_t i = implicit ? j : idx[j];
            const float x = vals[i];
            if (implicit && x == -INFINITY) {
                continue;
            }
            const uint32_t key = order_key(x);
            const uint32_t b = (key >> sh) & mask;
            if (keep_all || b > keep_above) {
                out[n_out++] = pair_of(key, i);
            } else if (b == keep_above) {
                idx[m2++] = i; /* m2 <= j: in-place compaction is safe */
            }
        }
        if (keep_all) {
            return n_out;
        }
        m = m2;
    }

    /* Finish: sort the undecided set (ids ascending; after all three digits their keys are equal and
     * the insertion sort is O(m)), then keep its shortest prefix reaching the remaining target. */
    uint64_t *rest = out + n_out;
    for (int32_t j = 0; j < m; ++j) {
        rest[j] = pair_of(order_key(vals[idx[j]]), idx[j]);
    }
    sort_pairs_insertion(rest, m);
    double cum = 0.0;
    for (int32_t j = 0; j < m; ++j) {
        cum += w ? (double)w[pair_id(rest[j])] : 1.0;
        if (cum >= target) {
            return n_out + j + 1;
        }
    }
    return n_out + m; /* rounding left the target unreached: keep all */
}

/* ================================================================================================
 * 5. Warp
 *
 *   top-k:  keep the top_k largest logits (ties -> lowest id)
 *   top-p:  with s = softmax(logits) at T = 1 over the kept tokens, sorted descending, keep the
 *           shortest prefix with cumulative s >= top_p (always >= 1 token)
 *   min-p:  keep s_i >= min_p * max_j s_j  <=>  l_i - l_max >= log(min_p)   (the normaliser cancels)
 *   temp.:  probs_i = exp((l_i - l_max) / T) / Z over the kept tokens, 0 elsewhere
 * Max-subtraction guard: every exponent is <= 0 and the argmax (always kept) contributes exp(0) = 1,
 * so nothing overflows and every normaliser Z is >= 1 (no division by zero).
 * Allowed-token mask (optional): a disallowed token is treated exactly like a -inf logit. mask_row
 * copies the row into ws->ml with those logits set to -inf and the warp runs unchanged on the copy,
 * so every rule above (ties, guards, the kept sets) holds over the allowed tokens alone.
 * ============================================================================================= */

/* Signed order key: for non-NaN floats, a < b  =>  skey(a) < skey(b) as int32 (and -0.0 < +0.0).
 * Negative floats get their magnitude bits flipped. +inf maps to SKEY_POS_INF, -inf to SKEY_NEG_INF;
 * positive NaNs map above SKEY_POS_INF and negative NaNs below SKEY_NEG_INF, so one integer max and
 * min per block detect them. Integer max/min/compare vectorise where float ones (NaN semantics) do not. */
#define SKEY_POS_INF ((int32_t)0x7F800000)
#define SKEY_NEG_INF (-(int32_t)0x7F800001) /* skey(-inf) = 0x807FFFFF as int32 */

static inline int32_t skey(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u ^= (0u - (u >> 31)) & UINT32_C(0x7FFFFFFF);
    return (int32_t)u; /* modular conversion (GCC, Clang, MSVC) */
}

static inline float from_skey(int32_t s)
{
    uint32_t u = (uint32_t)s;
    u ^= (0u - (u >> 31)) & UINT32_C(0x7FFFFFFF);
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/*
 * exp(x) for x <= 0 in float, branch-free so that the V-long loops vectorise (libm's expf does not).
 * Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2 (ln2 split in a 9-bit head, so n * head is exact),
 * then the degree-7 Taylor polynomial of e^r (truncation < 6e-9 relative) and 2^n built in the
 * exponent bits. Max relative error 1.7 ulp over [-87.3, 0] (checked against double exp).
 * Guard: x below -87.34 (where 2^n would leave the normal range) and -inf give 0; the clamp happens
 * in integer key space, so no float select blocks vectorisation. x must not be NaN (callers form
 * x = (l - l_max) * inv_t with inv_t > 0 finite, so it cannot be).
 * Needs IEEE binary32 floats and round-to-nearest (the +1.5*2^23 rounding trick).
 */
static inline float exp_nonpos(float x)
{
    const int32_t k_lo = skey(-87.33654f);
    const int32_t kx = skey(x);
    const int32_t flush = kx < k_lo; /* below range, or -inf */
    const float xc = from_skey(flush ? k_lo : kx);
    const float nf = (xc * 1.44269504088896341f + 0x1.8p23f) - 0x1.8p23f; /* round(x / ln2) */
    const float r = (xc - nf * 0.693359375f) + nf * 2.12194440e-4f;        /* x - n ln2 */
    float poly = 1.0f / 5040.0f;
    poly = poly * r + 1.0f / 720.0f;
    poly = poly * r + 1.0f / 120.0f;
    poly = poly * r + 1.0f / 24.0f;
    poly = poly * r + 1.0f / 6.0f;
    poly = poly * r + 0.5f;
    poly = poly * r + 1.0f;
    poly = poly * r + 1.0f;
    const int32_t n = (int32_t)nf; /* in [-126, 0] */
    const uint32_t bits = flush ? 0u : (uint32_t)(n + 127) << 23; /* 2^n, or 0 to flush */
    float two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    return poly * two_n;
}

_Static_assert(sizeof(float) == 4 && FLT_MANT_DIG == 24, "IEEE binary32 float required");

/* Scan a logits row: reject NaN and +inf, count the finite logits, and record the maximum of each
 * block of CG_BLOCK ids in bmax (in integer key space: see skey). */
static cg_status scan_row(const float *l, int32_t n, float *bmax, float *l_max, int32_t *n_finite)
{
    const int32_t nb = n_blocks(n);
    int32_t k_row = INT32_MIN;
    int32_t nf = 0;
    for (int32_t b = 0; b < nb; ++b) {
        const int32_t lo = b * CG_BLOCK;
        const int32_t hi = n - lo < CG_BLOCK ? n : lo + CG_BLOCK;
        int32_t k_max = INT32_MIN;
        int32_t k_min = INT32_MAX;
        int32_t fin = 0;
        for (int32_t i = lo; i < hi; ++i) {
            const int32_t k = skey(l[i]);
            k_max = k > k_max ? k : k_max;
            k_min = k < k_min ? k : k_min;
            fin += k > SKEY_NEG_INF;
        }
        if (k_max >= SKEY_POS_INF || k_min < SKEY_NEG_INF) {
            return CG_ERR_NONFINITE_LOGITS; /* +inf or a NaN */
        }
        bmax[b] = from_skey(k_max);
        k_row = k_max > k_row ? k_max : k_row;
        nf += fin;
    }
    if (nf == 0) {
        return CG_ERR_NONFINITE_LOGITS; /* every logit is -inf: no distribution */
    }
    *l_max = from_skey(k_row);
    *n_finite = nf;
    return CG_OK;
}

/* Lowest id holding the maximum m: the first block whose max is m, then the first id in it. */
static int32_t first_argmax(const float *l, int32_t n, const float *bmax, float m)
{
    int32_t b = 0;
    while (bmax[b] != m) {
        ++b;
    }
    int32_t i = b * CG_BLOCK;
    while (i < n && l[i] != m) {
        ++i;
    }
    return i;
}

/* (float)x for a finite x, clamped to [-FLT_MAX, FLT_MAX]: converting a double beyond the float
 * range is undefined behaviour in C. */
static float float_clamped(double x)
{
    if (x < -FLT_MAX) {
        return -FLT_MAX;
    }
    if (x > FLT_MAX) {
        return FLT_MAX;
    }
    return (float)x;
}

/* Ids i with l[i] >= thr and l[i] > -inf, ascending, into idx; returns their count. Reads only the
 * blocks whose maximum reaches thr. */
static int32_t collect_at_least(const float *l, int32_t n, const float *bmax, float thr, int32_t *idx)
{
    const int32_t nb = n_blocks(n);
    int32_t c = 0;
    for (int32_t b = 0; b < nb; ++b) {
        if (bmax[b] >= thr && bmax[b] > -INFINITY) {
            const int32_t hi = n - b * CG_BLOCK < CG_BLOCK ? n : (b + 1) * CG_BLOCK;
            for (int32_t i = b * CG_BLOCK; i < hi; ++i) {
                if (l[i] >= thr && l[i] > -INFINITY) {
                    idx[c++] = i;
                }
            }
        }
    }
    return c;
}

/*
 * Top-k candidates into ws->idx (ascending ids), a superset of the top k, usually a few k ids.
 * Bound: the k largest block maxima are k distinct logits, so the k-th largest logit is >= t0, the
 * k-th largest block maximum. Hence every top-k logit is >= t0 and lies in a block whose max >= t0;
 * only those blocks are read. With fewer than k finite blocks, t0 = -inf (every finite logit).
 * Cost: O(V / CG_BLOCK) for the block selection plus CG_BLOCK per block read.
 */
static int32_t topk_candidates(const float *l, int32_t n, int32_t top_k, const cg_ws *ws)
{
    const int32_t nb = n_blocks(n);
    float t0 = -INFINITY;
    if (nb > top_k) {
        const int32_t kb = select_prefix(ws->bmax, NULL, nb, 0, (double)top_k, ws);
        if (kb == top_k) {
            t0 = ws->bmax[pair_id(last_pair(ws->pairs, kb))];
        }
    }
    return collect_at_least(l, n, ws->bmax, t0, ws->idx);
}

/*
 * Top-p candidates into ws->idx (ascending ids): a superset of the top-p prefix P, given the weights
 * w_i = exp(l_i - l_max) and their sum z over the n_finite finite logits.
 * Bound: with c = (1 - top_p) z / n_finite, the tokens with w < c weigh less than c n_finite =
 * (1 - top_p) z in total, so {w >= c} already weighs more than top_p z and, being a top set,
 * contains the shortest one, P. We cut in logit space, l >= l_max + log(c) - 1e-3 (a top set for
 * sure, and the 1e-3 margin covers the error of exp_nonpos), reading only blocks that reach it.
 * For peaked (LLM-like) distributions this leaves a few hundred of the V tokens.
 */
static int32_t topp_candidates(const float *l, int32_t n, float l_max, double z, int32_t n_finite,
                               float top_p, const cg_ws *ws)
{
    const double c = (1.0 - (double)top_p) * z / (double)n_finite; /* < 1: z <= n_finite */
    const float thr = float_clamped((double)l_max + log(c) - 1e-3);
    return collect_at_least(l, n, ws->bmax, thr, ws->idx);
}

/*
 * e_i = exp((l_i - l_max) * inv_t) for ids whose key skey(l_i) >= k_thr, else 0, into e[0 .. n);
 * returns sum_i e_i. The difference is formed in float: it is exact when l_i is within a factor 2
 * of l_max (Sterbenz) and otherwise off by 2^-24 relative, which moves e_i by < 1e-7 of the max.
 * Four double accumulators keep the sum vectorisable (the order is fixed, so it is deterministic).
 */
static double dense_exp(const float *l, int32_t n, float l_max, float inv_t, int32_t k_thr, float *e)
{
    for (int32_t i = 0; i < n; ++i) {
        const float x = l[i];
        const float v = exp_nonpos((x - l_max) * inv_t);
        uint32_t bits;
        memcpy(&bits, &v, sizeof bits);
        bits &= 0u - (uint32_t)(skey(x) >= k_thr); /* all ones to keep, zero to drop */
        memcpy(&e[i], &bits, sizeof bits);
    }
    double zl[4] = {0.0, 0.0, 0.0, 0.0};
    int32_t i = 0;
    for (; i + 4 <= n; i += 4) {
        for (int t = 0; t < 4; ++t) {
            zl[t] += (double)e[i + t];
        }
    }
    for (; i < n; ++i) {
        zl[0] += (double)e[i];
    }
    return (zl[0] + zl[1]) + (zl[2] + zl[3]);
}

/* Arguments already validated; ws carved. probs must not overlap logits (it doubles as scratch). */
static cg_status warp_row(const float *logits, int32_t n_logits, int32_t n_vocab,
                          const cg_sampler_params *sp, float *probs, const cg_ws *ws)
{
    float l_max;
    int32_t n_finite;
    const cg_status st = scan_row(logits, n_logits, ws->bmax, &l_max, &n_finite);
    if (st != CG_OK) {
        return st;
    }
    /* entries past the draft's logits (a draft vocabulary that is a prefix) have probability 0 */
    if (n_vocab > n_logits) {
        memset(probs + n_logits, 0, (size_t)(n_vocab - n_logits) * sizeof *probs);
    }

    if (!(sp->temperature > 0.0f)) { /* greedy: one-hot at the lowest argmax (every warp keeps it) */
        memset(probs, 0, (size_t)n_logits * sizeof *probs);
        probs[first_argmax(logits, n_logits, ws->bmax, l_max)] = 1.0f;
        return CG_OK;
    }

    const double md = (double)l_max;
    const double inv_t = 1.0 / (double)sp->temperature;
    /* float 1/T for the dense loops, kept >= FLT_MIN: T = +inf would give 0 and (-inf) * 0 = NaN;
     * FLT_MIN still maps every finite logit to exp(~0) = 1 (the uniform limit) */
    const float inv_t_f = float_clamped(inv_t) > FLT_MIN ? float_clamped(inv_t) : FLT_MIN;
    const int use_min_p = sp->min_p > 0.0f;
    const double log_min_p = use_min_p ? log((double)sp->min_p) : 0.0; /* <= 0: the argmax passes */
    uint64_t *list = ws->pairs;
    int32_t n_list = -1; /* -1: no explicit kept list; the kept set is every finite logit */

    if (sp->top_k > 0 && sp->top_k < n_finite) {
        const int32_t n_cand = topk_candidates(logits, n_logits, sp->top_k, ws);
        n_list = select_prefix(logits, NULL, n_cand, 1, (double)sp->top_k, ws);
        sort_pairs(list, n_list); /* O(top_k log top_k); top-p below needs the descending order */
        if (sp->top_p < 1.0f) {
            /* s_j = exp(l_j - l_max) / Z over the kept list; shortest prefix with sum s >= top_p */
            double z = 0.0;
            for (int32_t j = 0; j < n_list; ++j) {
                z += exp((double)logits[pair_id(list[j])] - md);
            }
            double cum = 0.0;
            for (int32_t j = 0; j < n_list; ++j) {
                cum += exp((double)logits[pair_id(list[j])] - md) / z;
                if (cum >= (double)sp->top_p) {
                    n_list = j + 1;
                    break;
                }
            }
        }
    } else if (sp->top_p < 1.0f) {
        /* top-p over every finite logit: weights w_i = exp(l_i - l_max) (probs as scratch), then the
         * shortest prefix of the descending order with sum w >= top_p * Z, by radix selection over
         * the candidates (the same prefix as sorting, in O(V)) */
        const double z1 = dense_exp(logits, n_logits, l_max, 1.0f, SKEY_NEG_INF + 1, probs);
        const int32_t n_cand = topp_candidates(logits, n_logits, l_max, z1, n_finite, sp->top_p, ws);
        n_list = select_prefix(logits, probs, n_cand, 1, (double)sp->top_p * z1, ws);
    }

    double z = 0.0;
    if (n_list >= 0) {
        /* min-p on the kept list (in place), then softmax at T over what is left */
        if (use_min_p) {
            int32_t m = 0;
            for (int32_t j = 0; j < n_list; ++j) {
                if ((double)logits[pair_id(list[j])] - md >= log_min_p) {
                    list[m++] = list[j];
                }
            }
            n_list = m;
        }
        memset(probs, 0, (size_t)n_logits * sizeof *probs);
        for (int32_t j = 0; j < n_list; ++j) {
            const int32_t i = pair_id(list[j]);
            const double e = exp(((double)logits[i] - md) * inv_t);
            probs[i] = (float)e;
            z += e;
        }
        const double inv_z = 1.0 / z; /* z >= 1: the argmax is in the list */
        for (int32_t j = 0; j < n_list; ++j) {
            const int32_t i = pair_id(list[j]);
            probs[i] = (float)((double)probs[i] * inv_z);
        }
        return CG_OK;
    }

    /* Dense: every finite logit that passes min-p is kept: V exponentials (exp_nonpos). */
    int32_t k_thr = SKEY_NEG_INF + 1; /* keep x > -inf */
    if (use_min_p) {
        /* the smallest float x with (double)x - l_max >= log(min_p), as a key threshold, so the
         * V-long loop compares integers; (double)x - l_max is monotone in x, so this is exact */
        float thr = float_clamped(md + log_min_p);
        while ((double)thr - md < log_min_p) {
            thr = nextafterf(thr, INFINITY);
        }
        while ((double)nextafterf(thr, -INFINITY) - md >= log_min_p) {
            thr = nextafterf(thr, -INFINITY);
        }
        k_thr = skey(thr == 0.0f ? -0.0f : thr); /* -0.0 == +0.0: take the smaller key */
    }
    z = dense_exp(logits, n_logits, l_max, inv_t_f, k_thr, probs);
    const double inv_z = 1.0 / z; /* z >= 1: the argmax contributes exp(0) */
    for (int32_t i = 0; i < n_logits; ++i) {
        probs[i] = (float)((double)probs[i] * inv_z);
    }
    return CG_OK;
}

/* Words of an allowed-token mask over n ids: ceil(n / 32). */
static inline int32_t mask_words(int32_t n) { return (int32_t)(((int64_t)n + 31) / 32); }

/*
 * ml[i] = l[i] if token i is allowed (bit i % 32 of allowed[i / 32]), else -inf, for i in [0, n).
 * Checks the row as given, mask or not: a NaN or +inf anywhere (a disallowed slot hides no fault) or
 * every logit -inf is CG_ERR_NONFINITE_LOGITS, as without a mask; then no allowed finite logit is
 * CG_ERR_EMPTY_MASK. One pass in integer key space (skey), 32 ids per mask word.
 */
static cg_status mask_row(const float *l, int32_t n, const uint32_t *allowed, float *ml)
{
    /* 1 << b from a table: a per-lane variable shift does not vectorise without AVX2 */
    static const uint32_t bit_of[32] = {
        0x1u,       0x2u,       0x4u,       0x8u,       0x10u,       0x20u,       0x40u,       0x80u,
        0x100u,     0x200u,     0x400u,     0x800u,     0x1000u,     0x2000u,     0x4000u,     0x8000u,
        0x10000u,   0x20000u,   0x40000u,   0x80000u,   0x100000u,   0x200000u,   0x400000u,   0x800000u,
        0x1000000u, 0x2000000u, 0x4000000u, 0x8000000u, 0x10000000u, 0x20000000u, 0x40000000u, 0x80000000u};
    int32_t k_max = INT32_MIN; /* over the row as given */
    int32_t k_min = INT32_MAX;
    int32_t k_kept = INT32_MIN; /* over the masked row */
    const int32_t nw = mask_words(n);
    for (int32_t w = 0; w < nw; ++w) {
        const int32_t lo = w * 32;
        const int32_t len = n - lo < 32 ? n - lo : 32;
        const uint32_t bits = allowed[w];
        for (int32_t b = 0; b < len; ++b) {
            const int32_t k = skey(l[lo + b]);
            const int32_t km = (bits & bit_of[b]) ? k : SKEY_NEG_INF;
            k_max = k > k_max ? k : k_max;
            k_min = k < k_min ? k : k_min;
            k_kept = km > k_kept ? km : k_kept;
            ml[lo + b] = from_skey(km); /* the very bits of l[i], or -inf */
        }
    }
    if (k_max >= SKEY_POS_INF || k_min < SKEY_NEG_INF || k_max == SKEY_NEG_INF) {
        return CG_ERR_NONFINITE_LOGITS;
    }
    return k_kept > SKEY_NEG_INF ? CG_OK : CG_ERR_EMPTY_MASK;
}

/* warp_row through the mask when one is given (allowed may be NULL): one branch per row, so a NULL
 * mask costs nothing. probs must not overlap logits or the workspace. */
static cg_status warp_masked(const float *logits, int32_t n_logits, int32_t n_vocab,
                             const uint32_t *allowed, const cg_sampler_params *sp, float *probs,
                             const cg_ws *ws)
{
    if (allowed) {
        const cg_status st = mask_row(logits, n_logits, allowed, ws->ml);
        if (st != CG_OK) {
            return st;
        }
        logits = ws->ml;
    }
    return warp_row(logits, n_logits, n_vocab, sp, probs, ws);
}

static cg_status check_warp_args(const float *logits, int32_t n_logits, int32_t n_vocab,
                                 const cg_sampler_params *sp, const float *probs, const float *work)
{
    if (!logits || !probs || !work || n_vocab < 1 || n_logits < 1 || n_logits > n_vocab) {
        return CG_ERR_BAD_ARGUMENT;
    }
    return check_sampler_params(sp);
}

cg_status cg_warp(const float *logits, int32_t n_logits, int32_t n_vocab, const uint32_t *allowed,
                  const cg_sampler_params *sp, float *probs, float *work)
{
    const cg_status st = check_warp_args(logits, n_logits, n_vocab, sp, probs, work);
    if (st != CG_OK) {
        return st;
    }
    const cg_ws ws = ws_carve(work, n_vocab);
    return warp_masked(logits, n_logits, n_vocab, allowed, sp, probs, &ws);
}

/* ================================================================================================
 * 6. Sampling
 *
 * Every random token the helper emits (cg_sample_probs, cg_warp_sample, greedy's x ~ q, the
 * residual and the bonus of cg_verify) is drawn by one routine, wl_pick, from a weight list: the
 * positive weights of the row being drawn from, materialised in ascending token-id order into the
 * workspace (ids in idx, weights as double in wts; section 3). Each caller only builds its list
 * (wl_support here for a probability row; section 8 derives the residual lists from q's support).
 *
 * Inverse CDF: with weights w (not necessarily normalised) and W = sum_i w_i, a uniform u in [0, 1)
 * picks the first i whose running sum exceeds t = u * W. Running sums are sequential in id order and
 * skip zero weights (the list holds only positive ones; skipping them is exact, adding +0.0 changes
 * nothing), so they reproduce W and never stop on a zero-weight token. Floats convert to double
 * exactly, so a list built from a float row sums and draws exactly as the row itself would.
 * Last-index guard: u * W can round up to W, leaving every running sum <= t; we then return the last
 * token with positive weight instead of running off the end.
 * ============================================================================================= */

/* A weight list: id int32 [m] ascending, w double [m] all > 0 (storage: ws->idx and ws->wts). */
typedef struct {
    int32_t *id;
    double *w;
    int32_t m;
} cg_wlist;

/* Offer (i, x) as the next entry of a list being built in id order: kept iff x > 0 (zero and
 * negative terms skipped). Branch-free: the slot m is written either way and only advanced for a
 * kept entry. Filtering a list in place is safe: the slot written, m, is never past the entry
 * being read. */
static inline void wl_offer(cg_wlist *wl, int32_t i, double x)
{
    wl->id[wl->m] = i;
    wl->w[wl->m] = x;
    wl->m += x > 0.0;
}

/* Empty a list to filter it in place (wl_offer refills it from the front); returns its old length. */
static inline int32_t wl_restart(cg_wlist *wl)
{
    const int32_t m = wl->m;
    wl->m = 0;
    return m;
}

/* W: the sequential sum of the list's weights, in id order. Not accumulated while lists are built:
 * a running sum is a chain of dependent additions, so it is paid once, over the final list only. */
static double wl_total(const cg_wlist *wl)
{
    double s = 0.0;
    for (int32_t j = 0; j < wl->m; ++j) {
        s += wl->w[j];
    }
    return s;
}

/* The inverse-CDF draw: the first listed token whose running sum exceeds t. */
static int32_t wl_pick(const cg_wlist *wl, double t)
{
    double cum = 0.0;
    for (int32_t j = 0; j < wl->m; ++j) {
        cum += wl->w[j];
        if (cum > t) {
            return wl->id[j];
        }
    }
    /* the last-index guard (see above); an empty list (m = 0) is never drawn from */
    return wl->m > 0 ? wl->id[wl->m - 1] : -1;
}

/* Draw from a list with m >= 1 using the uniform u. */
static int32_t wl_draw(const cg_wlist *wl, double u)
{
    return wl_pick(wl, u * wl_total(wl));
}

/* The support of a row (no NaN): its entries > 0 as a weight list. One vectorisable pass per block
 * of CG_BLOCK entries counts the positive ones (for a non-NaN float x, x > 0 iff its bits u satisfy
 * u - 1 < 0x7F800000 unsigned): a block with none is skipped (a warped row cut by top-k or top-p has
 * only a few positive blocks), a block with all of them is copied straight (vectorisable), and a
 * mixed one is compacted branch-free (the slot m <= i < n written by wl_offer always exists). */
static cg_wlist wl_support(const float *x, int32_t n, const cg_ws *ws)
{
    cg_wlist wl = {ws->idx, ws->wts, 0};
    const int32_t nb = n_blocks(n);
    for (int32_t b = 0; b < nb; ++b) {
        const int32_t lo = b * CG_BLOCK;
        const int32_t len = n - lo < CG_BLOCK ? n - lo : CG_BLOCK;
        const float *xb = x + lo;
        int32_t n_pos = 0;
        for (int32_t j = 0; j < len; ++j) {
            uint32_t u;
            memcpy(&u, &xb[j], sizeof u);
            n_pos += u - 1u < UINT32_C(0x7F800000);
        }
        if (n_pos == len) {
            int32_t *id = wl.id + wl.m;
            double *w = wl.w + wl.m;
            for (int32_t j = 0; j < len; ++j) {
                id[j] = lo + j;
                w[j] = (double)xb[j];
            }
            wl.m += len;
        } else if (n_pos > 0) {
            for (int32_t j = 0; j < len; ++j) {
                wl_offer(&wl, lo + j, (double)xb[j]);
            }
        }
    }
    return wl;
}

/* Draw from a valid probability row with positive sum using the given uniform u. */
static int32_t sample_row(const float *w, int32_t n, double u, const cg_ws *ws)
{
    const cg_wlist wl = wl_support(w, n, ws);
    return wl_draw(&wl, u);
}

cg_status cg_sample_probs(const float *probs, int32_t n_vocab, cg_rng *rng, float *work,
                          int32_t *token)
{
    if (!probs || !rng || !work || !token || n_vocab < 1) {
        return CG_ERR_BAD_ARGUMENT;
    }
    const cg_status st = check_prob_row(probs, n_vocab);
    if (st != CG_OK) {
        return st;
    }
    const cg_ws ws = ws_carve(work, n_vocab);
    const cg_wlist wl = wl_support(probs, n_vocab, &ws);
    const double total = wl_total(&wl);
    if (!(total < INFINITY)) {
        return CG_ERR_BAD_DISTRIBUTION; /* finite entries whose sum overflows */
    }
    *token = wl_pick(&wl, cg_rng_uniform(rng) * total);
    return CG_OK;
}

cg_status cg_warp_sample(const float *logits, int32_t n_logits, int32_t n_vocab,
                         const uint32_t *allowed, const cg_sampler_params *sp, cg_rng *rng,
                         float *probs, float *work, int32_t *token)
{
    cg_status st = check_warp_args(logits, n_logits, n_vocab, sp, probs, work);
    if (st != CG_OK) {
        return st;
    }
    if (!rng || !token) {
        return CG_ERR_BAD_ARGUMENT;
    }
    const cg_ws ws = ws_carve(work, n_vocab);
    st = warp_masked(logits, n_logits, n_vocab, allowed, sp, probs, &ws);
    if (st != CG_OK) {
        return st;
    }
    *token = sample_row(probs, n_vocab, cg_rng_uniform(rng), &ws); /* exactly one uniform per call */
    return CG_OK;
}

/* ================================================================================================
 * 7. Cactus gamma
 *
 * Cactus (Hao & Mou 2026) maximises the acceptance of the drafted token n subject to KL(h || q) <= delta.
 * The optimum keeps the shape of q off n:  h[n] = gamma,  h[i] = q[i] (1 - gamma) / (1 - q[n]),  and
 * then KL(h || q) equals the binary KL
 *     D(gamma || q_n) = gamma log(gamma / q_n) + (1 - gamma) log((1 - gamma) / (1 - q_n)).
 * Taylor (the paper's closed form, from D ~ (gamma - q_n)^2 / (2 q_n (1 - q_n))):
 *     gamma = min(1, q_n + sqrt(2 delta q_n (1 - q_n)))
 * Exact: the root of D(gamma || q_n) = delta in [q_n, 1], or 1 when D(1 || q_n) = -log q_n <= delta.
 * delta = 0 returns q_n exactly (both solvers), which makes Cactus bit-for-bit SpS.
 * ============================================================================================= */

/* D(g || q) with 0 log 0 = 0; +inf when g puts mass where q has none.
 * Written with log1p of the relative changes (g - q) / q and (q - g) / (1 - q): for g near q the
 * two terms are each ~ (g - q) and cancel to ~ (g - q)^2 / (2 q (1 - q)); plain log(g / q) carries an
 * absolute error of ~1e-17 there, which made the result negative and the exact solver overshoot
 * budgets below ~1e-16. The max(0, .) guard covers the last-ulp rounding that can remain. */
static double binary_kl(double g, double q)
{
    double a = 0.0;
    double b = 0.0;
    if (g > 0.0) {
        a = g * log1p((g - q) / q); /* q = 0 < g: +inf */
    }
    if (g < 1.0) {
        b = (1.0 - g) * log1p((q - g) / (1.0 - q)); /* q = 1 > g: +inf */
    }
    return a + b > 0.0 ? a + b : 0.0; /* KL >= 0 */
}

static double gamma_taylor(double q, double delta)
{
    const double g = q + sqrt(2.0 * delta * q * (1.0 - q));
    return g < 1.0 ? g : 1.0;
}

/*
 * f(g) = D(g || q) - delta on [q, 1]: f(q) = -delta < 0, f' = logit(g) - logit(q) >= 0 and
 * f'' = 1 / (g (1 - g)) > 0, so f is increasing and convex with one root. Safeguarded Newton: keep a
 * bracket [lo, hi] around the root, take the Newton step when it lands strictly inside the bracket,
 * bisect otherwise (at g = q, f' = 0). Converges to ~1 ulp; capped at 200 iterations.
 */
static double gamma_exact(double q, double delta)
{
    if (-log(q) <= delta) {
        return 1.0; /* f(1) = -log q - delta <= 0: even gamma = 1 fits the budget */
    }
    const double logit_q = log(q / (1.0 - q));
    double lo = q;
    double hi = 1.0;
    double g = gamma_taylor(q, delta);
    if (!(g > lo && g < hi)) {
        g = 0.5 * (lo + hi);
    }
    for (int it = 0; it < 200; ++it) {
        const double f = binary_kl(g, q) - delta;
        if (f == 0.0) {
            return g;
        }
        if (f > 0.0) {
            hi = g;
        } else {
            lo = g;
        }
        const double slope = log(g / (1.0 - g)) - logit_q;
        double g_next = g - f / slope;
        if (!(g_next > lo && g_next < hi)) {
            g_next = 0.5 * (lo + hi); /* Newton left the bracket, or slope = 0 */
        }
        if (g_next == g || hi - lo <= 2.0 * DBL_EPSILON * hi) {
            g = g_next;
            break;
        }
        g = g_next;
    }
    /* The root is only known to a few ulps: never hand back a gamma whose (computed) KL exceeds the
     * budget. lo always satisfies binary_kl(lo, q) <= delta (it starts at q, where the KL is 0). */
    return binary_kl(g, q) <= delta ? g : lo;
}

double cg_cactus_gamma(double q_n, double delta, int32_t solver)
{
    if (isnan(q_n) || !(delta >= 0.0) || (solver != CG_SOLVER_TAYLOR && solver != CG_SOLVER_EXACT)) {
        return NAN; /* invalid input; cg_verify validates before calling */
    }
    if (q_n <= 0.0) {
        return 0.0; /* q[n] = 0: any h[n] > 0 has infinite KL, the token is never accepted */
    }
    if (q_n >= 1.0) {
        return 1.0; /* q[n] = 1: h = q */
    }
    if (delta == 0.0) {
        return q_n; /* no budget: h = q exactly (SpS) */
    }
    return solver == CG_SOLVER_TAYLOR ? gamma_taylor(q_n, delta) : gamma_exact(q_n, delta);
}

/* ================================================================================================
 * 8. Verification
 *
 * Per drafted position i (0-based) with drafted token n, draft row p (or one-hot at n) and
 * q = warp(verifier_logits[i]):
 *   accept n with probability min(1, h[n] / p[n]); on the first rejection emit a residual token
 *   from norm(max(0, h - p)) and stop; if all k are accepted emit a bonus token from
 *   warp(verifier_logits[k]).
 * The acceptance test u < min(1, h[n] / p[n]) is evaluated as u * p[n] < h[n]: the same for
 * p[n] > 0 (u < 1 makes the min(1, .) implicit), and well defined for p[n] = 0, where the draft
 * proposed a token it gives no mass: accept iff h[n] > 0.
 *
 * RNG order (fixed, so the same seed and inputs give the same result):
 *   - one uniform u per evaluated position, drawn right after that position's warp: the acceptance
 *     draw (sps, cactus, topk), the draw of x ~ q (greedy), drawn and unused (typical);
 *   - on a rejection with sps, cactus or topk: one more uniform for the residual draw;
 *     typical (argmax) and greedy (x itself) draw nothing more;
 *   - when all k are accepted: one uniform for the bonus draw.
 * ============================================================================================= */

/* The draft's probability of token i: the row, or one-hot at n for a deterministic drafter. */
static inline double draft_prob(const float *p, int32_t i, int32_t n)
{
    if (p) {
        return (double)p[i];
    }
    return i == n ? 1.0 : 0.0;
}

/* The rescaled target: h[n] = h_n, h[i] = q[i] * scale (i != n). SpS is h_n = q[n], scale = 1. */
static inline double target_prob(const float *q, int32_t i, int32_t n, double h_n, double scale)
{
    return i == n ? h_n : (double)q[i] * scale;
}

/* Residual draw for sps and cactus: r = max(0, h - p), token ~ r / sum(r), with uniform v.
 * Only tokens in supp(q) can have r > 0, since p >= 0 and h vanishes off supp(q): h[i] = q[i] * scale
 * (i != n) with a finite scale, and h[n] (q[n] for SpS, gamma for Cactus) is 0 when q[n] is. So the
 * list starts as q's support and keeps, in id order, the tokens whose r is positive (zero and negative
 * terms skipped, as in section 6): the same terms, in the same order, as a pass over all V ids. */
static int32_t residual_rescaled(const float *q, const float *p, int32_t n, double h_n, double scale,
                                 int32_t n_vocab, double v, const cg_ws *ws)
{
    cg_wlist wl = wl_support(q, n_vocab, ws);
    int32_t m_q = wl_restart(&wl);
    for (int32_t j = 0; j < m_q; ++j) {
        const int32_t i = wl.id[j];
        wl_offer(&wl, i, target_prob(q, i, n, h_n, scale) - draft_prob(p, i, n)); /* kept iff > 0 */
    }
    if (wl.m > 0) { /* m > 0 <=> sum(r) > 0: a sum of positive terms */
        return wl_draw(&wl, v);
    }
    /* All-zero residual: h <= p everywhere, i.e. h = p up to rounding, so the rejection itself had
     * probability ~0. Fall back to a draw from h with the same v. h has positive mass: gamma > 0,
     * or gamma = q[n] = 0 and scale = 1, leaving q's mass. */
    wl = wl_support(q, n_vocab, ws);
    m_q = wl_restart(&wl);
    for (int32_t j = 0; j < m_q; ++j) {
        const int32_t i = wl.id[j];
        wl_offer(&wl, i, target_prob(q, i, n, h_n, scale)); /* scale = 0 (gamma = 1) leaves only n */
    }
    return wl_draw(&wl, v);
}

/* Membership of the top set T of q, described by its last element (value cut_v, id cut_id) in the
 * order (q desc, id asc): i in T  <=>  q[i] > cut_v, or q[i] = cut_v and i <= cut_id. */
static inline int in_top(const float *q, int32_t i, float cut_v, int32_t cut_id)
{
    /* q[i] > 0: a token the warped verifier excludes is never in T (T shrinks to q's support) */
    return q[i] > 0.0f && (q[i] > cut_v || (q[i] == cut_v && i <= cut_id));
}

/* Residual draw for topk acceptance: r = max(0, 1[T] - p), with uniform v. T lies in q's support
 * (in_top), so the list starts as q's support and keeps the members of T with r > 0. */
static int32_t residual_topk(const float *q, const float *p, int32_t n, float cut_v, int32_t cut_id,
                             int32_t n_vocab, double v, const cg_ws *ws)
{
    cg_wlist wl = wl_support(q, n_vocab, ws);
    int32_t m_q = wl_restart(&wl);
    for (int32_t j = 0; j < m_q; ++j) {
        const int32_t i = wl.id[j];
        wl_offer(&wl, i, in_top(q, i, cut_v, cut_id) ? 1.0 - draft_prob(p, i, n) : 0.0);
    }
    if (wl.m > 0) {
        return wl_draw(&wl, v);
    }
    /* All-zero residual (|T| = 1 and p one-hot on it, which the test would have accepted): fall back
     * to a draw from h = uniform on T with the same v. */
    wl = wl_support(q, n_vocab, ws);
    m_q = wl_restart(&wl);
    for (int32_t j = 0; j < m_q; ++j) {
        const int32_t i = wl.id[j];
        wl_offer(&wl, i, in_top(q, i, cut_v, cut_id) ? 1.0 : 0.0);
    }
    return wl_draw(&wl, v);
}

/* Typical acceptance's threshold min(eps, alpha exp(-H(q))), H in nats, and argmax q (lowest id). */
static double typical_threshold(const float *q, int32_t n_vocab, const cg_accept_params *ap,
                                int32_t *argmax)
{
    double entropy = 0.0;
    int32_t arg = 0;
    float q_max = q[0];
    for (int32_t i = 0; i < n_vocab; ++i) {
        const float x = q[i];
        if (x > 0.0f) {
            entropy -= (double)x * log((double)x); /* 0 log 0 = 0: zeros skipped */
            if (x > q_max) {
                q_max = x;
                arg = i;
            }
        }
    }
    *argmax = arg;
    const double a_thr = ap->typical_alpha * exp(-entropy);
    return ap->typical_epsilon < a_thr ? ap->typical_epsilon : a_thr;
}

/* Top-k acceptance's set T: the top K = min(accept_top_k, V, |supp q|) tokens of q (ties -> lower
 * id), left in ws->pairs[0, m) (m = min(accept_top_k, V) selected, m_pos of them with q > 0, so
 * tokens the warped verifier excludes are never in T), with its last element for in_top. */
typedef struct {
    int32_t m;
    int32_t m_pos; /* |T| >= 1 (q sums to 1) */
    float cut_v;
    int32_t cut_id;
} top_set;

static top_set top_set_of(const float *q, int32_t n_vocab, const cg_accept_params *ap,
                          const cg_ws *ws)
{
    top_set t;
    const int32_t kk = ap->accept_top_k < n_vocab ? ap->accept_top_k : n_vocab;
    t.m = select_prefix(q, NULL, n_vocab, 0, (double)kk, ws); /* = kk */
    t.m_pos = 0;
    for (int32_t j = 0; j < t.m; ++j) {
        t.m_pos += q[pair_id(ws->pairs[j])] > 0.0f;
    }
    t.cut_id = pair_id(last_pair(ws->pairs, t.m)); /* last of the top m; m = kk >= 1 */
    t.cut_v = q[t.cut_id];
    return t;
}

/* What a rule needs of q at a position beyond q itself, computed once per position for the
 * emitted law and the acceptance test: typical's threshold and argmax, topk's set T. */
typedef struct {
    double thr;    /* typical */
    int32_t arg;   /* typical: argmax q, lowest id */
    top_set top;   /* topk (its selection stays in ws->pairs until the next select_prefix) */
} rule_set;

static rule_set rule_set_of(const float *q, int32_t n_vocab, const cg_accept_params *ap,
                            const cg_ws *ws)
{
    rule_set rs;
    memset(&rs, 0, sizeof rs);
    if (ap->method == CG_METHOD_TYPICAL) {
        rs.thr = typical_threshold(q, n_vocab, ap, &rs.arg);
    } else if (ap->method == CG_METHOD_TOPK) {
        rs.top = top_set_of(q, n_vocab, ap, ws);
    }
    return rs;
}

/* Outcome of one position's acceptance test. */
typedef struct {
    int accepted;
    int32_t token; /* the emitted token at this position: n if accepted, else the residual token */
    double kl;     /* KL(h || q) of the target used at this position, nats */
} position_outcome;

static void evaluate_position(const float *q, const float *p, int32_t n, int32_t n_vocab,
                              const cg_accept_params *ap, const rule_set *rs, const cg_ws *ws,
                              cg_rng *rng, position_outcome *o)
{
    const double q_n = (double)q[n];
    const double p_n = draft_prob(p, n, n);
    const double u = cg_rng_uniform(rng); /* the position's one draw, for every method */
    o->token = n;
    o->kl = 0.0;

    switch (ap->method) {
    case CG_METHOD_SPS:
    case CG_METHOD_CACTUS: {
        /* SpS: h = q.  Cactus: h[n] = gamma, h[i] = q[i] (1 - gamma) / (1 - q[n]).
         * scale stays exactly 1 when gamma = q[n] (delta = 0, q[n] in {0, 1}), so delta = 0 runs the
         * very same arithmetic as SpS; otherwise gamma > q[n], hence 1 - q[n] > 0 (no 0/0), and
         * gamma = 1 gives scale = 0 (h one-hot at n). */
        double h_n = q_n;
        double scale = 1.0;
        if (ap->method == CG_METHOD_CACTUS) {
            h_n = cg_cactus_gamma(q_n, ap->delta, ap->solver);
            if (h_n != q_n) {
                scale = (1.0 - h_n) / (1.0 - q_n);
            }
            o->kl = binary_kl(h_n, q_n); /* = KL(h || q) for this h; 0 when gamma = q[n] */
        }
        o->accepted = u * p_n < h_n;
        if (!o->accepted) {
            o->token = residual_rescaled(q, p, n, h_n, scale, n_vocab, cg_rng_uniform(rng), ws);
        }
        break;
    }
    case CG_METHOD_TYPICAL: {
        /* accept iff q[n] > thr; else emit argmax q (lowest id). h is one-hot on the emitted token
         * x, so KL(h || q) = -log q[x] (q[x] > 0 either way). */
        o->accepted = q_n > rs->thr;
        if (!o->accepted) {
            o->token = rs->arg;
        }
        o->kl = 0.0 - log((double)q[o->token]); /* 0.0 - : q = 1 gives +0, not -0 */
        break;
    }
    case CG_METHOD_TOPK: {
        /* accept iff n in T; h = uniform on T, so KL(h || q) = sum_{i in T} (1/K) log((1/K) / q_i),
         * finite. */
        const top_set t = rs->top;
        /* KL = -(1/K) sum_{i in T} log(K q_i): summing log(K q_i) (near 0 when q is flat on T)
         * avoids the cancellation of -log K - mean(log q_i) */
        double sum_log_kq = 0.0;
        for (int32_t j = 0; j < t.m; ++j) {
            const float qi = q[pair_id(ws->pairs[j])];
            if (qi > 0.0f) {
                sum_log_kq += log((double)t.m_pos * (double)qi);
            }
        }
        const double kl = t.m_pos > 0 ? -sum_log_kq / (double)t.m_pos : 0.0;
        o->kl = kl > 0.0 ? kl : 0.0; /* KL >= 0; rounding can leave -1e-17 when q is flat on T */
        o->accepted = in_top(q, n, t.cut_v, t.cut_id);
        if (!o->accepted) {
            o->token = residual_topk(q, p, n, t.cut_v, t.cut_id, n_vocab, cg_rng_uniform(rng), ws);
        }
        break;
    }
    default: { /* CG_METHOD_GREEDY (validated): x ~ q with u; accept iff x = n; else emit x. h = q. */
        const int32_t x = sample_row(q, n_vocab, u, ws);
        o->accepted = x == n;
        o->token = x;
        break;
    }
    }
}

/* ================================================================================================
 * 9. The emitted law
 *
 * A drafted position emits its drafted token n (drawn from p) when the test accepts it, else a
 * residual token, so the token it emits follows the mixture (cactus-notes.md, "What delta bounds")
 *     P(x) = sum_n p[n] (1[x = n] a_n + (1 - a_n) r_n[x]),  a_n = min(1, h_n[n] / p[n]),
 *     r_n = norm(max(0, h_n - p)).
 * SpS and greedy emit q exactly (P = q). Typical and topk accept on a set A that does not depend on
 * the draft, with one residual r for every rejection: P(x) = p[x] 1[x in A] + rho r[x], rho = the
 * mass p puts outside A (typical: r one-hot on argmax q; topk: r = norm(1[T] - p) on T).
 *
 * Cactus: h_n[n] = g_n, h_n[i] = s_n q[i] (i != n), s_n = (1 - g_n) / (1 - q[n]) in [0, 1]. With
 * m_n = p[n] - g_n: if m_n <= 0 the draft is always accepted and adds p[n] at n; else it adds g_n
 * at n and m_n r_n elsewhere, r_n[x] = max(0, s_n q[x] - p[x]) / Z_n (r_n[n] = 0 since h_n[n] < p[n]),
 * Z_n = sum_i max(0, s_n q[i] - p[i]). The term at i is positive iff t_i = p[i] / q[i] < s_n (and
 * t_n > 1 >= s_n excludes i = n by itself), so with w_n = m_n / Z_n
 *     Z_n  = s_n Q(s_n) - Pp(s_n),   Q(s) = sum_{t_i < s} q[i],  Pp(s) = sum_{t_i < s} p[i],
 *     P(x) = min(p[x], g_x) + q[x] sum_{n in R: s_n > t_x} w_n s_n - p[x] sum_{n in R: s_n > t_x} w_n
 * over the rejectable drafts R = {n : m_n > 0}. Sorting R by s, one pass over supp(q) drops each
 * q[i], p[i] into the bucket of the first s above t_i (binary search) and prefix sums give Q, Pp at
 * every s_n; suffix sums of w s and w then give each P(x) with one more binary search. Every draft
 * with q[n] = 0 (g = 0, s = 1, all of p[n] rejected: h = q) shares one entry of R. Tokens outside
 * supp(q) get P = 0 (g = 0 there and s q - p <= 0), so KL(P || q) is finite. Exact, in
 * O(|supp q| log |R| + |R| log |R|) instead of the O(|supp p| |supp q|) of the sum over n.
 * Exact solver shortcut: a token with p[x] > q[x] and D(p[x] || q[x]) <= delta has g_x >= p[x]
 * (D increases on [q, 1]), so it is always accepted and needs no root (the test's own gamma may sit
 * an ulp below p[x]: an acceptance of 1 - 1e-16 read as 1).
 * A draft whose Z rounds to <= 0 (h_n = p up to rounding, so its rejection has probability ~0;
 * cg_verify then draws from h_n) is left out of the residual sums: P loses at most its m_n ~ 1e-7.
 * ============================================================================================= */

/* Whether a draft with p > q is accepted with probability 1 (gamma >= p), decided without a
 * root or a square root where possible. Taylor: q + sqrt(2 delta q (1 - q)) >= p  <=>
 * (p - q)^2 <= 2 delta q (1 - q). Exact: gamma >= p <=> D(p || q) <= delta (D increases on [q, 1]),
 * and D <= chi^2 = (p - q)^2 / (q (1 - q)) settles most tokens of a long tail without a log. */
static inline int always_accepted(double p, double q, double delta, int32_t solver)
{
    if (delta == 0.0) {
        return 0;
    }
    const double d2 = (p - q) * (p - q);
    const double v = q * (1.0 - q);
    if (solver == CG_SOLVER_TAYLOR) {
        return d2 <= 2.0 * delta * v;
    }
    return d2 <= delta * v || binary_kl(p, q) <= delta;
}

/* log x for a positive normal double, in a form that vectorises: x = 2^e m with m in
 * [sqrt(1/2), sqrt(2)), log m = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.1716, by its series to
 * s^15: absolute error < 1e-14. Only the KL sums use it (one log per support token). */
static inline double log_fast(double x)
{
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    int64_t e = (int64_t)((u >> 52) & 0x7FF) - 1023;
    u = (u & UINT64_C(0x000FFFFFFFFFFFFF)) | UINT64_C(0x3FF0000000000000);
    double m;
    memcpy(&m, &u, sizeof m);
    const int big = m > 1.4142135623730951;
    m = big ? 0.5 * m : m;
    e += big;
    const double s = (m - 1.0) / (m + 1.0);
    const double z = s * s;
    const double series = 2.0 / 13.0 + z * (2.0 / 15.0);
    const double poly = 2.0 + z * (2.0 / 3.0 + z * (2.0 / 5.0 + z * (2.0 / 7.0 + z * (2.0 / 9.0
                        + z * (2.0 / 11.0 + z * series)))));
    return (double)e * 0.6931471805599453 + s * poly;
}

static int cmp_entry_s(const void *a, const void *b)
{
    const double x = ((const cg_draft_entry *)a)->s;
    const double y = ((const cg_draft_entry *)b)->s;
    return (x > y) - (x < y);
}

/* The first j in [0, m) with e[j].s > t, or m (e sorted by s ascending). Most tokens of a long
 * tail have t above every s: one comparison. */
static int32_t first_above(const cg_draft_entry *e, int32_t m, double t)
{
    if (m == 0 || t >= e[m - 1].s) {
        return m;
    }
    int32_t lo = 0;
    int32_t hi = m;
    while (lo < hi) {
        const int32_t mid = lo + (hi - lo) / 2;
        if (e[mid].s > t) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    return lo;
}

/* sum_{x in supp q} P(x) log(P(x) / q(x)) over a support list whose weights are P: >= 0. */
static double kl_of_list(const cg_wlist *sq, const float *q)
{
    double kl = 0.0;
    for (int32_t j = 0; j < sq->m; ++j) {
        const double px = sq->w[j];
        if (px > 0.0) {
            const double ratio = px / (double)q[sq->id[j]];
            kl += px * (ratio >= DBL_MIN ? log_fast(ratio) : log(ratio));
        }
    }
    return kl > 0.0 ? kl : 0.0;
}

/* Cactus at budget delta: P over q's support (left as the weights of the returned list: ws->idx,
 * ws->wts), its KL and the acceptance. p NULL = one-hot at n. */
static cg_wlist cactus_law(const float *p, int32_t n, const float *q, int32_t n_vocab, double delta,
                           int32_t solver, const cg_ws *ws, double *kl, double *acceptance)
{
    cg_wlist sq = wl_support(q, n_vocab, ws); /* ids of supp q; weights become min(p, g) below */
    cg_draft_entry *e = ws->law;
    int32_t m = 0;
    double p_in = 0.0; /* p's mass on supp q */
    double acc = 0.0;
    for (int32_t j = 0; j < sq.m; ++j) {
        const int32_t i = sq.id[j];
        const double qi = sq.w[j];
        const double pi = draft_prob(p, i, n);
        p_in += pi;
        double direct = pi; /* min(p, g): what token i gets as an accepted draft */
        if (pi > qi && !always_accepted(pi, qi, delta, solver)) {
            const double g = cg_cactus_gamma(qi, delta, solver); /* delta = 0: g = q (SpS) */
            if (g < pi) {
                e[m].s = (1.0 - g) / (1.0 - qi); /* g < p <= 1, so q < 1 */
                e[m].m = pi - g;
                ++m;
                direct = g;
            }
        }
        sq.w[j] = direct;
        acc += direct;
    }
    const double p_out = 1.0 - p_in; /* drafts the verifier excludes: all rejected, residual from q */
    if (p_out > 0.0) {
        e[m].s = 1.0;
        e[m].m = p_out;
        ++m;
    }
    qsort(e, (size_t)m, sizeof *e, cmp_entry_s);
    for (int32_t r = 0; r <= m; ++r) {
        e[r].a = 0.0;
        e[r].b = 0.0;
    }
    for (int32_t j = 0; j < sq.m; ++j) { /* buckets: q[i], p[i] at the first s above t_i */
        const int32_t i = sq.id[j];
        const double qi = (double)q[i];
        const double pi = draft_prob(p, i, n);
        const int32_t r = first_above(e, m, pi / qi);
        e[r].a += qi;
        e[r].b += pi;
    }
    double cq = 0.0;
    double cp = 0.0;
    for (int32_t r = 0; r < m; ++r) { /* prefix sums: Q(s_r), Pp(s_r); then w_r = m_r / Z_r */
        cq += e[r].a;
        cp += e[r].b;
        const double z = e[r].s * cq - cp;
        e[r].m = z > 0.0 ? e[r].m / z : 0.0;
    }
    e[m].a = 0.0;
    e[m].b = 0.0;
    for (int32_t r = m - 1; r >= 0; --r) { /* suffix sums of w s and w */
        e[r].a = e[r + 1].a + e[r].m * e[r].s;
        e[r].b = e[r + 1].b + e[r].m;
    }
    for (int32_t j = 0; j < sq.m; ++j) {
        const int32_t i = sq.id[j];
        const double qi = (double)q[i];
        const double pi = draft_prob(p, i, n);
        const int32_t r = first_above(e, m, pi / qi);
        const double inflow = qi * e[r].a - pi * e[r].b; /* a sum of positive terms: clamp rounding */
        sq.w[j] += inflow > 0.0 ? inflow : 0.0;
    }
    *kl = kl_of_list(&sq, q);
    *acceptance = acc;
    return sq;
}

/* The per-draft budget of the output budget: the largest delta' in [0, delta] found by bisection
 * whose law keeps KL(P || q) <= delta (delta' = delta when that already does; delta' = 0, SpS, is
 * always feasible). Only feasible points are kept, so the bound holds whatever the shape of
 * KL(P_delta' || q); when it increases with delta' (as acceptance does), delta' is the largest to
 * within delta 2^-CG_OUTPUT_STEPS. */
#define CG_OUTPUT_STEPS 20

static double output_delta(const float *p, int32_t n, const float *q, int32_t n_vocab,
                           const cg_accept_params *ap, const cg_ws *ws, double *kl_used)
{
    double kl;
    double acc;
    *kl_used = 0.0; /* delta' = 0 is SpS: KL 0 */
    if (ap->delta == 0.0) {
        return 0.0;
    }
    cactus_law(p, n, q, n_vocab, ap->delta, ap->solver, ws, &kl, &acc);
    if (kl <= ap->delta) {
        *kl_used = kl;
        return ap->delta;
    }
    double lo = 0.0;
    double hi = ap->delta; /* finite: at delta = inf every draft is accepted, P = p, KL finite */
    for (int it = 0; it < CG_OUTPUT_STEPS; ++it) {
        const double mid = 0.5 * (lo + hi);
        cactus_law(p, n, q, n_vocab, mid, ap->solver, ws, &kl, &acc);
        if (kl <= ap->delta) {
            lo = mid;
            *kl_used = kl; /* the law at the delta' returned: no need to evaluate it again */
        } else {
            hi = mid;
        }
    }
    return lo;
}

/* The law at one position, for any rule: KL(P || q), acceptance, and P in `law` when non-NULL.
 * For Cactus it runs at `delta` (the caller resolves the output budget first). */
static void position_law(const float *p, int32_t n, const float *q, int32_t n_vocab,
                         const cg_accept_params *ap, double delta, const rule_set *rs,
                         const cg_ws *ws, double *law, cg_law *out)
{
    out->kl = 0.0;
    out->acceptance = 0.0;
    out->delta = 0.0;
    if (law) {
        for (int32_t i = 0; i < n_vocab; ++i) {
            law[i] = 0.0;
        }
    }
    if (ap->method == CG_METHOD_CACTUS && delta > 0.0) { /* delta = 0 is SpS: P = q below */
        const cg_wlist sq = cactus_law(p, n, q, n_vocab, delta, ap->solver, ws, &out->kl,
                                       &out->acceptance);
        out->delta = delta;
        if (law) {
            for (int32_t j = 0; j < sq.m; ++j) {
                law[sq.id[j]] = sq.w[j];
            }
        }
        return;
    }
    cg_wlist sq = wl_support(q, n_vocab, ws); /* P lives on supp q for every rule */
    const int exact = ap->method == CG_METHOD_SPS || ap->method == CG_METHOD_GREEDY
                      || ap->method == CG_METHOD_CACTUS; /* here cactus has delta = 0 */
    if (exact) {
        for (int32_t j = 0; j < sq.m; ++j) {
            const double pi = draft_prob(p, sq.id[j], n);
            const double qi = sq.w[j];
            out->acceptance += ap->method == CG_METHOD_GREEDY ? pi * qi : (pi < qi ? pi : qi);
        }
    } else if (ap->method == CG_METHOD_TYPICAL) {
        const double thr = rs->thr;
        const int32_t arg = rs->arg;
        int32_t j_arg = 0;
        for (int32_t j = 0; j < sq.m; ++j) {
            const int32_t i = sq.id[j];
            const double pi = draft_prob(p, i, n);
            sq.w[j] = (double)q[i] > thr ? pi : 0.0;
            out->acceptance += sq.w[j];
            j_arg = i == arg ? j : j_arg;
        }
        const double rho = 1.0 - out->acceptance;
        sq.w[j_arg] += rho > 0.0 ? rho : 0.0; /* every rejection emits argmax q */
        out->kl = kl_of_list(&sq, q);
    } else { /* CG_METHOD_TOPK */
        const top_set t = rs->top;
        double z = 0.0;
        for (int32_t j = 0; j < sq.m; ++j) {
            const int32_t i = sq.id[j];
            const int in = in_top(q, i, t.cut_v, t.cut_id);
            const double pi = draft_prob(p, i, n);
            sq.w[j] = in ? pi : 0.0;
            out->acceptance += sq.w[j];
            z += in ? 1.0 - pi : 0.0;
        }
        const double rho = 1.0 - out->acceptance > 0.0 ? 1.0 - out->acceptance : 0.0;
        for (int32_t j = 0; j < sq.m; ++j) { /* residual norm(1[T] - p), or uniform on T if 0 */
            const int32_t i = sq.id[j];
            if (in_top(q, i, t.cut_v, t.cut_id)) {
                const double pi = draft_prob(p, i, n);
                sq.w[j] += z > 0.0 ? rho * (1.0 - pi) / z : rho / (double)t.m_pos;
            }
        }
        out->kl = kl_of_list(&sq, q);
    }
    if (law) {
        for (int32_t j = 0; j < sq.m; ++j) {
            law[sq.id[j]] = exact ? (double)q[sq.id[j]] : sq.w[j];
        }
    }
}

cg_status cg_emitted_law(const float *p, int32_t token, const float *q, int32_t n_vocab,
                         const cg_accept_params *ap, float *work, double *law, cg_law *out)
{
    if (!out) {
        return CG_ERR_BAD_ARGUMENT;
    }
    memset(out, 0, sizeof *out);
    if (!q || !work || n_vocab < 1 || (!p && (token < 0 || token >= n_vocab))) {
        return CG_ERR_BAD_ARGUMENT;
    }
    cg_status st = check_accept_params(ap);
    if (st == CG_OK) {
        st = check_prob_row(q, n_vocab);
    }
    if (st == CG_OK && p) {
        st = check_prob_row(p, n_vocab);
    }
    if (st != CG_OK) {
        return st;
    }
    const cg_ws ws = ws_carve(work, n_vocab);
    double delta = ap->delta;
    if (ap->method == CG_METHOD_CACTUS && ap->budget == CG_BUDGET_OUTPUT) {
        double kl_used;
        delta = output_delta(p, token, q, n_vocab, ap, &ws, &kl_used);
    }
    const rule_set rs = rule_set_of(q, n_vocab, ap, &ws);
    position_law(p, token, q, n_vocab, ap, delta, &rs, &ws, law, out);
    return CG_OK;
}

cg_status cg_verify(const float *draft_probs, const int32_t *draft_tokens,
                    const float *verifier_logits, const uint32_t *allowed, int32_t k, int32_t n_vocab,
                    const cg_sampler_params *sp, const cg_accept_params *ap, cg_rng *rng,
                    float *work, cg_step_result *out)
{
    if (!out) {
        return CG_ERR_BAD_ARGUMENT;
    }
    memset(out, 0, sizeof *out); /* on any error the result reads as all zeros */
    if (!verifier_logits || !rng || !work || k < 0 || n_vocab < 1 || (k > 0 && !draft_tokens)) {
        return CG_ERR_BAD_ARGUMENT;
    }
    cg_status st = check_sampler_params(sp);
    if (st == CG_OK) {
        st = check_accept_params(ap);
    }
    if (st != CG_OK) {
        return st;
    }
    for (int32_t i = 0; i < k; ++i) {
        if (draft_tokens[i] < 0 || draft_tokens[i] >= n_vocab) {
            return CG_ERR_BAD_ARGUMENT;
        }
    }
    if (draft_probs) {
        for (int32_t i = 0; i < k; ++i) {
            st = check_prob_row(draft_probs + (size_t)i * (size_t)n_vocab, n_vocab);
            if (st != CG_OK) {
                return st;
            }
        }
    }

    const cg_ws ws = ws_carve(work, n_vocab);
    float *q = ws.q;
    const size_t nw = (size_t)mask_words(n_vocab); /* words per row of the mask */
    const int output_budget = ap->method == CG_METHOD_CACTUS && ap->budget == CG_BUDGET_OUTPUT;
    const int has_law = (ap->output_kl || output_budget)
                        && (ap->method == CG_METHOD_CACTUS || ap->method == CG_METHOD_TYPICAL
                            || ap->method == CG_METHOD_TOPK); /* sps, greedy: P = q, KL 0 */
    cg_accept_params at = *ap; /* the position's rule: the output budget changes delta */
    for (int32_t i = 0; i < k; ++i) {
        const float *row = verifier_logits + (size_t)i * (size_t)n_vocab;
        const uint32_t *mask = allowed ? allowed + (size_t)i * nw : NULL;
        st = warp_masked(row, n_vocab, n_vocab, mask, sp, q, &ws);
        if (st != CG_OK) {
            memset(out, 0, sizeof *out);
            return st;
        }
        const float *p = draft_probs ? draft_probs + (size_t)i * (size_t)n_vocab : NULL;
        const int32_t n = draft_tokens[i];
        double kl_out = 0.0; /* KL(P || q) of this position's emitted law */
        const rule_set rs = rule_set_of(q, n_vocab, ap, &ws);
        if (output_budget) {
            at.delta = output_delta(p, n, q, n_vocab, ap, &ws, &kl_out); /* its search has it */
        } else if (has_law && !(ap->method == CG_METHOD_CACTUS && at.delta == 0.0)) { /* SpS: 0 */
            cg_law law;
            position_law(p, n, q, n_vocab, &at, at.delta, &rs, &ws, NULL, &law);
            kl_out = law.kl;
        }
        out->output_kl_sum += kl_out;
        out->output_kl_max = kl_out > out->output_kl_max ? kl_out : out->output_kl_max;
        out->delta_sum += ap->method == CG_METHOD_CACTUS ? at.delta : 0.0;
        position_outcome o;
        evaluate_position(q, p, n, n_vocab, &at, &rs, &ws, rng, &o);
        out->kl_sum += o.kl;
        out->kl_max = o.kl > out->kl_max ? o.kl : out->kl_max;
        if (!o.accepted) {
            out->n_accepted = i;
            out->next_token = o.token;
            out->n_evaluated = i + 1;
            return CG_OK;
        }
    }

    /* all k accepted (or k = 0): the bonus token from q at position k */
    st = warp_masked(verifier_logits + (size_t)k * (size_t)n_vocab, n_vocab, n_vocab,
                     allowed ? allowed + (size_t)k * nw : NULL, sp, q, &ws);
    if (st != CG_OK) {
        memset(out, 0, sizeof *out);
        return st;
    }
    out->n_accepted = k;
    out->next_token = sample_row(q, n_vocab, cg_rng_uniform(rng), &ws);
    out->n_evaluated = k;
    return CG_OK;
}
