# ambssgd bindings: included from _core.pyx. DP-AMBSSGD / DP-SSGD as one pass over the rows
# (core/ambssgd.h); the PostgreSQL aggregate dpsql.ambssgd_pass runs the same C.

cdef extern from "ambssgd.h":
    int DPSQL_AMBSSGD_HEADER_LEN
    uint64_t DPSQL_AMBSSGD_STREAM
    ctypedef struct DpsqlAmbssgdParams:
        int dim
        int intercept
        double x_bound
        int64_t n_rows
        long blocks
        int64_t batch
        int64_t stat
        double alpha
        double eta
        double r_x
        double log_factor
        double domain
        int levels
        double sigma_c
        double theta
        double zeta_fixed
        int keep_iterates
    ctypedef struct DpsqlAmbssgdResult:
        int p
        long blocks
        long blocks_done
        int64_t rows_used
        int64_t rows_unused
        int64_t clipped
        const double *gammas
        const double *zetas
        const double *draws
        const double *w_last
        const double *iterates
    size_t dpsql_ambssgd_state_size(const DpsqlAmbssgdParams *params)
    DpsqlStatus dpsql_ambssgd_init(double *state, size_t len, const DpsqlAmbssgdParams *params,
                                   const char **problem)
    void dpsql_ambssgd_seed(double *state, const uint8_t *key)
    void dpsql_ambssgd_seed_from_seed(double *state, int64_t seed)
    DpsqlStatus dpsql_ambssgd_check(const double *state, size_t len)
    int dpsql_ambssgd_row_length(const double *state)
    void dpsql_ambssgd_row(double *state, const double *x, int x_len, double y,
                           int is_null) nogil
    DpsqlStatus dpsql_ambssgd_result(const double *state, double *w_bar, DpsqlAmbssgdResult *r)
    int dpsql_ambssgd_clipped_gradient(const double *state, const double *x, int x_len, double y,
                                       int is_null, double zeta, double *out)
    double dpsql_ambssgd_level(double domain, int levels, int i)
    int64_t dpsql_ambssgd_count(const double *sorted, int64_t s, double level)
    void dpsql_ambssgd_sort(double *r, int64_t s)
    int dpsql_ambssgd_dp_stat(DpsqlRng *rng, double *resid, int64_t s, double domain,
                              int levels, double sigma_c, double theta, int *draws)


AMBSSGD_HEADER_LEN = DPSQL_AMBSSGD_HEADER_LEN
# Order of the fields of DpsqlAmbssgdHeader (ambssgd.h).
AMBSSGD_HEADER_FIELDS = (
    "magic", "version", "dim", "intercept", "p", "x_bound", "n_rows", "blocks", "batch", "stat",
    "alpha", "eta", "r_x", "log_factor", "domain", "levels", "sigma_c", "theta", "zeta_fixed",
    "keep_iterates", "block", "pos", "unused", "zeta", "clipped",
)


cdef cnp.ndarray _ambssgd_checked(state):
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] s = np.ascontiguousarray(state,
                                                                                dtype=np.float64)
    cdef DpsqlStatus st = dpsql_ambssgd_check(&s[0], s.shape[0]) if s.shape[0] > 0 else 1
    if st != 0:
        _raise(st, " (not a DP-AMBSSGD pass state)")
    return s


def ambssgd_init(int dim, *, n_rows, blocks, batch, stat, double alpha, double eta,
                 double r_x=0.0, double log_factor=0.0, double domain=0.0, int levels=0,
                 double sigma_c=0.0, double theta=0.0, double zeta_fixed=0.0,
                 bint intercept=False, double x_bound=0.0, seed=None,
                 bint keep_iterates=False):
    """A fresh DP-AMBSSGD pass state (w_0 = 0) for rows of `dim` features.

    stat > 0: adaptive clipping (DP-STAT on `stat` rows per block, levels domain 2^(i-levels),
    count noise `sigma_c`, break threshold `theta`, zeta_t = r_x gamma_t log_factor);
    stat = 0: fixed clipping norm `zeta_fixed` (DP-SSGD with batch = 1, blocks = n_rows).
    The generator is keyed by `seed` (reproducible, NOT private) or by the OS.
    `keep_iterates` keeps w_1..w_T in the state for ambssgd_result (tests).
    """
    cdef DpsqlAmbssgdParams p
    cdef const char *problem = NULL
    p.dim = dim
    p.intercept = 1 if intercept else 0
    p.x_bound = x_bound
    p.n_rows = n_rows
    p.blocks = blocks
    p.batch = batch
    p.stat = stat
    p.alpha = alpha
    p.eta = eta
    p.r_x = r_x
    p.log_factor = log_factor
    p.domain = domain
    p.levels = levels
    p.sigma_c = sigma_c
    p.theta = theta
    p.zeta_fixed = zeta_fixed
    p.keep_iterates = 1 if keep_iterates else 0
    cdef size_t n = dpsql_ambssgd_state_size(&p)
    if n == 0:
        # the shape is wrong: init names the parameter
        dpsql_ambssgd_init(NULL, 0, &p, &problem)
        raise ValueError(f"dpsql: DP-AMBSSGD: {problem.decode() if problem else 'state too large'}")
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] s = np.zeros(n, dtype=np.float64)
    cdef DpsqlStatus st = dpsql_ambssgd_init(&s[0], n, &p, &problem)
    if st != 0:
        raise ValueError(f"dpsql: DP-AMBSSGD: {problem.decode() if problem else 'invalid'}")
    cdef bytes key
    if seed is None:
        import os
        key = os.urandom(32)
        dpsql_ambssgd_seed(&s[0], key)
    else:
        dpsql_ambssgd_seed_from_seed(&s[0], seed)
    return s


def ambssgd_check(state):
    """Validate a pass state; raise ValueError when malformed."""
    _ambssgd_checked(state)


def ambssgd_header(state):
    """The state's header as a dict (field names as in ambssgd.h)."""
    s = _ambssgd_checked(state)
    return {name: float(s[i]) for i, name in enumerate(AMBSSGD_HEADER_FIELDS)}


def ambssgd_run(state, X, y):
    """Feed the rows of X (n x dim) and y, in order; returns the new state (input untouched).

    A row with a NaN/Inf feature or label is the zero record. X must have dim columns.
    Several calls continue one pass: the rows are blocked by their position in the pass.
    """
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] s = _ambssgd_checked(state).copy()
    cdef cnp.ndarray[cnp.float64_t, ndim=2, mode="c"] xs = np.ascontiguousarray(
        np.atleast_2d(X), dtype=np.float64)
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] ys = np.ascontiguousarray(
        np.atleast_1d(y), dtype=np.float64)
    cdef Py_ssize_t m = xs.shape[0], i
    cdef int d = xs.shape[1]
    cdef double *sp = &s[0]
    cdef const double *xp = &xs[0, 0] if m > 0 and d > 0 else NULL
    if ys.shape[0] != m:
        raise ValueError(f"dpsql: X has {m} rows but y has {ys.shape[0]}")
    if m > 0 and d != dpsql_ambssgd_row_length(sp):
        _raise(4, f" (rows have {d} features, the model expects {dpsql_ambssgd_row_length(sp)})")
    with nogil:
        for i in range(m):
            dpsql_ambssgd_row(sp, xp + i * d if xp != NULL else NULL, d, ys[i], 0)
    return s


def _ambssgd_copy(s, Py_ssize_t offset, Py_ssize_t n):
    return np.array(s[offset:offset + n], dtype=np.float64)


def ambssgd_result(state):
    """The pass's outcome as a dict.

    weights (w_bar, the mean of w_{T/2+1}..w_T; None until every block is done), gammas,
    zetas, draws (noisy counts per block), rows_used, rows_unused, blocks_done, w_last,
    iterates (T x p, or None unless kept) and clipped (diagnostic; data-dependent, never
    release it).
    """
    s = _ambssgd_checked(state)
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] ss = s
    cdef DpsqlAmbssgdResult r
    dpsql_ambssgd_result(&ss[0], NULL, &r)
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] w = np.zeros(r.p, dtype=np.float64)
    cdef DpsqlStatus st = 1
    if r.blocks_done == r.blocks:
        st = dpsql_ambssgd_result(&ss[0], &w[0], NULL)
        if st != 0:
            _raise(st, " (DP-AMBSSGD output)")
    T, p = r.blocks, r.p
    cdef const double *origin = &ss[0]
    gam = r.gammas - origin
    zet = r.zetas - origin
    dra = r.draws - origin
    wl = r.w_last - origin
    it = r.iterates - origin if r.iterates != NULL else -1
    return {
        "weights": w if st == 0 else None,
        "gammas": _ambssgd_copy(s, gam, T),
        "zetas": _ambssgd_copy(s, zet, T),
        "draws": _ambssgd_copy(s, dra, T).astype(np.int64),
        "rows_used": int(r.rows_used),
        "rows_unused": int(r.rows_unused),
        "blocks_done": int(r.blocks_done),
        "w_last": _ambssgd_copy(s, wl, p),
        "iterates": _ambssgd_copy(s, it, T * p).reshape(T, p) if it >= 0 else None,
        "clipped": int(r.clipped),
    }


def ambssgd_clipped_gradient(state, x, double y, double zeta):
    """(g, clipped): one row's clipped gradient at the state's current w (NaN: zero record)."""
    s = _ambssgd_checked(state)
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] ss = s
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] xs = np.ascontiguousarray(
        np.atleast_1d(x), dtype=np.float64)
    h = ambssgd_header(s)
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] g = np.zeros(int(h["p"]), dtype=np.float64)
    cdef int clipped = dpsql_ambssgd_clipped_gradient(
        &ss[0], &xs[0] if xs.shape[0] > 0 else NULL, xs.shape[0], y, 0, zeta, &g[0])
    return g, bool(clipped)


def ambssgd_level_counts(residuals, double domain, int levels):
    """True counts c_i = #{r <= domain 2^(i - levels)}, i = 0..levels (DP-STAT's queries)."""
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] r = np.array(residuals, dtype=np.float64,
                                                                   copy=True).ravel()
    cdef int64_t s = r.shape[0]
    cdef int i
    dpsql_ambssgd_sort(&r[0] if s > 0 else NULL, s)
    return np.array([dpsql_ambssgd_count(&r[0] if s > 0 else NULL, s,
                                         dpsql_ambssgd_level(domain, levels, i))
                     for i in range(levels + 1)], dtype=np.int64)


def ambssgd_dp_stat(residuals, *, double domain, int levels, double sigma_c, double theta,
                    Py_ssize_t trials=1, seed=None):
    """(gammas, level indices, draws) of `trials` independent DP-STAT runs on the residuals.

    One generator (keyed by `seed`, or the OS) serves every trial, as it serves the blocks of
    a pass. Parameters are those of ambssgd_init.
    """
    if not (0 < domain < np.inf) or not (0 <= levels <= 1 << 20) or not (0 <= sigma_c < np.inf) \
            or not np.isfinite(theta) or trials < 0:
        raise ValueError("dpsql: DP-STAT needs domain > 0, 0 <= levels <= 2^20, sigma_c >= 0 "
                         "and theta finite")
    cdef cnp.ndarray[cnp.float64_t, ndim=1, mode="c"] r = np.array(
        residuals, dtype=np.float64).ravel().copy()
    cdef int64_t s = r.shape[0]
    cdef cnp.ndarray[cnp.int64_t, ndim=1, mode="c"] lv = np.zeros(trials, dtype=np.int64)
    cdef cnp.ndarray[cnp.int64_t, ndim=1, mode="c"] dr = np.zeros(trials, dtype=np.int64)
    cdef DpsqlRng rng
    cdef int draws = 0
    cdef Py_ssize_t k
    _rng(&rng, seed, DPSQL_AMBSSGD_STREAM)
    for k in range(trials):
        lv[k] = dpsql_ambssgd_dp_stat(&rng, &r[0] if s > 0 else NULL, s, domain, levels,
                                      sigma_c, theta, &draws)
        dr[k] = draws
    gam = np.array([dpsql_ambssgd_level(domain, levels, int(i)) for i in lv], dtype=np.float64)
    return gam, lv, dr
