# ftrl bindings: included from _core.pyx.
# DP-FTRL with tree aggregation (core/ftrl.h; Thakurta, §6.3.2): the
# streaming tree, the node-noise calibration and whole DP-FTRL runs on numpy arrays (the same
# C code as the aggregate dpsql_internal._dp_ftrl_epoch).

cdef extern from "ftrl.h":
    int DPSQL_FTRL_MAX_DIM
    int DPSQL_TREE_MAX_LEVELS
    int DPSQL_FTRL_CONFIG_LENGTH
    ctypedef struct DpsqlFtrlConfig:
        pass
    ctypedef struct DpsqlFtrlEpoch:
        int levels
        long long leaves
        long long t
        double *theta
        double *s_prev
        double *theta_sum
    int dpsql_tree_levels(int64_t n)
    size_t dpsql_tree_length(int p, int levels)
    void dpsql_tree_init(double *tree, int p, int levels)
    DpsqlStatus dpsql_tree_add(double *tree, int p, int levels, int64_t t, const double *leaf,
                               double sigma, DpsqlRng *rng)
    int dpsql_tree_prefix_sum(const double *tree, int p, int levels, int64_t t, double *out)
    double dpsql_ftrl_sigma(double clip, int levels, int epochs, double epsilon, double delta)
    DpsqlStatus dpsql_ftrl_config_from_array(const double *a, int len, DpsqlFtrlConfig *c)
    double dpsql_ftrl_add_gradient(const DpsqlFtrlConfig *c, const double *theta,
                                   const double *x, int xlen, double y, int y_null,
                                   double *leaf)
    size_t dpsql_ftrl_epoch_length(int p, int levels)
    DpsqlStatus dpsql_ftrl_epoch_init(DpsqlFtrlEpoch *e, const DpsqlFtrlConfig *c, double *buf,
                                      const double *s_prev)
    DpsqlStatus dpsql_ftrl_epoch_row(DpsqlFtrlEpoch *e, const double *x, int xlen, double y,
                                     int y_null, DpsqlRng *rng)
    DpsqlStatus dpsql_ftrl_epoch_finish(DpsqlFtrlEpoch *e, DpsqlRng *rng)


FTRL_LOSSES = {"logistic": 1, "huber": 2, "linear": 3}


def tree_levels(long long n):
    """m = floor(lg n) + 1, the tree levels used over n leaves (0 for n < 1)."""
    return dpsql_tree_levels(n)


def ftrl_sigma(double clip, int levels, int epochs, double epsilon, double delta):
    """Node noise std: the analytic Gaussian for L2 sensitivity 2 clip sqrt(levels epochs)."""
    cdef double s = dpsql_ftrl_sigma(clip, levels, epochs, epsilon, delta)
    if not np.isfinite(s):
        raise ValueError("dpsql: ftrl_sigma needs clip > 0, levels >= 1, epochs >= 1, "
                         "epsilon > 0 and 0 < delta < 1")
    return s


cdef void _seed_rng(DpsqlRng *rng, seed, uint64_t stream):
    cdef uint8_t key[32]
    cdef bytes raw
    if seed is None:
        import os
        raw = os.urandom(32)
        for i in range(32):
            key[i] = raw[i]
        dpsql_rng_init(rng, key, stream)
    else:
        dpsql_rng_init_seed(rng, <int64_t> seed, stream)


def tree_prefix_sums(leaves, double sigma, seed=None, n_leaves=None, long long stream=1):
    """Streams the rows of `leaves` (T x p) through a tree sized for n_leaves (default T)
    leaves with node noise std sigma; returns (GetSum(t) for t = 1..T as a T x p array, the
    number of nodes each used)."""
    cdef cnp.ndarray[cnp.float64_t, ndim=2, mode="c"] a = np.ascontiguousarray(
        np.atleast_2d(leaves), dtype=np.float64)
    cdef int T = a.shape[0]
    cdef int p = a.shape[1]
    cdef long long n = T if n_leaves is None else n_leaves
    cdef int levels = dpsql_tree_levels(n)
    if p < 1 or T < 1 or n < T or levels > DPSQL_TREE_MAX_LEVELS:
        raise ValueError("dpsql: tree_prefix_sums needs 1 <= T <= n_leaves leaves of p >= 1")
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] tree = np.zeros(
        dpsql_tree_length(p, levels), dtype=np.float64)
    cdef cnp.ndarray[cnp.float64_t, ndim=2, mode="c"] out = np.zeros((T, p), dtype=np.float64)
    cdef cnp.ndarray[cnp.int64_t, ndim=1] used = np.zeros(T, dtype=np.int64)
    cdef DpsqlRng rng
    cdef DpsqlStatus st
    cdef Py_ssize_t t
    _seed_rng(&rng, seed, stream)
    dpsql_tree_init(&tree[0], p, levels)
    for t in range(T):
        st = dpsql_tree_add(&tree[0], p, levels, t + 1, &a[t, 0], sigma, &rng)
        if st != 0:
            _raise(st, f" (leaf {t + 1})")
        used[t] = dpsql_tree_prefix_sum(&tree[0], p, levels, t + 1, &out[t, 0])
    return out, used


cdef cnp.ndarray _ftrl_config(str model, int p, double clip, long long batch, long long n,
                              double sigma, double reg, double radius, double x_bound,
                              double y_bound, bint intercept, double huber_h):
    if model not in FTRL_LOSSES:
        raise ValueError(f"dpsql: unknown DP-FTRL model {model!r}")
    return np.array([FTRL_LOSSES[model], huber_h, x_bound, y_bound, 1.0 if intercept else 0.0,
                     p, clip, batch, n, sigma, reg, radius], dtype=np.float64)


def ftrl_leaf_sum(X, y, theta, str model="logistic", double clip=1.0, double x_bound=1.0,
                  double y_bound=1.0, bint intercept=False, double huber_h=0.1):
    """(SUM of the rows' clipped per-example gradients at theta, their norms before clipping).
    NaN rows or bad labels are the zero record."""
    cdef cnp.ndarray[cnp.float64_t, ndim=2, mode="c"] xs = np.ascontiguousarray(
        np.atleast_2d(X), dtype=np.float64)
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] ys = np.ascontiguousarray(y, dtype=np.float64)
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] th = np.ascontiguousarray(theta, dtype=np.float64)
    cdef int d = xs.shape[1]
    cdef int p = d + (1 if intercept else 0)
    if ys.shape[0] != xs.shape[0] or th.shape[0] != p:
        raise ValueError("dpsql: ftrl_leaf_sum needs one label per row and theta of length p")
    cdef cnp.ndarray cfg_arr = _ftrl_config(model, p, clip, 1, 1, 0.0, 1.0, 1.0, x_bound,
                                            y_bound, intercept, huber_h)
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] ca = cfg_arr
    cdef DpsqlFtrlConfig cfg
    cdef DpsqlStatus st = dpsql_ftrl_config_from_array(&ca[0], ca.shape[0], &cfg)
    if st != 0:
        _raise(st, " (DP-FTRL settings)")
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] leaf = np.zeros(p, dtype=np.float64)
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] norms = np.zeros(xs.shape[0], dtype=np.float64)
    cdef Py_ssize_t i
    for i in range(xs.shape[0]):
        norms[i] = dpsql_ftrl_add_gradient(&cfg, &th[0], &xs[i, 0], d, ys[i], 0, &leaf[0])
    return leaf, norms


def ftrl_run(X, y, str model="logistic", double clip=1.0, long long batch=1, int epochs=1,
             double sigma=0.0, double reg=1.0, double radius=10.0, double x_bound=1.0,
             double y_bound=1.0, bint intercept=False, double huber_h=0.1, seed=None):
    """E epochs of DP-FTRL over the rows in order (stream e for epoch e, as the server):
    returns (average of the iterates used, last iterate, the final noisy total S)."""
    cdef cnp.ndarray[cnp.float64_t, ndim=2, mode="c"] xs = np.ascontiguousarray(
        np.atleast_2d(X), dtype=np.float64)
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] ys = np.ascontiguousarray(y, dtype=np.float64)
    cdef int d = xs.shape[1]
    cdef int p = d + (1 if intercept else 0)
    cdef long long n = xs.shape[0]
    if ys.shape[0] != n or n < 1 or epochs < 1:
        raise ValueError("dpsql: ftrl_run needs rows, one label per row and epochs >= 1")
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] ca = _ftrl_config(
        model, p, clip, batch, n, sigma, reg, radius, x_bound, y_bound, intercept, huber_h)
    cdef DpsqlFtrlConfig cfg
    cdef DpsqlStatus st = dpsql_ftrl_config_from_array(&ca[0], ca.shape[0], &cfg)
    if st != 0:
        _raise(st, " (DP-FTRL settings)")
    cdef long long leaves = (n + batch - 1) // batch
    cdef int levels = dpsql_tree_levels(leaves)
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] buf = np.zeros(
        dpsql_ftrl_epoch_length(p, levels), dtype=np.float64)
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] s_prev = np.zeros(p, dtype=np.float64)
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] theta_sum = np.zeros(p, dtype=np.float64)
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] last = np.zeros(p, dtype=np.float64)
    cdef DpsqlFtrlEpoch e
    cdef DpsqlRng rng
    cdef Py_ssize_t i, j
    cdef int epoch
    for epoch in range(1, epochs + 1):
        _seed_rng(&rng, seed, epoch)
        st = dpsql_ftrl_epoch_init(&e, &cfg, &buf[0], &s_prev[0])
        if st != 0:
            _raise(st)
        for i in range(n):
            st = dpsql_ftrl_epoch_row(&e, &xs[i, 0], d, ys[i], 0, &rng)
            if st != 0:
                _raise(st, f" (row {i + 1})")
        st = dpsql_ftrl_epoch_finish(&e, &rng)
        if st != 0:
            _raise(st)
        for j in range(p):
            s_prev[j] = e.s_prev[j]
            theta_sum[j] += e.theta_sum[j]
            last[j] = e.theta[j]
    return theta_sum / (epochs * leaves), last, s_prev
