/*
 * abi.c - what a caller allocates and checks: the workspace (its size and how it is carved into
 * typed regions; the layout is in cg_internal.h), the probability-row check every entry point
 * shares, the status names and the layout of the public structs (field offsets and sizes).
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

const char *cg_status_name(int32_t status)
{
    static const char *const names[] = {
        [CG_OK] = "ok",
        [CG_ERR_BAD_ARGUMENT] = "bad_argument",
        [CG_ERR_NONFINITE_LOGITS] = "nonfinite_logits",
        [CG_ERR_BAD_DISTRIBUTION] = "bad_distribution",
        [CG_ERR_EMPTY_MASK] = "empty_mask",
    };
    _Static_assert(sizeof names / sizeof names[0] == CG_STATUS_COUNT, "one name per cg_status");
    return status >= 0 && status < CG_STATUS_COUNT ? names[status] : NULL;
}

typedef struct {
    const char *name; /* "struct" or "struct.field" */
    int64_t offset;   /* offsetof the field; 0 for a struct */
    int64_t size;     /* sizeof the field or the struct */
} abi_row;

#define STRUCT_ROW(type) {#type, 0, (int64_t)sizeof(type)}
#define FIELD_ROW(type, field) \
    {#type "." #field, (int64_t)offsetof(type, field), (int64_t)sizeof(((type *)0)->field)}

/* Every public struct and each of its fields, in declaration order (cactus_native.h). A field
 * added to a struct goes here too: a binding whose mirror has it refuses a table that lacks it. */
static const abi_row ABI_LAYOUT[] = {
    STRUCT_ROW(cg_sampler_params),
    FIELD_ROW(cg_sampler_params, temperature),
    FIELD_ROW(cg_sampler_params, top_k),
    FIELD_ROW(cg_sampler_params, top_p),
    FIELD_ROW(cg_sampler_params, min_p),
    STRUCT_ROW(cg_accept_params),
    FIELD_ROW(cg_accept_params, method),
    FIELD_ROW(cg_accept_params, solver),
    FIELD_ROW(cg_accept_params, delta),
    FIELD_ROW(cg_accept_params, typical_epsilon),
    FIELD_ROW(cg_accept_params, typical_alpha),
    FIELD_ROW(cg_accept_params, accept_top_k),
    FIELD_ROW(cg_accept_params, budget),
    FIELD_ROW(cg_accept_params, output_kl),
    FIELD_ROW(cg_accept_params, ears_alpha),
    FIELD_ROW(cg_accept_params, top_gap),
    FIELD_ROW(cg_accept_params, end_tau),
    FIELD_ROW(cg_accept_params, end_mask),
    STRUCT_ROW(cg_rng),
    FIELD_ROW(cg_rng, s),
    STRUCT_ROW(cg_step_result),
    FIELD_ROW(cg_step_result, n_accepted),
    FIELD_ROW(cg_step_result, next_token),
    FIELD_ROW(cg_step_result, n_evaluated),
    FIELD_ROW(cg_step_result, kl_sum),
    FIELD_ROW(cg_step_result, kl_max),
    FIELD_ROW(cg_step_result, output_kl_sum),
    FIELD_ROW(cg_step_result, output_kl_max),
    FIELD_ROW(cg_step_result, delta_sum),
    STRUCT_ROW(cg_law),
    FIELD_ROW(cg_law, kl),
    FIELD_ROW(cg_law, acceptance),
    FIELD_ROW(cg_law, delta),
    STRUCT_ROW(cg_row_reader),
    FIELD_ROW(cg_row_reader, ctx),
    FIELD_ROW(cg_row_reader, candidates),
    FIELD_ROW(cg_row_reader, candidates_count),
    FIELD_ROW(cg_row_reader, logits),
    FIELD_ROW(cg_row_reader, logits_count),
};

const char *cg_abi_field(int32_t i, int64_t *offset, int64_t *size)
{
    if (i < 0 || (size_t)i >= sizeof ABI_LAYOUT / sizeof ABI_LAYOUT[0]) {
        return NULL;
    }
    if (offset) {
        *offset = ABI_LAYOUT[i].offset;
    }
    if (size) {
        *size = ABI_LAYOUT[i].size;
    }
    return ABI_LAYOUT[i].name;
}
