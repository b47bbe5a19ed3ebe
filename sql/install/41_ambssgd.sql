------------------------------------------------------------------------------------------
-- DP-AMBSSGD and DP-SSGD (spec 000): one pass over a shuffled training table, in one
-- aggregate call (cython_ext/core/ambssgd.h). The state holds noiseless intermediate values
-- (residuals, gradient sums): it stays inside the server; _ambssgd_result releases the
-- private transcript only. Not granted to anyone here (the entry points call these).
------------------------------------------------------------------------------------------

-- A fresh pass state (w_0 = 0). stat > 0: adaptive clipping (DP-STAT, levels
-- domain 2^(i - levels), count noise sigma_c, threshold theta, zeta_t = r_x gamma_t log_factor);
-- stat = 0: fixed clipping norm zeta_fixed (DP-SSGD with batch 1 and blocks = n_rows).
-- The noise generator is keyed by pg_strong_random, or by seed (tests only: not private).
CREATE OR REPLACE FUNCTION dpsql._ambssgd_init(dim int, intercept boolean, x_bound float8,
                                               n_rows bigint, blocks int, batch bigint,
                                               stat bigint, alpha float8, eta float8,
                                               r_x float8, log_factor float8, domain float8,
                                               levels int, sigma_c float8, theta float8,
                                               zeta_fixed float8, seed bigint)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_ambssgd_init_state'
LANGUAGE C CALLED ON NULL INPUT VOLATILE PARALLEL UNSAFE;

CREATE OR REPLACE FUNCTION dpsql._ambssgd_transition(state float8[], x float8[], y float8,
                                                     init float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_ambssgd_transition'
LANGUAGE C CALLED ON NULL INPUT VOLATILE PARALLEL UNSAFE;

-- The whole one-pass algorithm: rows count in the order they arrive (call it with
-- ORDER BY rid); init comes from _ambssgd_init and is used for one pass only. Sequential by
-- nature: no combine function, never in a parallel plan. Malformed rows (NULL x or y, wrong
-- length, NaN/Inf) are zero records, never errors.
CREATE OR REPLACE AGGREGATE dpsql.ambssgd_pass(x float8[], y float8, init float8[]) (
    SFUNC = dpsql._ambssgd_transition,
    STYPE = float8[],
    PARALLEL = UNSAFE
);

-- The released transcript of a finished pass: the tail average w_bar, gamma_t and zeta_t of
-- every block, and how many noisy counts each block's DP-STAT made (<= levels + 1).
CREATE OR REPLACE FUNCTION dpsql._ambssgd_result(state float8[], OUT weights float8[],
                                                 OUT gammas float8[], OUT zetas float8[],
                                                 OUT draws int[], OUT rows_used bigint,
                                                 OUT rows_unused bigint)
AS 'MODULE_PATHNAME', 'dpsql_ambssgd_result_sql'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

SELECT dpsql._register_mechanism(
    'dp_ambssgd', '_train_linear', 'regression', false, true,
    'DP-AMBSSGD: one pass, adaptive clipping by DP-STAT, tail averaging', 'docs/linear.md');
SELECT dpsql._register_mechanism(
    'dp_ssgd', '_train_linear', 'regression', false, true,
    'DP-SSGD: the spec''s baseline, one noisy step per row (refused where its noise swamps the model)',
    'docs/linear.md');
