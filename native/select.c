/*
 * select.c - selection of a prefix of one order.
 *
 * The warps and the top-k acceptance all keep a prefix of one order: value descending, ties by
 * token id ascending. We select such a prefix in O(n) with a three-level MSD radix partition on an
 * order-preserving 32-bit key (order_key, cg_internal.h; digits of 11, 11 and 10 bits), then sort
 * only the selected prefix.
 */
#include "cg_internal.h"

#include <stdlib.h> /* qsort (sorts in place, allocates nothing) */

#define CG_SMALL 32 /* undecided sets this small are finished by insertion sort */

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

void cgi_sort_pairs(uint64_t *a, int32_t m)
{
    if (m <= CG_SMALL) {
        sort_pairs_insertion(a, m);
    } else {
        qsort(a, (size_t)m, sizeof *a, cmp_u64);
    }
}

uint64_t cgi_last_pair(const uint64_t *a, int32_t m)
{
    uint64_t last = a[0];
    for (int32_t j = 1; j < m; ++j) {
        last = a[j] > last ? a[j] : last;
    }
    return last;
}

/* One radix digit (shift sh, mask) over the undecided set: the ids idx[0 .. len), or, when
 * `implicit`, every i in [0, len) with vals[i] > -inf. */
typedef struct {
    const float *vals;
    const float *w;   /* weights, or NULL: every candidate weighs 1 */
    int32_t *idx;
    int32_t len;
    int implicit;
    int sh;
    uint32_t mask;
} digit_pass;

/* Histogram of the digit: count and (when weighted) weight per bin. */
static inline void digit_histogram(const digit_pass *d, uint32_t *cnt, double *mass)
{
    const uint32_t nb = d->mask + 1;
    memset(cnt, 0, nb * sizeof *cnt);
    if (d->w) {
        for (uint32_t b = 0; b < nb; ++b) {
            mass[b] = 0.0;
        }
    }
    for (int32_t j = 0; j < d->len; ++j) {
        const int32_t i = d->implicit ? j : d->idx[j];
        const float x = d->vals[i];
        if (d->implicit && x == -INFINITY) {
            continue;
        }
        const uint32_t b = (order_key(x) >> d->sh) & d->mask;
        cnt[b]++;
        if (d->w) {
            mass[b] += (double)d->w[i];
        }
    }
}

/* Walk the bins from the largest values down to the bin where the target is reached: returns it
 * (or -1 when the total stays below the target, by rounding) and the weight of the bins above it. */
static inline int64_t digit_walk(const digit_pass *d, const uint32_t *cnt, const double *mass,
                                 double target, double *cum_above)
{
    double cum = 0.0;
    int64_t bstar = -1;
    for (int64_t b = (int64_t)d->mask; b >= 0; --b) {
        if (cnt[b] == 0) {
            continue;
        }
        const double wb = d->w ? mass[b] : (double)cnt[b];
        if (cum + wb >= target) {
            bstar = b;
            break;
        }
        cum += wb;
    }
    *cum_above = cum;
    return bstar;
}

/* Bins above keep_above are kept whole (appended to out); bin keep_above stays undecided and is
 * compacted into idx (returns its size); keep_all keeps every candidate. */
static inline int32_t digit_partition(const digit_pass *d, int keep_all, uint32_t keep_above,
                                      uint64_t *out, int32_t *n_out)
{
    int32_t m2 = 0;
    for (int32_t j = 0; j < d->len; ++j) {
        const int32_t i = d->implicit ? j : d->idx[j];
        const float x = d->vals[i];
        if (d->implicit && x == -INFINITY) {
            continue;
        }
        const uint32_t key = order_key(x);
        const uint32_t b = (key >> d->sh) & d->mask;
        if (keep_all || b > keep_above) {
            out[(*n_out)++] = pair_of(key, i);
        } else if (b == keep_above) {
            d->idx[m2++] = i; /* m2 <= j: in-place compaction is safe */
        }
    }
    return m2;
}

/* Finish: sort the undecided set idx[0 .. m) (ids ascending; after all three digits their keys are
 * equal and the insertion sort is O(m)), then keep its shortest prefix reaching the remaining
 * target after the n_out pairs already kept. */
static int32_t finish_prefix(const float *vals, const float *w, const int32_t *idx, int32_t m,
                             double target, uint64_t *out, int32_t n_out)
{
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

/*
 * Select the shortest prefix P of the candidates, in the order (vals desc, id asc), whose cumulative
 * weight reaches `target`:  sum_{i in P} w_i >= target  (w_i = w[i], or 1 when w is NULL: then P is
 * the top-`target` set). Candidates: the ids ws->idx[0 .. n) when `from_idx` (ascending, finite
 * values), else {i in [0, n): vals[i] > -inf}. If the total weight stays below the target (only
 * rounding can do that for top-p), every candidate is kept.
 * Writes P to ws->pairs[0 .. return value) as pair_of(key, id), in no particular order.
 * Cost: two passes over the candidates, then passes over ever smaller undecided sets.
 */
int32_t cgi_select_prefix(const float *vals, const float *w, int32_t n, int from_idx,
                          double target, const cg_ws *ws)
{
    const int shifts[3] = {21, 10, 0};
    const uint32_t masks[3] = {0x7FFu, 0x7FFu, 0x3FFu};
    int32_t *idx = ws->idx; /* undecided ids, kept in ascending id order by stable compaction */
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
        const int implicit = level == 0 && !from_idx; /* iterate [0, n) directly, skipping -inf */
        const digit_pass d = {vals, w, idx, implicit ? n : m, implicit, shifts[level], masks[level]};
        digit_histogram(&d, ws->cnt, ws->mass);
        double cum;
        const int64_t bstar = digit_walk(&d, ws->cnt, ws->mass, target, &cum);
        /* bins above bstar are kept whole; bin bstar stays undecided with the remaining target;
         * bstar < 0 (total below target, by rounding): keep every undecided candidate */
        const int keep_all = bstar < 0;
        target -= cum; /* > 0: cum < target held when the walk stopped */
        m = digit_partition(&d, keep_all, keep_all ? 0u : (uint32_t)bstar, ws->pairs, &n_out);
        if (keep_all) {
            return n_out;
        }
    }
    return finish_prefix(vals, w, idx, m, target, ws->pairs, n_out);
}
