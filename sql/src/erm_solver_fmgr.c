/*
 * erm_solver_fmgr.c - the fixed-work Newton solver (core/erm_solver.h) in SQL: the line-search
 * aggregate dpsql_internal._glm_line (J along the Newton direction at the fixed step sizes,
 * one scan), the step's choice dpsql_internal._glm_line_choose, and, for a local table whose
 * rows fit in dpsql.sampling_memory, the whole solve from one scan,
 * dpsql_internal._glm_solve_rows. 45_erm_solver.sql drives them.
 *
 * A NULL, malformed or non-finite record is the zero record (it counts in n, adds nothing and
 * costs a row's arithmetic), never an error that could leak it.
 */
#include "postgres.h"

#include <math.h>

#include "catalog/pg_type.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/guc.h"
#include "utils/memutils.h"

#include "erm_solver.h"
#include "glue.h"
#include "objective.h"

PG_FUNCTION_INFO_V1(dpsql_glm_line_transition);
PG_FUNCTION_INFO_V1(dpsql_glm_line_combine);
PG_FUNCTION_INFO_V1(dpsql_glm_line_final);
PG_FUNCTION_INFO_V1(dpsql_glm_line_choose_sql);
PG_FUNCTION_INFO_V1(dpsql_glm_solve_rows_transition);
PG_FUNCTION_INFO_V1(dpsql_glm_solve_rows_final);
PG_FUNCTION_INFO_V1(dpsql_glm_rows_fit);

#define HEADER DPSQL_GLM_HEADER_LEN

/* The GLM settings at arguments from .. from + 4 (loss, param, y_bound, x_bound, intercept). */
static DpsqlGlm
glm_settings(FunctionCallInfo fcinfo, int from, int p, const char *fn)
{
	DpsqlGlm	g;

	dpsql_no_nulls(fcinfo, from, from + 5, fn);
	g.loss = PG_GETARG_INT32(from);
	g.param = PG_GETARG_FLOAT8(from + 1);
	g.y_bound = PG_GETARG_FLOAT8(from + 2);
	g.x_bound = PG_GETARG_FLOAT8(from + 3);
	g.intercept = PG_GETARG_BOOL(from + 4) ? 1 : 0;
	g.p = p;
	if (dpsql_glm_check(&g) != DPSQL_OK)
		dpsql_bad_argument(fn, "loss 1 (logistic), 2 (Huber SVM, 0 < h < 1) or 3 (Huber "
						   "regression, k > 0 and y_bound > 0 finite); x_bound finite and > 0; "
						   "1 to 512 coefficients with at least one feature.");
	return g;
}

/* x as the row's features when it is a 1-D float8[] of d entries without NULLs, else NULL. */
static const double *
row_features(FunctionCallInfo fcinfo, int arg, int d)
{
	ArrayType  *x;

	if (PG_ARGISNULL(arg))
		return NULL;
	x = PG_GETARG_ARRAYTYPE_P(arg);
	if (ARR_ELEMTYPE(x) != FLOAT8OID || ARR_NDIM(x) != 1 || ARR_DIMS(x)[0] != d ||
		(ARR_HASNULL(x) && array_contains_nulls(x)))
		return NULL;
	return (const double *) ARR_DATA_PTR(x);
}

/* A finite float8[] of p entries (argument arg), or ERROR. */
static double *
finite_vector(FunctionCallInfo fcinfo, int arg, int p, const char *what, const char *fn)
{
	int			n;
	double	   *v = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(arg), &n, what);

	if (n != p)
		dpsql_bad_argument(fn, "theta, direction and b must have the same length.");
	for (int j = 0; j < n; j++)
		if (!isfinite(v[j]))
			dpsql_bad_argument(fn, "theta, direction and b must be finite.");
	return v;
}

/*
 * dpsql_internal._glm_line_transition(state float8[], x float8[], y float8, theta float8[],
 *     direction float8[], loss int, param float8, y_bound float8, x_bound float8,
 *     intercept boolean) -> float8[]: theta, direction and the settings are the scan's public
 * constants; the first row's are kept and every later row must pass the same settings.
 */
Datum
dpsql_glm_line_transition(PG_FUNCTION_ARGS)
{
	const char *fn = "_glm_line_transition";
	MemoryContext aggcontext;
	ArrayType  *state;
	double	   *s;
	int			len;
	DpsqlGlm	g;

	if (!AggCheckCallContext(fcinfo, &aggcontext))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("dpsql: _glm_line_transition called outside an aggregate")));
	if (PG_ARGISNULL(0))
	{
		int			p;
		double	   *theta,
				   *dir;
		MemoryContext old;

		dpsql_no_nulls(fcinfo, 3, 5, fn);
		(void) dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(3), &p, "theta");	/* p */
		g = glm_settings(fcinfo, 5, p, fn);
		theta = finite_vector(fcinfo, 3, p, "theta", fn);
		dir = finite_vector(fcinfo, 4, p, "direction", fn);
		len = (int) dpsql_glm_line_state_length(p);
		old = MemoryContextSwitchTo(aggcontext);
		state = dpsql_new_float8_array(len);
		MemoryContextSwitchTo(old);
		s = (double *) ARR_DATA_PTR(state);
		dpsql_glm_line_state_init(s, &g, theta, dir);
		dpsql_state_remember(fcinfo, state);
	}
	else
	{
		state = PG_GETARG_ARRAYTYPE_P(0);
		s = (double *) ARR_DATA_PTR(state);
		len = ARR_DIMS(state)[0];
		if (!dpsql_state_is_known(fcinfo, state))
		{
			s = dpsql_float8_array(state, &len, "_glm_line state");
			dpsql_check_state(dpsql_glm_line_state_read(s, (size_t) len, &g), fn);
			dpsql_state_remember(fcinfo, state);
		}
		dpsql_check_state(dpsql_glm_line_state_read(s, (size_t) len, &g), fn);
	}
	if (PG_ARGISNULL(5) || PG_ARGISNULL(6) || PG_ARGISNULL(7) || PG_ARGISNULL(8) ||
		PG_ARGISNULL(9) || PG_GETARG_INT32(5) != g.loss || PG_GETARG_FLOAT8(6) != g.param ||
		PG_GETARG_FLOAT8(7) != g.y_bound || PG_GETARG_FLOAT8(8) != g.x_bound ||
		(PG_GETARG_BOOL(9) ? 1 : 0) != g.intercept)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: _glm_line: the settings must be the same on every row")));
	{
		double		xr[DPSQL_GLM_MAX_DIM],
					yr,
					wr;
		double	   *line = s + HEADER + 2 * g.p;

		dpsql_glm_prepare_row(&g, row_features(fcinfo, 1, g.p - g.intercept),
							  PG_ARGISNULL(2) ? 0.0 : PG_GETARG_FLOAT8(2), PG_ARGISNULL(2),
							  xr, &yr, &wr);
		line[0] += 1.0;
		dpsql_glm_line_rows(&g, s + HEADER, s + HEADER + g.p, xr, g.p, &yr, &wr, NULL, 1, line);
	}
	PG_RETURN_POINTER(state);
}

/* dpsql_internal._glm_line_combine(a, b): strict; partial sums of the same scan add up. */
Datum
dpsql_glm_line_combine(PG_FUNCTION_ARGS)
{
	return dpsql_combine_states(fcinfo, dpsql_glm_line_state_combine, "partial _glm_line states");
}

/* dpsql_internal._glm_line_final(state) -> [n, J's loss at each step size, gradient at 1] */
Datum
dpsql_glm_line_final(PG_FUNCTION_ARGS)
{
	double	   *s;
	int			len;
	DpsqlGlm	g;
	ArrayType  *out;

	if (PG_ARGISNULL(0))
		PG_RETURN_NULL();
	s = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(0), &len, "_glm_line state");
	dpsql_check_state(dpsql_glm_line_state_read(s, (size_t) len, &g), "_glm_line_final");
	out = dpsql_new_float8_array(dpsql_glm_line_length(g.p));
	memcpy(ARR_DATA_PTR(out), s + HEADER + 2 * g.p,
		   sizeof(double) * (Size) dpsql_glm_line_length(g.p));
	PG_RETURN_ARRAYTYPE_P(out);
}

/*
 * dpsql_internal._glm_line_choose(line float8[], theta float8[], direction float8[],
 *     reg float8, b float8[], objective float8, grad_norm float8, slope float8, loss int)
 *     -> float8[]: theta + t direction for the first acceptable step size t of the loss's,
 * or theta.
 */
Datum
dpsql_glm_line_choose_sql(PG_FUNCTION_ARGS)
{
	const char *fn = "_glm_line_choose";
	double	   *line,
			   *theta,
			   *dir,
			   *b = NULL;
	int			nl,
				p,
				taken;
	ArrayType  *out;
	DpsqlStatus st;
	DpsqlGlm	g = {0};

	dpsql_no_nulls(fcinfo, 0, 4, fn);
	dpsql_no_nulls(fcinfo, 5, 9, fn);
	g.loss = PG_GETARG_INT32(8);
	if (g.loss < DPSQL_GLM_LOGISTIC || g.loss > DPSQL_GLM_HUBER_REG)
		dpsql_bad_argument(fn, "loss must be 1, 2 or 3.");
	theta = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(1), &p, "theta");
	if (p < 1 || p > DPSQL_GLM_MAX_DIM)
		dpsql_bad_argument(fn, "theta must have 1 to 512 coefficients.");
	line = dpsql_float8_array(PG_GETARG_ARRAYTYPE_P(0), &nl, "line sums");
	if (nl != dpsql_glm_line_length(p))
		dpsql_bad_argument(fn, "the line sums and theta are of different dimensions.");
	dir = finite_vector(fcinfo, 2, p, "direction", fn);
	if (!PG_ARGISNULL(4))
		b = finite_vector(fcinfo, 4, p, "b", fn);
	out = dpsql_new_float8_array(p);
	st = dpsql_glm_line_choose(line, p, dpsql_glm_line_steps(&g), theta, dir, PG_GETARG_FLOAT8(3), b,
							   PG_GETARG_FLOAT8(5), PG_GETARG_FLOAT8(6), PG_GETARG_FLOAT8(7),
							   (double *) ARR_DATA_PTR(out), &taken);
	if (st != DPSQL_OK)
		dpsql_raise(st, "_glm_line_choose: the sums, theta, direction, reg >= 0, b, objective, "
					"gradient norm and slope must be finite");
	PG_RETURN_ARRAYTYPE_P(out);
}

/*
 * dpsql_internal._glm_solve_rows(x, y, p, loss, param, y_bound, x_bound, intercept, reg, b,
 *     tolerance, steps, rows): the scan keeps every row prepared (clipped, the intercept's 1, the
 * label mapped; the zero record as a row of weight 0) in memory, and the final function runs
 * the whole solve over them (dpsql_glm_solve_rows: the scanned path's arithmetic in its
 * order). The per-row arguments after y are the same datum on every row; the first row's are
 * used. The caller bounds the rows' memory (45_erm_solver.sql, _erm_in_memory).
 */
typedef struct GlmRows
{
	DpsqlGlm	g;
	double		reg,
				tolerance;
	int			steps;
	double	   *b;				/* NULL: no linear term */
	double	   *xs;
	double	   *ys;
	double	   *ws;
	size_t		rows,
				cap;
} GlmRows;

static GlmRows *
glm_rows_begin(FunctionCallInfo fcinfo, MemoryContext aggcontext)
{
	const char *fn = "_glm_solve_rows";
	GlmRows    *st = MemoryContextAllocZero(aggcontext, sizeof(GlmRows));
	int			p;

	/* the transition's arguments: 0 the state, 1 x, 2 y, then the aggregate's third on */
	dpsql_no_nulls(fcinfo, 3, 4, fn);
	p = PG_GETARG_INT32(3);
	st->g = glm_settings(fcinfo, 4, p, fn);
	dpsql_no_nulls(fcinfo, 9, 10, fn);
	dpsql_no_nulls(fcinfo, 11, 14, fn);
	st->reg = PG_GETARG_FLOAT8(9);
	st->tolerance = PG_GETARG_FLOAT8(11);
	st->steps = PG_GETARG_INT32(12);
	if (!(st->reg > 0.0 && isfinite(st->reg)) ||
		!(st->tolerance >= 0.0 && isfinite(st->tolerance)))
		dpsql_bad_argument(fn, "reg must be finite and > 0, tolerance finite and >= 0.");
	if (st->steps < 0 || st->steps > DPSQL_GLM_MAX_NEWTON_STEPS)
		dpsql_bad_argument(fn, "steps must be in [0, 100].");
	/* room for the public row count at once (no copies while the rows arrive): the caller
	 * checked that it fits in dpsql.sampling_memory; more rows than announced still fit */
	{
		double		rows = PG_GETARG_FLOAT8(13);

		if (!(rows >= 0.0 && rows <= 1e12))
			dpsql_bad_argument(fn, "rows must be in [0, 1e12].");
		st->cap = rows > 0 ? (size_t) rows : 0;
		if (st->cap > 0)
		{
			size_t		stride = (size_t) dpsql_glm_row_stride(p);

			st->xs = MemoryContextAllocHuge(aggcontext, sizeof(double) * st->cap * stride);
			st->ys = MemoryContextAllocHuge(aggcontext, sizeof(double) * st->cap);
			st->ws = MemoryContextAllocHuge(aggcontext, sizeof(double) * st->cap);
		}
	}
	if (!PG_ARGISNULL(10))
	{
		double	   *b = finite_vector(fcinfo, 10, p, "b", fn);

		st->b = MemoryContextAlloc(aggcontext, sizeof(double) * (Size) p);
		memcpy(st->b, b, sizeof(double) * (Size) p);
	}
	return st;
}

/* Room for one more row (doubling; huge allocations: the caller bounds the table's size). */
static void
glm_rows_grow(GlmRows *st, MemoryContext aggcontext)
{
	size_t		cap = st->cap == 0 ? 1024 : 2 * st->cap;
	size_t		p = (size_t) dpsql_glm_row_stride(st->g.p);

	if (st->cap == 0)
	{
		st->xs = MemoryContextAllocHuge(aggcontext, sizeof(double) * cap * p);
		st->ys = MemoryContextAllocHuge(aggcontext, sizeof(double) * cap);
		st->ws = MemoryContextAllocHuge(aggcontext, sizeof(double) * cap);
	}
	else
	{
		st->xs = repalloc_huge(st->xs, sizeof(double) * cap * p);
		st->ys = repalloc_huge(st->ys, sizeof(double) * cap);
		st->ws = repalloc_huge(st->ws, sizeof(double) * cap);
	}
	st->cap = cap;
}

Datum
dpsql_glm_solve_rows_transition(PG_FUNCTION_ARGS)
{
	MemoryContext aggcontext;
	GlmRows    *st;
	size_t		stride;
	double	   *xr;

	if (!AggCheckCallContext(fcinfo, &aggcontext))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("dpsql: _glm_solve_rows_transition called outside an aggregate")));
	st = PG_ARGISNULL(0) ? glm_rows_begin(fcinfo, aggcontext) : (GlmRows *) PG_GETARG_POINTER(0);
	stride = (size_t) dpsql_glm_row_stride(st->g.p);
	if (st->rows == st->cap)
		glm_rows_grow(st, aggcontext);
	xr = st->xs + st->rows * stride;
	dpsql_glm_prepare_row(&st->g, row_features(fcinfo, 1, st->g.p - st->g.intercept),
						  PG_ARGISNULL(2) ? 0.0 : PG_GETARG_FLOAT8(2), PG_ARGISNULL(2),
						  xr, st->ys + st->rows, st->ws + st->rows);
	memset(xr + st->g.p, 0, sizeof(double) * (stride - (size_t) st->g.p));
	st->rows++;
	PG_RETURN_POINTER(st);
}

/* Between two evaluations over the rows: a cancelled query stops here. */
static void
glm_interrupts(void *arg)
{
	(void) arg;
	CHECK_FOR_INTERRUPTS();
}

/* -> [theta (p), ||grad J(theta)||, evaluations over the rows (2 steps + 1)]; NULL: no rows */
Datum
dpsql_glm_solve_rows_final(PG_FUNCTION_ARGS)
{
	GlmRows    *st;
	int			p,
				passes = 0;
	double	   *work,
			   *zs,
			   *out_data,
				grad_norm = 0.0;
	ArrayType  *out;
	DpsqlStatus status;

	if (PG_ARGISNULL(0))
		PG_RETURN_NULL();
	st = (GlmRows *) PG_GETARG_POINTER(0);
	p = st->g.p;
	out = dpsql_new_float8_array(p + 2);
	out_data = (double *) ARR_DATA_PTR(out);
	work = palloc(sizeof(double) * dpsql_glm_solve_work_length(p));
	zs = palloc_extended(sizeof(double) * (st->rows > 0 ? st->rows : 1), MCXT_ALLOC_HUGE);
	status = dpsql_glm_solve_rows(&st->g, st->xs, st->ys, st->ws, st->rows, st->reg, st->b,
								  st->tolerance, st->steps, out_data, &grad_norm, &passes, work,
								  zs, glm_interrupts, NULL);
	explicit_bzero(work, sizeof(double) * dpsql_glm_solve_work_length(p));
	pfree(work);
	pfree(zs);
	if (status != DPSQL_OK)
		dpsql_raise(status, "_glm_solve_rows");
	/* public: S and the evaluations it implies, whatever the rows */
	elog(DEBUG1, "dpsql: _erm_solve: %d Newton steps over the rows kept in memory, "
		 "%d evaluations", st->steps, passes);
	out_data[p] = grad_norm;
	out_data[p + 1] = passes;
	PG_RETURN_ARRAYTYPE_P(out);
}

/*
 * dpsql_internal._glm_rows_fit(n float8, p int) -> boolean: whether n prepared rows of p
 * coefficients (the stride's doubles, the label and the weight each) fit in
 * dpsql.sampling_memory. Read here, where the module (which defines the setting) is loaded.
 */
Datum
dpsql_glm_rows_fit(PG_FUNCTION_ARGS)
{
	double		n = PG_GETARG_FLOAT8(0);
	int			p = PG_GETARG_INT32(1),
				kb;
	const char *value = GetConfigOption("dpsql.sampling_memory", false, false);

	if (!(n >= 0.0 && isfinite(n)) || p < 1 || p > DPSQL_GLM_MAX_DIM)
		dpsql_bad_argument("_glm_rows_fit", "n must be finite and >= 0, p in [1, 512].");
	if (value == NULL || !parse_int(value, &kb, GUC_UNIT_KB, NULL))
		elog(ERROR, "dpsql: dpsql.sampling_memory is not readable");
	PG_RETURN_BOOL(n * (dpsql_glm_row_stride(p) + 2.0) * 8.0 <= (double) kb * 1024.0);
}
