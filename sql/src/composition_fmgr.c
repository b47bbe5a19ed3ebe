/*
 * composition_fmgr.c - the closed-form privacy conversions of core/composition.h in
 * SQL: dpsql.zcdp_rho, dpsql.zcdp_epsilon, dpsql_internal._zcdp_sigma and
 * dpsql_internal._bst14_epsilon1.
 */
#include "postgres.h"

#include <math.h>

#include "fmgr.h"

#include "composition.h"

PG_FUNCTION_INFO_V1(dpsql_zcdp_rho_sql);
PG_FUNCTION_INFO_V1(dpsql_zcdp_epsilon_sql);
PG_FUNCTION_INFO_V1(dpsql_zcdp_sigma_sql);
PG_FUNCTION_INFO_V1(dpsql_advanced_composition_step_sql);

/* dpsql.zcdp_rho(epsilon, delta) (strict) */
Datum
dpsql_zcdp_rho_sql(PG_FUNCTION_ARGS)
{
	double		epsilon = PG_GETARG_FLOAT8(0),
				delta = PG_GETARG_FLOAT8(1),
				rho = dpsql_zcdp_rho(epsilon, delta);

	if (isnan(rho))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: zCDP needs epsilon > 0 and 0 < delta < 1, got (%g, %g)",
						epsilon, delta),
				 errhint("The linear-regression mechanisms are (epsilon, delta)-DP with delta > 0.")));
	PG_RETURN_FLOAT8(rho);
}

/* dpsql.zcdp_epsilon(rho, delta) (strict) */
Datum
dpsql_zcdp_epsilon_sql(PG_FUNCTION_ARGS)
{
	double		rho = PG_GETARG_FLOAT8(0),
				delta = PG_GETARG_FLOAT8(1),
				epsilon = dpsql_zcdp_epsilon(rho, delta);

	if (isnan(epsilon))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: zcdp_epsilon needs rho >= 0 and 0 < delta < 1, got (%g, %g)",
						rho, delta)));
	PG_RETURN_FLOAT8(epsilon);
}

/* dpsql_internal._zcdp_sigma(sensitivity, rho, shares) (strict) */
Datum
dpsql_zcdp_sigma_sql(PG_FUNCTION_ARGS)
{
	double		sensitivity = PG_GETARG_FLOAT8(0),
				rho = PG_GETARG_FLOAT8(1),
				shares = PG_GETARG_FLOAT8(2),
				sigma = dpsql_zcdp_sigma(sensitivity, rho, shares);

	if (isnan(sigma))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: the zCDP Gaussian needs a finite sensitivity >= 0, a finite "
						"rho > 0 and shares >= 1, got (%g, %g, %g)", sensitivity, rho, shares)));
	PG_RETURN_FLOAT8(sigma);
}

/* dpsql_internal._bst14_epsilon1(epsilon, delta1, steps bigint) (strict) */
Datum
dpsql_advanced_composition_step_sql(PG_FUNCTION_ARGS)
{
	double		e1 = dpsql_advanced_composition_step(PG_GETARG_FLOAT8(0), PG_GETARG_FLOAT8(1),
													 (double) PG_GETARG_INT64(2));

	if (isnan(e1))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: advanced composition needs epsilon > 0, 0 < delta1 < 1 and "
						"at least one step")));
	PG_RETURN_FLOAT8(e1);
}
