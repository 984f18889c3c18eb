/*
 * cg_internal.h - what the sources of the native helper share; not part of the contract (that is
 * cactus_native.h, which defines V, k, p, q, h, drafted / accepted / residual / bonus and AL).
 *
 *   rng.c     xoshiro256** seeded by splitmix64
 *   abi.c     workspace size and carving, probability-row checks, status names, struct layouts
 *   select.c  O(V) radix selection of a prefix of the order (value desc, token id asc)
 *   warp.c    top-k -> top-p -> min-p -> temperature (llama.cpp's default order), masks
 *   sample.c  weight lists and the one inverse-CDF draw (last-index guard)
 *   gamma.c   the Cactus target mass: Taylor (paper) and exact (binary-KL root) solvers
 *   rules.c   the acceptance rules, one table entry each (target, test, residual, law, budget)
 *   law.c     the exact law of the token a drafted position emits; the output budget
 *   verify.c  one draft-verify step (cg_verify) and cg_emitted_law, for every rule
 *   compact.c the compact step's rows: read from llama.cpp's backend sampler, their union
 * The maths behind them: docs/maths.md.
 *
 * Floating point: probabilities are stored as float32; sums, ratios and the Cactus target are
 * computed in double. Every sum that decides a draw (sampling, residual, acceptance) is sequential
 * in token-id order and skips zero terms (adding +0.0 is exact, so it equals the plain sequential
 * sum a reference computes with cumsum); only softmax normalisers use four lanes. The build turns
 * floating-point contraction off (no a*b-c fused into an FMA), so, given the same q, the decisions
 * match a NumPy reference operation for operation. The V-long loops are written branch-free, in
 * integer key space where float NaN semantics would block vectorisation.
 *
 * Everything declared here without `static` is internal: the library is built with hidden
 * visibility (GCC / Clang) or exports only CG_API functions (Windows), so none of it is exported.
 */
#ifndef CG_INTERNAL_H
#define CG_INTERNAL_H

#define CG_BUILDING_LIBRARY 1 /* CG_API exports (Windows) rather than imports */
#include "cactus_native.h"

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <string.h> /* memcpy, memset */

_Static_assert(sizeof(float) == 4 && FLT_MANT_DIG == 24, "IEEE binary32 float required");

/* ================================================================================================
 * Workspace (abi.c)
 *
 * The caller passes float scratch of cg_workspace_size(V) floats. It is untyped scratch (allocate it
 * with malloc / numpy, do not pass a declared float array): it is carved into the regions below,
 * each only ever accessed through its own type within a call. Layout, in floats:
 *   [0, 1)                    slack to reach 8-byte alignment
 *   pairs  uint64 [V]         2V floats   (order key, token id) of selected candidates
 *   wts    double [V]         2V          weights of the row being drawn from (sample.c)
 *   mass   double [BINS]      2*BINS      radix histogram: weight per bin
 *   cnt    uint32 [BINS]      BINS        radix histogram: count per bin
 *   idx    int32  [V]         V           candidate / undecided token ids during a selection; during
 *                                         a draw, the token ids matching wts (the two uses never
 *                                         overlap in time: a draw starts after the last selection)
 *   bmax   float  [V/BLOCK]   ceil(V/64)  maximum logit of each block of 64 consecutive ids
 *   q      float  [V]         V           cg_verify: the warped verifier distribution at a position
 *   ml     float  [V]         V           a logits row with the disallowed tokens set to -inf (only
 *                                         when an allowed-token mask is given; warp.c)
 *   [.., +1)                  slack to realign to 8 bytes
 *   law    cg_draft_entry [V+2]  8V + 16  the rejectable drafts and their sums (law.c)
 * ============================================================================================= */

#define CG_BINS 2048 /* 2^11: the widest radix digit */
#define CG_BLOCK 64  /* ids per block for the block maxima used by top-k and the support scan */

/* One rejectable draft of the emitted-law computation (law.c). */
typedef struct {
    double s;  /* the target's scale off the drafted token, (1 - gamma) / (1 - q[n]) */
    double m;  /* the rejected mass p[n] - gamma, then the residual weight m / Z */
    double a;  /* bucket / suffix sums (law.c) */
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

/* Blocks of CG_BLOCK ids over n ids: ceil(n / CG_BLOCK). */
static inline int32_t n_blocks(int32_t n) { return (int32_t)(((int64_t)n + CG_BLOCK - 1) / CG_BLOCK); }

/* Words of an allowed-token mask over n ids: ceil(n / 32). */
static inline int32_t mask_words(int32_t n) { return (int32_t)(((int64_t)n + 31) / 32); }

cg_ws cgi_ws_carve(float *work, int32_t n_vocab);

/* A probability row (need not be normalised): every entry finite and >= 0, at least one > 0. */
cg_status cgi_check_prob_row(const float *p, int32_t n);

/* ================================================================================================
 * Order keys and selection (select.c)
 * ============================================================================================= */

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

/* The shortest prefix of the candidates, in the order (vals desc, id asc), whose weight reaches
 * target, into ws->pairs[0 .. return value) (select.c documents the arguments). */
int32_t cgi_select_prefix(const float *vals, const float *w, int32_t n, int from_idx,
                          double target, const cg_ws *ws);

/* Sort selected pairs into (value desc, id asc): O(m log m). */
void cgi_sort_pairs(uint64_t *a, int32_t m);

/* The last selected element in the order (value desc, id asc): the largest pair. m >= 1. */
uint64_t cgi_last_pair(const uint64_t *a, int32_t m);

/* ================================================================================================
 * Warp (warp.c)
 * ============================================================================================= */

cg_status cgi_check_sampler_params(const cg_sampler_params *sp);

/* The checks cg_warp and cg_warp_sample share: pointers, sizes, then the sampler params. */
cg_status cgi_check_warp_args(const float *logits, int32_t n_logits, int32_t n_vocab,
                              const cg_sampler_params *sp, const float *probs, const float *work);

/* Warp one row through its mask when one is given (allowed may be NULL); arguments validated, ws
 * carved. probs must not overlap logits or the workspace. */
cg_status cgi_warp_masked(const float *logits, int32_t n_logits, int32_t n_vocab,
                          const uint32_t *allowed, const cg_sampler_params *sp, float *probs,
                          const cg_ws *ws);

/* ================================================================================================
 * Weight lists (sample.c)
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

/* The support of a row (no NaN): its entries > 0 as a weight list in ws->idx / ws->wts. */
cg_wlist cgi_wl_support(const float *x, int32_t n, const cg_ws *ws);

/* W: the sequential sum of the list's weights, in id order. */
double cgi_wl_total(const cg_wlist *wl);

/* The inverse-CDF draw: the first listed token whose running sum exceeds t (last-index guard). */
int32_t cgi_wl_pick(const cg_wlist *wl, double t);

/* Draw from a list with m >= 1 using the uniform u. */
int32_t cgi_wl_draw(const cg_wlist *wl, double u);

/* Draw from a valid probability row with positive sum using the given uniform u. */
int32_t cgi_sample_row(const float *w, int32_t n, double u, const cg_ws *ws);

/* ================================================================================================
 * The Cactus target (gamma.c)
 * ============================================================================================= */

/* D(g || q), the binary KL in nats, with 0 log 0 = 0; +inf when g puts mass where q has none. */
double cgi_binary_kl(double g, double q);

/* ================================================================================================
 * Acceptance rules (rules.c; their laws in law.c)
 *
 * A rule is one cg_rule entry, indexed by its cg_method. cg_verify and cg_emitted_law run every
 * rule through the same steps at a drafted position, in this order:
 *   budget  the per-draft budget the position runs at (Cactus's output budget searches it)
 *   target  what the test compares against, from q: gamma (sps, cactus), typical's threshold and
 *           argmax, topk's set T; with KL(h || q) where it does not depend on the outcome
 *   law     the exact law P of the token the position emits (only when asked for, or to report
 *           KL(P || q)), drawing nothing
 *   accept  the acceptance test with the position's one uniform u (greedy draws x ~ q with it)
 *   residual on a rejection, the residual token with one more uniform (NULL: the rule emits the
 *           token accept chose, typical's argmax or greedy's x, and draws nothing more)
 * ============================================================================================= */

/* One drafted position. */
typedef struct {
    const float *q;              /* float32 [n_vocab] the warped verifier distribution */
    const float *p;              /* float32 [n_vocab] the warped draft distribution, or NULL:
                                  * one-hot at n (a deterministic drafter) */
    int32_t n;                   /* the drafted token */
    int32_t n_vocab;
    const cg_accept_params *ap;  /* the rule, with delta already the position's budget */
    const cg_ws *ws;
    double q_max;                /* max q (cgi_position_prepare; 0 when no rule needs it) */
    double near;                 /* Cactus's top_gap: a draft i is relaxed iff q[i] >= near,
                                  * max(q) exp(-top_gap) (0: every draft, the paper's) */
} cg_position;

/* Fill pos->q_max and pos->near for the rule in pos->ap (O(V) only when EARS or a finite top_gap
 * needs max q). Call once per position, after q is warped. */
void cgi_position_prepare(cg_position *pos);

/* Cactus's budget at draft i under top_gap: delta when q[i] >= pos->near, else 0 (SpS's target). */
static inline double cactus_delta_at(const cg_position *pos, double delta, double q_i)
{
    return q_i >= pos->near ? delta : 0.0;
}

/* Top-k acceptance's set T: the top K = min(accept_top_k, V, |supp q|) tokens of q (ties -> lower
 * id), left in ws->pairs[0, m) (m = min(accept_top_k, V) selected, m_pos of them with q > 0, so
 * tokens the warped verifier excludes are never in T), with its last element for in_top. */
typedef struct {
    int32_t m;
    int32_t m_pos; /* |T| >= 1 (q sums to 1) */
    float cut_v;
    int32_t cut_id;
} cg_top_set;

/* What the test compares against at one position (the fields its rule uses; the rest stay 0). */
typedef struct {
    double h_n;     /* sps, cactus: h[n] (q[n], or gamma) */
    double scale;   /* sps, cactus: h[i] = q[i] * scale off n, (1 - gamma) / (1 - q[n]) */
    double thr;     /* typical: min(eps, alpha exp(-H(q))) */
    int32_t arg;    /* typical: argmax q, lowest id */
    cg_top_set top; /* topk (its selection stays in ws->pairs until the next selection) */
    double kl;      /* KL(h || q), nats, when known before the test (all but typical) */
} cg_target;

/* Outcome of one position's acceptance test. */
typedef struct {
    int accepted;
    int32_t token; /* the emitted token at this position: n if accepted, else the residual token */
    double kl;     /* KL(h || q) of the target used at this position, nats */
} cg_outcome;

typedef struct {
    const char *name; /* the option's value (cg_method_name) */
    /* The per-draft budget at this position (pos->ap->delta is the requested one): returns it and
     * sets *kl_out to KL(P || q) at it when the search computed the law (*has_kl = 1). NULL: the rule
     * has no budget (delta_sum adds 0). */
    double (*budget)(const cg_position *pos, double *kl_out, int *has_kl);
    /* Fills t from q (NULL: nothing to prepare; t stays zeroed). Draws nothing. */
    void (*target)(const cg_position *pos, cg_target *t);
    /* Whether the emitted law is q itself at this position (KL(P || q) = 0, the law need not be
     * computed to report it). */
    int (*emits_q)(const cg_accept_params *ap);
    /* The emitted law P over supp q as a weight list (weights P; storage ws->idx / ws->wts), with
     * out->kl = KL(P || q) and out->acceptance. Draws nothing. */
    cg_wlist (*law)(const cg_position *pos, const cg_target *t, cg_law *out);
    /* The test with the position's uniform u: o->accepted, o->token (n, or what the rule emits on a
     * rejection when it has no residual), o->kl. */
    void (*accept)(const cg_position *pos, const cg_target *t, double u, cg_outcome *o);
    /* The residual token after a rejection, drawn with the uniform v; NULL: no residual draw. */
    int32_t (*residual)(const cg_position *pos, const cg_target *t, double v);
} cg_rule;

/* The rule of a validated cg_method. */
const cg_rule *cgi_rule(int32_t method);

cg_status cgi_check_accept_params(const cg_accept_params *ap);

/* The draft's probability of token i: the row, or one-hot at n for a deterministic drafter. */
static inline double draft_prob(const float *p, int32_t i, int32_t n)
{
    if (p) {
        return (double)p[i];
    }
    return i == n ? 1.0 : 0.0;
}

/* EARS's reach at a token: q + thr p, the mass its test can accept there (rules.c, law.c). The
 * tolerance is 0 where p is 0, for any thr: thr = inf (alpha = inf) times 0 is taken as its limit,
 * never NaN. */
static inline double ears_reach(double q, double p, double thr)
{
    return p > 0.0 ? q + thr * p : q;
}

/* Membership of the top set T of q, described by its last element (value cut_v, id cut_id) in the
 * order (q desc, id asc): i in T  <=>  q[i] > cut_v, or q[i] = cut_v and i <= cut_id. */
static inline int in_top(const float *q, int32_t i, float cut_v, int32_t cut_id)
{
    /* q[i] > 0: a token the warped verifier excludes is never in T (T shrinks to q's support) */
    return q[i] > 0.0f && (q[i] > cut_v || (q[i] == cut_v && i <= cut_id));
}

/* The laws and the output budget (law.c), for the rule table. */
cg_wlist cgi_law_q(const cg_position *pos, const cg_target *t, cg_law *out);
cg_wlist cgi_law_greedy(const cg_position *pos, const cg_target *t, cg_law *out);
cg_wlist cgi_law_cactus(const cg_position *pos, const cg_target *t, cg_law *out);
cg_wlist cgi_law_typical(const cg_position *pos, const cg_target *t, cg_law *out);
cg_wlist cgi_law_topk(const cg_position *pos, const cg_target *t, cg_law *out);
cg_wlist cgi_law_ears(const cg_position *pos, const cg_target *t, cg_law *out);
double cgi_budget_cactus(const cg_position *pos, double *kl_out, int *has_kl);

#endif /* CG_INTERNAL_H */
