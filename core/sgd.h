/*
 * sgd.h - Bismarck-style SGD over a stream of rows: the model state and one epoch's steps.
 *
 * The state is a flat array of doubles (a float8[] inside PostgreSQL, a numpy array in
 * Python): a fixed header, then the weights w[n_out * dim], then the mini-batch gradient
 * accumulator g[n_out * dim]. Integers in the header are stored as exact doubles. Keeping
 * the state a plain double array lets PostgreSQL use it as a real aggregate state type
 * (parallel and Citus aggregation need that) and lets both engines share this code.
 *
 * An epoch is: dpsql_sgd_epoch_begin, dpsql_sgd_row for every row in scan order,
 * dpsql_sgd_epoch_end. Partial aggregates of a parallel scan are merged by dpsql_sgd_combine.
 */
#ifndef DPSQL_SGD_H
#define DPSQL_SGD_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define DPSQL_STATE_MAGIC 4472.0	/* "dpsql state, layout version 2" */
#define DPSQL_MAX_CLASSES 1024
/*
 * Batched epochs (Poisson sampling, sampling with replacement) take one noisy step per batch,
 * empty ones included: steps_per_epoch bounds an epoch's work whatever the rows are. Batch
 * numbers are int in SQL (_poisson_batches), hence 2^31 - 1.
 */
#define DPSQL_MAX_STEPS_PER_EPOCH 2147483647L

/* Step-size schedules; s is the global mini-batch update counter, 1-based, never reset. */
typedef enum DpsqlSchedule
{
	DPSQL_SCHEDULE_CONSTANT = 1,	/* eta */
	DPSQL_SCHEDULE_DECREASING = 2,	/* min(1/beta, 1/(gamma s)): strongly convex, Alg. 2 */
	DPSQL_SCHEDULE_INVERSE = 3,		/* eta / (s + offset): convex decreasing, Cor. 2 */
	DPSQL_SCHEDULE_SQRT = 4			/* eta / (sqrt(s) + offset): square-root, Cor. 3 */
} DpsqlSchedule;

/* Row transforms applied to x before use (and identically at prediction time). */
#define DPSQL_FLAG_CLIP_ROWS	0x1 /* x <- x / max(1, ||x||) */
#define DPSQL_FLAG_UNIT_ROWS	0x2 /* x <- x / ||x||, the bolt-on paper's normalisation */
#define DPSQL_FLAG_INTERCEPT	0x4 /* a constant feature 1 appended (before the row transform) */
/*
 * Private runs: a row that would be an error (NULL, NaN/Inf, wrong length, label outside the
 * declared set) is processed as a null record with zero data gradient instead, so that no
 * error can reveal a data value. Such a record is a valid member of the loss class (its loss
 * is the regulariser alone), so every sensitivity bound still holds.
 */
#define DPSQL_FLAG_SANITIZE		0x8
/*
 * White-box audits (sql/install/65_audit_dirac.sql, docs/audit.md): a row whose last feature
 * is nonzero is a Dirac canary, not a data row. Its gradient is exactly clip_norm (white-box
 * states) or the loss's data Lipschitz constant (the bolt-on) times the unit vector of its
 * other features (zero when they are all zero), on the first output, without the loss or the
 * intercept: the largest gradient one row may contribute, in a direction the audit chooses.
 * A canary that is not finite, or whose loss has no finite Lipschitz constant, is a null
 * record (private runs) or an error.
 */
#define DPSQL_FLAG_CANARY_ROWS	0x10
/* Private runs keep every weight in [-box, box] (sgd.c, guard_weights). */
#define DPSQL_WEIGHT_BOX		1e100
#define DPSQL_FLAG_MASK			0x1F

typedef struct DpsqlSgdHeader
{
	double		magic;
	double		loss;			/* DpsqlLoss */
	double		schedule;		/* DpsqlSchedule */
	double		flags;			/* DPSQL_FLAG_* */
	double		dim;			/* model dimension per output, intercept included */
	double		n_out;			/* 1, or the number of classes for multinomial */
	double		lambda;			/* L2 regularisation */
	double		eta;			/* step size parameter of the schedule */
	double		offset;			/* schedule offset (m^c in the bolt-on corollaries) */
	double		beta;			/* smoothness, caps the decreasing schedule */
	double		gamma;			/* strong convexity of the decreasing schedule */
	double		radius;			/* project onto ||w|| <= radius after every update; 0 = none */
	double		huber_h;		/* Huber half-width */
	double		batch_size;		/* b */
	double		step;			/* completed updates before/through this epoch */
	double		step_start;		/* step at the start of this epoch */
	double		in_batch;		/* rows in the current partial batch */
	double		rows;			/* rows seen this epoch */
	double		loss_sum;		/* sum of per-row data losses at the pre-update model */
	double		dropped;		/* rows of discarded partial batches (drop_last) */
	double		clipped;		/* rows scaled down by the row transform */
	double		shards;			/* partial states averaged into this one */
	double		invalid;		/* rows processed as null records (DPSQL_FLAG_SANITIZE) */
	/* White-box private SGD (noise inside every step) */
	double		clip_norm;		/* clip each example's data gradient to this norm; 0 = off */
	double		noise_kind;		/* DpsqlNoiseKind */
	double		noise_scale;	/* Gaussian sigma, or the Gamma-norm scale (eq. 3) */
	double		noise_divisor;	/* divide (gradient sum + noise) by this; 0 = the batch size */
	double		batch_id;		/* batched epochs: the batch being accumulated (0 = none yet) */
	double		steps_per_epoch;	/* batched epochs (rows carry their batch); 0 = counted batches */
} DpsqlSgdHeader;

/* Noise added to every step's gradient sum (white-box mechanisms). */
typedef enum DpsqlNoiseKind
{
	DPSQL_NOISE_NONE = 0,
	DPSQL_NOISE_GAUSSIAN = 1,	/* i.i.d. N(0, scale^2) per coordinate */
	DPSQL_NOISE_GAMMA_NORM = 2	/* norm ~ Gamma(n, scale), uniform direction (eq. 3) */
} DpsqlNoiseKind;

/*
 * States with noise carry the CSPRNG (a DpsqlRng, ChaCha20) after the accumulator, stored
 * as raw bytes in DPSQL_RNG_LEN doubles (never released, never read as numbers).
 */
#define DPSQL_RNG_LEN 136

#define DPSQL_HEADER_LEN ((int) (sizeof(DpsqlSgdHeader) / sizeof(double)))

typedef struct DpsqlSgdParams
{
	int			loss;
	int			schedule;
	int			flags;
	int			dim;			/* number of input features (without the intercept) */
	int			n_classes;		/* size of the label set: multinomial classes, or >= 3 for
								 * one-vs-rest logistic/huber; 1 or 2 = one output */
	double		lambda;
	double		eta;
	double		offset;
	double		radius;
	double		huber_h;
	long		batch_size;
	double		clip_norm;		/* 0 = no per-example clipping */
	int			noise_kind;		/* DpsqlNoiseKind */
	double		noise_scale;
	double		noise_divisor;	/* 0 = batch size */
	long		steps_per_epoch;	/* > 0: rows carry their batch number (Poisson, sampling) */
} DpsqlSgdParams;

/* Number of outputs (weight vectors): classes for multinomial and one-vs-rest, else 1. */
int			dpsql_outputs(int loss, int n_classes);

/* Total state length for a validated header (noise: the CSPRNG tail included). */
size_t		dpsql_sgd_state_length(int model_dim, int n_out, int noise_kind);

/* Key the state's noise generator (states with noise only). */
void		dpsql_sgd_seed_noise(double *state, const uint8_t key[32]);
void		dpsql_sgd_seed_noise_from_seed(double *state, int64_t seed);

/* Length of the state that dpsql_sgd_init would build, or 0 when the parameters are invalid. */
size_t		dpsql_sgd_init_length(const DpsqlSgdParams *params);

/* Fill a zero model state of length dpsql_sgd_init_length(params) (a fresh run, step 0). */
DpsqlStatus dpsql_sgd_init(const DpsqlSgdParams *params, double *state, size_t len);

/*
 * Validate a state array of length len (never trust a state handed in from outside): every
 * header field, the length, the generator's position, and finite weights. O(len).
 */
DpsqlStatus dpsql_sgd_check(const double *state, size_t len);

/*
 * The O(1) part of dpsql_sgd_check: everything the row functions index or loop by (header
 * fields, length, generator position), not the weights' finiteness. Cheap enough for every
 * row of an aggregate, whose state may come from a bogus INITCOND.
 */
DpsqlStatus dpsql_sgd_check_header(const double *state, size_t len);

/*
 * Whether the loss sum, the model and the accumulator of a state that passed the header check
 * are finite: a well-formed state that is not has diverged (a full check calls it malformed).
 */
int			dpsql_sgd_finite(const double *state);
/* A private state's weights onto their box (DPSQL_WEIGHT_BOX); nothing for other states. */
void		dpsql_sgd_guard(double *state);

/* Number of feature values a row must carry for this state (dim minus the intercept). */
int			dpsql_sgd_row_length(const double *state);

static inline double *
dpsql_sgd_weights(double *state)
{
	return state + DPSQL_HEADER_LEN;
}

/* Step size of update s (1-based) under a schedule: the one place the schedules are written. */
double		dpsql_schedule_step(int schedule, double eta, double offset, double beta, double gamma,
								double s);

/* Step size of update s under the state's schedule. */
double		dpsql_sgd_step_size(const DpsqlSgdHeader *h, double s);

/* Reset the per-epoch counters of a validated state; the model and step counter carry over. */
void		dpsql_sgd_epoch_begin(double *state);

/* Process one row: x has dpsql_sgd_row_length(state) values. */
DpsqlStatus dpsql_sgd_row(double *state, const double *x, int xlen, double y);

/*
 * Batched epochs (steps_per_epoch > 0): rows arrive ordered by their batch number in
 * 1..steps_per_epoch (Poisson sampling, sampling with replacement); skipped batch numbers are
 * empty batches, whose step still adds its noise. Errors when batches go backwards.
 */
DpsqlStatus dpsql_sgd_row_batch(double *state, const double *x, int xlen, double y, long batch);

/*
 * Batched epochs on shards (Citus, docs/citus.md): the coordinator's state takes each batch's
 * clipped-gradient sum from the shards and adds the step's noise once.
 *
 * dpsql_sgd_probe: the noise-free copy of a batched state that the shards sum a batch into
 * (header, model, zero accumulator; no generator: the noise key never leaves the coordinator),
 * for the batch the state is at (1 at the start of an epoch). len = dpsql_sgd_probe_length.
 * dpsql_sgd_probe_row: add one member row's clipped gradient to a probe (no step).
 * dpsql_sgd_probe_combine: add probe b's sums to a (the same batch and the same model).
 * dpsql_sgd_add_batch: the sums of batch `batch` (sums NULL: an empty batch) added to the
 * state, then the batch's noisy step taken, as dpsql_sgd_row_batch would over the same members.
 */
size_t		dpsql_sgd_probe_length(const double *state);
DpsqlStatus dpsql_sgd_probe(const double *state, double *probe, size_t len);
DpsqlStatus dpsql_sgd_probe_row(double *probe, const double *x, int xlen, double y);
DpsqlStatus dpsql_sgd_probe_combine(double *a, const double *b, size_t len);
DpsqlStatus dpsql_sgd_add_batch(double *state, const double *sums, size_t slen, long batch);

/*
 * End of the epoch: drop the partial mini-batch (drop_last: Wu et al. 2017 assume b divides m;
 * dropping the last m mod b positions is data-independent).
 */
DpsqlStatus dpsql_sgd_epoch_end(double *state);

/*
 * Merge partial state b into a: row-count-weighted average of the models (each shard's
 * partial batch is dropped first), counters summed, step = max of the two.
 */
DpsqlStatus dpsql_sgd_combine(double *a, const double *b, size_t len);

/* Mean data loss of the epoch plus (lambda/2)||w||^2 at the final model. */
double		dpsql_sgd_objective(const double *state);

/*
 * Per-example loss and full gradient (data part + lambda*w) at the state's current model,
 * for tests and diagnostics; grad has n_out * dim entries.
 */
DpsqlStatus dpsql_sgd_example_gradient(const double *state, const double *x, int xlen, double y,
									   double *loss, double *grad);

/*
 * Scale factor the row transform applies to x (and its intercept feature). Also reports
 * non-finite features. Returns DPSQL_OK or DPSQL_E_NONFINITE_X.
 */
DpsqlStatus dpsql_row_scale(int flags, const double *x, int xlen, double *scale);

/*
 * Prediction with released coefficients coef[n_out * dim]:
 * logistic -> probability of +1; huber, squared -> score; multinomial and one-vs-rest
 * (n_out >= 2) -> class index.
 */
DpsqlStatus dpsql_predict(int loss, int flags, const double *coef, int n_out, int dim,
						  const double *x, int xlen, double *out);

/* ||x|| of a finite vector without overflow or underflow (scaled by its largest entry). */
double		dpsql_rescaled_norm(const double *x, int n);

/*
 * The factor min(1, bound / ||x||) that clips a row to L2 norm bound (the norm taken without
 * overflow), or NAN when an entry is NaN or infinite (the caller's zero record). Shared by the
 * aggregates of the private-ERM toolbox.
 */
double		dpsql_clip_scale(const double *x, int n, double bound);

/* <w, x> with the engine's summation order (four partial sums), shared by the mechanisms. */
double		dpsql_dot(const double *w, const double *x, int n);

#endif
