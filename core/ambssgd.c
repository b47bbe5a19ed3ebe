/*
 * ambssgd.c - DP-AMBSSGD / DP-SSGD as one pass over the rows (Varshney et al. 2022,
 * "Private linear regression via adaptive clipping", Algorithms 1-3).
 *
 * ambssgd.h describes the algorithm and the state. The loops have a fixed summation order and
 * no -ffast-math, so the PostgreSQL aggregate and the Cython engine give the same bits.
 */
#include <math.h>
#include <string.h>

#include "ambssgd.h"
#include "sgd.h"
#include "csprng.h"
#include "host.h"
#include "noise.h"

typedef DpsqlAmbssgdHeader Header;

/* The state's arrays, located from a validated header. */
typedef struct Layout
{
	double	   *w;
	double	   *g;
	double	   *tail;
	double	   *resid;
	double	   *gammas;
	double	   *zetas;
	double	   *draws;
	double	   *iterates;		/* NULL unless kept */
	DpsqlRng   *rng;
	size_t		len;			/* total length in doubles */
} Layout;

static int
is_count(double v, double max)
{
	return isfinite(v) && v >= 0.0 && v <= max && v == floor(v);
}

/* Offsets of the arrays; sizes are checked by the callers before anything is cast. */
static size_t
layout_of(double *state, size_t p, size_t s, size_t T, int keep, Layout *l)
{
	size_t		off = (size_t) DPSQL_AMBSSGD_HEADER_LEN;

	l->w = state ? state + off : NULL;
	off += p;
	l->g = state ? state + off : NULL;
	off += p;
	l->tail = state ? state + off : NULL;
	off += p;
	l->resid = state ? state + off : NULL;
	off += s;
	l->gammas = state ? state + off : NULL;
	off += T;
	l->zetas = state ? state + off : NULL;
	off += T;
	l->draws = state ? state + off : NULL;
	off += T;
	l->iterates = (state && keep) ? state + off : NULL;
	off += keep ? T * p : 0;
	l->rng = state ? (DpsqlRng *) (state + off) : NULL;
	off += DPSQL_AMBSSGD_RNG_LEN;
	l->len = off;
	return off;
}

static void
layout(double *state, Layout *l)
{
	const Header *h = (const Header *) state;

	layout_of(state, (size_t) h->p, (size_t) h->stat, (size_t) h->blocks,
			  h->keep_iterates != 0.0, l);
}

/* Shape checks shared by state_size and init: the arrays' sizes only. */
static const char *
shape_problem(const DpsqlAmbssgdParams *p)
{
	if (p->dim < 1 || p->dim > DPSQL_AMBSSGD_MAX_DIM)
		return "dim must be between 1 and 100000";
	if (p->intercept != 0 && p->intercept != 1)
		return "intercept must be 0 or 1";
	if (p->blocks < 2 || p->blocks > DPSQL_AMBSSGD_MAX_BLOCKS || p->blocks % 2 != 0)
		return "blocks (T) must be an even integer between 2 and 2^24";
	if (p->stat < 0 || (double) p->stat > DPSQL_AMBSSGD_MAX_ROWS)
		return "stat (s) must be >= 0";
	if (p->keep_iterates != 0 && p->keep_iterates != 1)
		return "keep_iterates must be 0 or 1";
	return NULL;
}

size_t
dpsql_ambssgd_state_size(const DpsqlAmbssgdParams *p)
{
	Layout		l;
	size_t		np;
	double		approx;

	if (p == NULL || shape_problem(p) != NULL)
		return 0;
	np = (size_t) p->dim + (size_t) p->intercept;
	/* in doubles first: no size_t overflow can slip through */
	approx = (double) DPSQL_AMBSSGD_HEADER_LEN + 3.0 * (double) np + (double) p->stat +
		3.0 * (double) p->blocks + (p->keep_iterates ? (double) p->blocks * (double) np : 0.0) +
		DPSQL_AMBSSGD_RNG_LEN;
	if (approx > (double) DPSQL_AMBSSGD_MAX_LEN)
		return 0;
	return layout_of(NULL, np, (size_t) p->stat, (size_t) p->blocks, p->keep_iterates, &l);
}

/* Every parameter; NULL when valid, else what is wrong. */
static const char *
params_problem(const DpsqlAmbssgdParams *p)
{
	const char *shape = shape_problem(p);
	double		zeta_max;

	if (shape != NULL)
		return shape;
	if (!(isfinite(p->x_bound) && p->x_bound >= 0.0))
		return "x_bound must be finite and >= 0 (0: no row clipping)";
	if (p->n_rows < 1 || (double) p->n_rows > DPSQL_AMBSSGD_MAX_ROWS)
		return "n_rows must be between 1 and 2^52";
	if (p->batch < 1 || (double) p->batch > DPSQL_AMBSSGD_MAX_ROWS)
		return "batch (b) must be >= 1";
	/* b + s < 2^53 exactly; then T (b + s) <= N without overflow */
	if (p->batch + p->stat > p->n_rows || p->blocks > p->n_rows / (p->batch + p->stat))
		return "blocks * (batch + stat) must not exceed n_rows";
	if (!(isfinite(p->alpha) && p->alpha >= 0.0))
		return "alpha must be finite and >= 0 (0: noiseless, tests only)";
	if (!(isfinite(p->eta) && p->eta > 0.0))
		return "eta must be finite and > 0";
	if (!(isfinite(p->r_x) && isfinite(p->log_factor) && isfinite(p->domain) &&
		  isfinite(p->sigma_c) && isfinite(p->theta) && isfinite(p->zeta_fixed)))
		return "r_x, log_factor, domain, sigma_c, theta and zeta_fixed must be finite";
	if (p->levels < 0 || p->levels > DPSQL_AMBSSGD_MAX_LEVELS)
		return "levels (L) must be between 0 and 2^20";
	if (p->stat == 0)
	{
		/* fixed mode: DP-SSGD and fixed-clipping baselines */
		if (!(p->zeta_fixed > 0.0))
			return "fixed mode (stat = 0) needs zeta_fixed > 0";
		zeta_max = p->zeta_fixed;
	}
	else
	{
		if (p->zeta_fixed != 0.0)
			return "zeta_fixed must be 0 in adaptive mode (stat > 0): DP-STAT sets zeta_t";
		if (!(p->r_x > 0.0))
			return "r_x must be > 0";
		if (!(p->log_factor > 0.0))
			return "log_factor must be > 0";
		if (!(p->domain > 0.0))
			return "domain (B) must be > 0";
		if (!(p->sigma_c >= 0.0))
			return "sigma_c must be >= 0";
		if (p->alpha > 0.0 && !(p->sigma_c > 0.0))
			return "a private run (alpha > 0) needs DP-STAT count noise sigma_c > 0";
		zeta_max = p->r_x * p->domain * p->log_factor;
	}
	if (!isfinite(zeta_max) || !isfinite(2.0 * zeta_max * p->alpha) ||
		!isfinite(p->eta * 2.0 * zeta_max * (p->alpha + 1.0)))
		return "the clipping norm (r_x * domain * log_factor, or zeta_fixed) or its noise overflows";
	return NULL;
}

DpsqlStatus
dpsql_ambssgd_init(double *state, size_t len, const DpsqlAmbssgdParams *p,
				   const char **problem)
{
	Header	   *h = (Header *) state;
	const char *why;
	int			fixed;

	if (problem != NULL)
		*problem = NULL;
	if (p == NULL)
		return DPSQL_E_PARAM;
	why = params_problem(p);
	if (why == NULL && (state == NULL || len != dpsql_ambssgd_state_size(p)))
		why = "state length does not match the parameters (or the state would be too large)";
	if (why != NULL)
	{
		if (problem != NULL)
			*problem = why;
		return DPSQL_E_PARAM;
	}
	fixed = p->stat == 0;
	memset(state, 0, len * sizeof(double));
	h->magic = DPSQL_AMBSSGD_MAGIC;
	h->version = DPSQL_AMBSSGD_VERSION;
	h->dim = p->dim;
	h->intercept = p->intercept;
	h->p = p->dim + p->intercept;
	h->x_bound = p->x_bound;
	h->n_rows = (double) p->n_rows;
	h->blocks = (double) p->blocks;
	h->batch = (double) p->batch;
	h->stat = (double) p->stat;
	h->alpha = p->alpha;
	h->eta = p->eta;
	/* DP-STAT's settings mean nothing in fixed mode: kept at 0 */
	h->r_x = fixed ? 0.0 : p->r_x;
	h->log_factor = fixed ? 0.0 : p->log_factor;
	h->domain = fixed ? 0.0 : p->domain;
	h->levels = fixed ? 0.0 : p->levels;
	h->sigma_c = fixed ? 0.0 : p->sigma_c;
	h->theta = fixed ? 0.0 : p->theta;
	h->zeta_fixed = p->zeta_fixed;
	h->keep_iterates = p->keep_iterates;
	h->zeta = fixed ? p->zeta_fixed : 0.0;
	return DPSQL_OK;
}

void
dpsql_ambssgd_set_rng(double *state, const DpsqlRng *rng)
{
	Layout		l;

	layout(state, &l);
	memcpy(l.rng, rng, sizeof(DpsqlRng));
}

void
dpsql_ambssgd_seed(double *state, const uint8_t key[32])
{
	Layout		l;

	layout(state, &l);
	dpsql_rng_init(l.rng, key, DPSQL_AMBSSGD_STREAM);
}

void
dpsql_ambssgd_seed_from_seed(double *state, int64_t seed)
{
	Layout		l;

	layout(state, &l);
	dpsql_rng_init_seed(l.rng, seed, DPSQL_AMBSSGD_STREAM);
}

DpsqlStatus
dpsql_ambssgd_check_header(const double *state, size_t len)
{
	const Header *h = (const Header *) state;
	DpsqlAmbssgdParams p;
	Layout		l;
	double		T;

	if (state == NULL || len < (size_t) DPSQL_AMBSSGD_HEADER_LEN + DPSQL_AMBSSGD_RNG_LEN ||
		h->magic != DPSQL_AMBSSGD_MAGIC || h->version != DPSQL_AMBSSGD_VERSION)
		return DPSQL_E_STATE;
	/* every integer field is a count before anything is cast */
	if (!is_count(h->dim, DPSQL_AMBSSGD_MAX_DIM) || !is_count(h->intercept, 1.0) ||
		h->p != h->dim + h->intercept ||
		!is_count(h->n_rows, DPSQL_AMBSSGD_MAX_ROWS) ||
		!is_count(h->blocks, (double) DPSQL_AMBSSGD_MAX_BLOCKS) ||
		!is_count(h->batch, DPSQL_AMBSSGD_MAX_ROWS) || !is_count(h->stat, DPSQL_AMBSSGD_MAX_ROWS) ||
		!is_count(h->levels, DPSQL_AMBSSGD_MAX_LEVELS) || !is_count(h->keep_iterates, 1.0))
		return DPSQL_E_STATE;
	p.dim = (int) h->dim;
	p.intercept = (int) h->intercept;
	p.x_bound = h->x_bound;
	p.n_rows = (int64_t) h->n_rows;
	p.blocks = (long) h->blocks;
	p.batch = (int64_t) h->batch;
	p.stat = (int64_t) h->stat;
	p.alpha = h->alpha;
	p.eta = h->eta;
	p.r_x = h->r_x;
	p.log_factor = h->log_factor;
	p.domain = h->domain;
	p.levels = (int) h->levels;
	p.sigma_c = h->sigma_c;
	p.theta = h->theta;
	p.zeta_fixed = h->zeta_fixed;
	p.keep_iterates = (int) h->keep_iterates;
	if (params_problem(&p) != NULL || dpsql_ambssgd_state_size(&p) != len)
		return DPSQL_E_STATE;
	/* progress counters */
	T = h->blocks;
	if (!is_count(h->block, T) || !is_count(h->pos, h->batch + h->stat - 1.0) ||
		(h->block == T && h->pos != 0.0) ||
		!is_count(h->unused, DPSQL_AMBSSGD_MAX_ROWS) || (h->unused > 0.0 && h->block < T) ||
		!is_count(h->clipped, DPSQL_AMBSSGD_MAX_ROWS) ||
		!(isfinite(h->zeta) && h->zeta >= 0.0) ||
		(h->stat == 0.0 && h->zeta != h->zeta_fixed))
		return DPSQL_E_STATE;
	layout((double *) state, &l);
	/* the generator hands out block[used]: an index from outside must stay in range */
	if (l.rng->used > 16 * DPSQL_RNG_BLOCKS)
		return DPSQL_E_STATE;
	return DPSQL_OK;
}

DpsqlStatus
dpsql_ambssgd_check(const double *state, size_t len)
{
	const Header *h = (const Header *) state;
	DpsqlStatus st = dpsql_ambssgd_check_header(state, len);
	Layout		l;
	double		L;
	size_t		t;

	if (st != DPSQL_OK)
		return st;
	layout((double *) state, &l);
	L = h->levels;
	for (t = 0; t < (size_t) h->blocks; t++)
		if (!is_count(l.draws[t], L + 1.0) || !(isfinite(l.gammas[t]) && l.gammas[t] >= 0.0) ||
			!(isfinite(l.zetas[t]) && l.zetas[t] >= 0.0))
			return DPSQL_E_STATE;
	return DPSQL_OK;
}

int
dpsql_ambssgd_row_length(const double *state)
{
	return (int) ((const Header *) state)->dim;
}

int64_t
dpsql_ambssgd_rows_used(const double *state)
{
	const Header *h = (const Header *) state;

	return (int64_t) h->block * ((int64_t) h->batch + (int64_t) h->stat) + (int64_t) h->pos;
}

int64_t
dpsql_ambssgd_rows_seen(const double *state)
{
	return dpsql_ambssgd_rows_used(state) + (int64_t) ((const Header *) state)->unused;
}

/* ---------------------------------------------------------------------------------------
 * Rows: augmentation, residual and clipped gradient
 * --------------------------------------------------------------------------------------- */

static int
all_finite(const double *x, int n)
{
	int			i;

	for (i = 0; i < n; i++)
		if (!isfinite(x[i]))
			return 0;
	return 1;
}

/*
 * One row as the algorithm sees it: the augmented, clipped row is x~ = (sc x, 1?) with norm
 * xn, and res = <x~, w> - y. A zero record has valid = 0 (x~ = 0, y = 0: res = 0).
 */
typedef struct RowView
{
	int			valid;
	double		sc;
	double		xn;
	double		res;
} RowView;

static void
view_row(int d, int intercept, double x_bound, const double *w, const double *x, int x_len,
		 double y, int is_null, RowView *v)
{
	double		ss,
				xnorm,
				xs;

	v->valid = 0;
	v->sc = 0.0;
	v->xn = 0.0;
	v->res = 0.0;
	if (is_null || x == NULL || x_len != d || !isfinite(y))
		return;
	ss = dpsql_dot(x, x, d);
	if (isfinite(ss))
		xnorm = sqrt(ss);
	else
	{
		/* NaN/Inf features, or finite ones whose squares overflow */
		if (!all_finite(x, d))
			return;
		xnorm = dpsql_rescaled_norm(x, d);
	}
	v->sc = (x_bound > 0.0 && xnorm > x_bound) ? x_bound / xnorm : 1.0;
	xs = v->sc * xnorm;
	v->xn = intercept ? hypot(xs, 1.0) : xs;
	v->res = v->sc * dpsql_dot(w, x, d) + (intercept ? w[d] : 0.0) - y;
	v->valid = 1;
}

/* The state's view of a row at its current w. */
static void
view_state_row(const Header *h, const double *w, const double *x, int x_len, double y,
			   int is_null, RowView *v)
{
	view_row((int) h->dim, h->intercept != 0.0, h->x_bound, w, x, x_len, y, is_null, v);
}

/*
 * The clipped gradient is c x~ with c = res min(1, zeta / (|res| ||x~||)), written as
 * sign(res) min(|res|, zeta / ||x~||) so that no product of huge numbers can overflow.
 * clip(0) = 0; zeta = 0 gives 0; a residual that overflowed to NaN gives 0.
 */
static double
clip_coef(const RowView *v, double zeta, int *clipped)
{
	double		cap;

	*clipped = 0;
	if (!v->valid || !(v->xn > 0.0) || v->res == 0.0)
		return 0.0;
	if (!(zeta > 0.0) || isnan(v->res))
	{
		*clipped = 1;
		return 0.0;
	}
	cap = zeta / v->xn;
	if (fabs(v->res) <= cap)
		return v->res;
	*clipped = 1;
	return copysign(cap, v->res);
}

/* g += the clipped gradient c x~ of a viewed row (the one summation order of every path) */
static void
add_gradient(double *g, const RowView *v, double c, const double *x, int d, int intercept)
{
	double		cs = c * v->sc;
	int			i;

	if (c == 0.0)
		return;
	for (i = 0; i < d; i++)
		g[i] += cs * x[i];
	if (intercept)
		g[d] += c;
}

/* A stat row's residual as DP-STAT counts it: |res|, NaN as +Infinity (a zero record's is 0) */
static double
stat_residual(const RowView *v)
{
	return isnan(v->res) ? INFINITY : fabs(v->res);
}

int
dpsql_ambssgd_clipped_gradient(const double *state, const double *x, int x_len, double y,
							   int is_null, double zeta, double *out)
{
	const Header *h = (const Header *) state;
	int			d = (int) h->dim;
	int			np = (int) h->p;
	RowView		v;
	double		c,
				cs;
	int			clipped;
	int			i;

	view_state_row(h, state + DPSQL_AMBSSGD_HEADER_LEN, x, x_len, y, is_null, &v);
	c = clip_coef(&v, zeta, &clipped);
	cs = c * v.sc;
	for (i = 0; i < np; i++)
		out[i] = 0.0;
	if (c != 0.0)
	{
		for (i = 0; i < d; i++)
			out[i] = cs * x[i];
		if (h->intercept != 0.0)
			out[d] = c;
	}
	return clipped;
}

/* ---------------------------------------------------------------------------------------
 * DP-STAT (Algorithm 3, robust variant)
 * --------------------------------------------------------------------------------------- */

double
dpsql_ambssgd_level(double domain, int levels, int i)
{
	/* integer levels (V4): never form B / N^100; ldexp is exact down to the subnormals */
	return ldexp(domain, i - levels);
}

int64_t
dpsql_ambssgd_count(const double *sorted, int64_t s, double level)
{
	int64_t		lo = 0,
				hi = s;

	/* first index whose residual exceeds the level */
	while (lo < hi)
	{
		int64_t		mid = lo + (hi - lo) / 2;

		if (sorted[mid] <= level)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static void
sift_down(double *r, int64_t root, int64_t n)
{
	for (;;)
	{
		int64_t		child = 2 * root + 1;
		double		tmp;

		if (child >= n)
			return;
		if (child + 1 < n && r[child + 1] > r[child])
			child++;
		if (!(r[child] > r[root]))
			return;
		tmp = r[root];
		r[root] = r[child];
		r[child] = tmp;
		root = child;
	}
}

void
dpsql_ambssgd_sort(double *r, int64_t s)
{
	int64_t		i;

	for (i = 0; i < s; i++)
		if (isnan(r[i]))
			r[i] = INFINITY;
	/* s is up to the state's length (2^27 in the server): seconds of work, so interruptible */
	for (i = s / 2; i-- > 0;)
	{
		DPSQL_CHECK_INTERRUPTS_EVERY(i, 16);
		sift_down(r, i, s);
	}
	for (i = s - 1; i > 0; i--)
	{
		double		tmp = r[0];

		DPSQL_CHECK_INTERRUPTS_EVERY(i, 16);
		r[0] = r[i];
		r[i] = tmp;
		sift_down(r, 0, i);
	}
}

/*
 * One level of DP-STAT: its count plus a fresh Gaussian (V1: sigma_c = alpha sqrt(L + 1)
 * covers all L + 1), against the threshold.
 */
static int
noisy_count_reaches(DpsqlRng *rng, double count, double sigma_c, double theta)
{
	if (sigma_c > 0.0)
		count += sigma_c * dpsql_sample_normal(rng);
	return count >= theta;
}

int
dpsql_ambssgd_dp_stat(DpsqlRng *rng, double *resid, int64_t s, double domain, int levels,
					  double sigma_c, double theta, int *draws)
{
	int			i;

	dpsql_ambssgd_sort(resid, s);
	for (i = 0; i <= levels; i++)
	{
		double		count = (double) dpsql_ambssgd_count(resid, s, dpsql_ambssgd_level(domain, levels, i));

		if (noisy_count_reaches(rng, count, sigma_c, theta))
		{
			*draws = i + 1;
			return i;
		}
	}
	*draws = levels + 1;
	return levels;
}

/* ---------------------------------------------------------------------------------------
 * The pass
 * --------------------------------------------------------------------------------------- */

/* DP-STAT's outcome for block t: gamma_t, its draws and zeta_t = r_x gamma_t log_factor. */
static void
set_block_clip(Header *h, const Layout *l, int64_t t, int level, int draws)
{
	double		gamma = dpsql_ambssgd_level(h->domain, (int) h->levels, level);

	l->gammas[t] = gamma;
	l->draws[t] = draws;
	h->zeta = h->r_x * gamma * h->log_factor;
}

/* End of block t's gradient batch: the noisy step, the transcript and the tail sum. */
static void
take_step(Header *h, const Layout *l, int64_t t)
{
	size_t		np = (size_t) h->p;
	long		T = (long) h->blocks;
	double		b = h->batch;
	double		noise_std = 2.0 * h->zeta * h->alpha / b;
	size_t		i;

	for (i = 0; i < np; i++)
	{
		double		step = l->g[i] / b;

		if (h->alpha > 0.0)
			step += noise_std * dpsql_sample_normal_fast(l->rng);
		l->w[i] -= h->eta * step;
		l->g[i] = 0.0;
	}
	l->zetas[t] = h->zeta;
	/* w_{t+1} is one of the averaged iterates w_{T/2+1}..w_T */
	if (t + 1 >= T / 2 + 1)
		for (i = 0; i < np; i++)
			l->tail[i] += l->w[i];
	if (l->iterates != NULL)
		memcpy(l->iterates + (size_t) t * np, l->w, np * sizeof(double));
}

void
dpsql_ambssgd_row(double *state, const double *x, int x_len, double y, int is_null)
{
	Header	   *h = (Header *) state;
	int64_t		s = (int64_t) h->stat;
	int64_t		b = (int64_t) h->batch;
	int64_t		t = (int64_t) h->block;
	int64_t		j = (int64_t) h->pos;
	Layout		l;
	RowView		v;

	if (h->block >= h->blocks)
	{
		/* after T (b + s) rows: never read */
		h->unused += 1.0;
		return;
	}
	layout(state, &l);
	view_state_row(h, l.w, x, x_len, y, is_null, &v);
	if (j < s)
	{
		/* stat sample: the residual at w_t (a zero record's is 0) */
		l.resid[j] = stat_residual(&v);
		if (j == s - 1)
		{
			int			draws;
			int			level = dpsql_ambssgd_dp_stat(l.rng, l.resid, s, h->domain, (int) h->levels,
													  h->sigma_c, h->theta, &draws);

			set_block_clip(h, &l, t, level, draws);
		}
	}
	else
	{
		int			clipped;
		double		c = clip_coef(&v, h->zeta, &clipped);

		if (clipped)
			h->clipped += 1.0;
		add_gradient(l.g, &v, c, x, (int) h->dim, h->intercept != 0.0);
		if (j == s + b - 1)
			take_step(h, &l, t);
	}
	if (j + 1 == s + b)
	{
		h->block += 1.0;
		h->pos = 0.0;
	}
	else
		h->pos += 1.0;
}

DpsqlStatus
dpsql_ambssgd_result(const double *state, double *w_bar, DpsqlAmbssgdResult *r)
{
	const Header *h = (const Header *) state;
	size_t		np = (size_t) h->p;
	double		half = h->blocks / 2.0;
	Layout		l;
	size_t		i;

	layout((double *) state, &l);
	if (r != NULL)
	{
		r->p = (int) np;
		r->blocks = (long) h->blocks;
		r->blocks_done = (long) h->block;
		r->rows_used = dpsql_ambssgd_rows_used(state);
		r->rows_unused = (int64_t) h->unused;
		r->clipped = (int64_t) h->clipped;
		r->gammas = l.gammas;
		r->zetas = l.zetas;
		r->draws = l.draws;
		r->w_last = l.w;
		r->iterates = l.iterates;
	}
	if (w_bar == NULL)
		return DPSQL_OK;
	if (h->block < h->blocks)
		return DPSQL_E_STATE;
	for (i = 0; i < np; i++)
	{
		w_bar[i] = l.tail[i] / half;
		if (!isfinite(w_bar[i]))
			return DPSQL_E_DIVERGED;
	}
	return DPSQL_OK;
}

/* ---------------------------------------------------------------------------------------
 * The pass on shards: a block's counts and gradient sum computed elsewhere
 * --------------------------------------------------------------------------------------- */

typedef DpsqlAmbssgdProbeHeader ProbeHeader;

size_t
dpsql_ambssgd_probe_length(const double *state)
{
	return (size_t) DPSQL_AMBSSGD_PROBE_HEADER_LEN + (size_t) ((const Header *) state)->p;
}

DpsqlStatus
dpsql_ambssgd_probe(const double *state, double *probe)
{
	const Header *h = (const Header *) state;
	ProbeHeader *ph = (ProbeHeader *) probe;

	if (h->block >= h->blocks)
		return DPSQL_E_STATE;
	ph->magic = DPSQL_AMBSSGD_PROBE_MAGIC;
	ph->dim = h->dim;
	ph->intercept = h->intercept;
	ph->x_bound = h->x_bound;
	ph->domain = h->domain;
	ph->levels = h->levels;
	/* the block's clipping norm once DP-STAT set it (adaptive), else zeta_fixed or 0 */
	ph->zeta = h->zeta;
	memcpy(probe + DPSQL_AMBSSGD_PROBE_HEADER_LEN, state + DPSQL_AMBSSGD_HEADER_LEN,
		   sizeof(double) * (size_t) h->p);
	return DPSQL_OK;
}

DpsqlStatus
dpsql_ambssgd_probe_check(const double *probe, size_t len)
{
	const ProbeHeader *ph = (const ProbeHeader *) probe;

	if (probe == NULL || len < (size_t) DPSQL_AMBSSGD_PROBE_HEADER_LEN ||
		ph->magic != DPSQL_AMBSSGD_PROBE_MAGIC || !is_count(ph->dim, DPSQL_AMBSSGD_MAX_DIM) ||
		ph->dim < 1.0 || !is_count(ph->intercept, 1.0) ||
		len != (size_t) DPSQL_AMBSSGD_PROBE_HEADER_LEN + (size_t) (ph->dim + ph->intercept) ||
		!(isfinite(ph->x_bound) && ph->x_bound >= 0.0) ||
		!(isfinite(ph->domain) && ph->domain >= 0.0) ||
		!is_count(ph->levels, DPSQL_AMBSSGD_MAX_LEVELS) ||
		!(isfinite(ph->zeta) && ph->zeta >= 0.0))
		return DPSQL_E_STATE;
	return DPSQL_OK;
}

static void
view_probe_row(const ProbeHeader *ph, const double *x, int x_len, double y, int is_null,
			   RowView *v)
{
	view_row((int) ph->dim, ph->intercept != 0.0, ph->x_bound,
			 (const double *) ph + DPSQL_AMBSSGD_PROBE_HEADER_LEN, x, x_len, y, is_null, v);
}

int
dpsql_ambssgd_probe_bucket(const double *probe, const double *x, int x_len, double y,
						   int is_null)
{
	const ProbeHeader *ph = (const ProbeHeader *) probe;
	int			levels = (int) ph->levels;
	RowView		v;
	double		r;
	int			i;

	view_probe_row(ph, x, x_len, y, is_null, &v);
	r = stat_residual(&v);
	/* the levels grow with i: the same comparisons as dpsql_ambssgd_count's */
	for (i = 0; i <= levels; i++)
		if (r <= dpsql_ambssgd_level(ph->domain, levels, i))
			return i;
	return levels + 1;
}

int
dpsql_ambssgd_probe_add(const double *probe, const double *x, int x_len, double y, int is_null,
						double *g)
{
	const ProbeHeader *ph = (const ProbeHeader *) probe;
	RowView		v;
	int			clipped;
	double		c;

	view_probe_row(ph, x, x_len, y, is_null, &v);
	c = clip_coef(&v, ph->zeta, &clipped);
	add_gradient(g, &v, c, x, (int) ph->dim, ph->intercept != 0.0);
	return clipped;
}

DpsqlStatus
dpsql_ambssgd_sums_combine(double *a, const double *b, size_t n)
{
	size_t		i;

	if (n < 1)
		return DPSQL_E_STATE;
	for (i = 0; i < n; i++)
		a[i] += b[i];
	return DPSQL_OK;
}

DpsqlStatus
dpsql_ambssgd_block_stat(double *state, const double *hist, size_t n)
{
	Header	   *h = (Header *) state;
	int			levels = (int) h->levels;
	double		count = 0.0;
	Layout		l;
	int			i;

	if (h->stat == 0.0 || h->block >= h->blocks || h->pos != 0.0)
		return DPSQL_E_STATE;
	if (n != (size_t) levels + 3 || hist[0] != h->stat)
		return DPSQL_E_PARAM;
	for (i = 0; i <= levels + 1; i++)
	{
		if (!is_count(hist[1 + i], h->stat))
			return DPSQL_E_PARAM;
		count += hist[1 + i];
	}
	if (count != h->stat)
		return DPSQL_E_PARAM;
	layout(state, &l);
	/* level i's count is #{r <= B 2^(i - L)}: the buckets up to i */
	count = 0.0;
	for (i = 0; i <= levels; i++)
	{
		count += hist[1 + i];
		if (noisy_count_reaches(l.rng, count, h->sigma_c, h->theta))
			break;
	}
	if (i > levels)
		set_block_clip(h, &l, (int64_t) h->block, levels, levels + 1);
	else
		set_block_clip(h, &l, (int64_t) h->block, i, i + 1);
	h->pos = h->stat;
	return DPSQL_OK;
}

DpsqlStatus
dpsql_ambssgd_block_step(double *state, const double *sums, size_t n)
{
	Header	   *h = (Header *) state;
	size_t		np = (size_t) h->p;
	Layout		l;

	if (h->block >= h->blocks || h->pos != h->stat)
		return DPSQL_E_STATE;
	if (n != 2 + np || sums[0] != h->batch || !is_count(sums[1], h->batch))
		return DPSQL_E_PARAM;
	layout(state, &l);
	memcpy(l.g, sums + 2, sizeof(double) * np);
	h->clipped += sums[1];
	take_step(h, &l, (int64_t) h->block);
	h->block += 1.0;
	h->pos = 0.0;
	return DPSQL_OK;
}

/* The generator must fit its slot in the state. */
typedef char dpsql_ambssgd_rng_fits[(sizeof(DpsqlRng) <= DPSQL_AMBSSGD_RNG_LEN * sizeof(double)) ? 1 : -1];
