# DP-GD for linear regression and its confidence intervals (Brown et al. 2024, "Private GD for
# linear regression", Algorithm 1 and §3): included from _core.pyx.
#
# The same C functions run in the server: dpsql.dpgd_gradient (one aggregate scan per step),
# dpsql_internal._dpgd_step, dpsql_internal._confint_draws, dpsql_internal._t_interval and dpsql.t_quantile.


cdef extern from "dpgd.h":
    size_t dpsql_dpgd_state_length(int p)
    DpsqlStatus dpsql_dpgd_init(double *state, size_t len, const double *theta, int p,
                                double gamma, int intercept, double x_bound) nogil
    void dpsql_dpgd_row(double *state, const double *x, int xlen, double y) nogil
    void dpsql_dpgd_result(const double *state, double *out) nogil
    DpsqlStatus dpsql_dpgd_step(DpsqlRng *rng, const double *theta, const double *grad_sum,
                                int p, double n, double eta, double noise_std,
                                double *out) nogil
    void dpsql_dpgd_rng_seed(DpsqlRng *rng, int64_t seed, uint64_t stream) nogil
    void dpsql_dpgd_rng_key(DpsqlRng *rng, const uint8_t *key, uint64_t stream) nogil


cdef extern from "stats.h":
    double dpsql_t_cdf(double t, double df)
    double dpsql_t_quantile(double p, double df)
    DpsqlStatus dpsql_t_interval(const double *draws, int m, int p, double alpha,
                                 double *estimate, double *sd, double *lower, double *upper)
    int dpsql_confint_method_from_name(const char *name)
    DpsqlStatus dpsql_confint_draws(const double *iterates, long n_iterates, int p, int method,
                                    int m, long burn_in, double *draws)


import os

CONFINT_METHODS = ("independent_runs", "checkpoints", "batch_means")


cdef tuple _dpgd_rows(X, y):
    """X as a C-contiguous (n, d) float64 array and y as (n,); NaN marks a malformed value."""
    xs = np.ascontiguousarray(np.atleast_2d(np.asarray(X, dtype=np.float64)))
    ys = np.ascontiguousarray(np.asarray(y, dtype=np.float64).reshape(-1))
    if xs.ndim != 2:
        raise ValueError("dpsql: X must be a 2-D array (rows x features)")
    if ys.shape[0] != xs.shape[0]:
        raise ValueError(f"dpsql: X has {xs.shape[0]} rows but y has {ys.shape[0]}")
    return xs, ys


cdef cnp.ndarray _dpgd_theta(theta, int p):
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] t = np.array(
        np.asarray(theta, dtype=np.float64).reshape(-1), dtype=np.float64, order="C")
    if t.shape[0] != p:
        raise ValueError(f"dpsql: theta has {t.shape[0]} coefficients, expected {p}")
    return t


cdef _dpgd_check_settings(int p, double gamma, bint intercept, double x_bound):
    if p < (2 if intercept else 1):
        raise ValueError(f"dpsql: the model needs at least {2 if intercept else 1} coefficients")
    if not gamma > 0.0:
        raise ValueError("dpsql: gamma (the gradient clipping norm) must be > 0 "
                         "(inf: no clipping)")
    if not (x_bound >= 0.0 and np.isfinite(x_bound)):
        raise ValueError("dpsql: x_bound must be finite and >= 0 (0: rows are not clipped)")


cdef int _dpgd_accumulate(double *state, size_t slen, const double *theta, int p, double gamma,
                          bint intercept, double x_bound, const double *xp, Py_ssize_t n,
                          int d, const double *yp, double *result) nogil:
    """One step's clipped gradient sum over the n rows into result[p + 2]."""
    cdef Py_ssize_t i
    cdef DpsqlStatus st = dpsql_dpgd_init(state, slen, theta, p, gamma, intercept, x_bound)
    if st != 0:
        return st
    for i in range(n):
        dpsql_dpgd_row(state, xp + i * d, d, yp[i])
    dpsql_dpgd_result(state, result)
    return 0


def dpgd_gradient(X, y, theta, double gamma, bint intercept=False, double x_bound=0.0):
    """Sum of the per-example gradients x_i (<x_i, theta> - y_i) clipped to norm gamma.

    Rows are clipped to norm x_bound first (x_bound > 0) and get a feature 1 appended when
    intercept is set; a row with a NaN/Inf feature or label is a null record (counted in n,
    zero gradient). Returns (sum (p,), n, clipped): clipped counts the gradients whose norm
    exceeded gamma (a diagnostic, not private). The server's dpsql.dpgd_gradient aggregate.
    """
    xs, ys = _dpgd_rows(X, y)
    cdef cnp.ndarray[cnp.float64_t, ndim=2, mode="c"] xm = xs
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] yv = ys
    cdef int d = xm.shape[1]
    cdef int p = d + (1 if intercept else 0)
    _dpgd_check_settings(p, gamma, intercept, x_bound)
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] t = _dpgd_theta(theta, p)
    if not np.all(np.isfinite(t)):
        raise ValueError("dpsql: theta contains NaN or Infinity")
    cdef size_t slen = dpsql_dpgd_state_length(p)
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] state = np.zeros(slen)
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] out = np.zeros(p + 2)
    cdef Py_ssize_t n = xm.shape[0]
    cdef const double *xp = &xm[0, 0] if n > 0 and d > 0 else NULL
    cdef const double *yp = &yv[0] if n > 0 else NULL
    cdef int st
    with nogil:
        st = _dpgd_accumulate(&state[0], slen, &t[0], p, gamma, intercept, x_bound, xp, n, d,
                              yp, &out[0])
    if st != 0:
        _raise(st)
    return out[:p].copy(), int(out[p]), int(out[p + 1])


cdef _dpgd_step_checks(double n, double eta, double noise_std):
    if not (n >= 1 and n == int(n)):
        raise ValueError("dpsql: the row count n must be a whole number >= 1")
    if not (eta > 0 and np.isfinite(eta)):
        raise ValueError("dpsql: eta (the step size) must be finite and > 0")
    if not (noise_std >= 0 and np.isfinite(noise_std)):
        raise ValueError("dpsql: noise_std must be finite and >= 0")


def dpgd_step(theta, grad_sum, double n, double eta, double noise_std, seed=None,
              unsigned long long stream=0):
    """theta - eta * grad_sum / n + eta * z, z ~ N(0, noise_std^2 I).

    The generator is keyed by the OS, or by seed (reproducible, NOT private) with stream
    separating the steps; dpsql_internal._dpgd_step with the same seed and stream gives the same
    iterate.
    """
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] t = np.array(
        np.asarray(theta, dtype=np.float64).reshape(-1), dtype=np.float64, order="C")
    cdef int p = t.shape[0]
    if p < 1:
        raise ValueError("dpsql: theta is empty")
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] g = _dpgd_theta(grad_sum, p)
    _dpgd_step_checks(n, eta, noise_std)
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] out = np.empty(p)
    cdef DpsqlRng rng
    cdef bytes key
    if seed is None:
        key = os.urandom(32)
        dpsql_dpgd_rng_key(&rng, key, stream)
    else:
        dpsql_dpgd_rng_seed(&rng, seed, stream)
    cdef DpsqlStatus st = dpsql_dpgd_step(&rng, &t[0], &g[0], p, n, eta, noise_std, &out[0])
    if st == 3:
        _raise(st, " (theta must be finite)")
    if st != 0:
        _raise(st)
    return out


def dpgd_run(X, y, *, long steps, double eta, double gamma, double noise_std,
             bint intercept=False, double x_bound=0.0, seed=None, theta0=None,
             bint return_clipped=False):
    """A whole DP-GD run in memory: the iterates theta_1..theta_steps, shape (steps, p).

    Step t (1-based) is dpgd_gradient at theta_{t-1} followed by dpgd_step with stream t
    (seeded runs reproduce the server's run step by step). theta0 defaults to 0. With
    return_clipped, also the clipped-gradient count of every step.
    """
    xs, ys = _dpgd_rows(X, y)
    cdef cnp.ndarray[cnp.float64_t, ndim=2, mode="c"] xm = xs
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] yv = ys
    cdef int d = xm.shape[1]
    cdef int p = d + (1 if intercept else 0)
    cdef Py_ssize_t n = xm.shape[0]
    _dpgd_check_settings(p, gamma, intercept, x_bound)
    if steps < 1:
        raise ValueError("dpsql: steps must be >= 1")
    _dpgd_step_checks(float(n), eta, noise_std)
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] theta = (
        np.zeros(p) if theta0 is None else _dpgd_theta(theta0, p))
    if not np.all(np.isfinite(theta)):
        raise ValueError("dpsql: theta0 contains NaN or Infinity")
    cdef cnp.ndarray[cnp.float64_t, ndim=2, mode="c"] iterates = np.empty((steps, p))
    cdef cnp.ndarray[cnp.int64_t, ndim=1, mode="c"] clipped = np.zeros(steps, dtype=np.int64)
    cdef size_t slen = dpsql_dpgd_state_length(p)
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] state = np.zeros(slen)
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] grad = np.zeros(p + 2)
    cdef const double *xp = &xm[0, 0] if n > 0 and d > 0 else NULL
    cdef const double *yp = &yv[0] if n > 0 else NULL
    cdef bint seeded = seed is not None
    cdef int64_t seed_value = seed if seeded else 0
    cdef bytes key = b"" if seeded else os.urandom(32)
    cdef const uint8_t *key_p = key
    cdef DpsqlRng rng
    cdef const double *prev
    cdef long t
    cdef int st = 0
    with nogil:
        prev = &theta[0]
        for t in range(steps):
            st = _dpgd_accumulate(&state[0], slen, prev, p, gamma, intercept, x_bound, xp, n,
                                  d, yp, &grad[0])
            if st != 0:
                break
            clipped[t] = <long> grad[p + 1]
            if seeded:
                dpsql_dpgd_rng_seed(&rng, seed_value, t + 1)
            else:
                dpsql_dpgd_rng_key(&rng, key_p, t + 1)
            st = dpsql_dpgd_step(&rng, prev, &grad[0], p, grad[p], eta, noise_std,
                                 &iterates[t, 0])
            if st != 0:
                break
            prev = &iterates[t, 0]
    if st != 0:
        _raise(st, f" (step {t + 1} of the run)")
    if return_clipped:
        return iterates, clipped
    return iterates


def t_cdf(double t, double df):
    """P(T <= t) for Student's t with df >= 1 degrees of freedom."""
    cdef double out = dpsql_t_cdf(t, df)
    if np.isnan(out):
        raise ValueError("dpsql: t_cdf needs df >= 1 (finite) and t not NaN")
    return out


def t_quantile(double p, double df):
    """The p-quantile of Student's t with df >= 1 degrees of freedom (relative error ~1e-13)."""
    if not (0.0 < p < 1.0):
        raise ValueError("dpsql: p must be in (0, 1)")
    if not (df >= 1.0 and np.isfinite(df)):
        raise ValueError("dpsql: df must be finite and >= 1")
    cdef double out = dpsql_t_quantile(p, df)
    if np.isnan(out):
        raise ValueError(f"dpsql: t_quantile did not converge for p={p}, df={df}")
    return out


def confint_draws(iterates, str method, int draws, long burn_in):
    """The m = draws estimates (draws, p) of a confidence-interval method (Brown et al. 2024,
    §3.1).

    iterates is (N, p), row k - 1 holding theta_k. 'independent_runs': the m runs' iterates
    concatenated (N = m L), draw l = mean of run l's theta_{b+1..L}; 'checkpoints': theta_{b+lB};
    'batch_means': mean of theta_{b+(l-1)B+1..b+lB}, with B = floor((N - b) / m), b = burn_in.
    """
    cdef cnp.ndarray[cnp.float64_t, ndim=2, mode="c"] it = np.ascontiguousarray(
        iterates, dtype=np.float64)
    cdef int code = dpsql_confint_method_from_name(method.encode())
    if code == 0:
        raise ValueError(f"dpsql: unknown method {method!r}; expected one of {CONFINT_METHODS}")
    if draws < 2:
        raise ValueError("dpsql: draws must be >= 2")
    if burn_in < 0:
        raise ValueError("dpsql: burn_in must be >= 0")
    if it.shape[0] < 1 or it.shape[1] < 1:
        raise ValueError("dpsql: iterates is empty")
    if not np.all(np.isfinite(it)):
        raise ValueError("dpsql: iterates contain NaN or Infinity")
    cdef cnp.ndarray[cnp.float64_t, ndim=2, mode="c"] out = np.empty((draws, it.shape[1]))
    cdef DpsqlStatus st = dpsql_confint_draws(&it[0, 0], it.shape[0], it.shape[1], code, draws,
                                              burn_in, &out[0, 0])
    if st == 4:
        raise ValueError(f"dpsql: {it.shape[0]} iterates are too few for {draws} {method} draws "
                         f"after a burn-in of {burn_in}")
    if st != 0:
        _raise(st)
    return out


def t_interval(draws, double alpha):
    """(estimate, lower, upper), each (p,): mean -/+ t_{m-1,1-alpha/2} sd / sqrt(m), ddof = 1."""
    cdef cnp.ndarray[cnp.float64_t, ndim=2, mode="c"] d = np.ascontiguousarray(
        draws, dtype=np.float64)
    cdef int m = d.shape[0], p = d.shape[1]
    if m < 2 or p < 1:
        raise ValueError("dpsql: t_interval needs at least 2 draws of at least 1 coefficient")
    if not (0.0 < alpha < 1.0):
        raise ValueError("dpsql: alpha must be in (0, 1)")
    if not np.all(np.isfinite(d)):
        raise ValueError("dpsql: draws contain NaN or Infinity")
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] est = np.empty(p)
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] lo = np.empty(p)
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] hi = np.empty(p)
    cdef DpsqlStatus st = dpsql_t_interval(&d[0, 0], m, p, alpha, &est[0], NULL, &lo[0], &hi[0])
    if st != 0:
        _raise(st)
    return est, lo, hi
