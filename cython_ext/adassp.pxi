# adassp bindings: included from _core.pyx.
# AdaSSP (Wang 2018; core/adassp.h) and the small dense linear algebra it uses
# (core/linalg.h), on numpy float64 arrays.

cdef extern from "linalg.h":
    int DPSQL_LINALG_MAX_DIM
    size_t dpsql_sym_eigvalsh_workspace(int p)
    DpsqlStatus dpsql_sym_eigvalsh(const double *a, int p, int first, int count, double *out,
                                   double *work) nogil
    DpsqlStatus dpsql_lu_solve(double *a, double *b, int p, int *singular) nogil


cdef extern from "adassp.h":
    int DPSQL_ADASSP_MAX_DIM
    int DPSQL_ADASSP_STREAM
    ctypedef struct DpsqlAdasspNoise:
        double sigma_min
        double sigma_xx
        double sigma_xy
        double min_shift
        double ridge_factor
    ctypedef struct DpsqlAdasspResult:
        double ridge
        double lambda_tilde
        int singular
    size_t dpsql_adassp_state_length(int dim, int intercept)
    DpsqlStatus dpsql_adassp_state_init(double *state, size_t len, int dim, double x_bound,
                                        double y_bound, int intercept)
    void dpsql_adassp_gram_row(double *state, const double *x, int xlen, double y) nogil
    size_t dpsql_adassp_gram_length(int p)
    void dpsql_adassp_gram_finish(const double *state, double *gram)
    DpsqlStatus dpsql_adassp_gram_check(const double *gram, size_t len, int *p)
    DpsqlStatus dpsql_adassp_sensitivities(double x_bound, double y_bound, double *out)
    size_t dpsql_adassp_release_workspace(int p)
    DpsqlStatus dpsql_adassp_release(const double *gram, size_t len,
                                     const DpsqlAdasspNoise *noise, DpsqlRng *rng,
                                     double *weights, double *work,
                                     DpsqlAdasspResult *result) nogil


class SingularSystemError(ValueError):
    """A linear system singular to working precision (the AdaSSP release releases nothing)."""


cdef object _square_matrix(A, str what):
    a = np.array(A, dtype=np.float64, order="C", copy=True)
    if a.ndim != 2 or a.shape[0] != a.shape[1] or a.shape[0] < 1:
        raise ValueError(f"dpsql: {what} must be a non-empty square matrix, got shape {a.shape}")
    if a.shape[0] > DPSQL_LINALG_MAX_DIM:
        raise ValueError(f"dpsql: {what} larger than {DPSQL_LINALG_MAX_DIM} x "
                         f"{DPSQL_LINALG_MAX_DIM}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"dpsql: {what} contains NaN or Infinity")
    return a


def sym_eigvalsh(A):
    """Eigenvalues of the symmetric matrix A in ascending order (its upper triangle is read)."""
    cdef cnp.ndarray[cnp.float64_t, ndim=2, mode="c"] a = _square_matrix(A, "matrix")
    cdef int p = a.shape[0]
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] out = np.empty(p)
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] work = np.empty(
        dpsql_sym_eigvalsh_workspace(p))
    cdef DpsqlStatus st
    with nogil:
        st = dpsql_sym_eigvalsh(&a[0, 0], p, 0, p, &out[0], &work[0])
    if st != 0:
        _raise(st, " (symmetric eigenvalues)")
    return out


def solve(A, b):
    """x with A x = b (LU with partial pivoting); SingularSystemError if A is singular to
    working precision (a pivot <= p * eps * max|A_ij|)."""
    cdef cnp.ndarray[cnp.float64_t, ndim=2, mode="c"] a = _square_matrix(A, "matrix")
    cdef int p = a.shape[0]
    rhs = np.array(b, dtype=np.float64, order="C", copy=True)
    if rhs.ndim != 1 or rhs.shape[0] != p:
        raise ValueError(f"dpsql: right-hand side must have shape ({p},), got {rhs.shape}")
    if not np.all(np.isfinite(rhs)):
        raise ValueError("dpsql: right-hand side contains NaN or Infinity")
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] x = rhs
    cdef int singular = 0
    cdef DpsqlStatus st
    with nogil:
        st = dpsql_lu_solve(&a[0, 0], &x[0], p, &singular)
    if st != 0:
        _raise(st, " (linear solve)")
    if singular:
        raise SingularSystemError("dpsql: singular matrix (to working precision)")
    return x


def adassp_gram(X, y, double x_bound, double y_bound, bint intercept=False):
    """The gram [n, p, X^T X (p*p, row-major), X^T y (p)] of clipped rows, as the aggregate
    dpsql.adassp_gram computes it: (x, 1 if intercept) clipped as one vector to norm x_bound,
    y to [-y_bound, y_bound]; a row with a NaN/Infinity in x or y is the zero record."""
    cdef cnp.ndarray[cnp.float64_t, ndim=2, mode="c"] xs = np.ascontiguousarray(X,
                                                                                 dtype=np.float64)
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] ys = np.ascontiguousarray(y,
                                                                                 dtype=np.float64)
    cdef int dim = xs.shape[1]
    cdef Py_ssize_t n = xs.shape[0]
    cdef Py_ssize_t i
    cdef size_t length = dpsql_adassp_state_length(dim, intercept)
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] state
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] gram
    cdef DpsqlStatus st
    if ys.shape[0] != n:
        raise ValueError(f"dpsql: X has {n} rows but y has {ys.shape[0]}")
    if length == 0:
        raise ValueError(f"dpsql: AdaSSP needs 1 to {DPSQL_ADASSP_MAX_DIM} coefficients "
                         f"(intercept included), got {dim} features")
    state = np.empty(length)
    st = dpsql_adassp_state_init(&state[0], length, dim, x_bound, y_bound, intercept)
    if st != 0:
        _raise(st, " (x_bound and y_bound finite and > 0; x_bound >= 1 with an intercept)")
    with nogil:
        for i in range(n):
            dpsql_adassp_gram_row(&state[0], &xs[i, 0], dim, ys[i])
    gram = np.empty(dpsql_adassp_gram_length(dim + intercept))
    dpsql_adassp_gram_finish(&state[0], &gram[0])
    return gram


def adassp_sensitivities(double x_bound, double y_bound):
    """(lambda_min, X^T X Frobenius, X^T y): replace-one sensitivities for ||x|| <= x_bound and
    |y| <= y_bound (adassp.h has the proofs)."""
    cdef double out[3]
    cdef DpsqlStatus st = dpsql_adassp_sensitivities(x_bound, y_bound, out)
    if st != 0:
        _raise(st, " (x_bound and y_bound finite and > 0)")
    return out[0], out[1], out[2]


def adassp_release(gram, double sigma_min, double sigma_xx, double sigma_xy, double min_shift,
                   double ridge_factor, seed=None):
    """(weights, ridge, lambda_tilde): the AdaSSP release of a gram (adassp.h). The noise is
    keyed by `seed` (reproducible, NOT private; the database's release with the same seed
    draws the same noise) or by the OS. SingularSystemError if the noisy system is singular."""
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] g = np.array(gram, dtype=np.float64,
                                                                    order="C", copy=True).ravel()
    cdef int p = 0
    cdef DpsqlAdasspNoise noise
    cdef DpsqlAdasspResult result
    cdef DpsqlRng rng
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] weights
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] work
    cdef DpsqlStatus st
    if g.shape[0] == 0 or dpsql_adassp_gram_check(&g[0], g.shape[0], &p) != 0:
        raise ValueError("dpsql: malformed AdaSSP gram: expected [n, p, X^T X (p*p, symmetric, "
                         "non-negative diagonal), X^T y (p)] with finite entries and "
                         f"1 <= p <= {DPSQL_ADASSP_MAX_DIM}")
    noise.sigma_min = sigma_min
    noise.sigma_xx = sigma_xx
    noise.sigma_xy = sigma_xy
    noise.min_shift = min_shift
    noise.ridge_factor = ridge_factor
    weights = np.empty(p)
    work = np.empty(dpsql_adassp_release_workspace(p))
    _rng(&rng, seed, DPSQL_ADASSP_STREAM)
    with nogil:
        st = dpsql_adassp_release(&g[0], g.shape[0], &noise, &rng, &weights[0], &work[0],
                                  &result)
    if st != 0:
        _raise(st, " (AdaSSP noise parameters must be finite and >= 0)")
    if result.singular:
        raise SingularSystemError("dpsql: singular noisy system in the AdaSSP release; "
                                  "nothing released")
    return weights, result.ridge, result.lambda_tilde
