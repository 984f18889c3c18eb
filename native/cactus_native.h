/*
 * cactus_native.h - the hot per-token math of cactus-gguf.
 *
 * Dimension letters (used in every comment below):
 *   V  vocabulary size of the verifier (the draft's vocabulary is V or a prefix of it)
 *   k  draft length: tokens proposed per verification step
 *
 * Glossary:
 *   p          draft distribution at a position, after the sampling warps            float [V]
 *   q          verifier distribution at a position, after the same warps             float [V]
 *   drafted    the token n the draft sampled from p at a position
 *   accepted   a drafted token kept by the acceptance test
 *   residual   on the first rejection, a token is drawn from norm(max(0, h - p))
 *   bonus      when all k drafts are accepted, a token drawn from q at position k+1
 *   AL         acceptance length: accepted drafts in one step (0..k)
 *   h          the target the acceptance test uses at a position (q for SpS; the Cactus target below)
 *
 * Token ids are int32 indices into [0, V); "row i" is an index into a batch of positions.
 *
 * Allowed-token mask (optional, for grammar-constrained decoding): uint32 [ceil(V / 32)] per row,
 * bit (i % 32) of word i / 32 set = token i allowed; bits for ids >= V are ignored. Read in place.
 * A disallowed token is treated exactly like a -inf logit: probability 0, never kept by any warp, so
 * the warped row is a distribution over the allowed tokens only. NULL = every token allowed (and costs
 * nothing: the mask is looked at once per row, never per token).
 *
 * Rules: Y. Hao, L. Mou, "Cactus: Accelerating Auto-Regressive Decoding with Constrained Acceptance
 * Speculative Sampling", ICLR 2026, arXiv:2604.04987; SpS: Leviathan et al. 2023, Chen et al. 2023;
 * typical acceptance: Cai et al. 2024 (Medusa) as in vLLM.
 *
 * The maths (glossary, SpS, the Cactus target and its solvers, the emitted law, the output budget,
 * typical / topk / greedy): docs/maths.md. Sources, one file each: rng.c, select.c, warp.c, sample.c,
 * gamma.c, rules.c (the acceptance rules, one table entry each), law.c, verify.c, abi.c;
 * cg_internal.h holds what they share.
 *
 * Contract: no allocation, no printing, no exit, no global state. Every function returns a
 * cg_status (or a documented value); the Python facade maps each code to a specific exception.
 * Randomness comes only from the cg_rng passed in, so the same seed gives the same trace.
 * Enum values are defined here and only here: callers ask the library for a name's value
 * (cg_status_name, cg_method_name, cg_solver_name, cg_budget_name) and check their mirrors of the
 * structs field by field (cg_abi_field).
 */
#ifndef CACTUS_NATIVE_H
#define CACTUS_NATIVE_H

#include <stdint.h>

/* CG_API marks the public functions: exported from the DLL on Windows (imported by a C caller that
 * links against it), default visibility elsewhere (the library is built with hidden visibility, so
 * nothing else leaks out). */
#if defined(_WIN32) || defined(__CYGWIN__)
#  ifdef CG_BUILDING_LIBRARY
#    define CG_API __declspec(dllexport)
#  else
#    define CG_API __declspec(dllimport)
#  endif
#elif defined(__GNUC__) || defined(__clang__)
#  define CG_API __attribute__((visibility("default")))
#else
#  define CG_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    CG_OK = 0,
    CG_ERR_BAD_ARGUMENT = 1,   /* a NULL pointer, V < 1, k < 0, a token outside [0, V), bad params */
    CG_ERR_NONFINITE_LOGITS = 2, /* a NaN or +inf logit (masked or not), or every logit -inf */
    CG_ERR_BAD_DISTRIBUTION = 3, /* a probability row that is negative, NaN, or sums to 0 */
    CG_ERR_EMPTY_MASK = 4,       /* an allowed-token mask leaves no finite logit in a row */
    CG_STATUS_COUNT              /* not a status: the number of codes (new ones go above) */
} cg_status;

typedef enum {
    CG_METHOD_SPS = 0,     /* h = q: the output follows the verifier exactly */
    CG_METHOD_CACTUS = 1,  /* h = argmax acceptance s.t. KL(h || q) <= delta */
    CG_METHOD_TYPICAL = 2, /* accept if q[n] > min(eps, alpha * exp(-H(q))); else emit argmax q */
    CG_METHOD_TOPK = 3,    /* accept if n in top-accept_top_k of q; residual norm(max(0, 1[topk] - p)) */
    CG_METHOD_GREEDY = 4,  /* sample x ~ q at each position; accept while x == n; else emit x */
    CG_METHOD_EARS = 5,    /* accept with probability min(1, q[n] / p[n] + ears_alpha (1 - max q)),
                            * never a token q excludes; residual norm(max(0, q - p)) as SpS */
    CG_METHOD_COUNT        /* not a rule: the number of rules (a new rule goes right above) */
} cg_method;

typedef enum {
    CG_SOLVER_TAYLOR = 0,  /* gamma = min(1, q[n] + sqrt(2 delta q[n] (1 - q[n])))  (paper, closed form) */
    CG_SOLVER_EXACT = 1,   /* gamma = root in [q[n], 1] of the binary KL = delta, or 1 if none */
    CG_SOLVER_COUNT
} cg_solver;

/* What a Cactus budget delta bounds (docs/maths.md, "What delta bounds" and "The output budget"):
 *   TARGET: KL(h_n || q) <= delta for the target of every drafted token n (the paper's). The token
 *           a position emits follows the mixture P (cg_emitted_law), and KL(P || q) can exceed delta.
 *   OUTPUT: KL(P || q) <= delta for the token each drafted position emits: the position runs the
 *           paper's rule with the largest per-draft budget delta' <= delta (bisection) whose P
 *           fits, so acceptance never falls below SpS's (delta' >= 0) and delta = 0 is still SpS. */
typedef enum {
    CG_BUDGET_TARGET = 0,
    CG_BUDGET_OUTPUT = 1,
    CG_BUDGET_COUNT
} cg_budget;

/* Sampling warps, applied in llama.cpp's default order: top-k, top-p, min-p, then temperature.
 * top-p and min-p look at softmax(logits) at temperature 1 over the tokens still kept.
 * temperature <= 0 means greedy: the warped distribution is one-hot at the argmax
 * (ties go to the lowest token id). */
typedef struct {
    float temperature; /* > 0, or <= 0 for greedy */
    int32_t top_k;     /* keep the top_k largest logits; 0 = off (ties go to the lowest token id) */
    float top_p;       /* keep the smallest top set with cumulative prob >= top_p; 1 = off; (0, 1] */
    float min_p;       /* keep tokens with prob >= min_p * max prob; 0 = off; [0, 1] */
} cg_sampler_params;

typedef struct {
    int32_t method;          /* cg_method */
    int32_t solver;          /* cg_solver (Cactus only) */
    double delta;            /* Cactus KL budget in nats, >= 0; delta = 0 is exactly SpS */
    double typical_epsilon;  /* TAS epsilon (vLLM default 0.09) */
    double typical_alpha;    /* TAS alpha (vLLM default 0.3) */
    int32_t accept_top_k;    /* top-k acceptance: size of the accepted set (default 5) */
    int32_t budget;          /* cg_budget (Cactus only): what delta bounds */
    int32_t output_kl;       /* 1: cg_verify reports output_kl_* (the emitted law at every evaluated
                              * position: ~0.05 ms per position with top-k 40, ~8 ms at an untruncated
                              * V = 152k); 0: they stay 0 (the output budget computes the law anyway) */
    double ears_alpha;       /* EARS: the tolerance's weight alpha, >= 0 (0 is SpS) */
    double top_gap;          /* Cactus: relax only drafts within top_gap nats of the verifier's top
                              * token, q[n] >= max(q) exp(-top_gap); the others get SpS's target
                              * h = q. >= 0; +inf = every draft (the paper's) */
    double end_tau;          /* Cactus, with end_mask: at a position where q(E) >= end_tau and
                              * q(E) > 0 (E = the ids end_mask sets), the position keeps its budget
                              * only if its emitted law P has P(E) >= q(E), else it runs SpS there
                              * (delta' = 0): ending is never made less likely. >= 0 */
    const uint32_t *end_mask; /* uint32 [ceil(n_vocab / 32)], bit i of word i / 32 set for an id of
                              * the end set (end-of-generation tokens, starts of stop strings); NULL:
                              * no protected ends. Read in place; the caller keeps it alive. */
} cg_accept_params;

/* xoshiro256** state; seeded by cg_rng_seed (splitmix64 expansion of a 64-bit seed). */
typedef struct {
    uint64_t s[4];
} cg_rng;

typedef struct {
    int32_t n_accepted;   /* AL: accepted drafts, 0..k */
    int32_t next_token;   /* the residual token (n_accepted < k) or the bonus token (n_accepted == k) */
    int32_t n_evaluated;  /* drafted positions that went through the acceptance test: min(AL + 1, k) */
    double kl_sum;        /* sum over evaluated positions of KL(h || q), nats */
    double kl_max;        /* max over evaluated positions of KL(h || q), nats (0 if none) */
    double output_kl_sum; /* sum over evaluated positions of KL(P || q), P the law of the token the
                           * position emits (cg_emitted_law), nats; the bonus position adds 0 */
    double output_kl_max; /* max over evaluated positions of KL(P || q), nats (0 if none) */
    double delta_sum;     /* Cactus: sum over evaluated positions of the per-draft budget used
                           * (delta itself for the target budget, delta' for the output budget) */
} cg_step_result;

/* The law of the token one drafted position emits, and what it costs in divergence. */
typedef struct {
    double kl;          /* KL(P || q), nats: 0 for sps and greedy (P = q) */
    double acceptance;  /* the chance the drafted token is accepted: sum_n p[n] a_n */
    double delta;       /* Cactus: the per-draft budget used (delta', see cg_budget); else 0 */
} cg_law;

/* Seed the generator. Same seed, same sequence. (NULL rng: no-op.) */
CG_API void cg_rng_seed(cg_rng *rng, uint64_t seed);

/* Uniform double in [0, 1) from 53 random bits: (next >> 11) * 2^-53. (NULL rng: NaN.) */
CG_API double cg_rng_uniform(cg_rng *rng);

/* Scratch floats the caller must provide to the functions below (per call, reused):
 * 15 V + ceil(V / 64) + 6162 floats (9.1 MB at V = 151,936); 0 when n_vocab < 1. Besides the warp's
 * selection scratch and cg_verify's warped row q, it holds the weight list every draw is made from
 * (token ids and double weights of the row being drawn from), the masked copy of a logits row
 * when an allowed-token mask is given, and the emitted-law tables, so no call allocates.
 * The workspace is untyped scratch carved into int32 / uint64 / double regions: allocate it with
 * malloc or numpy (4-byte alignment suffices), never pass a declared float array, and never share
 * one workspace between concurrent calls. */
CG_API int64_t cg_workspace_size(int32_t n_vocab);

/* Warp one logits row into probabilities.
 *   logits:  float32 [n_logits]  raw logits (read only). 1 <= n_logits <= n_vocab; entries
 *            [n_logits, n_vocab) of probs are set to 0 (a draft vocabulary that is a prefix).
 *            -inf logits are allowed (probability 0).
 *   allowed: uint32 [ceil(n_vocab / 32)] allowed-token mask (see the top), or NULL for none; only
 *            the words covering [0, n_logits) are read.
 *   probs:   float32 [n_vocab]   output, sums to 1, zeros outside the kept set. Must not overlap
 *            logits or work (it doubles as scratch).
 *   work:    float32 [cg_workspace_size(n_vocab)]
 * min-p is evaluated exactly as l_i - l_max >= log(min_p) in double. O(V): top-k selects through
 * block maxima and a radix partition, top-p without top-k through a radix partition (no full sort).
 * Accuracy against the exact softmax of the float32 inputs: explicit kept lists (top-k, top-p) use
 * double exp (~1 ulp); V-long loops use a float polynomial exp (1.7 ulp) of a float argument:
 * absolute error < 2e-7 of the largest probability, relative < 1e-6 above 1e-6 of it, and
 * tokens below exp(-87.3) of the largest (where floats turn subnormal) get exactly 0.
 * With a mask the row is first copied into the workspace with every disallowed logit set to -inf
 * (one pass over n_logits); the warp then runs on the copy exactly as without a mask.
 * Errors, checked in this order: CG_ERR_BAD_ARGUMENT; CG_ERR_NONFINITE_LOGITS (a NaN or +inf
 * anywhere in the row, allowed or not, or every logit -inf); CG_ERR_EMPTY_MASK (logits are finite
 * somewhere, but at no allowed token). probs is unspecified after an error. */
CG_API cg_status cg_warp(const float *logits, int32_t n_logits, int32_t n_vocab,
                         const uint32_t *allowed, const cg_sampler_params *sp, float *probs,
                         float *work);

/* Draw a token from a probability row (need not be normalised; must have a positive sum).
 *   probs: float32 [n_vocab];  work: float32 [cg_workspace_size(n_vocab)];  token: out.
 * Exactly one uniform u per call; the token is the first i whose running sum exceeds u * sum
 * (never a zero-probability token). Errors: CG_ERR_BAD_DISTRIBUTION (a negative / NaN / inf
 * entry, or a zero sum; no uniform is drawn), CG_ERR_BAD_ARGUMENT. */
CG_API cg_status cg_sample_probs(const float *probs, int32_t n_vocab, cg_rng *rng, float *work,
                                 int32_t *token);

/* Warp then sample: the draft's per-token call and the verifier-alone baseline's.
 *   allowed: as for cg_warp (NULL = none); the token is then always an allowed one.
 *   probs:   float32 [n_vocab] out (the warped distribution the token was drawn from).
 * Exactly one uniform per call (also when temperature <= 0); none when the warp fails (errors as
 * for cg_warp). */
CG_API cg_status cg_warp_sample(const float *logits, int32_t n_logits, int32_t n_vocab,
                                const uint32_t *allowed, const cg_sampler_params *sp, cg_rng *rng,
                                float *probs, float *work, int32_t *token);

/* Cactus target mass on the drafted token: gamma(q_n, delta) for the given solver.
 * q_n in [0, 1]; delta >= 0. q_n = 0 -> 0; q_n = 1 -> 1; delta = 0 -> q_n exactly (both solvers).
 * The exact solver is a safeguarded Newton iteration, converged to ~1 ulp (<= 200 steps).
 * Returns NaN for q_n NaN, delta < 0 or NaN, or an unknown solver. */
CG_API double cg_cactus_gamma(double q_n, double delta, int32_t solver);

/* One verification step.
 *   draft_probs:     float32 [k, n_vocab], row stride n_vocab; the warped draft distributions p.
 *                    NULL means a deterministic drafter (p one-hot at each drafted token).
 *   draft_tokens:    int32 [k]
 *   verifier_logits: float32 [k+1, n_vocab], row stride n_vocab (read in place; row i is the
 *                    verifier's prediction for draft position i, row k the bonus position)
 *   allowed:         uint32 [k+1, ceil(n_vocab / 32)], row stride ceil(n_vocab / 32), or NULL for
 *                    none: row i masks verifier row i (see the top; read in place). The caller
 *                    masks the draft's rows with the same masks through cg_warp_sample, so p and q
 *                    are distributions over the same legal set (SpS then emits exactly the masked
 *                    verifier law). Whatever p is, no rule emits a disallowed token: q is 0 there.
 *   k:               draft length, >= 0 (k = 0 just samples the bonus from row 0)
 *   work:            float32 [cg_workspace_size(n_vocab)]
 *   out:             result (see cg_step_result)
 * Uses the rng in a fixed order (the same with or without a mask), so the same seed and inputs
 * give the same result:
 *   - one uniform u per evaluated position, drawn after that position's warp: the acceptance draw
 *     (sps, cactus, topk), the draw of x ~ q (greedy), or drawn and unused (typical);
 *   - on the first rejection, one more uniform for the residual draw (sps, cactus, topk only:
 *     typical emits argmax q, greedy emits x);
 *   - when all k are accepted, one uniform for the bonus draw.
 * The test u < min(1, h[n] / p[n]) is evaluated as u * p[n] < h[n] (the same for p[n] > 0; for
 * p[n] = 0 it accepts iff h[n] > 0). If the residual max(0, h - p) is all zero (h <= p, only
 * possible through rounding or unnormalised p), the residual token is drawn from h instead.
 * KL(h || q) per evaluated position, nats: sps, greedy 0; cactus the binary KL of gamma vs q[n]
 * (exactly KL(h || q) for that h); typical -log q[x] for the emitted x (h one-hot on x); topk
 * sum_{i in T} (1/K) log((1/K) / q_i) with h uniform on T (always finite).
 * topk's T is the top K = min(accept_top_k, V, |supp q|) tokens of q, ties to the lower id: a token
 * the warped verifier gives probability 0 is never in T, so it is never accepted.
 * KL(P || q) per evaluated position (output_kl_*): the exact law of cg_emitted_law, computed with
 * the position's p and q before its acceptance draw (it draws nothing). With the output budget the
 * position's acceptance test and residual use the delta' found there, so output_kl_max <= delta.
 * Validation is up front: every id in draft_tokens and every draft_probs row (k x V reads;
 * CG_ERR_BAD_DISTRIBUTION for a negative / NaN / inf entry or an all-zero row). Verifier rows are
 * warped only as reached: row i only when positions 0 .. i-1 were accepted (so a non-finite row
 * past the first rejection is not reported); a reached row fails as in cg_warp
 * (CG_ERR_NONFINITE_LOGITS, or CG_ERR_EMPTY_MASK when its mask allows no finite logit).
 * On an error, out is all zeros and the rng may have advanced. */
CG_API cg_status cg_verify(const float *draft_probs, const int32_t *draft_tokens,
                           const float *verifier_logits, const uint32_t *allowed, int32_t k,
                           int32_t n_vocab, const cg_sampler_params *sp,
                           const cg_accept_params *ap, cg_rng *rng, float *work,
                           cg_step_result *out);

/* The law P of the token a drafted position emits (accepted draft or residual), exactly:
 *     P(x) = sum_n p[n] (1[x = n] a_n + (1 - a_n) r_n[x]),  a_n = the acceptance of draft n,
 *     r_n = the residual after rejecting n              (docs/maths.md, "The emitted law")
 * for the rule in ap (for Cactus with ap->budget = OUTPUT, at the delta' that rule picks).
 *   p:       float32 [n_vocab] the warped draft distribution (normalised, as cg_warp's rows are:
 *            the mass outside q's support is taken as 1 - the mass inside), or NULL for a
 *            deterministic drafter (p one-hot at token)
 *   token:   the drafted token when p is NULL (else ignored; may be anything)
 *   q:       float32 [n_vocab] the warped verifier distribution (a probability row)
 *   law:     float64 [n_vocab] out, P (NULL: not wanted); sums to 1 up to rounding
 *   work:    float32 [cg_workspace_size(n_vocab)]
 *   out:     KL(P || q), the acceptance probability, the delta used
 * Cost: cactus O(|supp q| log |R|) with R the drafts that can be rejected (law.c), typical and
 * topk O(V), sps and greedy O(|supp q|); the output budget repeats the cactus law ~20 times.
 * cg_verify computes the same law (without `law`) at every position it evaluates.
 * Errors: CG_ERR_BAD_ARGUMENT (NULL q / work / out, n_vocab < 1, bad params, token outside
 * [0, n_vocab) with p NULL), CG_ERR_BAD_DISTRIBUTION (p or q not a probability row). */
CG_API cg_status cg_emitted_law(const float *p, int32_t token, const float *q, int32_t n_vocab,
                                const cg_accept_params *ap, float *work, double *law, cg_law *out);

/* Compact rows. When the warps keep at most K tokens (top-k K > 0), a row needs only the ids that
 * can be kept: llama.cpp's backend sampler (llama.h, llama_set_sampler with a top-k(K + 1) chain)
 * leaves each output row's K + 1 largest logits and their ids on the device, and the step runs on
 * the union U of its rows' ids (ascending), every row gathered into U (-inf logits, 0 probabilities
 * outside its own ids): cg_verify / cg_warp_sample with n_vocab = |U| then give the full rows'
 * results index for index, with the same uniforms, because the warps select by (logit descending,
 * id ascending) and every draw walks the kept ids in id order skipping zeros. A row is exact when
 * its (K + 1)-th largest logit is strictly below its K-th: its K + 1 ids then hold every id the
 * top K can keep, whatever the ties inside it.
 *
 * The reader: llama.cpp's accessors of those rows, called with the context and an output index i
 * (negative: from the last row), given as pointers so the helper does not link llama.cpp
 * (llama_get_sampled_candidates_ith, _candidates_count_ith, _logits_ith, _logits_count_ith; their
 * struct llama_context * is passed as the void * ctx). */
typedef struct {
    void *ctx;
    const int32_t *(*candidates)(void *ctx, int32_t i);
    uint32_t (*candidates_count)(void *ctx, int32_t i);
    const float *(*logits)(void *ctx, int32_t i);
    uint32_t (*logits_count)(void *ctx, int32_t i);
} cg_row_reader;

/* Read the last decode's last n_rows output rows (i = -n_rows .. -1) of `width` = K + 1
 * candidates each: row r into ids int32 [n_rows, width] ascending and logits float32 [n_rows,
 * width] (the row's own float32 values). *inexact: the first row that is not exact (its count is
 * not width, an id outside [0, n_vocab) or repeated, a NaN, or its smallest logit not strictly
 * below the others), -1 when every row is; rows from there on are not read. One call per step:
 * no per-row crossing of a binding. Errors: CG_ERR_BAD_ARGUMENT (NULL pointers, n_rows < 1,
 * width < 2, n_vocab < 1). */
CG_API cg_status cg_read_rows(const cg_row_reader *rd, int32_t n_rows, int32_t width,
                              int32_t n_vocab, int32_t *ids, float *logits, int32_t *inexact);

/* The union U of a step's compact rows and every row gathered into it, for cg_verify over |U| ids:
 *   ver_ids, ver_logits: int32 / float32 [n_ver, ver_width], ids ascending (cg_read_rows)
 *   draft_ids, draft_probs: int32 / float32 [n_draft, draft_width] (NULL when n_draft = 0): each
 *                draft row's ids ascending, entries with id < 0 skipped (padding)
 *   draft_tokens: int32 [n_tokens], the drafted ids (in U even if no row holds them)
 *   end_mask:    uint32 [ceil(n_vocab / 32)] the acceptance's end set (cg_accept_params), or NULL
 *   scratch:     int32 [capacity];  capacity >= n_ver ver_width + n_draft draft_width + n_tokens
 * out: u_ids int32 [capacity] (U in [0, *n_out)), u_logits float32 [n_ver, |U|] (row stride |U|;
 * buffer of n_ver capacity), u_probs float32 [n_draft, |U|] (buffer of n_draft capacity), u_tokens
 * int32 [n_tokens] (each drafted token's index in U), u_end uint32 [ceil(|U| / 32)] (end_mask's
 * bits at U; buffer of ceil(capacity / 32) words; only with end_mask), *n_out = |U|.
 * Cost O(rows x |U|). Errors: CG_ERR_BAD_ARGUMENT (NULL pointers, too small a capacity, an id
 * outside [0, n_vocab), a row not ascending). */
CG_API cg_status cg_compact_union(const int32_t *ver_ids, const float *ver_logits, int32_t n_ver,
                                  int32_t ver_width, const int32_t *draft_ids,
                                  const float *draft_probs, int32_t n_draft, int32_t draft_width,
                                  const int32_t *draft_tokens, int32_t n_tokens,
                                  const uint32_t *end_mask, int32_t n_vocab, int32_t capacity,
                                  int32_t *scratch, int32_t *u_ids, float *u_logits,
                                  float *u_probs, int32_t *u_tokens, uint32_t *u_end,
                                  int32_t *n_out);

/* What the library is, for a caller that binds it at run time (ctypes): enum names, struct layouts.
 *
 * The name of each enum value, or NULL for a value outside [0, CG_*_COUNT): statuses ("ok",
 * "bad_argument", "nonfinite_logits", "bad_distribution", "empty_mask": CG_OK, CG_ERR_* in lower
 * case) and the option names of the others ("sps", "cactus", "typical", "topk", "greedy", "ears";
 * "taylor", "exact"; "target", "output"). A binding maps names to values by asking for 0, 1, ...
 * until NULL, so it never depends on the order of a list of its own. Static strings: never freed,
 * never written. */
CG_API const char *cg_status_name(int32_t status);
CG_API const char *cg_method_name(int32_t method);
CG_API const char *cg_solver_name(int32_t solver);
CG_API const char *cg_budget_name(int32_t budget);

/* The layout of the public structs, one row per call: row i is a struct ("cg_law": offset 0, its
 * sizeof) or one of its fields ("cg_law.kl": its offsetof and sizeof), every struct followed by its
 * fields in declaration order (cg_sampler_params, cg_accept_params, cg_rng, cg_step_result,
 * cg_law, cg_row_reader); NULL past the last row (i < 0 too). offset, size: out (NULL: not
 * wanted; untouched when NULL is returned). A binding asks for rows 0, 1, ... until NULL and
 * compares each with its mirror of the struct before it passes one: a field that moved (two
 * fields of one size swapped) is caught, not only a size that changed. Static strings. */
CG_API const char *cg_abi_field(int32_t i, int64_t *offset, int64_t *size);

#ifdef __cplusplus
}
#endif

#endif /* CACTUS_NATIVE_H */
