/*
 * law.c - the exact law of the token a drafted position emits, for every rule, and the output
 * budget (docs/maths.md, "The emitted law" and "The output budget").
 *
 * A drafted position emits its drafted token n (drawn from p) when the test accepts it, else a
 * residual token, so the token it emits follows the mixture
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
 */
#include "cg_internal.h"

#include <stdlib.h> /* qsort (sorts in place, allocates nothing) */

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
    return d2 <= delta * v || cgi_binary_kl(p, q) <= delta;
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

/* Cactus, first pass over supp q (the list sq, weights q on entry): each token's direct mass
 * min(p, g) replaces its weight, the rejectable drafts go to e (returns their number), *acc gets
 * the acceptance sum_n min(p[n], g_n). */
static int32_t cactus_direct(const cg_position *pos, double delta, cg_wlist *sq, double *acc)
{
    cg_draft_entry *e = pos->ws->law;
    int32_t m = 0;
    double p_in = 0.0; /* p's mass on supp q */
    double a = 0.0;
    for (int32_t j = 0; j < sq->m; ++j) {
        const int32_t i = sq->id[j];
        const double qi = sq->w[j];
        const double pi = draft_prob(pos->p, i, pos->n);
        p_in += pi;
        double direct = pi; /* min(p, g): what token i gets as an accepted draft */
        const double d = cactus_delta_at(pos, delta, qi); /* 0 for a draft top_gap leaves to SpS */
        if (pi > qi && !always_accepted(pi, qi, d, pos->ap->solver)) {
            const double g = cg_cactus_gamma(qi, d, pos->ap->solver); /* d = 0: g = q */
            if (g < pi) {
                e[m].s = (1.0 - g) / (1.0 - qi); /* g < p <= 1, so q < 1 */
                e[m].m = pi - g;
                ++m;
                direct = g;
            }
        }
        sq->w[j] = direct;
        a += direct;
    }
    const double p_out = 1.0 - p_in; /* drafts the verifier excludes: all rejected, residual from q */
    if (p_out > 0.0) {
        e[m].s = 1.0;
        e[m].m = p_out;
        ++m;
    }
    *acc = a;
    return m;
}

/* Cactus, the residual inflow: sort the m rejectable drafts by s, bucket q and p at the first s
 * above each t_i, prefix sums give each Z and weight w = m / Z, suffix sums of w s and w give the
 * inflow q[x] sum w s - p[x] sum w added to each token's weight in sq. */
static void cactus_inflow(const cg_position *pos, cg_wlist *sq, int32_t m)
{
    const float *q = pos->q;
    cg_draft_entry *e = pos->ws->law;
    qsort(e, (size_t)m, sizeof *e, cmp_entry_s);
    for (int32_t r = 0; r <= m; ++r) {
        e[r].a = 0.0;
        e[r].b = 0.0;
    }
    for (int32_t j = 0; j < sq->m; ++j) { /* buckets: q[i], p[i] at the first s above t_i */
        const int32_t i = sq->id[j];
        const double qi = (double)q[i];
        const double pi = draft_prob(pos->p, i, pos->n);
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
    for (int32_t j = 0; j < sq->m; ++j) {
        const int32_t i = sq->id[j];
        const double qi = (double)q[i];
        const double pi = draft_prob(pos->p, i, pos->n);
        const int32_t r = first_above(e, m, pi / qi);
        const double inflow = qi * e[r].a - pi * e[r].b; /* a sum of positive terms: clamp rounding */
        sq->w[j] += inflow > 0.0 ? inflow : 0.0;
    }
}

/* Cactus at budget delta: P over q's support (the weights of the returned list: ws->idx, ws->wts),
 * its KL and the acceptance. pos->p NULL = one-hot at pos->n. */
static cg_wlist cactus_law(const cg_position *pos, double delta, double *kl, double *acceptance)
{
    cg_wlist sq = cgi_wl_support(pos->q, pos->n_vocab, pos->ws); /* weights become P below */
    const int32_t m = cactus_direct(pos, delta, &sq, acceptance);
    cactus_inflow(pos, &sq, m);
    *kl = kl_of_list(&sq, pos->q);
    return sq;
}

/* The per-draft budget of the output budget: the largest delta' in [0, delta] found by bisection
 * whose law keeps KL(P || q) <= delta (delta' = delta when that already does; delta' = 0, SpS, is
 * always feasible). Only feasible points are kept, so the bound holds whatever the shape of
 * KL(P_delta' || q); when it increases with delta' (as acceptance does), delta' is the largest to
 * within delta 2^-CG_OUTPUT_STEPS. */
#define CG_OUTPUT_STEPS 20

static double output_delta(const cg_position *pos, double *kl_used)
{
    const double delta = pos->ap->delta;
    double kl;
    double acc;
    *kl_used = 0.0; /* delta' = 0 is SpS: KL 0 */
    if (delta == 0.0) {
        return 0.0;
    }
    cactus_law(pos, delta, &kl, &acc);
    if (kl <= delta) {
        *kl_used = kl;
        return delta;
    }
    double lo = 0.0;
    double hi = delta; /* finite: at delta = inf every draft is accepted, P = p, KL finite */
    for (int it = 0; it < CG_OUTPUT_STEPS; ++it) {
        const double mid = 0.5 * (lo + hi);
        cactus_law(pos, mid, &kl, &acc);
        if (kl <= delta) {
            lo = mid;
            *kl_used = kl; /* the law at the delta' returned: no need to evaluate it again */
        } else {
            hi = mid;
        }
    }
    return lo;
}

#define CG_END_TOLERANCE 1e-6

static inline int in_mask(const uint32_t *mask, int32_t i)
{
    return (int)((mask[i >> 5] >> (i & 31)) & 1u);
}

/* The mass a weight list puts on the ids of mask, summed in id order. */
static double mass_on(const cg_wlist *wl, const uint32_t *mask)
{
    double s = 0.0;
    for (int32_t j = 0; j < wl->m; ++j) {
        s += in_mask(mask, wl->id[j]) ? wl->w[j] : 0.0;
    }
    return s;
}

/* Protected ends: at a position where the verifier's mass on the end set E is q(E) >= end_tau
 * (and > 0), keep the budget d only if the emitted law at d ends at least as often,
 * P(E) >= q(E) - CG_END_TOLERANCE;
 * else run SpS there (d = 0, P = q). So no protected position makes ending less likely than the
 * verifier does: the rule's answers stop where the verifier's would. *kl_out / *has_kl are updated
 * when the law was evaluated. */
static double protect_ends(const cg_position *pos, double d, double *kl_out, int *has_kl)
{
    const uint32_t *mask = pos->ap->end_mask;
    if (!mask || !(d > 0.0)) {
        return d;
    }
    const cg_wlist sq = cgi_wl_support(pos->q, pos->n_vocab, pos->ws); /* weights q */
    const double q_end = mass_on(&sq, mask);
    if (!(q_end > 0.0) || q_end < pos->ap->end_tau) {
        return d;
    }
    double kl;
    double acc;
    const cg_wlist law = cactus_law(pos, d, &kl, &acc);
    /* P(E) = q(E) exactly in arithmetic when the end set's drafts are not relaxed (e.g. top_gap
     * leaves them to SpS): a tolerance above the law's own rounding (a draft whose Z rounds to 0
     * drops its ~1e-7, see the top) keeps such ties on one side */
    if (mass_on(&law, mask) < q_end - CG_END_TOLERANCE) {
        *kl_out = 0.0; /* SpS: P = q */
        *has_kl = 1;
        return 0.0;
    }
    *kl_out = kl;
    *has_kl = 1;
    return d;
}

double cgi_budget_cactus(const cg_position *pos, double *kl_out, int *has_kl)
{
    double d = pos->ap->delta; /* the target budget: the paper's delta for every draft */
    *has_kl = 0;
    if (pos->ap->budget == CG_BUDGET_OUTPUT) {
        *has_kl = 1; /* the search evaluated the law at the delta' it returns */
        d = output_delta(pos, kl_out);
    }
    return protect_ends(pos, d, kl_out, has_kl);
}

/* SpS (and Cactus at delta = 0): P = q; acceptance sum_n min(p[n], q[n]). */
cg_wlist cgi_law_q(const cg_position *pos, const cg_target *t, cg_law *out)
{
    (void)t;
    const cg_wlist sq = cgi_wl_support(pos->q, pos->n_vocab, pos->ws); /* weights q = P */
    double acc = 0.0;
    for (int32_t j = 0; j < sq.m; ++j) {
        const double pi = draft_prob(pos->p, sq.id[j], pos->n);
        const double qi = sq.w[j];
        acc += pi < qi ? pi : qi;
    }
    out->acceptance = acc;
    out->kl = 0.0;
    return sq;
}

/* Greedy: P = q (x ~ q is emitted either way); acceptance sum_n p[n] q[n]. */
cg_wlist cgi_law_greedy(const cg_position *pos, const cg_target *t, cg_law *out)
{
    (void)t;
    const cg_wlist sq = cgi_wl_support(pos->q, pos->n_vocab, pos->ws);
    double acc = 0.0;
    for (int32_t j = 0; j < sq.m; ++j) {
        acc += draft_prob(pos->p, sq.id[j], pos->n) * sq.w[j];
    }
    out->acceptance = acc;
    out->kl = 0.0;
    return sq;
}

cg_wlist cgi_law_cactus(const cg_position *pos, const cg_target *t, cg_law *out)
{
    if (!(pos->ap->delta > 0.0)) {
        return cgi_law_q(pos, t, out); /* delta = 0 is SpS: P = q */
    }
    return cactus_law(pos, pos->ap->delta, &out->kl, &out->acceptance);
}

/* Typical: P = p on A = {q > thr}, plus the mass p puts outside A on argmax q. */
cg_wlist cgi_law_typical(const cg_position *pos, const cg_target *t, cg_law *out)
{
    cg_wlist sq = cgi_wl_support(pos->q, pos->n_vocab, pos->ws); /* P lives on supp q */
    double acc = 0.0;
    int32_t j_arg = 0;
    for (int32_t j = 0; j < sq.m; ++j) {
        const int32_t i = sq.id[j];
        const double pi = draft_prob(pos->p, i, pos->n);
        sq.w[j] = (double)pos->q[i] > t->thr ? pi : 0.0;
        acc += sq.w[j];
        j_arg = i == t->arg ? j : j_arg;
    }
    const double rho = 1.0 - acc;
    sq.w[j_arg] += rho > 0.0 ? rho : 0.0; /* every rejection emits argmax q */
    out->acceptance = acc;
    out->kl = kl_of_list(&sq, pos->q);
    return sq;
}

/* EARS: a_x = min(1, q[x] / p[x] + thr) on supp q (0 off it), so the accepted mass at x is
 * min(p[x], q[x] + thr p[x]); every rejection draws the one residual r = norm(max(0, q - p)) (q
 * itself when that is all zero, as cg_verify's fallback draws h = q), so
 *     P(x) = min(p[x], q[x] + thr p[x]) + rho r[x],   rho = 1 - the accepted mass. */
cg_wlist cgi_law_ears(const cg_position *pos, const cg_target *t, cg_law *out)
{
    cg_wlist sq = cgi_wl_support(pos->q, pos->n_vocab, pos->ws); /* weights q, then P */
    double acc = 0.0;
    double z = 0.0;
    for (int32_t j = 0; j < sq.m; ++j) {
        const double qi = sq.w[j];
        const double pi = draft_prob(pos->p, sq.id[j], pos->n);
        const double reach = ears_reach(qi, pi, t->thr);
        acc += pi < reach ? pi : reach;
        z += qi > pi ? qi - pi : 0.0;
    }
    const double rho = 1.0 - acc > 0.0 ? 1.0 - acc : 0.0;
    for (int32_t j = 0; j < sq.m; ++j) {
        const double qi = sq.w[j];
        const double pi = draft_prob(pos->p, sq.id[j], pos->n);
        const double reach = ears_reach(qi, pi, t->thr);
        const double r = z > 0.0 ? (qi > pi ? qi - pi : 0.0) / z : qi;
        sq.w[j] = (pi < reach ? pi : reach) + rho * r;
    }
    out->acceptance = acc;
    out->kl = kl_of_list(&sq, pos->q);
    return sq;
}

/* Topk: P = p on T, plus the rejected mass rho spread by the residual norm(1[T] - p) (uniform on T
 * when that residual is all zero, as cg_verify's fallback draws). */
cg_wlist cgi_law_topk(const cg_position *pos, const cg_target *t, cg_law *out)
{
    const cg_top_set *top = &t->top;
    cg_wlist sq = cgi_wl_support(pos->q, pos->n_vocab, pos->ws);
    double acc = 0.0;
    double z = 0.0;
    for (int32_t j = 0; j < sq.m; ++j) {
        const int32_t i = sq.id[j];
        const int in = in_top(pos->q, i, top->cut_v, top->cut_id);
        const double pi = draft_prob(pos->p, i, pos->n);
        sq.w[j] = in ? pi : 0.0;
        acc += sq.w[j];
        z += in ? 1.0 - pi : 0.0;
    }
    const double rho = 1.0 - acc > 0.0 ? 1.0 - acc : 0.0;
    for (int32_t j = 0; j < sq.m; ++j) {
        const int32_t i = sq.id[j];
        if (in_top(pos->q, i, top->cut_v, top->cut_id)) {
            const double pi = draft_prob(pos->p, i, pos->n);
            sq.w[j] += z > 0.0 ? rho * (1.0 - pi) / z : rho / (double)top->m_pos;
        }
    }
    out->acceptance = acc;
    out->kl = kl_of_list(&sq, pos->q);
    return sq;
}
