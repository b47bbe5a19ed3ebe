------------------------------------------------------------------------------------------
-- AdaSSP (Wang 2018, Algorithm 2; spec 002 section 6.4): DP linear regression by
-- sufficient-statistics perturbation with an adaptive ridge. C core: cython_ext/core/adassp.h
-- (the mechanism, the sensitivities and their proofs); glue: sql/src/adassp_fmgr.c.
------------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION dpsql._adassp_gram_transition(state float8[], x float8[], y float8,
                                                         x_bound float8, y_bound float8,
                                                         intercept boolean, dim int)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_adassp_gram_transition'
LANGUAGE C CALLED ON NULL INPUT PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql._adassp_gram_combine(a float8[], b float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_adassp_gram_combine'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql._adassp_gram_final(state float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_adassp_gram_final'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

-- The noiseless sufficient statistics of one scan, [n, p, X^T X (p*p, row-major), X^T y (p)]:
-- each row's dim features (plus a constant 1, last, when intercept; p = dim + intercept) are
-- clipped as ONE vector to norm x_bound (x_bound >= 1 with an intercept), y to
-- [-y_bound, y_bound]. A NULL x or y, an x of another length, or a NaN/Infinity makes the
-- zero record: it counts in n and adds nothing. NULL when there are no rows. dim must be
-- public (never inferred from the rows). Parallel partial scans are summed.
CREATE OR REPLACE AGGREGATE dpsql.adassp_gram(x float8[], y float8, x_bound float8,
                                              y_bound float8, intercept boolean, dim int) (
    SFUNC = dpsql._adassp_gram_transition,
    STYPE = float8[],
    FINALFUNC = dpsql._adassp_gram_final,
    COMBINEFUNC = dpsql._adassp_gram_combine,
    PARALLEL = SAFE
);

-- The release (adassp.h): lambda_tilde = max(lambda_min(X^T X) + sigma_min Z - min_shift, 0),
-- ridge = max(0, ridge_factor - lambda_tilde),
-- weights = (X^T X + sigma_xx E + ridge I)^{-1} (X^T y + sigma_xy z). The caller calibrates the
-- sigmas from dpsql.adassp_sensitivities. Noise from pg_strong_random unless seed is given
-- (tests only: not private). A singular noisy system raises SQLSTATE 22P01 (nothing released).
CREATE OR REPLACE FUNCTION dpsql._adassp_release(gram float8[], sigma_min float8, sigma_xx float8,
                                                 sigma_xy float8, min_shift float8,
                                                 ridge_factor float8, seed bigint DEFAULT NULL,
                                                 OUT weights float8[], OUT ridge float8,
                                                 OUT lambda_min_noisy float8)
AS 'MODULE_PATHNAME', 'dpsql_adassp_release_sql'
LANGUAGE C CALLED ON NULL INPUT VOLATILE;

CREATE OR REPLACE FUNCTION dpsql.adassp_sensitivities(x_bound float8, y_bound float8,
                                                      OUT lambda_min float8, OUT xtx float8,
                                                      OUT xty float8)
AS 'MODULE_PATHNAME', 'dpsql_adassp_sensitivities_sql'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION dpsql.adassp_sensitivities(float8, float8) IS
    'Replace-one L2 sensitivities of AdaSSP''s lambda_min (x_bound^2), X^T X (Frobenius, '
    'sqrt(2) x_bound^2) and X^T y (2 x_bound y_bound) for ||x|| <= x_bound, |y| <= y_bound';

SELECT dpsql._register_mechanism(
    'adassp', '_train_linear', 'regression', false, true,
    'AdaSSP: sufficient-statistics perturbation with an adaptive ridge', 'docs/linear.md');
