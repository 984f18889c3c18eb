/*
 * warp.c - one logits row into probabilities, in llama.cpp's default order:
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
 */
#include "cg_internal.h"

cg_status cgi_check_sampler_params(const cg_sampler_params *sp)
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
        const int32_t kb = cgi_select_prefix(ws->bmax, NULL, nb, 0, (double)top_k, ws);
        if (kb == top_k) {
            t0 = ws->bmax[pair_id(cgi_last_pair(ws->pairs, kb))];
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

/* The explicit kept list of top-k (then top-p over it) or of top-p alone, in ws->pairs; returns its
 * length, or -1 when neither applies (the kept set is every finite logit). probs is scratch here. */
static int32_t kept_list(const float *logits, int32_t n_logits, float l_max, int32_t n_finite,
                         const cg_sampler_params *sp, float *probs, const cg_ws *ws)
{
    const double md = (double)l_max;
    uint64_t *list = ws->pairs;
    int32_t n_list = -1;
    if (sp->top_k > 0 && sp->top_k < n_finite) {
        const int32_t n_cand = topk_candidates(logits, n_logits, sp->top_k, ws);
        n_list = cgi_select_prefix(logits, NULL, n_cand, 1, (double)sp->top_k, ws);
        cgi_sort_pairs(list, n_list); /* O(top_k log top_k); top-p below needs the descending order */
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
        n_list = cgi_select_prefix(logits, probs, n_cand, 1, (double)sp->top_p * z1, ws);
    }
    return n_list;
}

/* min-p on the kept list (in place), then softmax at T over what is left, into probs. */
static void softmax_list(const float *logits, int32_t n_logits, float l_max, double inv_t,
                         double log_min_p, int use_min_p, uint64_t *list, int32_t n_list,
                         float *probs)
{
    const double md = (double)l_max;
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
    double z = 0.0;
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
}

/* Dense: every finite logit that passes min-p is kept: V exponentials (exp_nonpos). */
static void softmax_dense(const float *logits, int32_t n_logits, float l_max, double inv_t,
                          double log_min_p, int use_min_p, float *probs)
{
    const double md = (double)l_max;
    /* float 1/T for the dense loops, kept >= FLT_MIN: T = +inf would give 0 and (-inf) * 0 = NaN;
     * FLT_MIN still maps every finite logit to exp(~0) = 1 (the uniform limit) */
    const float inv_t_f = float_clamped(inv_t) > FLT_MIN ? float_clamped(inv_t) : FLT_MIN;
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
    const double z = dense_exp(logits, n_logits, l_max, inv_t_f, k_thr, probs);
    const double inv_z = 1.0 / z; /* z >= 1: the argmax contributes exp(0) */
    for (int32_t i = 0; i < n_logits; ++i) {
        probs[i] = (float)((double)probs[i] * inv_z);
    }
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
    const double inv_t = 1.0 / (double)sp->temperature;
    const int use_min_p = sp->min_p > 0.0f;
    const double log_min_p = use_min_p ? log((double)sp->min_p) : 0.0; /* <= 0: the argmax passes */
    const int32_t n_list = kept_list(logits, n_logits, l_max, n_finite, sp, probs, ws);
    if (n_list >= 0) {
        softmax_list(logits, n_logits, l_max, inv_t, log_min_p, use_min_p, ws->pairs, n_list, probs);
    } else {
        softmax_dense(logits, n_logits, l_max, inv_t, log_min_p, use_min_p, probs);
    }
    return CG_OK;
}

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

/* One branch per row, so a NULL mask costs nothing. */
cg_status cgi_warp_masked(const float *logits, int32_t n_logits, int32_t n_vocab,
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

cg_status cgi_check_warp_args(const float *logits, int32_t n_logits, int32_t n_vocab,
                              const cg_sampler_params *sp, const float *probs, const float *work)
{
    if (!logits || !probs || !work || n_vocab < 1 || n_logits < 1 || n_logits > n_vocab) {
        return CG_ERR_BAD_ARGUMENT;
    }
    return cgi_check_sampler_params(sp);
}

cg_status cg_warp(const float *logits, int32_t n_logits, int32_t n_vocab, const uint32_t *allowed,
                  const cg_sampler_params *sp, float *probs, float *work)
{
    const cg_status st = cgi_check_warp_args(logits, n_logits, n_vocab, sp, probs, work);
    if (st != CG_OK) {
        return st;
    }
    const cg_ws ws = cgi_ws_carve(work, n_vocab);
    return cgi_warp_masked(logits, n_logits, n_vocab, allowed, sp, probs, &ws);
}
