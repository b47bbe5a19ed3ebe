/*
 * sensitivity.h - L2 sensitivity of the PSGD output (Wu et al. 2017, "Bolt-on DP", §3.2): the
 * closed forms the bolt-on releases use, and the exact growth-recursion calculator that checks
 * them.
 *
 * Neighbouring datasets are replace-one and m is public. n = floor(m/b) updates per pass (the
 * partial batch is dropped), so m_eff = n b replaces m. The same permutation is used for S and
 * S'; "fresh" permutations (a new one each pass) take the worst position per pass.
 */
#ifndef DPSQL_SENSITIVITY_H
#define DPSQL_SENSITIVITY_H

#include "status.h"

typedef struct DpsqlSensitivityParams
{
	int			schedule;		/* DpsqlSchedule */
	double		eta;			/* schedule parameters (see dpsql_schedule_step) */
	double		offset;
	double		lipschitz;		/* L of each example's loss on the model space */
	double		smoothness;		/* beta */
	double		strong_convexity;	/* gamma; 0 = merely convex */
	long		rows;			/* m */
	long		batch_size;		/* b */
	long		epochs;			/* k */
	int			fresh_permutation;
	int			paper_minibatch;	/* SC decreasing: the paper's 2L/(gamma m b) (UNSOUND) */
} DpsqlSensitivityParams;

/*
 * Closed forms (Wu et al. 2017, Corollaries 1-3, Lemmas 7 and 8; Corollary 2 as the exact sum,
 * since its printed ln k form is below the true bound at small k; strongly convex mini-batch
 * without the paper's division by b, which fails with decreasing steps, §3.2.3):
 *   convex constant eta <= 2/beta:      2 k L eta / b
 *   convex inverse / sqrt schedules:    (2L/b) sum_{j<k} eta_{1 + j n}     (Cor. 2/3, exact sums)
 *   SC decreasing min(1/beta, 1/(gamma t)): 2L / (gamma m_eff)            (independent of b, k)
 *   SC constant eta <= 1/beta:          (2 eta L / b)(1 - rho^{kn}) / (1 - rho^n), rho = 1 - eta gamma
 * SC with another schedule uses the convex bound (strongly convex steps are also 1-expansive).
 * DPSQL_E_PARAM when a step exceeds its limit (2/beta convex, 1/beta SC decreasing) or n = 0.
 */
DpsqlStatus dpsql_bolton_sensitivity(const DpsqlSensitivityParams *p, double *delta2);

/*
 * Limits of the growth recursion (public: the SQL function's error names them). It runs one
 * iteration per step, k n <= 2^32 (seconds, interruptible); with one permutation for every pass
 * it keeps one double per position of a pass, n <= 2^24 (128 MB). DPSQL_E_LIMIT above them: the
 * closed forms have no such limit.
 */
#define DPSQL_SENSITIVITY_MAX_STEPS (1L << 32)
#define DPSQL_SENSITIVITY_MAX_POSITIONS (1L << 24)

/*
 * The growth recursion (Wu et al. 2017, Lemma 4, unrolled over the worst position per pass),
 * O(k n): always <= the closed form.
 * DPSQL_E_LIMIT beyond the limits above, DPSQL_E_MEMORY when its work area is not available.
 */
DpsqlStatus dpsql_exact_sensitivity(const DpsqlSensitivityParams *p, double *delta2);

#endif
