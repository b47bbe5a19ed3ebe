------------------------------------------------------------------------------------------
-- DP-GD for linear regression (spec 002): one aggregate scan per gradient step, the noisy
-- step in the server, and the confidence intervals built from released iterates.
------------------------------------------------------------------------------------------

-- The clipped gradient sum of one full-batch step. Rows: x_bound > 0 clips x to that norm,
-- intercept appends a feature 1 after it; a NULL or malformed record (NULL x or y, wrong
-- length, NULL elements, NaN/Inf) counts as a row and adds nothing. theta, gamma, intercept
-- and x_bound are the step's public constants (read on the first row).
CREATE OR REPLACE FUNCTION dpsql._dpgd_gradient_transition(state float8[], x float8[], y float8,
                                                           theta float8[], gamma float8,
                                                           intercept boolean, x_bound float8)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_dpgd_gradient_transition'
LANGUAGE C CALLED ON NULL INPUT PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql._dpgd_gradient_combine(a float8[], b float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_dpgd_gradient_combine'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql._dpgd_gradient_final(state float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_dpgd_gradient_final'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

-- Returns [sum_1 .. sum_p, n, clipped] (p = length of theta): the sum over rows of
-- x_i (<x_i, theta> - y_i) clipped to norm gamma (gamma = 'Infinity': no clipping), the row
-- count n, and the number of clipped gradients (a diagnostic, NOT private: never release it).
-- NULL when no row was scanned. Partial sums of a parallel scan add up (COMBINEFUNC).
CREATE OR REPLACE AGGREGATE dpsql.dpgd_gradient(x float8[], y float8, theta float8[], gamma float8,
                                                intercept boolean, x_bound float8) (
    SFUNC = dpsql._dpgd_gradient_transition,
    STYPE = float8[],
    FINALFUNC = dpsql._dpgd_gradient_final,
    COMBINEFUNC = dpsql._dpgd_gradient_combine,
    PARALLEL = SAFE
);

-- theta - eta * sum / n + eta * z, z ~ N(0, noise_std^2 I), from dpgd_gradient's output
-- grad. The noise is keyed by pg_strong_random, or by seed (tests only: NOT private) with
-- stream separating the steps of a run.
CREATE OR REPLACE FUNCTION dpsql._dpgd_step(theta float8[], grad float8[], eta float8,
                                            noise_std float8, seed bigint DEFAULT NULL,
                                            stream bigint DEFAULT 0)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_dpgd_step_sql'
LANGUAGE C CALLED ON NULL INPUT VOLATILE;

-- The m draws of a confidence-interval method from released iterates (N x p, row k holds
-- theta_k): 'independent_runs' (the runs' iterates concatenated; the mean of each run's
-- iterates after the burn-in), 'checkpoints' (theta_{b + l B}, B = floor((N - b) / m)) or
-- 'batch_means' (means of m consecutive batches of B iterates after the burn-in).
CREATE OR REPLACE FUNCTION dpsql._confint_draws(iterates float8[], method text, draws int,
                                                burn_in int)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_confint_draws_sql'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

-- Rows estimate (mean), sd (ddof = 1), lower, upper of the per-coordinate t-interval
-- mean -/+ t_{m-1, 1-alpha/2} sd / sqrt(m) from m draws (m x p).
CREATE OR REPLACE FUNCTION dpsql._t_interval_matrix(draws float8[], alpha float8)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_t_interval_sql'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

-- The same, one row per coefficient (coef_index 1..p).
CREATE OR REPLACE FUNCTION dpsql._t_interval(draws float8[], alpha float8,
                                             OUT coef_index int, OUT estimate float8,
                                             OUT lower float8, OUT upper float8, OUT sd float8)
RETURNS SETOF record LANGUAGE sql STRICT IMMUTABLE PARALLEL SAFE AS $$
    SELECT j, ci[1][j], ci[3][j], ci[4][j], ci[2][j]
    FROM (SELECT dpsql._t_interval_matrix(draws, alpha) AS ci) AS t,
         generate_series(1, array_length(t.ci, 2)) AS j
$$;

-- The p-quantile of Student's t with df >= 1 degrees of freedom.
CREATE OR REPLACE FUNCTION dpsql.t_quantile(p float8, df float8)
RETURNS float8 AS 'MODULE_PATHNAME', 'dpsql_t_quantile_sql'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

SELECT dpsql._register_mechanism(
    'dpgd', '_train_linear', 'regression', false, true,
    'DP-GD: full-batch noisy gradient descent with confidence intervals, privately preconditioned',
    'docs/linear.md');
