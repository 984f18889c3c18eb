/*
 * abi.c - what a caller allocates and checks: the workspace (its size and how it is carved into
 * typed regions; the layout is in cg_internal.h), the probability-row check every entry point
 * shares, and the sizes of the public structs.
 */
#include "cg_internal.h"

int64_t cg_workspace_size(int32_t n_vocab)
{
    if (n_vocab < 1) {
        return 0;
    }
    const int64_t v = n_vocab;
    return 1 + 2 * v + 2 * v + 2 * CG_BINS + CG_BINS + v + n_blocks(n_vocab) + v + v
           + 1 + 8 * (v + 2);
}

cg_ws cgi_ws_carve(float *work, int32_t n_vocab)
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

/* Checked on the bit patterns u so that the loop vectorises: a float is finite and >= 0 iff
 * u <= 0x7F7FFFFF (sign clear, exponent not all ones) or it is -0.0 (u = 0x80000000); it is > 0
 * iff 0 < u <= 0x7F7FFFFF. NaN, +-inf and negatives all fail. */
cg_status cgi_check_prob_row(const float *p, int32_t n)
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

int32_t cg_abi_sizes(int64_t *sizes, int32_t n)
{
    const int64_t all[CG_ABI_N_SIZES] = {
        (int64_t)sizeof(cg_sampler_params), (int64_t)sizeof(cg_accept_params),
        (int64_t)sizeof(cg_rng),            (int64_t)sizeof(cg_step_result),
        (int64_t)sizeof(cg_law),
    };
    for (int32_t i = 0; sizes && i < n && i < CG_ABI_N_SIZES; ++i) {
        sizes[i] = all[i];
    }
    return CG_ABI_N_SIZES;
}
