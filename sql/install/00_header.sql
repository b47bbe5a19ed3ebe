-- dpsql: in-database SGD (Bismarck-style epoch aggregate), training runs, models,
-- private releases (bolt-on, white-box, linear regression), datasets, roles and the ledger.
\echo Use "CREATE EXTENSION dpsql" to load this file. \quit

-- Training tables of runs in progress live here, out of analysts' reach: private runs' in
-- dpsql_work, where only the extension owner creates tables (a data owner's table named like
-- a run's next training table would fail, or be used by, a private run); data owners'
-- non-private runs' in dpsql_owner_work.
CREATE SCHEMA IF NOT EXISTS dpsql_work;
CREATE SCHEMA IF NOT EXISTS dpsql_owner_work;
-- The extension's internal functions (names starting with _): the dpsql schema holds the API.
CREATE SCHEMA IF NOT EXISTS dpsql_internal;

------------------------------------------------------------------------------------------
-- C functions (sql/src, core/)
------------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION dpsql_internal._sgd_transition(state float8[], x float8[], y float8, init float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_sgd_transition'
LANGUAGE C CALLED ON NULL INPUT PARALLEL SAFE;

-- Loads dpsql's library in the backend: its transaction callbacks flush the WAL before an
-- abandoned training table's files are removed (sql/src/durable_drops.c). Called before a
-- training table is created.
CREATE OR REPLACE FUNCTION dpsql_internal._load_module()
RETURNS void AS 'MODULE_PATHNAME', 'dpsql_load_module'
LANGUAGE C VOLATILE;

CREATE OR REPLACE FUNCTION dpsql_internal._sgd_final(state float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_sgd_final'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._sgd_combine(a float8[], b float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_sgd_combine_states'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

-- One call = one SGD epoch over the scanned rows, in scan order. COMBINEFUNC averages the
-- models of parallel partial scans weighted by their row counts (opt-in model averaging).
CREATE OR REPLACE AGGREGATE dpsql.sgd_epoch(x float8[], y float8, init float8[]) (
    SFUNC = dpsql_internal._sgd_transition,
    STYPE = float8[],
    FINALFUNC = dpsql_internal._sgd_final,
    COMBINEFUNC = dpsql_internal._sgd_combine,
    PARALLEL = SAFE
);

CREATE OR REPLACE FUNCTION dpsql_internal._sgd_init(model text, dim int, n_classes int, lambda float8,
                                schedule text, eta float8, step_offset float8, radius float8,
                                huber_h float8, batch_size bigint, flags int,
                                clip_norm float8 DEFAULT 0, noise text DEFAULT 'none',
                                noise_scale float8 DEFAULT 0, noise_divisor float8 DEFAULT 0,
                                steps_per_epoch bigint DEFAULT 0, noise_seed bigint DEFAULT NULL)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_sgd_init_state'
LANGUAGE C CALLED ON NULL INPUT VOLATILE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._sgd_info(state float8[], OUT step bigint, OUT rows bigint,
                                OUT objective float8, OUT dropped bigint, OUT clipped bigint,
                                OUT shards int)
AS 'MODULE_PATHNAME', 'dpsql_sgd_state_info'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._sgd_weights(state float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_sgd_state_weights'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._predict(loss int, flags int, coef float8[], x float8[])
RETURNS float8 AS 'MODULE_PATHNAME', 'dpsql_predict_coef'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._loss_code(model text)
RETURNS int AS 'MODULE_PATHNAME', 'dpsql_loss_code'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql.loss_constants(model text, lambda float8 DEFAULT 0,
                                     radius float8 DEFAULT 0, huber_h float8 DEFAULT 0.1,
                                     OUT lipschitz float8, OUT lipschitz_data float8,
                                     OUT smoothness float8, OUT strong_convexity float8)
AS 'MODULE_PATHNAME', 'dpsql_loss_constants_sql'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION dpsql.loss_constants(text, float8, float8, float8) IS
    'Lipschitz, smoothness and strong-convexity constants of one example''s loss for ||x|| <= 1';

CREATE OR REPLACE FUNCTION dpsql_internal._shuffle_key(seed bigint, pos bigint)
RETURNS bigint AS 'MODULE_PATHNAME', 'dpsql_shuffle_key_sql'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._random_seed()
RETURNS bigint AS 'MODULE_PATHNAME', 'dpsql_random_seed'
LANGUAGE C STRICT VOLATILE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._apply_bounds(x float8[], bounds float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_apply_bounds'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

-- A row as a model with preprocessing sees it: bounds, row transform, minus the centre
-- (core/prediction.h; Python's Model.predict uses it too).
CREATE OR REPLACE FUNCTION dpsql_internal._preprocess(x float8[], bounds float8[], row_flags int, centre float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_preprocess_sql'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

-- A state flag bit of sgd.h by name (clip_rows, unit_rows, row_transform, intercept, sanitize).
CREATE OR REPLACE FUNCTION dpsql_internal._flag(name text)
RETURNS int AS 'MODULE_PATHNAME', 'dpsql_row_flag'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

-- The binary decision rule (core/prediction.h; Python's Model.predict uses it too).
CREATE OR REPLACE FUNCTION dpsql_internal._is_positive(loss int, raw float8)
RETURNS boolean AS 'MODULE_PATHNAME', 'dpsql_is_positive_sql'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._bolton_release(state float8[], sensitivity float8, epsilon float8,
                                      delta float8, per_output boolean, calibration text,
                                      seed bigint, OUT weights float8[], OUT noise_scale float8)
AS 'MODULE_PATHNAME', 'dpsql_bolton_release'
LANGUAGE C CALLED ON NULL INPUT VOLATILE;

-- L2 sensitivity of the PSGD output: the closed forms of the C core (exact => the growth
-- recursion instead; paper_minibatch => the paper's unsound strongly convex mini-batch form).
CREATE OR REPLACE FUNCTION dpsql.bolton_sensitivity(schedule text, eta float8, step_offset float8,
                                         lipschitz float8, smoothness float8,
                                         strong_convexity float8, rows bigint, batch_size bigint,
                                         epochs int, fresh boolean DEFAULT false,
                                         exact boolean DEFAULT false,
                                         paper_minibatch boolean DEFAULT false)
RETURNS float8 AS 'MODULE_PATHNAME', 'dpsql_bolton_sensitivity_sql'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._exponential_mechanism(utility float8[], epsilon float8, sensitivity float8,
                                             seed bigint)
RETURNS int AS 'MODULE_PATHNAME', 'dpsql_exponential_mechanism_sql'
LANGUAGE C CALLED ON NULL INPUT VOLATILE;

CREATE OR REPLACE FUNCTION dpsql_internal._sgd_transition_batch(state float8[], x float8[], y float8, batch bigint,
                                            init float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_sgd_transition_batch'
LANGUAGE C CALLED ON NULL INPUT;

-- An epoch whose rows carry their batch number (Poisson sampling, sampling with replacement):
-- call it with ORDER BY batch. Sequential by nature: no combine function.
CREATE OR REPLACE AGGREGATE dpsql.sgd_epoch_batches(x float8[], y float8, batch bigint, init float8[]) (
    SFUNC = dpsql_internal._sgd_transition_batch,
    STYPE = float8[],
    FINALFUNC = dpsql_internal._sgd_final
);

CREATE OR REPLACE FUNCTION dpsql_internal._poisson_batches(seed bigint, rid bigint, steps int, q float8)
RETURNS int[] AS 'MODULE_PATHNAME', 'dpsql_poisson_batches'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

-- A sampled epoch without a sort (sampled_fmgr.c). Poisson: the scan copies each row into
-- the bucket of each step it joins (its own stream keyed by the rid, as _poisson_batches), the
-- buckets are spilled to temporary files over dpsql.sampling_memory, and the final function
-- replays them in step order; up to dpsql.sampling_in_place_memory the scan files the rows by
-- rid instead and the members are listed by step and read in place. With replacement: the scan files each row by its rid and the
-- final function replays the draws from the epoch's secret seed; rows x (features + 1)
-- doubles, which _sampled_epoch_fits says fit in dpsql.sampling_memory. Given a run and its
-- training table, the filed rows stay for the run's later epochs in the same transaction
-- (Poisson: when they fit beside the buckets), which _sgd_epoch_replayed replays without a
-- scan (NULL when it does not hold them).
CREATE OR REPLACE FUNCTION dpsql_internal._sgd_sampled_transition(internal, x float8[], y float8, rid bigint,
                                              init float8[], sampling text, seed bigint,
                                              rows bigint, q float8, run bigint, relation oid)
RETURNS internal AS 'MODULE_PATHNAME', 'dpsql_sampled_transition'
LANGUAGE C CALLED ON NULL INPUT;

CREATE OR REPLACE FUNCTION dpsql_internal._sgd_sampled_final(internal)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_sampled_final'
LANGUAGE C CALLED ON NULL INPUT;

CREATE OR REPLACE AGGREGATE dpsql_internal._sgd_epoch_sampled(x float8[], y float8, rid bigint, init float8[],
                                                 sampling text, seed bigint, rows bigint,
                                                 q float8, run bigint, relation oid) (
    SFUNC = dpsql_internal._sgd_sampled_transition,
    STYPE = internal,
    FINALFUNC = dpsql_internal._sgd_sampled_final,
    FINALFUNC_MODIFY = READ_WRITE
);

CREATE OR REPLACE FUNCTION dpsql_internal._sgd_epoch_replayed(init float8[], run bigint, relation oid,
                                          sampling text, seed bigint, rows bigint, q float8)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_sampled_replayed'
LANGUAGE C CALLED ON NULL INPUT VOLATILE;

CREATE OR REPLACE FUNCTION dpsql_internal._sampled_epoch_fits(state float8[], rows bigint)
RETURNS boolean AS 'MODULE_PATHNAME', 'dpsql_sampled_fits'
LANGUAGE C STRICT STABLE PARALLEL SAFE;

-- The members (step, rid) of a sampled epoch's steps: with replacement in the order the replay
-- visits them; Poisson by rid (the replay visits them by step, then rid).
CREATE OR REPLACE FUNCTION dpsql_internal._sampled_members(sampling text, seed bigint, rows bigint, steps int,
                                       q float8, batch bigint)
RETURNS TABLE (step int, rid bigint) AS 'MODULE_PATHNAME', 'dpsql_sampled_members'
LANGUAGE C STRICT IMMUTABLE ROWS 1000;

CREATE OR REPLACE FUNCTION dpsql_internal._uniform_index(seed bigint, pos bigint, rows bigint)
RETURNS bigint AS 'MODULE_PATHNAME', 'dpsql_uniform_index'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql.gaussian_sigma(sensitivity float8, epsilon float8, delta float8,
                                     calibration text DEFAULT 'analytic')
RETURNS float8 AS 'MODULE_PATHNAME', 'dpsql_gaussian_sigma_sql'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION dpsql.gaussian_sigma(float8, float8, float8, text) IS
    'Gaussian noise for (epsilon, delta): analytic (Balle-Wang) or classic (eq. 4, epsilon < 1)';

-- One-vs-rest (Wu et al. 2017, "Bolt-on DP", §4.3): a logistic or Huber model over 3 or more
-- classes is that many binary models, each on all the rows, each with (epsilon, delta) / models
-- (basic composition); otherwise models = 1 and the budget is the release's. The bolt-on, the
-- private-ERM toolbox, DP-FTRL and the defaults all split through this (C core:
-- dpsql_one_vs_rest_models and dpsql_one_vs_rest_share, mechanisms.h). A NULL budget gives
-- a NULL share.
CREATE OR REPLACE FUNCTION dpsql_internal._one_vs_rest(model text, classes int, epsilon float8,
                                                       delta float8, OUT models int,
                                                       OUT model_epsilon float8,
                                                       OUT model_delta float8)
AS 'MODULE_PATHNAME', 'dpsql_one_vs_rest_sql'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

-- The size over dim coordinates of the noise of a release of L2 sensitivity s: the Gamma-norm
-- noise (delta = 0) has norm ~ Gamma(dim, s/epsilon), mean dim s/epsilon; the Gaussian
-- (calibration analytic or classic) sigma sqrt(dim). dim = 1: the noise scale itself (C core:
-- dpsql_noise_size, mechanisms.h; output perturbation draws with that scale).
CREATE OR REPLACE FUNCTION dpsql_internal._noise_size(sensitivity float8, epsilon float8, delta float8,
                                                      dim int, calibration text DEFAULT 'analytic')
RETURNS float8 AS 'MODULE_PATHNAME', 'dpsql_noise_size_sql'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._accountant(request text)
RETURNS text AS 'MODULE_PATHNAME', 'dpsql_accountant'
LANGUAGE C STRICT VOLATILE;
