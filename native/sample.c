/*
 * sample.c - weight lists and the one inverse-CDF draw.
 *
 * Every random token the helper emits (cg_sample_probs, cg_warp_sample, greedy's x ~ q, the
 * residual and the bonus of cg_verify) is drawn by one routine, cgi_wl_pick, from a weight list:
 * the positive weights of the row being drawn from, materialised in ascending token-id order into
 * the workspace (ids in idx, weights as double in wts; cg_internal.h). Each caller only builds its
 * list (cgi_wl_support here for a probability row; rules.c derives the residual lists from q's
 * support).
 *
 * Inverse CDF: with weights w (not necessarily normalised) and W = sum_i w_i, a uniform u in [0, 1)
 * picks the first i whose running sum exceeds t = u * W. Running sums are sequential in id order and
 * skip zero weights (the list holds only positive ones; skipping them is exact, adding +0.0 changes
 * nothing), so they reproduce W and never stop on a zero-weight token. Floats convert to double
 * exactly, so a list built from a float row sums and draws exactly as the row itself would.
 * Last-index guard: u * W can round up to W, leaving every running sum <= t; we then return the last
 * token with positive weight instead of running off the end.
 */
#include "cg_internal.h"

/* Not accumulated while lists are built: a running sum is a chain of dependent additions, so it is
 * paid once, over the final list only. */
double cgi_wl_total(const cg_wlist *wl)
{
    double s = 0.0;
    for (int32_t j = 0; j < wl->m; ++j) {
        s += wl->w[j];
    }
    return s;
}

int32_t cgi_wl_pick(const cg_wlist *wl, double t)
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

int32_t cgi_wl_draw(const cg_wlist *wl, double u)
{
    return cgi_wl_pick(wl, u * cgi_wl_total(wl));
}

/* One vectorisable pass per block of CG_BLOCK entries counts the positive ones (for a non-NaN float
 * x, x > 0 iff its bits u satisfy u - 1 < 0x7F800000 unsigned): a block with none is skipped (a
 * warped row cut by top-k or top-p has only a few positive blocks), a block with all of them is
 * copied straight (vectorisable), and a mixed one is compacted branch-free (the slot m <= i < n
 * written by wl_offer always exists). */
cg_wlist cgi_wl_support(const float *x, int32_t n, const cg_ws *ws)
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

int32_t cgi_sample_row(const float *w, int32_t n, double u, const cg_ws *ws)
{
    const cg_wlist wl = cgi_wl_support(w, n, ws);
    return cgi_wl_draw(&wl, u);
}

cg_status cg_sample_probs(const float *probs, int32_t n_vocab, cg_rng *rng, float *work,
                          int32_t *token)
{
    if (!probs || !rng || !work || !token || n_vocab < 1) {
        return CG_ERR_BAD_ARGUMENT;
    }
    const cg_status st = cgi_check_prob_row(probs, n_vocab);
    if (st != CG_OK) {
        return st;
    }
    const cg_ws ws = cgi_ws_carve(work, n_vocab);
    const cg_wlist wl = cgi_wl_support(probs, n_vocab, &ws);
    const double total = cgi_wl_total(&wl);
    if (!(total < INFINITY)) {
        return CG_ERR_BAD_DISTRIBUTION; /* finite entries whose sum overflows */
    }
    *token = cgi_wl_pick(&wl, cg_rng_uniform(rng) * total);
    return CG_OK;
}

cg_status cg_warp_sample(const float *logits, int32_t n_logits, int32_t n_vocab,
                         const uint32_t *allowed, const cg_sampler_params *sp, cg_rng *rng,
                         float *probs, float *work, int32_t *token)
{
    cg_status st = cgi_check_warp_args(logits, n_logits, n_vocab, sp, probs, work);
    if (st != CG_OK) {
        return st;
    }
    if (!rng || !token) {
        return CG_ERR_BAD_ARGUMENT;
    }
    const cg_ws ws = cgi_ws_carve(work, n_vocab);
    st = cgi_warp_masked(logits, n_logits, n_vocab, allowed, sp, probs, &ws);
    if (st != CG_OK) {
        return st;
    }
    *token = cgi_sample_row(probs, n_vocab, cg_rng_uniform(rng), &ws); /* exactly one uniform */
    return CG_OK;
}
