# frank_wolfe bindings: included from _core.pyx.
# Private Frank-Wolfe over the L1 ball (core/frank_wolfe.h), on numpy arrays.

cdef extern from "frank_wolfe.h":
    int DPSQL_FW_MAX_DIM
    int DPSQL_FW_MAX_STEPS
    int DPSQL_FW_LASSO
    int DPSQL_FW_LOGISTIC
    uint64_t DPSQL_FW_STREAM
    DpsqlStatus dpsql_fw_l1_bound(int model, double r_inf, double s, double y_bound,
                                  double *l1)
    DpsqlStatus dpsql_fw_eps_step(double epsilon, double delta, double rho, int steps,
                                  double *eps_step)
    int dpsql_fw_default_steps(int model, double n, double epsilon, double s, double r_inf,
                               double l1)
    DpsqlStatus dpsql_fw_probabilities(const double *grad, int p, double s, double eps_step,
                                       double delta_u, double *prob)
    DpsqlStatus dpsql_fw_select(DpsqlRng *rng, const double *grad, int p, double s,
                                double eps_step, double delta_u, double *work, int *vertex)
    DpsqlStatus dpsql_fw_move(double *theta, int p, int k, int vertex, double s)
    int dpsql_fw_lasso_dim(const double *gram, size_t len)
    DpsqlStatus dpsql_fw_lasso(const double *gram, size_t len, double s, int steps,
                               double eps_step, double delta_u, DpsqlRng *rng, double *theta,
                               double *iterates, double *work) nogil
    size_t dpsql_fw_state_length(int p)
    DpsqlStatus dpsql_fw_state_init(double *state, size_t len, int p, int intercept,
                                    double x_bound, double l1_clamp)
    void dpsql_fw_gradient_row(double *state, const double *x, int xlen, double y,
                               const double *theta) nogil


cdef int _fw_model(str model) except -1:
    if model == "lasso":
        return DPSQL_FW_LASSO
    if model == "logistic":
        return DPSQL_FW_LOGISTIC
    raise ValueError(f"dpsql: frank_wolfe models are lasso and logistic, got {model!r}")


def fw_l1_bound(str model, double r_inf, double s, double y_bound=0.0):
    """Per-example gradient inf-norm bound L_1 over the L1 ball of radius s."""
    cdef double l1 = 0.0
    cdef DpsqlStatus st = dpsql_fw_l1_bound(_fw_model(model), r_inf, s, y_bound, &l1)
    if st != 0:
        _raise(st, " (r_inf, s > 0 finite; y_bound >= 0 for lasso)")
    return l1


def fw_eps_step(double epsilon, double delta, double rho, int steps):
    """Per-step epsilon: sqrt(8 rho / K) when delta > 0, epsilon / K when delta = 0."""
    cdef double e = 0.0
    cdef DpsqlStatus st = dpsql_fw_eps_step(epsilon, delta, rho, steps, &e)
    if st != 0:
        _raise(st)
    return e


def fw_default_steps(str model, double n, double epsilon, double s, double r_inf, double l1):
    """Thm 6.22's K from public numbers, clamped to [2, DPSQL_FW_MAX_STEPS]."""
    cdef int k = dpsql_fw_default_steps(_fw_model(model), n, epsilon, s, r_inf, l1)
    if k == 0:
        raise ValueError("dpsql: invalid parameters of fw_default_steps")
    return k


cdef cnp.ndarray _vec(v):
    return np.ascontiguousarray(v, dtype=np.float64).reshape(-1)


def fw_probabilities(grad, double s, double eps_step, double delta_u):
    """Selection probabilities of the 2p vertices (+s e_j for j < p, then -s e_j)."""
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] g = _vec(grad)
    cdef int p = g.shape[0]
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] out = np.empty(2 * max(p, 1))
    if p < 1:
        raise ValueError("dpsql: empty gradient")
    cdef DpsqlStatus st = dpsql_fw_probabilities(&g[0], p, s, eps_step, delta_u, &out[0])
    if st != 0:
        _raise(st)
    return out


def fw_select(grad, double s, double eps_step, double delta_u, seed=None, uint64_t stream=0):
    """One private vertex index (exponential mechanism); seed makes it reproducible."""
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] g = _vec(grad)
    cdef int p = g.shape[0]
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] work = np.empty(2 * max(p, 1))
    cdef int vertex = -1
    cdef DpsqlRng rng
    if p < 1:
        raise ValueError("dpsql: empty gradient")
    _rng(&rng, seed, DPSQL_FW_STREAM + stream)
    cdef DpsqlStatus st = dpsql_fw_select(&rng, &g[0], p, s, eps_step, delta_u, &work[0],
                                          &vertex)
    if st != 0:
        _raise(st)
    return vertex


def fw_gradient(X, y, theta, double x_bound, bint intercept=False, double l1_clamp=1.0):
    """[n, SUM gradient (p)] of the logistic loss as the aggregate
    dpsql_internal._fw_gradient computes it (rows clipped, gradients clamped)."""
    cdef cnp.ndarray[cnp.float64_t, ndim=2, mode="c"] xs = np.ascontiguousarray(
        X, dtype=np.float64)
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] ys = _vec(y)
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] t = _vec(theta)
    cdef int dim = xs.shape[1]
    cdef int p = t.shape[0]
    cdef Py_ssize_t i, n = xs.shape[0]
    if p != dim + intercept:
        raise ValueError(f"dpsql: theta has {p} coefficients, expected {dim + intercept}")
    if ys.shape[0] != n:
        raise ValueError("dpsql: X and y have different numbers of rows")
    cdef size_t length = dpsql_fw_state_length(p)
    if length == 0:
        raise ValueError(f"dpsql: 1 to {DPSQL_FW_MAX_DIM} coefficients")
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] state = np.empty(length)
    cdef DpsqlStatus st = dpsql_fw_state_init(&state[0], length, p, intercept, x_bound,
                                              l1_clamp)
    if st != 0:
        _raise(st)
    with nogil:
        for i in range(n):
            dpsql_fw_gradient_row(&state[0], &xs[i, 0] if dim > 0 else NULL, dim, ys[i],
                                  &t[0])
    return state[5:].copy()


def fw_lasso(gram, double s, int steps, double eps_step, double delta_u, seed=None,
             bint return_iterates=False):
    """K private Frank-Wolfe steps from the gram [n, p, X^T X, X^T y] (dpsql.adassp_gram's
    layout): theta_K, or (theta_K, iterates K x p) with return_iterates."""
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] g = _vec(gram)
    cdef int p = dpsql_fw_lasso_dim(&g[0], g.shape[0]) if g.shape[0] > 0 else 0
    if p < 1:
        raise ValueError("dpsql: malformed gram")
    if steps < 1 or steps > DPSQL_FW_MAX_STEPS:
        raise ValueError(f"dpsql: steps must be between 1 and {DPSQL_FW_MAX_STEPS}")
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] theta = np.empty(p)
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] work = np.empty(3 * p)
    cdef cnp.ndarray[cnp.float64_t, ndim=2, mode="c"] its = np.empty(
        (steps if return_iterates else 1, p))
    cdef double *itp = &its[0, 0] if return_iterates else NULL
    cdef DpsqlRng rng
    cdef DpsqlStatus st
    _rng(&rng, seed, DPSQL_FW_STREAM)
    with nogil:
        st = dpsql_fw_lasso(&g[0], g.shape[0], s, steps, eps_step, delta_u, &rng, &theta[0],
                            itp, &work[0])
    if st != 0:
        _raise(st)
    if return_iterates:
        return theta, its
    return theta
