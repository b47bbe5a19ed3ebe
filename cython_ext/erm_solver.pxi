# erm_solver bindings: included from _core.pyx.
# The fixed-work Newton solver of objective and output perturbation (core/erm_solver.h), on
# numpy arrays: the server's in-memory path (dpsql_internal._glm_solve_rows), the same C.

cdef extern from "objective.h":
    ctypedef struct DpsqlGlm:
        int loss
        double param
        double y_bound
        double x_bound
        int intercept
        int p
    int DPSQL_GLM_MAX_DIM
    DpsqlStatus dpsql_glm_check(const DpsqlGlm *g)


cdef extern from "erm_solver.h":
    int dpsql_glm_row_stride(int p)
    double dpsql_glm_prepare_row(const DpsqlGlm *g, const double *x, double y, int y_null,
                                 double *xr, double *yr, double *wr)
    size_t dpsql_glm_solve_work_length(int p)
    ctypedef void (*DpsqlGlmPassHook)(void *arg)
    DpsqlStatus dpsql_glm_solve_rows(const DpsqlGlm *g, const double *xs, const double *ys,
                                     const double *ws, size_t rows, double reg, const double *b,
                                     double tolerance, int steps, double *theta,
                                     double *grad_norm, int *passes, double *work, double *zs,
                                     DpsqlGlmPassHook hook, void *hook_arg) nogil


def glm_solve(X, y, int loss, double param, double y_bound, double x_bound, bint intercept,
              double reg, b, double tolerance, int steps):
    """(theta, ||grad J(theta)||, evaluations) of the fixed-work Newton solver on the rows of X
    (n x d; a NaN row or label is a zero record) with labels y: loss 1 logistic, 2 Huber SVM
    (y in {-1, 1}), 3 Huber regression; b the linear term (None: zero)."""
    cdef DpsqlGlm g
    cdef cnp.ndarray[cnp.float64_t, ndim=2, mode="c"] x = np.ascontiguousarray(X, dtype=np.float64)
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] labels = np.ascontiguousarray(y, dtype=np.float64)
    cdef Py_ssize_t n = x.shape[0], i
    g.loss = loss
    g.param = param
    g.y_bound = y_bound
    g.x_bound = x_bound
    g.intercept = 1 if intercept else 0
    g.p = <int> x.shape[1] + g.intercept
    if labels.shape[0] != n or x.shape[1] < 1 or dpsql_glm_check(&g) != 0:
        _raise(DPSQL_E_PARAM, " (X n x d, y of n labels; the GLM settings)")
    cdef int stride = dpsql_glm_row_stride(g.p)
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] xs = np.zeros(max(n, 1) * stride)
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] ys = np.zeros(max(n, 1))
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] ws = np.zeros(max(n, 1))
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] zs = np.zeros(max(n, 1))
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] theta = np.zeros(g.p)
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] work = np.zeros(dpsql_glm_solve_work_length(g.p))
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] lin
    cdef const double *bp = NULL
    if b is not None:
        lin = np.ascontiguousarray(b, dtype=np.float64)
        if lin.shape[0] != g.p:
            _raise(DPSQL_E_PARAM, " (b of p = d + intercept entries)")
        bp = &lin[0]
    for i in range(n):
        dpsql_glm_prepare_row(&g, &x[i, 0], labels[i], 0, &xs[i * stride], &ys[i], &ws[i])
    cdef double grad_norm = 0.0
    cdef int passes = 0
    cdef DpsqlStatus st
    with nogil:
        st = dpsql_glm_solve_rows(&g, &xs[0], &ys[0], &ws[0], n, reg, bp, tolerance, steps,
                                  &theta[0], &grad_norm, &passes, &work[0], &zs[0], NULL, NULL)
    if st != 0:
        _raise(st, " (reg > 0, tolerance >= 0, 0 <= steps <= 100)")
    return theta, grad_norm, passes
