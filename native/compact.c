/*
 * compact.c - the compact step (cactus_native.h, "Compact rows"): llama.cpp's backend-sampled
 * rows read in one call (cg_read_rows), and the union of a step's rows with every row gathered
 * into it (cg_compact_union), so a verification step whose warps truncate the vocabulary costs
 * O(k K) host work, not O(k V).
 */
#include "cg_internal.h"

#include <stdlib.h> /* qsort */

/* Sort n (id, logit) pairs by id, ascending: insertion sort for the usual row (K + 1 = 21), qsort
 * for a wide one (a large top-k). */
typedef struct {
    int32_t id;
    float logit;
} id_logit;

static int cmp_id_logit(const void *a, const void *b)
{
    const int32_t x = ((const id_logit *)a)->id, y = ((const id_logit *)b)->id;
    return (x > y) - (x < y);
}

static void sort_by_id(id_logit *e, int32_t n)
{
    if (n > 64) {
        qsort(e, (size_t)n, sizeof *e, cmp_id_logit);
        return;
    }
    for (int32_t i = 1; i < n; ++i) {
        const id_logit x = e[i];
        int32_t j = i;
        while (j > 0 && e[j - 1].id > x.id) {
            e[j] = e[j - 1];
            --j;
        }
        e[j] = x;
    }
}

/* One row of `width` candidates: sorted by id into ids / logits; 1 when its top (width - 1) is
 * exact (see cg_read_rows), else 0. */
static int read_row(const cg_row_reader *rd, int32_t i, int32_t width, int32_t n_vocab,
                    int32_t *ids, float *logits, id_logit *tmp)
{
    if (rd->candidates_count(rd->ctx, i) != (uint32_t)width
        || rd->logits_count(rd->ctx, i) != (uint32_t)width) {
        return 0;
    }
    const int32_t *c = rd->candidates(rd->ctx, i);
    const float *l = rd->logits(rd->ctx, i);
    if (!c || !l) {
        return 0;
    }
    float lo = INFINITY;
    for (int32_t j = 0; j < width; ++j) {
        if (c[j] < 0 || c[j] >= n_vocab || isnan(l[j])) {
            return 0;
        }
        lo = l[j] < lo ? l[j] : lo;
        tmp[j].id = c[j];
        tmp[j].logit = l[j];
    }
    int32_t at_lo = 0; /* the smallest must be alone: strictly below the width - 1 others */
    for (int32_t j = 0; j < width; ++j) {
        at_lo += l[j] == lo;
    }
    if (at_lo != 1) {
        return 0;
    }
    sort_by_id(tmp, width);
    for (int32_t j = 0; j < width; ++j) {
        if (j > 0 && tmp[j].id == tmp[j - 1].id) {
            return 0; /* a repeated id: not a top-k of distinct tokens */
        }
        ids[j] = tmp[j].id;
        logits[j] = tmp[j].logit;
    }
    return 1;
}

cg_status cg_read_rows(const cg_row_reader *rd, int32_t n_rows, int32_t width, int32_t n_vocab,
                       int32_t *ids, float *logits, int32_t *inexact)
{
    if (!rd || !rd->candidates || !rd->candidates_count || !rd->logits || !rd->logits_count
        || !ids || !logits || !inexact || n_rows < 1 || width < 2 || n_vocab < 1) {
        return CG_ERR_BAD_ARGUMENT;
    }
    id_logit small[64];
    id_logit *tmp = width <= 64 ? small : malloc((size_t)width * sizeof *tmp);
    if (!tmp) {
        return CG_ERR_BAD_ARGUMENT;
    }
    *inexact = -1;
    for (int32_t r = 0; r < n_rows; ++r) {
        if (!read_row(rd, r - n_rows, width, n_vocab, ids + (size_t)r * (size_t)width,
                      logits + (size_t)r * (size_t)width, tmp)) {
            *inexact = r;
            break;
        }
    }
    if (tmp != small) {
        free(tmp);
    }
    return CG_OK;
}

/* Merge the ascending ids of one row (entries < 0 skipped) into the ascending set u[0, n):
 * the union in out, its size returned. */
static int32_t merge_row(const int32_t *u, int32_t n, const int32_t *row, int32_t width,
                         int32_t *out)
{
    int32_t a = 0, b = 0, m = 0;
    for (;;) {
        while (b < width && row[b] < 0) {
            ++b;
        }
        if (a >= n && b >= width) {
            return m;
        }
        const int32_t x = (b >= width || (a < n && u[a] <= row[b])) ? u[a++] : row[b++];
        if (m == 0 || out[m - 1] != x) {
            out[m++] = x;
        }
    }
}

/* Whether a row's ids are below n_vocab and strictly ascending, skipping entries < 0 (allowed
 * only when padded is set). */
static int ascending_ids(const int32_t *row, int32_t width, int32_t n_vocab, int padded)
{
    int32_t last = -1;
    for (int32_t j = 0; j < width; ++j) {
        if (row[j] < 0) {
            if (!padded) {
                return 0;
            }
            continue;
        }
        if (row[j] >= n_vocab || row[j] <= last) {
            return 0;
        }
        last = row[j];
    }
    return 1;
}

/* The position of id in the ascending set u[0, n), or -1. */
static int32_t find(const int32_t *u, int32_t n, int32_t id)
{
    int32_t lo = 0, hi = n;
    while (lo < hi) {
        const int32_t mid = lo + (hi - lo) / 2;
        if (u[mid] < id) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo < n && u[lo] == id ? lo : -1;
}

/* A row of `width` (id ascending, value) entries into the dense row `out` over the ascending
 * set u: ids < 0 skipped; every other id is in u. */
static void gather_row(const int32_t *u, const int32_t *ids, const float *vals,
                       int32_t width, float *out)
{
    int32_t a = 0;
    for (int32_t j = 0; j < width; ++j) {
        if (ids[j] < 0) {
            continue;
        }
        while (u[a] < ids[j]) {
            ++a;
        }
        out[a] = vals[j];
    }
}

cg_status cg_compact_union(const int32_t *ver_ids, const float *ver_logits, int32_t n_ver,
                           int32_t ver_width, const int32_t *draft_ids, const float *draft_probs,
                           int32_t n_draft, int32_t draft_width, const int32_t *draft_tokens,
                           int32_t n_tokens, const uint32_t *end_mask, int32_t n_vocab,
                           int32_t capacity, int32_t *scratch, int32_t *u_ids, float *u_logits,
                           float *u_probs, int32_t *u_tokens, uint32_t *u_end, int32_t *n_out)
{
    if (!ver_ids || !ver_logits || n_ver < 1 || ver_width < 1 || n_draft < 0 || n_tokens < 0
        || (n_draft > 0 && (!draft_ids || !draft_probs || draft_width < 1 || !u_probs))
        || (n_tokens > 0 && (!draft_tokens || !u_tokens)) || (end_mask && !u_end)
        || n_vocab < 1 || !scratch || !u_ids || !u_logits || !n_out) {
        return CG_ERR_BAD_ARGUMENT;
    }
    const int64_t need = (int64_t)n_ver * ver_width + (int64_t)n_draft * draft_width + n_tokens;
    if ((int64_t)capacity < need) {
        return CG_ERR_BAD_ARGUMENT;
    }
    *n_out = 0;
    /* the drafted tokens, sorted (a handful: insertion), start the set */
    int32_t n = 0;
    for (int32_t i = 0; i < n_tokens; ++i) {
        const int32_t x = draft_tokens[i];
        if (x < 0 || x >= n_vocab) {
            return CG_ERR_BAD_ARGUMENT;
        }
        int32_t j = n;
        while (j > 0 && u_ids[j - 1] > x) {
            u_ids[j] = u_ids[j - 1];
            --j;
        }
        if (j > 0 && u_ids[j - 1] == x) { /* already there: undo the shift */
            memmove(u_ids + j, u_ids + j + 1, (size_t)(n - j) * sizeof *u_ids);
            continue;
        }
        u_ids[j] = x;
        ++n;
    }
    /* every row merged in, ping-ponging between u_ids and scratch */
    int32_t *cur = u_ids, *nxt = scratch;
    for (int32_t r = 0; r < n_ver + n_draft; ++r) {
        const int32_t *row = r < n_ver ? ver_ids + (size_t)r * (size_t)ver_width
                                       : draft_ids + (size_t)(r - n_ver) * (size_t)draft_width;
        const int32_t width = r < n_ver ? ver_width : draft_width;
        if (!ascending_ids(row, width, n_vocab, r >= n_ver)) {
            return CG_ERR_BAD_ARGUMENT;
        }
        n = merge_row(cur, n, row, width, nxt);
        int32_t *t = cur;
        cur = nxt;
        nxt = t;
    }
    if (n < 1) {
        return CG_ERR_BAD_ARGUMENT;
    }
    if (cur != u_ids) {
        memcpy(u_ids, cur, (size_t)n * sizeof *u_ids);
    }
    /* every row gathered into U: -inf / 0 outside its own ids */
    for (size_t j = 0, e = (size_t)n_ver * (size_t)n; j < e; ++j) {
        u_logits[j] = -INFINITY;
    }
    for (int32_t r = 0; r < n_ver; ++r) {
        gather_row(u_ids, ver_ids + (size_t)r * (size_t)ver_width,
                   ver_logits + (size_t)r * (size_t)ver_width, ver_width,
                   u_logits + (size_t)r * (size_t)n);
    }
    if (n_draft > 0) {
        memset(u_probs, 0, (size_t)n_draft * (size_t)n * sizeof *u_probs);
        for (int32_t r = 0; r < n_draft; ++r) {
            gather_row(u_ids, draft_ids + (size_t)r * (size_t)draft_width,
                       draft_probs + (size_t)r * (size_t)draft_width, draft_width,
                       u_probs + (size_t)r * (size_t)n);
        }
    }
    for (int32_t i = 0; i < n_tokens; ++i) {
        u_tokens[i] = find(u_ids, n, draft_tokens[i]);
    }
    if (end_mask) {
        memset(u_end, 0, (size_t)mask_words(n) * sizeof *u_end);
        for (int32_t j = 0; j < n; ++j) {
            const uint32_t id = (uint32_t)u_ids[j];
            if ((end_mask[id >> 5] >> (id & 31u)) & 1u) {
                u_end[j >> 5] |= UINT32_C(1) << (j & 31);
            }
        }
    }
    *n_out = n;
    return CG_OK;
}
