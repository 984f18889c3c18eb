/*
 * verify.c - one draft-verify step (cg_verify) and the emitted law (cg_emitted_law), for every
 * rule of rules.c through the same steps (cg_internal.h lists them).
 *
 * RNG order (fixed, so the same seed and inputs give the same result):
 *   - one uniform u per evaluated position, drawn right after that position's warp (and after its
 *     law, which draws nothing): the acceptance draw (sps, cactus, topk), the draw of x ~ q
 *     (greedy), drawn and unused (typical);
 *   - on a rejection, one more uniform for the residual draw when the rule has one (sps, cactus,
 *     topk); typical (argmax) and greedy (x itself) draw nothing more;
 *   - when all k are accepted: one uniform for the bonus draw.
 */
#include "cg_internal.h"

/* Arguments, params, drafted ids and draft rows, in the order the header documents. */
static cg_status check_verify_args(const float *draft_probs, const int32_t *draft_tokens,
                                   const float *verifier_logits, int32_t k, int32_t n_vocab,
                                   const cg_sampler_params *sp, const cg_accept_params *ap,
                                   const cg_rng *rng, const float *work)
{
    if (!verifier_logits || !rng || !work || k < 0 || n_vocab < 1 || (k > 0 && !draft_tokens)) {
        return CG_ERR_BAD_ARGUMENT;
    }
    cg_status st = cgi_check_sampler_params(sp);
    if (st == CG_OK) {
        st = cgi_check_accept_params(ap);
    }
    if (st != CG_OK) {
        return st;
    }
    for (int32_t i = 0; i < k; ++i) {
        if (draft_tokens[i] < 0 || draft_tokens[i] >= n_vocab) {
            return CG_ERR_BAD_ARGUMENT;
        }
    }
    for (int32_t i = 0; draft_probs && i < k; ++i) {
        st = cgi_check_prob_row(draft_probs + (size_t)i * (size_t)n_vocab, n_vocab);
        if (st != CG_OK) {
            return st;
        }
    }
    return CG_OK;
}

/* One drafted position whose q is warped: its budget, target, law (when reported), test and
 * residual; adds its KL terms and budget to out. */
static cg_outcome run_position(const cg_rule *rule, cg_position *pos, cg_rng *rng,
                               cg_step_result *out)
{
    const cg_accept_params *ap = pos->ap;
    cg_accept_params at = *ap; /* the position's rule: the output budget changes delta */
    double kl_out = 0.0;       /* KL(P || q) of this position's emitted law */
    int has_kl = 0;
    if (rule->budget) {
        at.delta = rule->budget(pos, &kl_out, &has_kl);
    }
    pos->ap = &at;
    cg_target t;
    memset(&t, 0, sizeof t);
    if (rule->target) {
        rule->target(pos, &t);
    }
    if (!has_kl && ap->output_kl && !rule->emits_q(&at)) {
        cg_law law;
        rule->law(pos, &t, &law);
        kl_out = law.kl;
    }
    out->output_kl_sum += kl_out;
    out->output_kl_max = kl_out > out->output_kl_max ? kl_out : out->output_kl_max;
    out->delta_sum += rule->budget ? at.delta : 0.0;
    cg_outcome o;
    rule->accept(pos, &t, cg_rng_uniform(rng), &o); /* the position's one draw, for every rule */
    if (!o.accepted && rule->residual) {
        o.token = rule->residual(pos, &t, cg_rng_uniform(rng));
    }
    out->kl_sum += o.kl;
    out->kl_max = o.kl > out->kl_max ? o.kl : out->kl_max;
    pos->ap = ap;
    return o;
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
    cg_status st = check_verify_args(draft_probs, draft_tokens, verifier_logits, k, n_vocab, sp, ap,
                                     rng, work);
    if (st != CG_OK) {
        return st;
    }
    const cg_ws ws = cgi_ws_carve(work, n_vocab);
    const size_t nw = (size_t)mask_words(n_vocab); /* words per row of the mask */
    const cg_rule *rule = cgi_rule(ap->method);
    cg_position pos = {ws.q, NULL, 0, n_vocab, ap, &ws, 0.0, 0.0};
    for (int32_t i = 0; i < k; ++i) {
        const float *row = verifier_logits + (size_t)i * (size_t)n_vocab;
        st = cgi_warp_masked(row, n_vocab, n_vocab, allowed ? allowed + (size_t)i * nw : NULL, sp,
                             ws.q, &ws);
        if (st != CG_OK) {
            memset(out, 0, sizeof *out);
            return st;
        }
        pos.p = draft_probs ? draft_probs + (size_t)i * (size_t)n_vocab : NULL;
        pos.n = draft_tokens[i];
        cgi_position_prepare(&pos);
        const cg_outcome o = run_position(rule, &pos, rng, out);
        if (!o.accepted) {
            out->n_accepted = i;
            out->next_token = o.token;
            out->n_evaluated = i + 1;
            return CG_OK;
        }
    }

    /* all k accepted (or k = 0): the bonus token from q at position k */
    st = cgi_warp_masked(verifier_logits + (size_t)k * (size_t)n_vocab, n_vocab, n_vocab,
                         allowed ? allowed + (size_t)k * nw : NULL, sp, ws.q, &ws);
    if (st != CG_OK) {
        memset(out, 0, sizeof *out);
        return st;
    }
    out->n_accepted = k;
    out->next_token = cgi_sample_row(ws.q, n_vocab, cg_rng_uniform(rng), &ws);
    out->n_evaluated = k;
    return CG_OK;
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
    cg_status st = cgi_check_accept_params(ap);
    if (st == CG_OK) {
        st = cgi_check_prob_row(q, n_vocab);
    }
    if (st == CG_OK && p) {
        st = cgi_check_prob_row(p, n_vocab);
    }
    if (st != CG_OK) {
        return st;
    }
    const cg_ws ws = cgi_ws_carve(work, n_vocab);
    const cg_rule *rule = cgi_rule(ap->method);
    /* With a row p the law does not depend on the drafted token (token may be anything): 0 stands
     * in for it, so the target's reads of q[n] stay in range. */
    cg_position pos = {q, p, p ? 0 : token, n_vocab, ap, &ws, 0.0, 0.0};
    cgi_position_prepare(&pos);
    cg_accept_params at = *ap;
    if (rule->budget) {
        double kl_used;
        int has_kl;
        at.delta = rule->budget(&pos, &kl_used, &has_kl);
    }
    pos.ap = &at;
    cg_target t;
    memset(&t, 0, sizeof t);
    if (rule->target) {
        rule->target(&pos, &t);
    }
    const cg_wlist sq = rule->law(&pos, &t, out);
    out->delta = rule->budget ? at.delta : 0.0;
    if (law) {
        for (int32_t i = 0; i < n_vocab; ++i) {
            law[i] = 0.0;
        }
        for (int32_t j = 0; j < sq.m; ++j) {
            law[sq.id[j]] = sq.w[j];
        }
    }
    return CG_OK;
}
