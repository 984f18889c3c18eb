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
 * Rules: Y. Hao, L. Mou, "Cactus: Accelerating Auto-Regressive Decoding with Constrained Acceptance
 * Speculative Sampling", ICLR 2026, arXiv:2604.04987; SpS: Leviathan et al. 2023, Chen et al. 2023;
 * typical acceptance: Cai et al. 2024 (Medusa) as in vLLM.
 *
 * Contract: no allocation, no printing, no exit, no global state. Every function returns a
 * cg_status; the Python facade maps each code to a specific exception. Randomness comes only from
 * the cg_rng passed in, so the same seed gives the same trace.
 */
#ifndef CACTUS_NATIVE_H
#define CACTUS_NATIVE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    CG_OK = 0,
    CG_ERR_BAD_ARGUMENT = 1,   /* a NULL pointer, V < 1, k < 0, a token outside [0, V), bad params */
    CG_ERR_NONFINITE_LOGITS = 2, /* a NaN or +inf logit, or every logit -inf */
    CG_ERR_BAD_DISTRIBUTION = 3, /* a probability row that is negative, NaN, or sums to 0 */
} cg_status;

typedef enum {
    CG_METHOD_SPS = 0,     /* h = q: the output follows the verifier exactly */
    CG_METHOD_CACTUS = 1,  /* h = argmax acceptance s.t. KL(h || q) <= delta */
    CG_METHOD_TYPICAL = 2, /* accept if q[n] > min(eps, alpha * exp(-H(q))); else emit argmax q */
    CG_METHOD_TOPK = 3,    /* accept if n in top-accept_top_k of q; residual norm(max(0, 1[topk] - p)) */
    CG_METHOD_GREEDY = 4,  /* sample x ~ q at each position; accept while x == n; else emit x */
} cg_method;

typedef enum {
    CG_SOLVER_TAYLOR = 0,  /* gamma = min(1, q[n] + sqrt(2 delta q[n] (1 - q[n])))  (paper, closed form) */
    CG_SOLVER_EXACT = 1,   /* gamma = root in [q[n], 1] of the binary KL = delta, or 1 if none */
} cg_solver;

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
} cg_step_result;

/* Seed the generator. Same seed, same sequence. */
void cg_rng_seed(cg_rng *rng, uint64_t seed);

/* Uniform double in [0, 1) from 53 random bits. */
double cg_rng_uniform(cg_rng *rng);

/* Scratch floats the caller must provide to the functions below (per call, reused): */
int64_t cg_workspace_size(int32_t n_vocab);

/* Warp one logits row into probabilities.
 *   logits: float32 [n_logits]  raw logits (read only). n_logits <= n_vocab; entries
 *           [n_logits, n_vocab) of probs are set to 0 (a draft vocabulary that is a prefix).
 *   probs:  float32 [n_vocab]   output, sums to 1, zeros outside the kept set.
 *   work:   float32 [cg_workspace_size(n_vocab)]
 * Errors: CG_ERR_NONFINITE_LOGITS, CG_ERR_BAD_ARGUMENT. */
cg_status cg_warp(const float *logits, int32_t n_logits, int32_t n_vocab,
                  const cg_sampler_params *sp, float *probs, float *work);

/* Draw a token from a probability row (need not be normalised; must have a positive sum).
 *   probs: float32 [n_vocab];  token: out. */
cg_status cg_sample_probs(const float *probs, int32_t n_vocab, cg_rng *rng, int32_t *token);

/* Warp then sample: the draft's per-token call and the verifier-alone baseline's.
 *   probs: float32 [n_vocab] out (the warped distribution the token was drawn from). */
cg_status cg_warp_sample(const float *logits, int32_t n_logits, int32_t n_vocab,
                         const cg_sampler_params *sp, cg_rng *rng, float *probs, float *work,
                         int32_t *token);

/* Cactus target mass on the drafted token: gamma(q_n, delta) for the given solver.
 * q_n in [0, 1]; delta >= 0. q_n = 0 -> 0; q_n = 1 -> 1. */
double cg_cactus_gamma(double q_n, double delta, int32_t solver);

/* One verification step.
 *   draft_probs:     float32 [k, n_vocab], row stride n_vocab; the warped draft distributions p.
 *                    NULL means a deterministic drafter (p one-hot at each drafted token).
 *   draft_tokens:    int32 [k]
 *   verifier_logits: float32 [k+1, n_vocab], row stride n_vocab (read in place; row i is the
 *                    verifier's prediction for draft position i, row k the bonus position)
 *   k:               draft length, >= 0 (k = 0 just samples the bonus from row 0)
 *   work:            float32 [cg_workspace_size(n_vocab)]
 *   out:             result (see cg_step_result)
 * Uses the rng in a fixed order, so the same seed and inputs give the same result. */
cg_status cg_verify(const float *draft_probs, const int32_t *draft_tokens,
                    const float *verifier_logits, int32_t k, int32_t n_vocab,
                    const cg_sampler_params *sp, const cg_accept_params *ap, cg_rng *rng,
                    float *work, cg_step_result *out);

#ifdef __cplusplus
}
#endif

#endif /* CACTUS_NATIVE_H */
