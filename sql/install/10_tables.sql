------------------------------------------------------------------------------------------
-- Tables
------------------------------------------------------------------------------------------

-- Every trained model; analysts read it through the filtered view dpsql.models (29_views.sql).
CREATE TABLE IF NOT EXISTS dpsql.model_store (
    model_id        bigserial PRIMARY KEY,
    created_at      timestamptz NOT NULL DEFAULT now(),
    created_by      name NOT NULL DEFAULT current_user,
    source          text NOT NULL,
    features        text[] NOT NULL,
    label           text NOT NULL,
    model           text NOT NULL,          -- logistic | linear | huber | multinomial
    classes         float8[],               -- binary: {negative, positive}; multinomial: classes
    n_features      int NOT NULL,
    fit_intercept   boolean NOT NULL,
    coef            float8[] NOT NULL,      -- 1-D, or classes x features for multinomial
    intercept       float8[],               -- one per output when fit_intercept
    weights         float8[] NOT NULL,      -- coef with the intercept column, as trained
    flags           int NOT NULL,           -- row transform flags of the C core
    -- the SGD run's (NULL for plan-and-fit mechanisms, which run no SGD: 33_planned.sql)
    epochs          int,                    -- requested
    epochs_run      int,                    -- fewer when the tolerance stopped training
    batch_size      bigint,
    lambda          float8 NOT NULL,
    schedule        text,
    step_size       float8,
    step_offset     float8,
    radius          float8,
    huber_h         float8,
    row_norm        text NOT NULL,
    shuffle         boolean,
    seed            bigint,
    seed_policy     text,                   -- user | random (pg_strong_random) | none
    rows            bigint NOT NULL,
    dropped_rows    bigint NOT NULL,        -- rows of partial last batches (drop_last), last epoch
    clipped_rows    bigint,                 -- rows scaled down by the row transform, last epoch
                                            -- (NULL for private models: data-dependent)
    train_loss      float8,                 -- objective of the last epoch (NULL when private)
    loss_history    float8[] NOT NULL,      -- empty for private models
    prepare_seconds float8 NOT NULL,
    train_seconds   float8 NOT NULL,
    privacy         text NOT NULL DEFAULT 'none',
    dataset_id      bigint,                 -- the registered dataset a private model charged
    epsilon         float8,
    delta           float8,
    sensitivity     float8,                 -- L2 sensitivity of the released model
    noise_scale     float8,                 -- Gamma scale sensitivity/epsilon, or Gaussian sigma
    params          jsonb NOT NULL          -- every argument of the run, for reproduction
);
-- (0.8.0: the SGD fields are NULL for plan-and-fit mechanisms; installed tables follow)
ALTER TABLE dpsql.model_store ALTER COLUMN epochs DROP NOT NULL, ALTER COLUMN epochs_run DROP NOT NULL,
    ALTER COLUMN batch_size DROP NOT NULL, ALTER COLUMN schedule DROP NOT NULL,
    ALTER COLUMN step_offset DROP NOT NULL, ALTER COLUMN shuffle DROP NOT NULL;
COMMENT ON TABLE dpsql.model_store IS 'Trained models with their hyperparameters and provenance';

-- Runs in progress: their noiseless state never leaves this table.
CREATE TABLE IF NOT EXISTS dpsql.runs (
    run_id          bigserial PRIMARY KEY,
    created_at      timestamptz NOT NULL DEFAULT now(),
    created_by      name NOT NULL DEFAULT current_user,
    spec            jsonb NOT NULL,
    train_table     text NOT NULL,
    state           float8[] NOT NULL,
    rows            bigint NOT NULL,
    epochs_done     int NOT NULL DEFAULT 0,
    losses          float8[] NOT NULL DEFAULT '{}',
    done            boolean NOT NULL DEFAULT false,
    prepare_seconds float8 NOT NULL,
    train_seconds   float8 NOT NULL DEFAULT 0,
    sampling_seed   bigint,         -- secret coins of sampled batches: never copied to a model
    fill            jsonb           -- a prepared private run's pending read (_prepare's row only:
                                    -- _read_rows makes it before the row is stored)
);
