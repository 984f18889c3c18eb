/*
 * gamma.c - the Cactus target mass on the drafted token (docs/maths.md, "Cactus").
 *
 * Cactus (Hao & Mou 2026) maximises the acceptance of the drafted token n subject to KL(h || q) <= delta.
 * The optimum keeps the shape of q off n:  h[n] = gamma,  h[i] = q[i] (1 - gamma) / (1 - q[n]),  and
 * then KL(h || q) equals the binary KL
 *     D(gamma || q_n) = gamma log(gamma / q_n) + (1 - gamma) log((1 - gamma) / (1 - q_n)).
 * Taylor (the paper's closed form, from D ~ (gamma - q_n)^2 / (2 q_n (1 - q_n))):
 *     gamma = min(1, q_n + sqrt(2 delta q_n (1 - q_n)))
 * Exact: the root of D(gamma || q_n) = delta in [q_n, 1], or 1 when D(1 || q_n) = -log q_n <= delta.
 * delta = 0 returns q_n exactly (both solvers), which makes Cactus bit-for-bit SpS.
 */
#include "cg_internal.h"

static const char *const SOLVER_NAMES[] = {
    [CG_SOLVER_TAYLOR] = "taylor",
    [CG_SOLVER_EXACT] = "exact",
};
_Static_assert(sizeof SOLVER_NAMES / sizeof SOLVER_NAMES[0] == CG_SOLVER_COUNT,
               "one name per cg_solver");

const char *cg_solver_name(int32_t solver)
{
    return solver >= 0 && solver < CG_SOLVER_COUNT ? SOLVER_NAMES[solver] : NULL;
}

/* Written with log1p of the relative changes (g - q) / q and (q - g) / (1 - q): for g near q the
 * two terms are each ~ (g - q) and cancel to ~ (g - q)^2 / (2 q (1 - q)); plain log(g / q) carries an
 * absolute error of ~1e-17 there, which made the result negative and the exact solver overshoot
 * budgets below ~1e-16. The max(0, .) guard covers the last-ulp rounding that can remain. */
double cgi_binary_kl(double g, double q)
{
    double a = 0.0;
    double b = 0.0;
    if (g > 0.0) {
        a = g * log1p((g - q) / q); /* q = 0 < g: +inf */
    }
    if (g < 1.0) {
        b = (1.0 - g) * log1p((q - g) / (1.0 - q)); /* q = 1 > g: +inf */
    }
    return a + b > 0.0 ? a + b : 0.0; /* KL >= 0 */
}

static double gamma_taylor(double q, double delta)
{
    const double g = q + sqrt(2.0 * delta * q * (1.0 - q));
    return g < 1.0 ? g : 1.0;
}

/*
 * f(g) = D(g || q) - delta on [q, 1]: f(q) = -delta < 0, f' = logit(g) - logit(q) >= 0 and
 * f'' = 1 / (g (1 - g)) > 0, so f is increasing and convex with one root. Safeguarded Newton: keep a
 * bracket [lo, hi] around the root, take the Newton step when it lands strictly inside the bracket,
 * bisect otherwise (at g = q, f' = 0). Converges to ~1 ulp; capped at 200 iterations.
 */
static double gamma_exact(double q, double delta)
{
    if (-log(q) <= delta) {
        return 1.0; /* f(1) = -log q - delta <= 0: even gamma = 1 fits the budget */
    }
    const double logit_q = log(q / (1.0 - q));
    double lo = q;
    double hi = 1.0;
    double g = gamma_taylor(q, delta);
    if (!(g > lo && g < hi)) {
        g = 0.5 * (lo + hi);
    }
    for (int it = 0; it < 200; ++it) {
        const double f = cgi_binary_kl(g, q) - delta;
        if (f == 0.0) {
            return g;
        }
        if (f > 0.0) {
            hi = g;
        } else {
            lo = g;
        }
        const double slope = log(g / (1.0 - g)) - logit_q;
        double g_next = g - f / slope;
        if (!(g_next > lo && g_next < hi)) {
            g_next = 0.5 * (lo + hi); /* Newton left the bracket, or slope = 0 */
        }
        if (g_next == g || hi - lo <= 2.0 * DBL_EPSILON * hi) {
            g = g_next;
            break;
        }
        g = g_next;
    }
    /* The root is only known to a few ulps: never hand back a gamma whose (computed) KL exceeds the
     * budget. lo always satisfies binary_kl(lo, q) <= delta (it starts at q, where the KL is 0). */
    return cgi_binary_kl(g, q) <= delta ? g : lo;
}

double cg_cactus_gamma(double q_n, double delta, int32_t solver)
{
    if (isnan(q_n) || !(delta >= 0.0) || (solver != CG_SOLVER_TAYLOR && solver != CG_SOLVER_EXACT)) {
        return NAN; /* invalid input; cg_verify validates before calling */
    }
    if (q_n <= 0.0) {
        return 0.0; /* q[n] = 0: any h[n] > 0 has infinite KL, the token is never accepted */
    }
    if (q_n >= 1.0) {
        return 1.0; /* q[n] = 1: h = q */
    }
    if (delta == 0.0) {
        return q_n; /* no budget: h = q exactly (SpS) */
    }
    return solver == CG_SOLVER_TAYLOR ? gamma_taylor(q_n, delta) : gamma_exact(q_n, delta);
}
