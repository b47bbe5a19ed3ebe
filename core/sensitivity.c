/*
 * sensitivity.c - bolt-on sensitivity: closed forms and the exact growth recursion.
 */
#include <math.h>

#include "host.h"
#include "sensitivity.h"
#include "sgd.h"

#define SLACK (1.0 + 1e-12)

static double
step(const DpsqlSensitivityParams *p, double s)
{
	return dpsql_schedule_step(p->schedule, p->eta, p->offset, p->smoothness,
							   p->strong_convexity, s);
}

static DpsqlStatus
check(const DpsqlSensitivityParams *p, long *n)
{
	/* A loss cannot be more strongly convex than it is smooth (gamma <= beta). */
	if (p->rows < 1 || p->batch_size < 1 || p->epochs < 1 || !(p->lipschitz >= 0.0) ||
		!isfinite(p->lipschitz) || !(p->smoothness > 0.0) || !isfinite(p->smoothness) ||
		!(p->strong_convexity >= 0.0) || !(p->strong_convexity <= p->smoothness))
		return DPSQL_E_PARAM;
	if (!(step(p, 1.0) > 0.0) || !isfinite(step(p, 1.0)))
		return DPSQL_E_PARAM;
	*n = p->rows / p->batch_size;
	if (*n < 1)
		return DPSQL_E_PARAM;
	if (p->schedule == DPSQL_SCHEDULE_DECREASING && !(p->strong_convexity > 0.0))
		return DPSQL_E_PARAM;
	return DPSQL_OK;
}

/* Convex bound: each pass adds (2L/b) eta at the differing record's step; steps never grow. */
static double
convex_sum(const DpsqlSensitivityParams *p, long n)
{
	double		total = 0.0;
	long		j;

	if (p->schedule == DPSQL_SCHEDULE_CONSTANT)
		return 2.0 * (double) p->epochs * p->lipschitz * p->eta / (double) p->batch_size;
	/* no closed form for these sums: epochs (an int in SQL) bounds the loop, interruptible */
	for (j = 0; j < p->epochs; j++)
	{
		DPSQL_CHECK_INTERRUPTS_EVERY(j, 16);
		total += step(p, 1.0 + (double) j * (double) n);
	}
	return 2.0 * p->lipschitz * total / (double) p->batch_size;
}

DpsqlStatus
dpsql_bolton_sensitivity(const DpsqlSensitivityParams *p, double *delta2)
{
	long		n;
	double		gamma = p->strong_convexity;
	double		b = (double) p->batch_size;
	double		eta1;
	DpsqlStatus st = check(p, &n);

	if (st != DPSQL_OK)
		return st;
	eta1 = step(p, 1.0);
	if (gamma > 0.0 && p->schedule == DPSQL_SCHEDULE_DECREASING)
	{
		/* Lemma 8; ERRATA: 2L/(gamma m), and mini-batches do not divide it by b (5.5). */
		*delta2 = 2.0 * p->lipschitz / (gamma * (double) n * b);
		if (p->paper_minibatch)
			*delta2 /= b;
		return DPSQL_OK;
	}
	if (gamma > 0.0 && p->schedule == DPSQL_SCHEDULE_CONSTANT && eta1 <= SLACK / p->smoothness)
	{
		/* Lemma 7, mini-batch form: the exponent is n, not m. */
		double		rho = 1.0 - eta1 * gamma;

		*delta2 = (2.0 * eta1 * p->lipschitz / b) * (1.0 - pow(rho, (double) p->epochs * (double) n)) /
			(1.0 - pow(rho, (double) n));
		return DPSQL_OK;
	}
	/* Lemma 1.1: every step is 1-expansive only while eta <= 2/beta (the first is the largest). */
	if (!(eta1 > 0.0) || eta1 > SLACK * 2.0 / p->smoothness)
		return DPSQL_E_PARAM;
	*delta2 = convex_sum(p, n);
	return DPSQL_OK;
}

DpsqlStatus
dpsql_exact_sensitivity(const DpsqlSensitivityParams *p, double *delta2)
{
	long		n;
	long		total_steps;
	long		s;
	double		beta = p->smoothness;
	double		gamma = p->strong_convexity;
	double		scale = 2.0 * p->lipschitz / (double) p->batch_size;
	double		product = 1.0;	/* prod_{u > s} rho_u */
	double	   *per_position = NULL;
	double		pass_max = 0.0;
	double		result = 0.0;
	DpsqlStatus st = check(p, &n);

	if (st != DPSQL_OK)
		return st;
	/* sizes first: k n must not overflow, nor run for hours, nor allocate gigabytes */
	if (n > DPSQL_SENSITIVITY_MAX_STEPS / p->epochs)
		return DPSQL_E_LIMIT;
	total_steps = p->epochs * n;
	if (!p->fresh_permutation)
	{
		if (n > DPSQL_SENSITIVITY_MAX_POSITIONS)
			return DPSQL_E_LIMIT;
		/* the host's memory: in PostgreSQL an interrupt below frees it with the context */
		per_position = dpsql_alloc_array((size_t) n, sizeof(double));
		if (per_position == NULL)
			return DPSQL_E_MEMORY;
	}
	for (s = total_steps; s >= 1; s--)
	{
		double		eta = step(p, (double) s);
		double		rho;
		double		c = scale * eta * product;

		DPSQL_CHECK_INTERRUPTS_EVERY(s, 16);
		if (per_position != NULL)
			per_position[(s - 1) % n] += c;
		else
		{
			pass_max = fmax(pass_max, c);
			if ((s - 1) % n == 0)	/* first step of a pass: close it */
			{
				result += pass_max;
				pass_max = 0.0;
			}
		}
		/* Expansiveness of step s (Lemmas 1 and 2). */
		if (gamma == 0.0)
		{
			if (eta > SLACK * 2.0 / beta)
				st = DPSQL_E_PARAM;
			rho = 1.0;
		}
		else if (eta <= SLACK / beta)
			rho = 1.0 - eta * gamma;
		else if (eta <= SLACK * 2.0 / (beta + gamma))
			rho = 1.0 - 2.0 * eta * beta * gamma / (beta + gamma);
		else if (eta <= SLACK * 2.0 / beta)
			rho = 1.0;			/* still convex: 1-expansive (Lemma 1.1) */
		else
		{
			st = DPSQL_E_PARAM;
			rho = 1.0;
		}
		product *= rho;
	}
	if (per_position != NULL)
	{
		long		i;

		for (i = 0; i < n; i++)
			result = fmax(result, per_position[i]);
		dpsql_free(per_position);
	}
	*delta2 = result;
	return st;
}
