/*
 * rules.c - the acceptance rules, one cg_rule entry each (the steps are listed in cg_internal.h;
 * the maths, rule by rule: docs/maths.md).
 *
 * Per drafted position with drafted token n, draft row p (or one-hot at n) and q = warp(verifier
 * row): accept n with probability min(1, h[n] / p[n]); on the first rejection emit a residual token
 * from norm(max(0, h - p)) and stop; if all k are accepted emit a bonus token from the next row's q.
 * The acceptance test u < min(1, h[n] / p[n]) is evaluated as u * p[n] < h[n]: the same for
 * p[n] > 0 (u < 1 makes the min(1, .) implicit), and well defined for p[n] = 0, where the draft
 * proposed a token it gives no mass: accept iff h[n] > 0.
 *
 * Adding a rule: one cg_method value in cactus_native.h (before CG_METHOD_COUNT), one entry in
 * RULES below (its law in law.c), one option value on the Python side.
 */
#include "cg_internal.h"

/* The rescaled target: h[n] = h_n, h[i] = q[i] * scale (i != n). SpS is h_n = q[n], scale = 1. */
static inline double target_prob(const float *q, int32_t i, int32_t n, double h_n, double scale)
{
    return i == n ? h_n : (double)q[i] * scale;
}

/* ---- sps and cactus: h = q, or the Cactus target ------------------------------------------ */

static void sps_target(const cg_position *pos, cg_target *t)
{
    t->h_n = (double)pos->q[pos->n];
    t->scale = 1.0;
    t->kl = 0.0;
}

/* h[n] = gamma, h[i] = q[i] (1 - gamma) / (1 - q[n]). scale stays exactly 1 when gamma = q[n]
 * (delta = 0, q[n] in {0, 1}), so delta = 0 runs the very same arithmetic as SpS; otherwise
 * gamma > q[n], hence 1 - q[n] > 0 (no 0/0), and gamma = 1 gives scale = 0 (h one-hot at n). */
static void cactus_target(const cg_position *pos, cg_target *t)
{
    const double q_n = (double)pos->q[pos->n];
    /* top_gap: a draft far below the verifier's top token gets delta 0, i.e. SpS's h = q */
    t->h_n = cg_cactus_gamma(q_n, cactus_delta_at(pos, pos->ap->delta, q_n), pos->ap->solver);
    t->scale = t->h_n != q_n ? (1.0 - t->h_n) / (1.0 - q_n) : 1.0;
    t->kl = cgi_binary_kl(t->h_n, q_n); /* = KL(h || q) for this h; 0 when gamma = q[n] */
}

static void rescaled_accept(const cg_position *pos, const cg_target *t, double u, cg_outcome *o)
{
    o->accepted = u * draft_prob(pos->p, pos->n, pos->n) < t->h_n;
    o->token = pos->n;
    o->kl = t->kl;
}

/* Residual draw for sps and cactus: r = max(0, h - p), token ~ r / sum(r), with uniform v.
 * Only tokens in supp(q) can have r > 0, since p >= 0 and h vanishes off supp(q): h[i] = q[i] * scale
 * (i != n) with a finite scale, and h[n] (q[n] for SpS, gamma for Cactus) is 0 when q[n] is. So the
 * list starts as q's support and keeps, in id order, the tokens whose r is positive (zero and negative
 * terms skipped, as in sample.c): the same terms, in the same order, as a pass over all V ids. */
static int32_t rescaled_residual(const cg_position *pos, const cg_target *t, double v)
{
    const float *q = pos->q;
    const int32_t n = pos->n;
    cg_wlist wl = cgi_wl_support(q, pos->n_vocab, pos->ws);
    int32_t m_q = wl_restart(&wl);
    for (int32_t j = 0; j < m_q; ++j) {
        const int32_t i = wl.id[j];
        wl_offer(&wl, i, target_prob(q, i, n, t->h_n, t->scale) - draft_prob(pos->p, i, n));
    }
    if (wl.m > 0) { /* m > 0 <=> sum(r) > 0: a sum of positive terms */
        return cgi_wl_draw(&wl, v);
    }
    /* All-zero residual: h <= p everywhere, i.e. h = p up to rounding, so the rejection itself had
     * probability ~0. Fall back to a draw from h with the same v. h has positive mass: gamma > 0,
     * or gamma = q[n] = 0 and scale = 1, leaving q's mass. */
    wl = cgi_wl_support(q, pos->n_vocab, pos->ws);
    m_q = wl_restart(&wl);
    for (int32_t j = 0; j < m_q; ++j) {
        const int32_t i = wl.id[j];
        wl_offer(&wl, i, target_prob(q, i, n, t->h_n, t->scale)); /* scale 0 (gamma 1): only n */
    }
    return cgi_wl_draw(&wl, v);
}

/* ---- typical: accept iff q[n] > min(eps, alpha exp(-H(q))), else emit argmax q ---------------- */

/* The threshold min(eps, alpha exp(-H(q))), H in nats, and argmax q (lowest id). */
static void typical_target(const cg_position *pos, cg_target *t)
{
    const float *q = pos->q;
    double entropy = 0.0;
    int32_t arg = 0;
    float q_max = q[0];
    for (int32_t i = 0; i < pos->n_vocab; ++i) {
        const float x = q[i];
        if (x > 0.0f) {
            entropy -= (double)x * log((double)x); /* 0 log 0 = 0: zeros skipped */
            if (x > q_max) {
                q_max = x;
                arg = i;
            }
        }
    }
    t->arg = arg;
    const double a_thr = pos->ap->typical_alpha * exp(-entropy);
    t->thr = pos->ap->typical_epsilon < a_thr ? pos->ap->typical_epsilon : a_thr;
}

/* h is one-hot on the emitted token x, so KL(h || q) = -log q[x] (q[x] > 0 either way). */
static void typical_accept(const cg_position *pos, const cg_target *t, double u, cg_outcome *o)
{
    (void)u; /* drawn and unused: the RNG order is the same for every rule */
    o->accepted = (double)pos->q[pos->n] > t->thr;
    o->token = o->accepted ? pos->n : t->arg;
    o->kl = 0.0 - log((double)pos->q[o->token]); /* 0.0 - : q = 1 gives +0, not -0 */
}

/* ---- topk: accept iff n is in the top set T of q; residual norm(max(0, 1[T] - p)) ------------- */

/* T = the top K = min(accept_top_k, V, |supp q|) of q. h is uniform on T, so KL(h || q) =
 * sum_{i in T} (1/K) log((1/K) / q_i) = -(1/K) sum_{i in T} log(K q_i), always finite; summing
 * log(K q_i) (near 0 when q is flat on T) avoids the cancellation of -log K - mean(log q_i). */
static void topk_target(const cg_position *pos, cg_target *t)
{
    const float *q = pos->q;
    const cg_ws *ws = pos->ws;
    cg_top_set *top = &t->top;
    const int32_t kk = pos->ap->accept_top_k < pos->n_vocab ? pos->ap->accept_top_k : pos->n_vocab;
    top->m = cgi_select_prefix(q, NULL, pos->n_vocab, 0, (double)kk, ws); /* = kk */
    top->m_pos = 0;
    for (int32_t j = 0; j < top->m; ++j) {
        top->m_pos += q[pair_id(ws->pairs[j])] > 0.0f;
    }
    top->cut_id = pair_id(cgi_last_pair(ws->pairs, top->m)); /* last of the top m; m = kk >= 1 */
    top->cut_v = q[top->cut_id];
    double sum_log_kq = 0.0;
    for (int32_t j = 0; j < top->m; ++j) {
        const float qi = q[pair_id(ws->pairs[j])];
        if (qi > 0.0f) {
            sum_log_kq += log((double)top->m_pos * (double)qi);
        }
    }
    const double kl = top->m_pos > 0 ? -sum_log_kq / (double)top->m_pos : 0.0;
    t->kl = kl > 0.0 ? kl : 0.0; /* KL >= 0; rounding can leave -1e-17 when q is flat on T */
}

static void topk_accept(const cg_position *pos, const cg_target *t, double u, cg_outcome *o)
{
    (void)u; /* the test is deterministic given T; u is drawn for the fixed RNG order */
    o->accepted = in_top(pos->q, pos->n, t->top.cut_v, t->top.cut_id);
    o->token = pos->n;
    o->kl = t->kl;
}

/* r = max(0, 1[T] - p), with uniform v. T lies in q's support (in_top), so the list starts as q's
 * support and keeps the members of T with r > 0. */
static int32_t topk_residual(const cg_position *pos, const cg_target *t, double v)
{
    const float *q = pos->q;
    const cg_top_set *top = &t->top;
    cg_wlist wl = cgi_wl_support(q, pos->n_vocab, pos->ws);
    int32_t m_q = wl_restart(&wl);
    for (int32_t j = 0; j < m_q; ++j) {
        const int32_t i = wl.id[j];
        wl_offer(&wl, i, in_top(q, i, top->cut_v, top->cut_id) ? 1.0 - draft_prob(pos->p, i, pos->n)
                                                               : 0.0);
    }
    if (wl.m > 0) {
        return cgi_wl_draw(&wl, v);
    }
    /* All-zero residual (|T| = 1 and p one-hot on it, which the test would have accepted): fall back
     * to a draw from h = uniform on T with the same v. */
    wl = cgi_wl_support(q, pos->n_vocab, pos->ws);
    m_q = wl_restart(&wl);
    for (int32_t j = 0; j < m_q; ++j) {
        const int32_t i = wl.id[j];
        wl_offer(&wl, i, in_top(q, i, top->cut_v, top->cut_id) ? 1.0 : 0.0);
    }
    return cgi_wl_draw(&wl, v);
}

/* ---- ears: accept with probability min(1, q[n] / p[n] + alpha (1 - max q)) ------------------ */

/* EARS (Sun et al. 2025, arXiv:2512.13194): SpS's test with a tolerance alpha (1 - max q) that
 * grows with the verifier's uncertainty; the residual is SpS's, norm(max(0, q - p)) (h = q). */
static void ears_target(const cg_position *pos, cg_target *t)
{
    t->h_n = (double)pos->q[pos->n];
    t->scale = 1.0;
    /* alpha (1 - max q) is 0 where q is one-hot (greedy), also at alpha = inf: the limit */
    t->thr = pos->q_max >= 1.0 ? 0.0 : pos->ap->ears_alpha * (1.0 - pos->q_max);
    t->kl = 0.0; /* no target distribution: the divergence is the emitted law's (output_kl_*) */
}

/* u < q[n] / p[n] + thr, evaluated as u p[n] < q[n] + thr p[n] (p[n] = 0: accept iff q[n] > 0).
 * A token the warped verifier excludes (q[n] = 0) is never accepted: the tolerance would
 * otherwise emit tokens outside the verifier's top-k / top-p set (or its grammar). */
static void ears_accept(const cg_position *pos, const cg_target *t, double u, cg_outcome *o)
{
    const double p_n = draft_prob(pos->p, pos->n, pos->n);
    o->accepted = pos->q[pos->n] > 0.0f && u * p_n < ears_reach(t->h_n, p_n, t->thr);
    o->token = pos->n;
    o->kl = 0.0;
}

void cgi_position_prepare(cg_position *pos)
{
    const cg_accept_params *ap = pos->ap;
    const int gap = ap->method == CG_METHOD_CACTUS && ap->top_gap < INFINITY;
    pos->q_max = 0.0;
    pos->near = 0.0;
    if (ap->method != CG_METHOD_EARS && !gap) {
        return;
    }
    float m = 0.0f;
    for (int32_t i = 0; i < pos->n_vocab; ++i) {
        m = pos->q[i] > m ? pos->q[i] : m;
    }
    pos->q_max = (double)m;
    pos->near = gap ? pos->q_max * exp(-ap->top_gap) : 0.0;
}

/* ---- greedy: x ~ q with the position's uniform; accept iff x = n, else emit x (h = q) ---------- */

static void greedy_accept(const cg_position *pos, const cg_target *t, double u, cg_outcome *o)
{
    (void)t;
    const int32_t x = cgi_sample_row(pos->q, pos->n_vocab, u, pos->ws);
    o->accepted = x == pos->n;
    o->token = x;
    o->kl = 0.0;
}

/* ---- whether a rule's emitted law is q itself ------------------------------------------------ */

static int always_q(const cg_accept_params *ap)
{
    (void)ap;
    return 1; /* sps, greedy: the output follows the verifier exactly */
}

static int never_q(const cg_accept_params *ap)
{
    (void)ap;
    return 0;
}

static int cactus_emits_q(const cg_accept_params *ap)
{
    return ap->delta == 0.0; /* delta = 0 is SpS */
}

static int ears_emits_q(const cg_accept_params *ap)
{
    return ap->ears_alpha == 0.0; /* alpha = 0 is SpS */
}

/* ---- the table --------------------------------------------------------------------------------- */

static const cg_rule RULES[] = {
    [CG_METHOD_SPS] = {.name = "sps", .budget = NULL, .target = sps_target, .emits_q = always_q,
                       .law = cgi_law_q, .accept = rescaled_accept, .residual = rescaled_residual},
    [CG_METHOD_CACTUS] = {.name = "cactus", .budget = cgi_budget_cactus, .target = cactus_target,
                          .emits_q = cactus_emits_q, .law = cgi_law_cactus,
                          .accept = rescaled_accept, .residual = rescaled_residual},
    [CG_METHOD_TYPICAL] = {.name = "typical", .budget = NULL, .target = typical_target,
                           .emits_q = never_q, .law = cgi_law_typical, .accept = typical_accept,
                           .residual = NULL},
    [CG_METHOD_TOPK] = {.name = "topk", .budget = NULL, .target = topk_target, .emits_q = never_q,
                        .law = cgi_law_topk, .accept = topk_accept, .residual = topk_residual},
    [CG_METHOD_GREEDY] = {.name = "greedy", .budget = NULL, .target = NULL, .emits_q = always_q,
                          .law = cgi_law_greedy, .accept = greedy_accept, .residual = NULL},
    [CG_METHOD_EARS] = {.name = "ears", .budget = NULL, .target = ears_target, .emits_q = ears_emits_q,
                        .law = cgi_law_ears, .accept = ears_accept, .residual = rescaled_residual},
};
_Static_assert(sizeof RULES / sizeof RULES[0] == CG_METHOD_COUNT, "one RULES entry per cg_method");

const cg_rule *cgi_rule(int32_t method) { return &RULES[method]; }

const char *cg_method_name(int32_t method)
{
    return method >= 0 && method < CG_METHOD_COUNT ? RULES[method].name : NULL;
}

const char *cg_budget_name(int32_t budget)
{
    static const char *const names[] = {[CG_BUDGET_TARGET] = "target", [CG_BUDGET_OUTPUT] = "output"};
    _Static_assert(sizeof names / sizeof names[0] == CG_BUDGET_COUNT, "one name per cg_budget");
    return budget >= 0 && budget < CG_BUDGET_COUNT ? names[budget] : NULL;
}

cg_status cgi_check_accept_params(const cg_accept_params *ap)
{
    if (!ap) {
        return CG_ERR_BAD_ARGUMENT;
    }
    if (ap->method < 0 || ap->method >= CG_METHOD_COUNT || ap->solver < 0
        || ap->solver >= CG_SOLVER_COUNT) {
        return CG_ERR_BAD_ARGUMENT;
    }
    /* written so that NaN fails; delta = +inf is allowed (gamma = 1 whenever q[n] > 0) */
    if (!(ap->delta >= 0.0) || !(ap->typical_epsilon >= 0.0) || !(ap->typical_alpha >= 0.0)) {
        return CG_ERR_BAD_ARGUMENT;
    }
    /* NaN fails; top_gap = +inf (off) and end_tau > 1 (never protect) are allowed */
    if (!(ap->ears_alpha >= 0.0) || !(ap->top_gap >= 0.0) || !(ap->end_tau >= 0.0)) {
        return CG_ERR_BAD_ARGUMENT;
    }
    if (ap->accept_top_k < 1) {
        return CG_ERR_BAD_ARGUMENT;
    }
    if (ap->budget < 0 || ap->budget >= CG_BUDGET_COUNT || (ap->output_kl != 0 && ap->output_kl != 1)) {
        return CG_ERR_BAD_ARGUMENT;
    }
    return CG_OK;
}
