"""dpsql._core: the C core of dpsql on numpy arrays (the in-memory engine).

Type stub of the Cython module built from cython_ext/_core.pyx and its includes
(ambssgd.pxi, dpgd.pxi, adassp.pxi). Array arguments accept anything numpy converts to float64
(copied to C order when needed); results are new float64 arrays unless stated otherwise. Names
(losses, schedules, noise kinds, calibrations, methods) are plain str: the core refuses unknown
ones with ValueError. Seeds
key a generator reproducibly (NOT private); ``None`` keys it from the OS. Invalid input raises
ValueError with a ``dpsql:`` message. tests/test_core_stub.py checks that every public name of
the compiled module is declared here.
"""

from collections.abc import Sequence
from typing import Any, Final, Literal, overload

import numpy as np
from numpy.typing import ArrayLike, NDArray

_Floats = NDArray[np.float64]
_Ints = NDArray[np.int64]

# -- SGD state, epochs, predictions (_core.pyx) ------------------------------------------------

#: Canonical model (loss) names and schedule names of the core (names.c) to their codes.
LOSSES: Final[dict[str, int]]
SCHEDULES: Final[dict[str, int]]
FLAG_CLIP_ROWS: Final[int]
FLAG_UNIT_ROWS: Final[int]
FLAG_INTERCEPT: Final[int]
FLAG_SANITIZE: Final[int]
HEADER_LEN: Final[int]
MAX_CLASSES: Final[int]
#: Field names of DpsqlSgdHeader (sgd.h), in order.
HEADER_FIELDS: Final[tuple[str, ...]]
NOISE_KINDS: Final[dict[str, int]]

def loss_code(name: str) -> int:
    """Code of a model name (aliases accepted, e.g. 'squared' for 'linear')."""

def init_state(
    loss: str,
    dim: int,
    *,
    n_classes: int = 1,
    lambda_: float = 0.0,
    schedule: str = "constant",
    eta: float = 0.1,
    offset: float = 0.0,
    radius: float = 0.0,
    huber_h: float = 0.1,
    batch_size: int = 1,
    flags: int = 0,
    clip_norm: float = 0.0,
    noise: str = "none",
    noise_scale: float = 0.0,
    noise_divisor: float = 0.0,
    steps_per_epoch: int = 0,
    noise_seed: int | None = None,
) -> _Floats:
    """A fresh model state (zero model, step 0) for `dim` input features; `noise` is one of
    NOISE_KINDS."""

def check_state(state: ArrayLike) -> None:
    """Validate a state array; raise ValueError when malformed."""

def header(state: ArrayLike) -> dict[str, float]:
    """The state's header as a dict (field names as in sgd.h)."""

def weights(state: ArrayLike) -> _Floats:
    """The model of a state, shaped (n_out, dim)."""

def run_epoch(
    state: ArrayLike, X: ArrayLike, y: ArrayLike, batches: ArrayLike | None = None
) -> _Floats:
    """One epoch over the rows of X (in order); returns the new state (input untouched)."""

def combine(a: ArrayLike, b: ArrayLike) -> _Floats:
    """Row-count-weighted model average of two partial states (the aggregate's combine)."""

def objective(state: ArrayLike) -> float:
    """Mean training loss of the last epoch plus (lambda/2)||w||^2."""

def step_size(state: ArrayLike, s: float) -> float:
    """Step size of update s (1-based) under the state's schedule."""

def example_gradient(state: ArrayLike, x: ArrayLike, y: float) -> tuple[float, _Floats]:
    """(loss, gradient) of one example at the state's model; gradient includes lambda*w."""

def predict(loss: str, flags: int, coef: ArrayLike, X: ArrayLike) -> _Floats:
    """Predictions for the rows of X with released coefficients coef (n_out x dim)."""

def loss_constants(
    loss: str,
    lambda_: float = 0.0,
    radius: float = 0.0,
    huber_h: float = 0.1,
    n_classes: int = 1,
) -> dict[str, float]:
    """Lipschitz (L), smoothness (beta) and strong convexity (gamma) of one example's loss."""

def shuffle_key(seed: int, position: int) -> int:
    """Sort key of row `position` under `seed` (the database's shuffle uses the same)."""

# -- Privacy: CSPRNG, samplers, calibrations, sensitivities, mechanisms -----------------------

SENSITIVITY_MAX_STEPS: Final[int]
SENSITIVITY_MAX_POSITIONS: Final[int]
CALIBRATIONS: Final[dict[str, int]]

def chacha20_block(key: Sequence[int], counter: int, nonce: Sequence[int]) -> list[int]:
    """The ChaCha20 block function (RFC 8439): 16 output words."""

def uniform(n: int, seed: int | None = None) -> _Floats:
    """n uniforms on the open interval (0, 1) with 53 random bits each."""

def normal(n: int, seed: int | None = None) -> _Floats:
    """n standard normals (Marsaglia polar method)."""

def rng_words(key: bytes, stream: int, n: int) -> list[int]:
    """The generator's first n 32-bit words for a raw 32-byte key (its keystream, in order)."""

def normal_fast(n: int, seed: int | None = None, chunk: int = 0) -> _Floats:
    """Standard normals from the ziggurat sampler used for per-step noise; chunk > 0: the bulk
    sampler, chunk normals at a time (the same draws)."""

def gamma(n: int, shape: float, scale: float = 1.0, seed: int | None = None) -> _Floats:
    """n Gamma(shape, scale) draws (Marsaglia-Tsang)."""

def directions(n: int, d: int, seed: int | None = None) -> _Floats:
    """n uniform directions on the unit sphere in R^d."""

def gaussian_delta(sigma: float, sensitivity: float, epsilon: float) -> float:
    """delta(epsilon) of the Gaussian mechanism (exact, Balle and Wang 2018)."""

def gaussian_sigma(
    sensitivity: float,
    epsilon: float,
    delta: float,
    calibration: str = "analytic",
) -> float:
    """Noise standard deviation for (epsilon, delta); 'classic' is eq. (4) (epsilon < 1)."""

def bolton_sensitivity(
    schedule: str,
    *,
    eta: float = 0.0,
    offset: float = 0.0,
    lipschitz: float,
    smoothness: float,
    strong_convexity: float = 0.0,
    rows: int,
    batch_size: int = 1,
    epochs: int = 1,
    fresh: bool = False,
    paper_minibatch: bool = False,
) -> float:
    """L2 sensitivity of the PSGD output by the closed forms the releases use."""

def exact_sensitivity(
    schedule: str,
    *,
    eta: float = 0.0,
    offset: float = 0.0,
    lipschitz: float,
    smoothness: float,
    strong_convexity: float = 0.0,
    rows: int,
    batch_size: int = 1,
    epochs: int = 1,
    fresh: bool = False,
) -> float:
    """The growth recursion of Wu et al. 2017, Lemma 4 (for checking the closed forms)."""

def output_perturbation(
    weights: ArrayLike,
    sensitivity: float,
    epsilon: float,
    delta: float = 0.0,
    *,
    seed: int | None = None,
    per_output: bool = False,
    calibration: str = "analytic",
) -> tuple[_Floats, float]:
    """(noisy copy of weights (n_out x dim), noise scale): the bolt-on release in memory."""

def exponential_mechanism(
    utility: ArrayLike, epsilon: float, sensitivity: float = 1.0, seed: int | None = None
) -> int:
    """Index drawn with probability proportional to exp(epsilon u / (2 sensitivity))."""

# -- Prediction-time preprocessing (prediction.h) ---------------------------------------------

def apply_bounds(X: ArrayLike, bounds: ArrayLike) -> _Floats:
    """Rows of X with each feature clipped to its public (lo, hi) and mapped onto [-1, 1]."""

def is_positive(loss: str, raw: ArrayLike) -> NDArray[np.int8]:
    """The binary decision rule on raw predictions: 1 positive, 0 negative, -1 undecided (NaN)."""

def preprocess(
    X: ArrayLike, bounds: ArrayLike | None, row_flags: int, centre: ArrayLike | None
) -> _Floats:
    """Rows of X as a model with preprocessing sees them: public bounds (or None), the row
    transform of row_flags, minus centre (or None); NaN rows for non-finite inputs."""

# -- DP-AMBSSGD / DP-SSGD, one pass over the rows (ambssgd.pxi) -------------------------------

AMBSSGD_HEADER_LEN: Final[int]
#: Field names of DpsqlAmbssgdHeader (ambssgd.h), in order.
AMBSSGD_HEADER_FIELDS: Final[tuple[str, ...]]

def ambssgd_init(
    dim: int,
    *,
    n_rows: int,
    blocks: int,
    batch: int,
    stat: int,
    alpha: float,
    eta: float,
    r_x: float = 0.0,
    log_factor: float = 0.0,
    domain: float = 0.0,
    levels: int = 0,
    sigma_c: float = 0.0,
    theta: float = 0.0,
    zeta_fixed: float = 0.0,
    intercept: bool = False,
    x_bound: float = 0.0,
    seed: int | None = None,
    keep_iterates: bool = False,
) -> _Floats:
    """A fresh DP-AMBSSGD pass state (w_0 = 0) for rows of `dim` features."""

def ambssgd_check(state: ArrayLike) -> None:
    """Validate a pass state; raise ValueError when malformed."""

def ambssgd_header(state: ArrayLike) -> dict[str, float]:
    """The state's header as a dict (field names as in ambssgd.h)."""

def ambssgd_run(state: ArrayLike, X: ArrayLike, y: ArrayLike) -> _Floats:
    """Feed the rows of X (n x dim) and y, in order; returns the new state (input untouched)."""

def ambssgd_result(state: ArrayLike) -> dict[str, Any]:
    """The pass's outcome as a dict: weights (None until every block is done), gammas, zetas,
    draws, rows_used, rows_unused, blocks_done, w_last, iterates (or None) and clipped."""

def ambssgd_clipped_gradient(
    state: ArrayLike, x: ArrayLike, y: float, zeta: float
) -> tuple[_Floats, bool]:
    """(g, clipped): one row's clipped gradient at the state's current w (NaN: zero record)."""

def ambssgd_level_counts(residuals: ArrayLike, domain: float, levels: int) -> _Ints:
    """True counts c_i = #{r <= domain 2^(i - levels)}, i = 0..levels (DP-STAT's queries)."""

def ambssgd_dp_stat(
    residuals: ArrayLike,
    *,
    domain: float,
    levels: int,
    sigma_c: float,
    theta: float,
    trials: int = 1,
    seed: int | None = None,
) -> tuple[_Floats, _Ints, _Ints]:
    """(gammas, level indices, draws) of `trials` independent DP-STAT runs on the residuals."""

# -- DP-GD for linear regression and its confidence intervals (dpgd.pxi) ----------------------

CONFINT_METHODS: Final[tuple[str, ...]]

def dpgd_gradient(
    X: ArrayLike,
    y: ArrayLike,
    theta: ArrayLike,
    gamma: float,
    intercept: bool = False,
    x_bound: float = 0.0,
) -> tuple[_Floats, int, int]:
    """(sum, n, clipped): the sum of the per-example gradients x_i (<x_i, theta> - y_i)
    clipped to norm gamma, the row count and the number of clipped gradients."""

def dpgd_step(
    theta: ArrayLike,
    grad_sum: ArrayLike,
    n: float,
    eta: float,
    noise_std: float,
    seed: int | None = None,
    stream: int = 0,
) -> _Floats:
    """theta - eta * grad_sum / n + eta * z, z ~ N(0, noise_std^2 I)."""

@overload
def dpgd_run(
    X: ArrayLike,
    y: ArrayLike,
    *,
    steps: int,
    eta: float,
    gamma: float,
    noise_std: float,
    intercept: bool = False,
    x_bound: float = 0.0,
    seed: int | None = None,
    theta0: ArrayLike | None = None,
    return_clipped: Literal[False] = False,
) -> _Floats: ...
@overload
def dpgd_run(
    X: ArrayLike,
    y: ArrayLike,
    *,
    steps: int,
    eta: float,
    gamma: float,
    noise_std: float,
    intercept: bool = False,
    x_bound: float = 0.0,
    seed: int | None = None,
    theta0: ArrayLike | None = None,
    return_clipped: Literal[True],
) -> tuple[_Floats, _Ints]: ...
@overload
def dpgd_run(
    X: ArrayLike,
    y: ArrayLike,
    *,
    steps: int,
    eta: float,
    gamma: float,
    noise_std: float,
    intercept: bool = False,
    x_bound: float = 0.0,
    seed: int | None = None,
    theta0: ArrayLike | None = None,
    return_clipped: bool,
) -> _Floats | tuple[_Floats, _Ints]:
    """A whole DP-GD run in memory: the iterates theta_1..theta_steps, shape (steps, p), and
    with return_clipped the clipped-gradient count of every step."""

def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with df >= 1 degrees of freedom."""

def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with df >= 1 degrees of freedom (relative error ~1e-13)."""

def confint_draws(
    iterates: ArrayLike,
    method: str,
    draws: int,
    burn_in: int,
) -> _Floats:
    """The m = draws estimates (draws, p) of a confidence-interval method (Brown et al. 2024,
    §3.1), one of CONFINT_METHODS."""

def t_interval(draws: ArrayLike, alpha: float) -> tuple[_Floats, _Floats, _Floats]:
    """(estimate, lower, upper), each (p,): mean -/+ t_{m-1,1-alpha/2} sd / sqrt(m), ddof = 1."""

# -- AdaSSP and its dense linear algebra (adassp.pxi) -----------------------------------------

class SingularSystemError(ValueError):
    """A linear system singular to working precision (the AdaSSP release releases nothing)."""

def sym_eigvalsh(A: ArrayLike) -> _Floats:
    """Eigenvalues of the symmetric matrix A in ascending order (its upper triangle is read)."""

def solve(A: ArrayLike, b: ArrayLike) -> _Floats:
    """x with A x = b (LU with partial pivoting); SingularSystemError if A is singular."""

def adassp_gram(
    X: ArrayLike, y: ArrayLike, x_bound: float, y_bound: float, intercept: bool = False
) -> _Floats:
    """The gram [n, p, X^T X (p*p, row-major), X^T y (p)] of clipped rows, as the aggregate
    dpsql.adassp_gram computes it."""

def adassp_sensitivities(x_bound: float, y_bound: float) -> tuple[float, float, float]:
    """(lambda_min, X^T X Frobenius, X^T y): replace-one sensitivities for ||x|| <= x_bound and
    |y| <= y_bound."""

def adassp_release(
    gram: ArrayLike,
    sigma_min: float,
    sigma_xx: float,
    sigma_xy: float,
    min_shift: float,
    ridge_factor: float,
    seed: int | None = None,
) -> tuple[_Floats, float, float]:
    """(weights, ridge, lambda_tilde): the AdaSSP release of a gram (adassp.h)."""

# Private Frank-Wolfe over the L1 ball (frank_wolfe.h; cython_ext/frank_wolfe.pxi).
def fw_l1_bound(model: str, r_inf: float, s: float, y_bound: float = 0.0) -> float: ...
def fw_eps_step(epsilon: float, delta: float, rho: float, steps: int) -> float: ...
def fw_default_steps(
    model: str, n: float, epsilon: float, s: float, r_inf: float, l1: float
) -> int: ...
def fw_probabilities(grad: ArrayLike, s: float, eps_step: float, delta_u: float) -> _Floats: ...
def fw_select(
    grad: ArrayLike,
    s: float,
    eps_step: float,
    delta_u: float,
    seed: int | None = None,
    stream: int = 0,
) -> int: ...
def fw_gradient(
    X: ArrayLike,
    y: ArrayLike,
    theta: ArrayLike,
    x_bound: float,
    intercept: bool = False,
    l1_clamp: float = 1.0,
) -> _Floats: ...
def fw_lasso(
    gram: ArrayLike,
    s: float,
    steps: int,
    eps_step: float,
    delta_u: float,
    seed: int | None = None,
    return_iterates: bool = False,
) -> Any: ...

# Exponential-mechanism ERM on a public grid (exp_mech_erm.h; cython_ext/exp_mech_erm.pxi).
def em_grid(p: int, radius: float, max_points: int = 4096) -> _Floats: ...
def em_lipschitz(model: str, r_x: float, radius: float, y_bound: float = 0.0) -> float: ...
def em_losses(
    model: str,
    X: ArrayLike,
    y: ArrayLike,
    x_bound: float,
    radius: float,
    intercept: bool = False,
    y_bound: float = 0.0,
    huber_h: float = 0.1,
    max_points: int = 4096,
) -> tuple[_Floats, _Floats, float]: ...
def em_probabilities(losses: ArrayLike, epsilon: float, delta_u: float) -> _Floats: ...
def em_sample(
    losses: ArrayLike,
    epsilon: float,
    delta_u: float,
    seed: int | None = None,
    stream: int = 0,
) -> int: ...

# -- DP-FTRL with tree aggregation (ftrl.pxi) --------------------------------------------------

FTRL_LOSSES: Final[dict[str, int]]

def tree_levels(n: int) -> int: ...
def ftrl_sigma(clip: float, levels: int, epochs: int, epsilon: float, delta: float) -> float: ...
def tree_prefix_sums(
    leaves: ArrayLike,
    sigma: float,
    seed: int | None = None,
    n_leaves: int | None = None,
    stream: int = 1,
) -> tuple[_Floats, _Ints]: ...
def ftrl_leaf_sum(
    X: ArrayLike,
    y: ArrayLike,
    theta: ArrayLike,
    model: str = "logistic",
    clip: float = 1.0,
    x_bound: float = 1.0,
    y_bound: float = 1.0,
    intercept: bool = False,
    huber_h: float = 0.1,
) -> tuple[_Floats, _Floats]: ...
def ftrl_run(
    X: ArrayLike,
    y: ArrayLike,
    model: str = "logistic",
    clip: float = 1.0,
    batch: int = 1,
    epochs: int = 1,
    sigma: float = 0.0,
    reg: float = 1.0,
    radius: float = 10.0,
    x_bound: float = 1.0,
    y_bound: float = 1.0,
    intercept: bool = False,
    huber_h: float = 0.1,
    seed: int | None = None,
) -> tuple[_Floats, _Floats, _Floats]: ...

# -- The fixed-work Newton solver of objective/output perturbation (erm_solver.pxi) ------------
def glm_solve(
    X: ArrayLike,
    y: ArrayLike,
    loss: int,
    param: float,
    y_bound: float,
    x_bound: float,
    intercept: bool,
    reg: float,
    b: ArrayLike | None,
    tolerance: float,
    steps: int,
) -> tuple[_Floats, float, int]: ...
