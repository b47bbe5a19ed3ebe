------------------------------------------------------------------------------------------
-- DP-GD with a private preconditioner (issue 10; Brown et al. 2024 assume 1/2 I <= Sigma <= 2 I,
-- Condition 2.4): on ill-conditioned features DP-GD's iterates barely move along the small
-- eigen-directions and its intervals do not cover. A noisy second-moment matrix of the rows (x
-- clipped, 1 appended) is released
-- (Gaussian, zCDP, a tenth of rho), floored to be positive definite, G = L L^T; DP-GD runs on
-- the whitened rows L^{-1} (x, 1) and every iterate maps back by L^{-T} (the batch means and
-- intervals commute with that linear map). On by default when the rows have a public norm
-- bound; options => {"precondition": false} runs the spec's plain DP-GD.
------------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION dpsql_internal._cholesky(a float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_cholesky_sql'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._whiten_row(x float8[], l float8[], append_one boolean, x_bound float8)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_whiten_row'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._unwhiten(theta float8[], l float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_unwhiten'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._min_eigenvalue(a float8[])
RETURNS float8 AS 'MODULE_PATHNAME', 'dpsql_min_eigenvalue'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

DROP FUNCTION IF EXISTS dpsql_internal._dpgd_preconditioner(text, jsonb, bigint);
-- The released preconditioner: the noisy, floored G = (X~^T X~ + E) / n + f I (E symmetric,
-- its upper triangle i.i.d. N(0, sigma^2), sigma = Delta / sqrt(2 rho_pre) with Delta the
-- replace-one Frobenius sensitivity sqrt(2) (x_bound^2 + intercept)); f lifts the noisy
-- spectrum to at least 2 sigma sqrt(p) / n (public). Returns its Cholesky factor and the
-- bound on a whitened row's norm.
CREATE OR REPLACE FUNCTION dpsql_internal._dpgd_preconditioner(train_table text, plan dpsql_internal.dpgd_plan, noise_seed bigint,
                                           OUT factor float8[], OUT row_bound float8,
                                           OUT info jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    d int := plan.dim;
    icpt boolean := plan.intercept;
    p int := d + icpt::int;
    xb float8 := plan.x_bound;
    n bigint := plan.rows;
    sigma float8 := plan.pre_noise_std;
    gram float8[];
    upper float8[];
    g float8[];
    g_noisy float8[];
    lambda_min float8;
    floor_ float8;
BEGIN
    -- The gram clips each (x, 1) as one vector: to sqrt(x_bound^2 + 1), the norm bound the
    -- noise is calibrated to (and >= 1 with an intercept, as the aggregate needs).
    EXECUTE format('SELECT dpsql.adassp_gram(x, y, $1, 1, $2, $3) FROM %s', train_table)
       INTO gram USING sqrt(xb ^ 2 + icpt::int), icpt, d;
    -- The upper triangle (the diagonal included), row by row, noised once.
    upper := dpsql_internal._add_gaussian(
        ARRAY(SELECT gram[2 + (i - 1) * p + j] FROM generate_series(1, p) i,
                     generate_series(1, p) j WHERE j >= i ORDER BY i, j),
        sigma, noise_seed, 8001);
    g := ARRAY(SELECT upper[(least(i, j) - 1) * p - (least(i, j) - 1) * (least(i, j) - 2) / 2
                            + greatest(i, j) - least(i, j) + 1] / n
                 FROM generate_series(1, p) i, generate_series(1, p) j ORDER BY i, j);
    g_noisy := g;
    lambda_min := dpsql_internal._min_eigenvalue(g);
    floor_ := greatest(0, -lambda_min) + 2 * sigma * sqrt(p) / n;
    g := ARRAY(SELECT g[(i - 1) * p + j] + CASE WHEN i = j THEN floor_ ELSE 0 END
                 FROM generate_series(1, p) i, generate_series(1, p) j ORDER BY i, j);
    factor := dpsql_internal._cholesky(g);
    -- ||L^{-1} x~|| <= ||x~|| / sqrt(lambda_min(G)), lambda_min(G) = lambda_min + floor
    row_bound := sqrt(xb ^ 2 + icpt::int) / sqrt(lambda_min + floor_);
    info := jsonb_build_object('rho', plan.rho_pre, 'noise_std', sigma,
                               'second_moment', g_noisy,
                               'lambda_min_noisy', lambda_min, 'floor', floor_,
                               'whitened_row_bound', row_bound);
END $$;

DROP FUNCTION IF EXISTS dpsql_internal._dpgd_fit_preconditioned(text, jsonb, bigint);
-- DP-GD on the whitened rows (a table of L^{-1} (x, 1), no intercept flag, the whitened
-- bound), then the estimate and every iterate mapped back by L^{-T}.
CREATE OR REPLACE FUNCTION dpsql_internal._dpgd_fit_preconditioned(train_table text, plan dpsql_internal.dpgd_plan, noise_seed bigint,
                                               OUT weights float8[], OUT info jsonb,
                                               OUT iterates float8[])
LANGUAGE plpgsql AS $$
DECLARE
    pre record := dpsql_internal._dpgd_preconditioner(train_table, plan, noise_seed);
    p int := plan.dim + plan.intercept::int;
    whitened text := train_table || '_w';
    w dpsql_internal.dpgd_plan;
    ids text;
    fit record;
BEGIN
    -- shaped (and, on Citus, placed) like the training table: filled shard by shard
    ids := dpsql_internal._derived_training_table(train_table, whitened);
    EXECUTE format('INSERT INTO %s SELECT %s, dpsql_internal._whiten_row(x, $1, $2, $3), y FROM %s ORDER BY rid',
                   whitened, ids, train_table)
        USING pre.factor, plan.intercept, plan.x_bound;
    -- the steps on the whitened rows: p features, no intercept flag, the whitened bound
    w := plan;
    w.dim := p;
    w.intercept := false;
    w.x_bound := pre.row_bound;
    fit := dpsql_internal._dpgd_fit_plain(whitened, w, noise_seed);
    EXECUTE format('DROP TABLE %s', whitened);
    weights := dpsql_internal._unwhiten(fit.weights, pre.factor);
    iterates := (SELECT array_agg(dpsql_internal._unwhiten(ARRAY(SELECT unnest(fit.iterates[i:i][1:p])),
                                                  pre.factor) ORDER BY i)
                   FROM generate_series(1, array_length(fit.iterates, 1)) i);
    info := fit.info || jsonb_build_object('preconditioner', pre.info);
END $$;
