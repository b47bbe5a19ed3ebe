# exp_mech_erm bindings: included from _core.pyx.
# Exponential-mechanism ERM on a public grid (core/exp_mech_erm.h).

cdef extern from "exp_mech_erm.h":
    int DPSQL_EM_MAX_DIM
    int DPSQL_EM_MAX_POINTS
    uint64_t DPSQL_EM_STREAM
    int DPSQL_EM_LOGISTIC
    int DPSQL_EM_SQUARED
    int DPSQL_EM_HUBER
    int dpsql_em_grid_axis(int p, int max_points, int *count)
    DpsqlStatus dpsql_em_grid(int p, double radius, int max_points, double *out, int *count)
    DpsqlStatus dpsql_em_lipschitz(int model, double r_x, double radius, double y_bound,
                                   double *lipschitz)
    size_t dpsql_em_state_length(int p, int max_points)
    DpsqlStatus dpsql_em_state_init(double *state, size_t len, int model, int dim,
                                    int intercept, double x_bound, double y_bound,
                                    double radius, double huber_h, int max_points)
    void dpsql_em_loss_row(double *state, const double *x, int xlen, double y) nogil
    int dpsql_em_state_points(const double *state)
    const double *dpsql_em_state_losses(const double *state)
    DpsqlStatus dpsql_em_probabilities(const double *losses, int count, double epsilon,
                                       double delta_u, double *prob)
    DpsqlStatus dpsql_em_sample(DpsqlRng *rng, const double *losses, int count,
                                double epsilon, double delta_u, double *work, int *index)


cdef int _em_model(str model) except -1:
    if model == "logistic":
        return DPSQL_EM_LOGISTIC
    if model in ("linear", "squared"):
        return DPSQL_EM_SQUARED
    if model == "huber":
        return DPSQL_EM_HUBER
    raise ValueError(f"dpsql: exponential_mechanism models are logistic, huber and linear, "
                     f"got {model!r}")


def em_grid(int p, double radius, int max_points=4096):
    """The public grid (G x p): k points per axis on [-radius, radius] inside the ball."""
    cdef int count = 0
    if dpsql_em_grid_axis(p, max_points, &count) == 0:
        raise ValueError(f"dpsql: p in 1..{DPSQL_EM_MAX_DIM}, max_points in "
                         f"1..{DPSQL_EM_MAX_POINTS}")
    cdef cnp.ndarray[cnp.float64_t, ndim=2, mode="c"] out = np.empty((max(count, 1), p))
    cdef DpsqlStatus st = dpsql_em_grid(p, radius, max_points, &out[0, 0], &count)
    if st != 0:
        _raise(st)
    return out[:count].copy()


def em_lipschitz(str model, double r_x, double radius, double y_bound=0.0):
    """L over the ball of radius R_C: R_x (logistic, huber) or R_x (R_x R_C + Y) (linear)."""
    cdef double lip = 0.0
    cdef DpsqlStatus st = dpsql_em_lipschitz(_em_model(model), r_x, radius, y_bound, &lip)
    if st != 0:
        _raise(st)
    return lip


def em_losses(str model, X, y, double x_bound, double radius, bint intercept=False,
              double y_bound=0.0, double huber_h=0.1, int max_points=4096):
    """(grid G x p, losses [Loss(0), Loss(g_1..g_G)], n) as the aggregate
    dpsql_internal._em_losses computes them."""
    cdef cnp.ndarray[cnp.float64_t, ndim=2, mode="c"] xs = np.ascontiguousarray(
        X, dtype=np.float64)
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] ys = np.ascontiguousarray(
        y, dtype=np.float64).reshape(-1)
    cdef int dim = xs.shape[1]
    cdef int p = dim + intercept
    cdef Py_ssize_t i, n = xs.shape[0]
    if ys.shape[0] != n:
        raise ValueError("dpsql: X and y have different numbers of rows")
    cdef size_t length = dpsql_em_state_length(p, max_points)
    if length == 0:
        raise ValueError(f"dpsql: p in 1..{DPSQL_EM_MAX_DIM}, max_points in "
                         f"1..{DPSQL_EM_MAX_POINTS}")
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] state = np.empty(length)
    cdef DpsqlStatus st = dpsql_em_state_init(&state[0], length, _em_model(model), dim,
                                              intercept, x_bound, y_bound, radius, huber_h,
                                              max_points)
    if st != 0:
        _raise(st)
    with nogil:
        for i in range(n):
            dpsql_em_loss_row(&state[0], &xs[i, 0], dim, ys[i])
    cdef int count = dpsql_em_state_points(&state[0])
    grid = state[10:10 + count * p].reshape(count, p).copy()
    return grid, state[10 + count * p:].copy(), state[9]


def em_probabilities(losses, double epsilon, double delta_u):
    """P(g) ∝ exp(-epsilon (Loss(g) - Loss(0)) / (2 delta_u)) from [Loss(0), Loss(g)...]."""
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] ls = np.ascontiguousarray(
        losses, dtype=np.float64).reshape(-1)
    cdef int count = ls.shape[0] - 1
    if count < 1:
        raise ValueError("dpsql: losses must be [Loss(0), Loss(g_1), ...]")
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] out = np.empty(count)
    cdef DpsqlStatus st = dpsql_em_probabilities(&ls[0], count, epsilon, delta_u, &out[0])
    if st != 0:
        _raise(st)
    return out


def em_sample(losses, double epsilon, double delta_u, seed=None, uint64_t stream=0):
    """One grid index drawn by the exponential mechanism (seeded: reproducible, NOT private)."""
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] ls = np.ascontiguousarray(
        losses, dtype=np.float64).reshape(-1)
    cdef int count = ls.shape[0] - 1
    if count < 1:
        raise ValueError("dpsql: losses must be [Loss(0), Loss(g_1), ...]")
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] work = np.empty(count)
    cdef int index = -1
    cdef DpsqlRng rng
    _rng(&rng, seed, DPSQL_EM_STREAM + stream)
    cdef DpsqlStatus st = dpsql_em_sample(&rng, &ls[0], count, epsilon, delta_u, &work[0],
                                          &index)
    if st != 0:
        _raise(st)
    return index
