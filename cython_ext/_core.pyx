# cython: language_level=3, boundscheck=False, wraparound=False
"""dpsql._core: the C core of dpsql on numpy arrays (the in-memory engine).

The same C functions run inside PostgreSQL's aggregate; for the same row order both engines
produce the same model bit for bit (tests/python/test_parity.py).
"""

import numpy as np

cimport numpy as cnp

cnp.import_array()


cdef extern from "status.h":
    ctypedef int DpsqlStatus
    DpsqlStatus DPSQL_E_PARAM
    const char *dpsql_status_message(DpsqlStatus status)


cdef extern from "losses.h":
    ctypedef struct DpsqlLossConstants:
        double lipschitz
        double lipschitz_data
        double smoothness
        double strong_convexity
    DpsqlLossConstants dpsql_loss_constants(int loss, double lam, double radius,
                                            double huber_h, int n_classes)


cdef extern from "sgd.h":
    int DPSQL_HEADER_LEN
    int DPSQL_MAX_CLASSES
    int DPSQL_FLAG_CLIP_ROWS
    int DPSQL_FLAG_UNIT_ROWS
    int DPSQL_FLAG_INTERCEPT
    int DPSQL_FLAG_SANITIZE
    ctypedef struct DpsqlSgdHeader:
        pass
    ctypedef struct DpsqlSgdParams:
        int loss
        int schedule
        int flags
        int dim
        int n_classes
        double lambda_ "lambda"
        double eta
        double offset
        double radius
        double huber_h
        long batch_size
        double clip_norm
        int noise_kind
        double noise_scale
        double noise_divisor
        long steps_per_epoch
    void dpsql_sgd_seed_noise_from_seed(double *state, long long seed)
    DpsqlStatus dpsql_sgd_row_batch(double *state, const double *x, int xlen, double y,
                                    long batch) nogil
    size_t dpsql_sgd_init_length(const DpsqlSgdParams *params)
    DpsqlStatus dpsql_sgd_init(const DpsqlSgdParams *params, double *state, size_t len)
    DpsqlStatus dpsql_sgd_check(const double *state, size_t len)
    int dpsql_sgd_row_length(const double *state)
    double dpsql_sgd_step_size(const DpsqlSgdHeader *h, double s)
    void dpsql_sgd_epoch_begin(double *state) nogil
    DpsqlStatus dpsql_sgd_row(double *state, const double *x, int xlen, double y) nogil
    DpsqlStatus dpsql_sgd_epoch_end(double *state) nogil
    DpsqlStatus dpsql_sgd_combine(double *a, const double *b, size_t len)
    double dpsql_sgd_objective(const double *state)
    DpsqlStatus dpsql_sgd_example_gradient(const double *state, const double *x, int xlen,
                                           double y, double *loss, double *grad)
    DpsqlStatus dpsql_predict(int loss, int flags, const double *coef, int n_out, int dim,
                              const double *x, int xlen, double *out) nogil


cdef extern from "names.h":
    int dpsql_loss_from_name(const char *name)
    const char *dpsql_loss_name(int loss)
    int dpsql_schedule_from_name(const char *name)
    const char *dpsql_schedule_name(int schedule)


# Canonical names from the core (names.c), which SQL uses too.
LOSSES = {dpsql_loss_name(c).decode(): c for c in range(1, 5)}
SCHEDULES = {dpsql_schedule_name(c).decode(): c for c in range(1, 5)}


def loss_code(str name):
    """Code of a model name (aliases accepted, e.g. 'squared' for 'linear')."""
    cdef int code = dpsql_loss_from_name(name.encode())
    if code == 0:
        raise ValueError(f"dpsql: unknown loss {name!r}; expected one of {sorted(LOSSES)}")
    return code
FLAG_CLIP_ROWS = DPSQL_FLAG_CLIP_ROWS
FLAG_UNIT_ROWS = DPSQL_FLAG_UNIT_ROWS
FLAG_INTERCEPT = DPSQL_FLAG_INTERCEPT
FLAG_SANITIZE = DPSQL_FLAG_SANITIZE
HEADER_LEN = DPSQL_HEADER_LEN
MAX_CLASSES = DPSQL_MAX_CLASSES
# Order of the fields of DpsqlSgdHeader (sgd.h).
HEADER_FIELDS = (
    "magic", "loss", "schedule", "flags", "dim", "n_out", "lambda", "eta", "offset", "beta",
    "gamma", "radius", "huber_h", "batch_size", "step", "step_start", "in_batch", "rows",
    "loss_sum", "dropped", "clipped", "shards", "invalid", "clip_norm", "noise_kind",
    "noise_scale", "noise_divisor", "batch_id", "steps_per_epoch",
)


cdef _raise(DpsqlStatus st, str where=""):
    msg = dpsql_status_message(st).decode()
    raise ValueError(f"dpsql: {msg}{where}")


cdef cnp.ndarray _checked(state):
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] s = np.ascontiguousarray(state, dtype=np.float64)
    cdef DpsqlStatus st = dpsql_sgd_check(&s[0], s.shape[0]) if s.shape[0] > 0 else 1
    if st != 0:
        _raise(st)
    return s


NOISE_KINDS = {"none": 0, "gaussian": 1, "gamma_norm": 2}


def init_state(str loss, int dim, *, int n_classes=1, double lambda_=0.0,
               str schedule="constant", double eta=0.1, double offset=0.0, double radius=0.0,
               double huber_h=0.1, long batch_size=1, int flags=0, double clip_norm=0.0,
               str noise="none", double noise_scale=0.0, double noise_divisor=0.0,
               long steps_per_epoch=0, noise_seed=None):
    """A fresh model state (zero model, step 0) for `dim` input features.

    White-box options: per-example clipping of the data gradient to `clip_norm`, noise
    ("gaussian" with std `noise_scale`, or "gamma_norm" with that Gamma scale) added to every
    step's gradient sum, dividing by `noise_divisor` (0: the batch size), and batched epochs
    (`steps_per_epoch` > 0: run_epoch takes each row's batch number). The noise generator is
    keyed by `noise_seed` (reproducible, not private) or by the OS.
    """
    cdef DpsqlSgdParams p
    p.loss = loss_code(loss)
    p.schedule = dpsql_schedule_from_name(schedule.encode())
    if p.schedule == 0:
        raise ValueError(f"dpsql: unknown schedule {schedule!r}; expected one of {sorted(SCHEDULES)}")
    p.flags = flags
    p.dim = dim
    p.n_classes = n_classes
    p.lambda_ = lambda_
    p.eta = eta
    p.offset = offset
    p.radius = radius
    p.huber_h = huber_h
    p.batch_size = batch_size
    if noise not in NOISE_KINDS:
        raise ValueError(f"dpsql: unknown noise {noise!r}; expected one of {sorted(NOISE_KINDS)}")
    p.clip_norm = clip_norm
    p.noise_kind = NOISE_KINDS[noise]
    p.noise_scale = noise_scale
    p.noise_divisor = noise_divisor
    p.steps_per_epoch = steps_per_epoch
    cdef size_t n = dpsql_sgd_init_length(&p)
    if n == 0:
        raise ValueError("dpsql: invalid model shape (dim >= 1; multinomial needs 2 to "
                         f"{MAX_CLASSES} classes)")
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] s = np.zeros(n, dtype=np.float64)
    cdef DpsqlStatus st = dpsql_sgd_init(&p, &s[0], n)
    if st != 0:
        _raise(st)
    if p.noise_kind != 0:
        import os
        seed = noise_seed if noise_seed is not None else int.from_bytes(os.urandom(8), "little", signed=True)
        dpsql_sgd_seed_noise_from_seed(&s[0], seed)
    return s


def check_state(state):
    """Validate a state array; raise ValueError when malformed."""
    _checked(state)


def header(state):
    """The state's header as a dict (field names as in sgd.h)."""
    s = _checked(state)
    return {name: float(s[i]) for i, name in enumerate(HEADER_FIELDS)}


def weights(state):
    """The model of a state, shaped (n_out, dim)."""
    h = header(state)
    n_out, dim = int(h["n_out"]), int(h["dim"])
    return np.asarray(state[HEADER_LEN:HEADER_LEN + n_out * dim]).reshape(n_out, dim).copy()


def run_epoch(state, X, y, batches=None):
    """One epoch over the rows of X (in order); returns the new state (input untouched).

    For batched states, `batches` gives each row's batch number (non-decreasing, 1-based)."""
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] s = _checked(state).copy()
    cdef cnp.ndarray[cnp.int64_t, ndim=1, mode="c"] bs
    cdef bint batched = batches is not None
    cdef cnp.ndarray[cnp.float64_t, ndim=2, mode="c"] xs = np.ascontiguousarray(X, dtype=np.float64)
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] ys = np.ascontiguousarray(y, dtype=np.float64)
    cdef Py_ssize_t m = xs.shape[0], i
    cdef int d = xs.shape[1]
    cdef DpsqlStatus st = 0
    cdef double *sp = &s[0]
    cdef const double *xp
    if ys.shape[0] != m:
        raise ValueError(f"dpsql: X has {m} rows but y has {ys.shape[0]}")
    if d != dpsql_sgd_row_length(sp):
        _raise(4, f" (rows have {d} features, the model expects {dpsql_sgd_row_length(sp)})")
    xp = &xs[0, 0] if m > 0 else NULL
    bs = np.ascontiguousarray(batches if batched else np.zeros(1), dtype=np.int64)
    if batched and bs.shape[0] != m:
        raise ValueError("dpsql: one batch number per row is needed")
    with nogil:
        dpsql_sgd_epoch_begin(sp)
        for i in range(m):
            if batched:
                st = dpsql_sgd_row_batch(sp, xp + i * d, d, ys[i], bs[i])
            else:
                st = dpsql_sgd_row(sp, xp + i * d, d, ys[i])
            if st != 0:
                break
        if st == 0:
            st = dpsql_sgd_epoch_end(sp)
    if st != 0:
        _raise(st, f" (row {i + 1} of the epoch)")
    return s


def combine(a, b):
    """Row-count-weighted model average of two partial states (the aggregate's combine)."""
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] sa = _checked(a).copy()
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] sb = _checked(b)
    if sa.shape[0] != sb.shape[0]:
        _raise(2)
    cdef DpsqlStatus st = dpsql_sgd_combine(&sa[0], &sb[0], sa.shape[0])
    if st != 0:
        _raise(st)
    return sa


def objective(state):
    """Mean training loss of the last epoch plus (lambda/2)||w||^2."""
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] s = _checked(state)
    return dpsql_sgd_objective(&s[0])


def step_size(state, double s):
    """Step size of update s (1-based) under the state's schedule."""
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] st = _checked(state)
    return dpsql_sgd_step_size(<const DpsqlSgdHeader *> &st[0], s)


def example_gradient(state, x, double y):
    """(loss, gradient) of one example at the state's model; gradient includes lambda*w."""
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] s = _checked(state)
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] xs = np.ascontiguousarray(x, dtype=np.float64)
    h = header(s)
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] g = np.zeros(
        int(h["dim"]) * int(h["n_out"]), dtype=np.float64)
    cdef double loss = 0.0
    cdef DpsqlStatus st = dpsql_sgd_example_gradient(
        &s[0], &xs[0] if xs.shape[0] > 0 else NULL, xs.shape[0], y, &loss, &g[0])
    if st != 0:
        _raise(st)
    return loss, g.reshape(int(h["n_out"]), int(h["dim"]))


def predict(str loss, int flags, coef, X):
    """Predictions for the rows of X with released coefficients coef (n_out x dim)."""
    cdef cnp.ndarray[cnp.float64_t, ndim=2, mode="c"] c = np.ascontiguousarray(
        np.atleast_2d(coef), dtype=np.float64)
    cdef cnp.ndarray[cnp.float64_t, ndim=2, mode="c"] xs = np.ascontiguousarray(
        np.atleast_2d(X), dtype=np.float64)
    cdef Py_ssize_t m = xs.shape[0], i
    cdef int d = xs.shape[1]
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] out = np.empty(m, dtype=np.float64)
    cdef DpsqlStatus st = 0
    cdef int code = loss_code(loss)
    for i in range(m):
        st = dpsql_predict(code, flags, &c[0, 0], c.shape[0], c.shape[1], &xs[i, 0], d, &out[i])
        if st != 0:
            _raise(st, f" (row {i + 1})")
    return out


def loss_constants(str loss, double lambda_=0.0, double radius=0.0, double huber_h=0.1,
                   int n_classes=1):
    """Lipschitz (L), smoothness (beta) and strong convexity (gamma) of one example's loss."""
    cdef DpsqlLossConstants c = dpsql_loss_constants(loss_code(loss), lambda_, radius, huber_h,
                                                     n_classes)
    return {"lipschitz": c.lipschitz, "lipschitz_data": c.lipschitz_data,
            "smoothness": c.smoothness, "strong_convexity": c.strong_convexity}


cdef extern from "shuffle.h":
    long long dpsql_shuffle_key(long long seed, long long position)


def shuffle_key(long long seed, long long position):
    """Sort key of row `position` under `seed` (the database's shuffle uses the same)."""
    return dpsql_shuffle_key(seed, position)


# ---------------------------------------------------------------------------------------------
# Privacy: CSPRNG, samplers, calibrations, sensitivities, mechanisms
# ---------------------------------------------------------------------------------------------

from libc.stdint cimport uint8_t, uint32_t, int64_t, uint64_t


cdef extern from "csprng.h":
    ctypedef struct DpsqlRng:
        pass
    void dpsql_rng_init(DpsqlRng *rng, const uint8_t *key, uint64_t stream)
    void dpsql_rng_init_seed(DpsqlRng *rng, int64_t seed, uint64_t stream)
    double dpsql_rng_uniform(DpsqlRng *rng)
    uint32_t dpsql_rng_u32(DpsqlRng *rng)
    void dpsql_chacha20_block(const uint32_t *key, uint32_t counter, const uint32_t *nonce,
                              uint32_t *out)


cdef extern from "noise.h":
    double dpsql_sample_normal(DpsqlRng *rng)
    double dpsql_sample_normal_fast(DpsqlRng *rng)
    void dpsql_fill_normal_fast(DpsqlRng *rng, double *out, size_t n)
    double dpsql_sample_gamma(DpsqlRng *rng, double shape, double scale)
    void dpsql_sample_direction(DpsqlRng *rng, double *out, int d)
    double dpsql_gaussian_delta(double sigma, double sensitivity, double epsilon)
    double dpsql_gaussian_sigma_analytic(double sensitivity, double epsilon, double delta)
    double dpsql_gaussian_sigma_classic(double sensitivity, double epsilon, double delta)


cdef extern from "sensitivity.h":
    ctypedef struct DpsqlSensitivityParams:
        int schedule
        double eta
        double offset
        double lipschitz
        double smoothness
        double strong_convexity
        long rows
        long batch_size
        long epochs
        int fresh_permutation
        int paper_minibatch
    DpsqlStatus dpsql_bolton_sensitivity(const DpsqlSensitivityParams *p, double *delta2)
    DpsqlStatus dpsql_exact_sensitivity(const DpsqlSensitivityParams *p, double *delta2) nogil
    long DPSQL_SENSITIVITY_MAX_STEPS
    long DPSQL_SENSITIVITY_MAX_POSITIONS


SENSITIVITY_MAX_STEPS = DPSQL_SENSITIVITY_MAX_STEPS
SENSITIVITY_MAX_POSITIONS = DPSQL_SENSITIVITY_MAX_POSITIONS


cdef extern from "mechanisms.h":
    DpsqlStatus dpsql_output_perturbation(DpsqlRng *rng, double *weights, int n_out, int dim,
                                          int per_output, double sensitivity, double epsilon,
                                          double delta, int calibration, double *scale)
    int dpsql_exponential_mechanism(DpsqlRng *rng, const double *utility, int n,
                                    double epsilon, double sensitivity)


CALIBRATIONS = {"analytic": 1, "classic": 2}


cdef void _rng(DpsqlRng *rng, seed, uint64_t stream):
    """Keyed by the seed (reproducible, NOT private) or, for seed None, by the OS."""
    import os
    cdef bytes key
    if seed is None:
        key = os.urandom(32)
        dpsql_rng_init(rng, key, stream)
    else:
        dpsql_rng_init_seed(rng, seed, stream)


def chacha20_block(key, uint32_t counter, nonce):
    """The ChaCha20 block function (RFC 8439): 16 output words."""
    cdef uint32_t k[8]
    cdef uint32_t n[3]
    cdef uint32_t out[16]
    for i in range(8):
        k[i] = key[i]
    for i in range(3):
        n[i] = nonce[i]
    dpsql_chacha20_block(k, counter, n, out)
    return [out[i] for i in range(16)]


def uniform(Py_ssize_t n, seed=None):
    cdef DpsqlRng rng
    _rng(&rng, seed, 0)
    return np.array([dpsql_rng_uniform(&rng) for _ in range(n)])


def normal(Py_ssize_t n, seed=None):
    cdef DpsqlRng rng
    _rng(&rng, seed, 0)
    return np.array([dpsql_sample_normal(&rng) for _ in range(n)])


def rng_words(bytes key, uint64_t stream, Py_ssize_t n):
    """The generator's first n 32-bit words for a raw 32-byte key (its keystream, in order)."""
    cdef DpsqlRng rng
    if len(key) != 32:
        raise ValueError("key must be 32 bytes")
    dpsql_rng_init(&rng, key, stream)
    return [dpsql_rng_u32(&rng) for _ in range(n)]


def normal_fast(Py_ssize_t n, seed=None, Py_ssize_t chunk=0):
    """Standard normals from the ziggurat sampler used for per-step noise: one call per normal,
    or (chunk > 0) the bulk sampler chunk normals at a time (the same draws)."""
    cdef DpsqlRng rng
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] out = np.empty(n)
    cdef Py_ssize_t start
    _rng(&rng, seed, 0)
    if chunk > 0:
        for start in range(0, n, chunk):
            dpsql_fill_normal_fast(&rng, &out[start], <size_t> min(chunk, n - start))
        return out
    for i in range(n):
        out[i] = dpsql_sample_normal_fast(&rng)
    return out


def gamma(Py_ssize_t n, double shape, double scale=1.0, seed=None):
    cdef DpsqlRng rng
    _rng(&rng, seed, 0)
    return np.array([dpsql_sample_gamma(&rng, shape, scale) for _ in range(n)])


def directions(Py_ssize_t n, int d, seed=None):
    """n uniform directions on the unit sphere in R^d."""
    cdef DpsqlRng rng
    cdef cnp.ndarray[cnp.float64_t, ndim=2, mode="c"] out = np.empty((n, d))
    _rng(&rng, seed, 0)
    for i in range(n):
        dpsql_sample_direction(&rng, &out[i, 0], d)
    return out


def gaussian_delta(double sigma, double sensitivity, double epsilon):
    """delta(epsilon) of the Gaussian mechanism (exact, Balle and Wang 2018)."""
    return dpsql_gaussian_delta(sigma, sensitivity, epsilon)


def gaussian_sigma(double sensitivity, double epsilon, double delta, str calibration="analytic"):
    """Noise standard deviation for (epsilon, delta); 'classic' is eq. (4) (epsilon < 1)."""
    if calibration == "analytic":
        return dpsql_gaussian_sigma_analytic(sensitivity, epsilon, delta)
    if calibration == "classic":
        return dpsql_gaussian_sigma_classic(sensitivity, epsilon, delta)
    raise ValueError(f"dpsql: unknown calibration {calibration!r}")


cdef DpsqlSensitivityParams _sens_params(str schedule, double eta, double offset,
                                         double lipschitz, double smoothness,
                                         double strong_convexity, long rows, long batch_size,
                                         long epochs, bint fresh, bint paper_minibatch) except *:
    cdef DpsqlSensitivityParams p
    p.schedule = dpsql_schedule_from_name(schedule.encode())
    if p.schedule == 0:
        raise ValueError(f"dpsql: unknown schedule {schedule!r}")
    p.eta = eta
    p.offset = offset
    p.lipschitz = lipschitz
    p.smoothness = smoothness
    p.strong_convexity = strong_convexity
    p.rows = rows
    p.batch_size = batch_size
    p.epochs = epochs
    p.fresh_permutation = fresh
    p.paper_minibatch = paper_minibatch
    return p


def bolton_sensitivity(str schedule, *, double eta=0.0, double offset=0.0, double lipschitz,
                       double smoothness, double strong_convexity=0.0, long rows,
                       long batch_size=1, long epochs=1, bint fresh=False,
                       bint paper_minibatch=False):
    """L2 sensitivity of the PSGD output by the closed forms the releases use."""
    cdef DpsqlSensitivityParams p = _sens_params(schedule, eta, offset, lipschitz, smoothness,
                                                 strong_convexity, rows, batch_size, epochs,
                                                 fresh, paper_minibatch)
    cdef double out = 0.0
    cdef DpsqlStatus st = dpsql_bolton_sensitivity(&p, &out)
    if st != 0:
        _raise(st, " (no closed form: check eta <= 2/beta (convex) or the schedule)")
    return out


def exact_sensitivity(str schedule, *, double eta=0.0, double offset=0.0, double lipschitz,
                      double smoothness, double strong_convexity=0.0, long rows,
                      long batch_size=1, long epochs=1, bint fresh=False):
    """The growth recursion of Wu et al. 2017, Lemma 4 (for checking the closed forms)."""
    cdef DpsqlSensitivityParams p = _sens_params(schedule, eta, offset, lipschitz, smoothness,
                                                 strong_convexity, rows, batch_size, epochs,
                                                 fresh, False)
    cdef double out = 0.0
    cdef DpsqlStatus st
    with nogil:
        st = dpsql_exact_sensitivity(&p, &out)
    if st == DPSQL_E_PARAM:
        _raise(st, " (a step exceeds its expansiveness limit)")
    if st != 0:
        _raise(st, f" (the recursion is limited to {SENSITIVITY_MAX_STEPS} steps, and to "
               f"{SENSITIVITY_MAX_POSITIONS} per pass with one permutation)")
    return out


def output_perturbation(weights, double sensitivity, double epsilon, double delta=0.0, *,
                        seed=None, bint per_output=False, str calibration="analytic"):
    """(noisy copy of weights (n_out x dim), noise scale): the bolt-on release in memory."""
    cdef cnp.ndarray[cnp.float64_t, ndim=2, mode="c"] w = np.array(
        np.atleast_2d(weights), dtype=np.float64, order="C")
    cdef DpsqlRng rng
    cdef double scale = 0.0
    if calibration not in CALIBRATIONS:
        raise ValueError(f"dpsql: unknown calibration {calibration!r}")
    _rng(&rng, seed, 1)
    cdef DpsqlStatus st = dpsql_output_perturbation(
        &rng, &w[0, 0], w.shape[0], w.shape[1], per_output, sensitivity, epsilon, delta,
        CALIBRATIONS[calibration], &scale)
    if st != 0:
        _raise(st, " (epsilon > 0, 0 <= delta < 1; classic Gaussian needs epsilon < 1)")
    return w, scale


def exponential_mechanism(utility, double epsilon, double sensitivity=1.0, seed=None):
    """Index drawn with probability proportional to exp(epsilon u / (2 sensitivity))."""
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] u = np.ascontiguousarray(utility,
                                                                                dtype=np.float64)
    cdef DpsqlRng rng
    _rng(&rng, seed, 2)
    return dpsql_exponential_mechanism(&rng, &u[0], u.shape[0], epsilon, sensitivity)


# Linear-regression mechanisms (issue 5), one include per mechanism.
include "ambssgd.pxi"
include "dpgd.pxi"
include "adassp.pxi"

# Private ERM toolbox (Thakurta, "Private Optimization").
include "frank_wolfe.pxi"
include "exp_mech_erm.pxi"
include "ftrl.pxi"
include "erm_solver.pxi"


cdef extern from "prediction.h":
    DpsqlStatus dpsql_bound_features(const double *bounds, int d, const double *x, double *out,
                                   int *bad)
    int dpsql_is_positive(int loss, double raw)
    DpsqlStatus dpsql_preprocess(const double *x, int d, const double *bounds, int row_flags,
                                 const double *centre, double *out, int *bad)


def apply_bounds(X, bounds):
    """Rows of X with each feature clipped to its public (lo, hi) and mapped onto [-1, 1]."""
    cdef cnp.ndarray[cnp.float64_t, ndim=2, mode="c"] b = np.ascontiguousarray(
        bounds, dtype=np.float64).reshape(-1, 2)
    cdef cnp.ndarray[cnp.float64_t, ndim=2, mode="c"] xs = np.ascontiguousarray(
        np.atleast_2d(X), dtype=np.float64)
    cdef int d = b.shape[0], bad = 0
    cdef Py_ssize_t i
    if xs.shape[1] != d:
        raise ValueError(f"dpsql: {d} feature bounds for {xs.shape[1]} features")
    cdef cnp.ndarray[cnp.float64_t, ndim=2, mode="c"] out = np.empty_like(xs)
    for i in range(xs.shape[0]):
        if dpsql_bound_features(&b[0, 0], d, &xs[i, 0], &out[i, 0], &bad) != 0:
            raise ValueError(f"dpsql: feature bound {bad + 1} is not a finite interval lo < hi")
    return out


def is_positive(str loss, raw):
    """The binary decision rule on raw predictions: 1 positive, 0 negative, -1 undecided (NaN)."""
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] r = np.ascontiguousarray(
        np.atleast_1d(raw), dtype=np.float64)
    cdef cnp.ndarray[cnp.int8_t, ndim=1, mode="c"] out = np.empty(r.shape[0], dtype=np.int8)
    cdef int code = loss_code(loss)
    cdef Py_ssize_t i
    for i in range(r.shape[0]):
        out[i] = dpsql_is_positive(code, r[i])
    return out


def preprocess(X, bounds, int row_flags, centre):
    """Rows of X as a model with preprocessing sees them: public bounds (or None), the row
    transform of row_flags, minus centre (or None); NaN rows for non-finite inputs."""
    cdef cnp.ndarray[cnp.float64_t, ndim=2, mode="c"] xs = np.ascontiguousarray(
        np.atleast_2d(X), dtype=np.float64)
    cdef int d = xs.shape[1], bad = 0
    cdef Py_ssize_t i
    cdef cnp.ndarray[cnp.float64_t, ndim=2, mode="c"] b
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] c
    cdef const double *bp = NULL
    cdef const double *cp = NULL
    cdef DpsqlStatus st
    if bounds is not None:
        b = np.ascontiguousarray(bounds, dtype=np.float64).reshape(-1, 2)
        if b.shape[0] != d:
            raise ValueError(f"dpsql: {b.shape[0]} feature bounds for {d} features")
        bp = &b[0, 0]
    if centre is not None:
        c = np.ascontiguousarray(centre, dtype=np.float64).ravel()
        if c.shape[0] != d:
            raise ValueError(f"dpsql: the centre has {c.shape[0]} entries for {d} features")
        cp = &c[0]
    cdef cnp.ndarray[cnp.float64_t, ndim=2, mode="c"] out = np.empty_like(xs)
    for i in range(xs.shape[0]):
        st = dpsql_preprocess(&xs[i, 0], d, bp, row_flags, cp, &out[i, 0], &bad)
        if st == DPSQL_E_PARAM:
            raise ValueError(f"dpsql: feature bound {bad + 1} is not a finite interval lo < hi")
        if st != 0:
            out[i, :] = np.nan
    return out
