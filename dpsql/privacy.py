"""Privacy mechanisms as Python objects, passed to ``Database.train(privacy=...)``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = [
    "BST14",
    "DPAMBSSGD",
    "DPGD",
    "DPSGD",
    "DPSGDF",
    "DPSGDFAlg2",
    "DPSSGD",
    "SCS13",
    "AdaSSP",
    "Auto",
    "BoltOn",
    "ObjectivePerturbation",
    "OutputPerturbation",
    "ExponentialMechanism",
    "FrankWolfe",
    "DPFTRL",
    "MECHANISMS",
    "mechanism_class",
]


@dataclass(frozen=True)
class BoltOn:
    """Bolt-on output perturbation (Wu et al., SIGMOD 2017), released by the server.

    Parameters
    ----------
    epsilon : float
        Privacy parameter, > 0.
    delta : float, default 0
        0 gives epsilon-DP (noise with a Gamma(d, sensitivity/epsilon) norm in a uniform
        direction); > 0 gives (epsilon, delta)-DP with Gaussian noise.
    gaussian : {"analytic", "classic"}, default "analytic"
        Gaussian calibration: the exact analytic Gaussian mechanism (any epsilon), or the
        paper's eq. (4) (epsilon < 1 per model).
    permutation : {"once", "fresh"}, default "once"
        Shuffle once, or draw a new data-independent permutation for every epoch.
    noise_seed : int, optional
        Seeds the noise (tests and reproductions only): the release is recorded as NOT private.
        By default the server draws the noise from a CSPRNG keyed by pg_strong_random.

    The algorithm follows from the model: lambda = 0 runs Algorithm 1 (convex, constant
    step <= 2/beta); lambda > 0 runs Algorithm 2 (strongly convex, step min(1/beta, 1/(lambda t)),
    projection onto ||w|| <= 1/lambda). Neighbouring datasets are replace-one, m is public.
    """

    epsilon: float
    delta: float = 0.0
    gaussian: str = "analytic"
    permutation: str = "once"
    noise_seed: int | None = None

    name = "bolton"

    def sql_args(self) -> dict[str, Any]:
        """Named arguments of ``dpsql.train`` for this mechanism."""
        return {
            "privacy": self.name,
            "epsilon": float(self.epsilon),
            "delta": float(self.delta),
            "gaussian": self.gaussian,
            "permutation": self.permutation,
            "noise_seed": self.noise_seed,
        }


@dataclass(frozen=True)
class DPSGD:
    """DP-SGD: per-example clipping to ``clip_norm`` and Gaussian noise in every step.

    Give ``epsilon`` (the noise multiplier is calibrated by dp-accounting) or
    ``noise_multiplier`` (epsilon is computed and charged). ``sampling="shuffle"``: disjoint
    batches, each record once per epoch, accounted without amplification; ``"poisson"``: each
    record joins each step with probability batch_size/m, accounted with amplification (PLD,
    replace-one). The accountant's report (PLD and RDP) is in the model's provenance.
    """

    epsilon: float | None = None
    delta: float = 1e-6
    clip_norm: float | None = None  # the server's default (docs/defaults.md)
    sampling: str = "shuffle"
    noise_multiplier: float | None = None
    noise_seed: int | None = None

    name = "dpsgd"

    def sql_args(self) -> dict[str, Any]:
        return {
            "privacy": self.name,
            "epsilon": None if self.epsilon is None else float(self.epsilon),
            "delta": float(self.delta),
            "clip_norm": None if self.clip_norm is None else float(self.clip_norm),
            "sampling": self.sampling,
            "noise_multiplier": self.noise_multiplier,
            "noise_seed": self.noise_seed,
        }


@dataclass(frozen=True)
class DPSGDF:
    """DPSGD-F* (spec 001 section 4): a private mean of the rows, the rows centred on it, then
    DP-SGD with Poisson sampling, clipping ``clip_norm`` and a bias. The mean's Gaussian and
    the steps are composed by the PLD accountant to (epsilon, delta); the mean is released
    with the model and folded into its intercept (``coef_`` and ``intercept_`` score the rows
    after the row transform). ``batch_size`` below 2 means 50."""

    epsilon: float
    delta: float = 1e-6
    clip_norm: float | None = None  # the server's default (docs/defaults.md)
    noise_seed: int | None = None

    name = "dpsgd_f"

    def sql_args(self) -> dict[str, Any]:
        return {
            "privacy": self.name,
            "epsilon": float(self.epsilon),
            "delta": float(self.delta),
            "clip_norm": None if self.clip_norm is None else float(self.clip_norm),
            "sampling": "poisson",
            "noise_seed": self.noise_seed,
        }


@dataclass(frozen=True)
class DPSGDFAlg2:
    """DPSGD-F, the theoretical version (spec 001 section 3, Algorithm 2): a diameter-adaptive
    private mean, a private quantile tau of the distances to it, DP-SGD on the features
    ``(x - mean, tau)`` clipped to sqrt(2) tau (no gradient is clipped), then the map back to
    ``(w, b)``. Mean, tau and DP-SGD get (epsilon/3, delta/3) each (basic composition).
    ``train(step_size=...)`` is eta_0: the step is eta_0 / tau^2. Logistic and multinomial
    only; the released model has an intercept (leave ``intercept`` false)."""

    epsilon: float
    delta: float = 1e-6
    noise_seed: int | None = None

    name = "dpsgd_f_alg2"

    def sql_args(self) -> dict[str, Any]:
        return {
            "privacy": self.name,
            "epsilon": float(self.epsilon),
            "delta": float(self.delta),
            "noise_seed": self.noise_seed,
        }


@dataclass(frozen=True)
class SCS13:
    """SCS13 as the bolt-on paper ran it: noise per mini-batch, epsilon/k per pass, 1/sqrt(t)."""

    epsilon: float
    delta: float = 0.0
    gaussian: str = "analytic"
    noise_seed: int | None = None

    name = "scs13"

    def sql_args(self) -> dict[str, Any]:
        return {
            "privacy": self.name,
            "epsilon": float(self.epsilon),
            "delta": float(self.delta),
            "gaussian": self.gaussian,
            "noise_seed": self.noise_seed,
        }


@dataclass(frozen=True)
class BST14:
    """BST14 with a constant number of epochs (bolt-on paper, Algorithms 4 and 5): sampling
    with replacement, Gaussian noise per step; ``noise="strict"`` (replace-one) or ``"paper"``."""

    epsilon: float
    delta: float
    noise: str = "strict"
    noise_seed: int | None = None

    name = "bst14"

    def sql_args(self) -> dict[str, Any]:
        return {
            "privacy": self.name,
            "epsilon": float(self.epsilon),
            "delta": float(self.delta),
            "bst14_noise": self.noise,
            "noise_seed": self.noise_seed,
        }


# ---------------------------------------------------------------------------------------------
# DP linear regression (model="linear", a dataset registered with label_bound); docs/linear.md.
# All four are (epsilon, delta)-DP with delta > 0, calibrated in zCDP.


@dataclass(frozen=True)
class _PlannedMechanism:
    """A plan-and-fit mechanism of the server (sql/install/33_planned.sql): epsilon, delta, the
    public knobs as ``options`` (each mechanism's page lists them) and the data owners' test
    noise seed. Subclasses name the mechanism and may change the default delta."""

    epsilon: float
    delta: float = 1e-6
    options: dict[str, Any] | None = None
    noise_seed: int | None = None

    name: ClassVar[str] = ""

    def sql_args(self) -> dict[str, Any]:
        """Named arguments of ``dpsql.train`` for this mechanism."""
        return _linear_args(
            self.name, self.epsilon, self.delta, self.noise_seed, options=self.options
        )


@dataclass(frozen=True)
class DPAMBSSGD:
    """DP-AMBSSGD (Varshney, Thakurta and Jain 2022): one pass over a shuffled table in disjoint
    blocks; each block privately estimates its residual scale (DP-STAT) on a stat sample, clips
    the gradients of its batch adaptively, and takes one noisy step; the model is the average of
    the last half of the iterates. One aggregate scan in the server.

    ``steps`` is the number of blocks T (default 2 ceil(8 kappa ln N / 2)); ``options`` takes
    the public constants of spec 000: ``r_x``, ``h_norm``, ``condition_number``, ``c1``,
    ``step_scale``, ``domain_bound``, ``beta_stat``, ``tight_accounting``, ``log_exponent``.
    """

    epsilon: float
    delta: float = 1e-6
    steps: int | None = None
    options: dict[str, Any] | None = None
    noise_seed: int | None = None

    name = "dp_ambssgd"

    def sql_args(self) -> dict[str, Any]:
        return _linear_args(
            self.name,
            self.epsilon,
            self.delta,
            self.noise_seed,
            steps=self.steps,
            options=self.options,
        )


@dataclass(frozen=True)
class DPSSGD:
    """DP-SSGD (Varshney et al. 2022, Algorithm 1), the baseline: one pass with batch size 1, a
    fixed clip norm and tail averaging; accounted without amplification by shuffling."""

    epsilon: float
    delta: float = 1e-6
    clip_norm: float | None = None
    options: dict[str, Any] | None = None
    noise_seed: int | None = None

    name = "dp_ssgd"

    def sql_args(self) -> dict[str, Any]:
        return _linear_args(
            self.name,
            self.epsilon,
            self.delta,
            self.noise_seed,
            clip_norm=self.clip_norm,
            options=self.options,
        )


@dataclass(frozen=True)
class DPGD:
    """Full-batch DP gradient descent (Brown et al. 2024) with confidence intervals.

    One aggregate scan per step; every iterate is released, so ``Model.confint`` is
    post-processing. ``ci`` is ``"batch_means"`` (default), ``"checkpoints"``,
    ``"independent_runs"`` or ``"none"`` (then 20 steps and the final iterate); ``steps`` counts
    every step (default ``burn_in + 40 ci_draws``, ``burn_in + 120 ci_draws`` preconditioned).
    Defaults follow spec 002: step 1/5, theta_0 = 0; the clip norm is a private quantile of the
    gradient norms chosen within the burn-in (default 40; 20 with a fixed ``clip_norm`` or
    ``options={"clip_quantile": False}``, which use 5 sqrt(p) max(noise_level, 1)).
    """

    epsilon: float
    delta: float = 1e-6
    steps: int | None = None
    ci: str = "batch_means"
    ci_draws: int = 10
    burn_in: int | None = None
    clip_norm: float | None = None
    step_size: float | None = None
    options: dict[str, Any] | None = None
    noise_seed: int | None = None

    name = "dpgd"

    def sql_args(self) -> dict[str, Any]:
        return _linear_args(
            self.name,
            self.epsilon,
            self.delta,
            self.noise_seed,
            steps=self.steps,
            ci=self.ci,
            ci_draws=self.ci_draws,
            burn_in=self.burn_in,
            clip_norm=self.clip_norm,
            step_size=self.step_size,
            options=self.options,
        )


@dataclass(frozen=True)
class AdaSSP(_PlannedMechanism):
    """AdaSSP (Wang 2018): noisy X^T X, X^T y and smallest eigenvalue with an adaptive ridge,
    from one aggregate scan; needs the dataset's public bounds on ||x|| and |y|."""

    name = "adassp"


@dataclass(frozen=True)
class Auto:
    """The server chooses the mechanism and its hyperparameters from public quantities only
    (the registration, the model, epsilon and delta): nothing is spent on the choice, and the
    model's record says what was chosen and why (docs/auto.md). Leave the other training
    arguments at their defaults: auto refuses to override what you set."""

    epsilon: float
    delta: float = 1e-6
    noise_seed: int | None = None

    name = "auto"

    def sql_args(self) -> dict[str, Any]:
        return {
            "privacy": self.name,
            "epsilon": float(self.epsilon),
            "delta": float(self.delta),
            "noise_seed": self.noise_seed,
        }


@dataclass(frozen=True)
class ObjectivePerturbation(_PlannedMechanism):
    """Objective perturbation (Chaudhuri et al. 2011; spec 004 A2): the server draws a secret
    linear term b and releases the exact minimiser of the regularised SUM loss plus <b, theta>,
    found by Newton's method and certified (||grad|| <= tolerance, covered by extra noise from
    1% of the budget). ``delta=0`` gives epsilon-DP (Gamma-norm b); ``delta>0`` the Gaussian
    GLM variant. Models: logistic, huber (one-vs-rest for 3+ classes), linear (Huber regression,
    threshold the label bound). ``options``: radius (public bound on ||theta*||, default 10),
    huber_threshold, max_scans (default 100; data owners only). The scan count and whether
    the solve certified depend on the rows: neither is released, and an uncertified last
    iterate is released like a certified one (docs/objective_perturbation.md)."""

    delta: float = 0.0

    name = "objective_perturbation"


@dataclass(frozen=True)
class OutputPerturbation(_PlannedMechanism):
    """Output perturbation of the exact regularised minimiser (spec 004 A10): Newton's method
    to a certified minimiser, then noise for the replace-one sensitivity 2 (L + tolerance) /
    (n lambda) — the bolt-on's strongly convex sensitivity for the exact minimiser. Give
    ``lambda_`` to ``Database.train``, or let the server choose the regulariser from
    public numbers (docs/objective_perturbation.md)."""

    delta: float = 0.0

    name = "output_perturbation"


@dataclass(frozen=True)
class DPFTRL(_PlannedMechanism):
    """DP-FTRL with tree aggregation (Kairouz et al. 2021; spec 004 A4/A5): one ordered scan
    per epoch over minibatch leaves of the shuffled rows, noisy prefix sums of clipped
    gradients, no sampling. Classifiers (one-vs-rest for 3+ classes) and linear regression;
    Gaussian noise, so delta > 0. Options: radius, regularizer, output ("average" or
    "last")."""

    name = "dp_ftrl"


def _linear_args(
    name: str, epsilon: float, delta: float, noise_seed: int | None, **extra: Any
) -> dict[str, Any]:
    from psycopg.types.json import Jsonb

    args: dict[str, Any] = {
        "privacy": name,
        "epsilon": float(epsilon),
        "delta": float(delta),
        "noise_seed": noise_seed,
    }
    for key, value in extra.items():
        if key == "options":
            args[key] = None if value is None else Jsonb(value)
        elif key == "step_size" and value is None:
            continue  # keep Database.train's own step_size
        else:
            args[key] = value
    return args


@dataclass(frozen=True)
class FrankWolfe(_PlannedMechanism):
    """Private Frank-Wolfe over an L1 ball (spec 004 A7/A8): sparse LASSO (``model="lasso"``,
    one scan of sufficient statistics) or binary logistic regression, each step's vertex drawn
    by the exponential mechanism. Options: ``l1_radius`` (default 1), ``steps`` (default from
    Thm 6.22). delta = 0 gives pure epsilon-DP (docs/frank_wolfe.md)."""

    name = "frank_wolfe"


@dataclass(frozen=True)
class ExponentialMechanism(_PlannedMechanism):
    """Exponential-mechanism ERM on a public grid in an L2 ball (spec 004 A1): pure
    epsilon-DP, at most 5 coefficients. Options: ``radius`` (default 1), ``grid_points``
    (default 4096) (docs/exponential_mechanism.md)."""

    delta: float = 0.0

    name = "exponential_mechanism"


# The Python side of the server's mechanism registry (sql/install/31_mechanisms.sql, listed by
# ``SELECT * FROM dpsql.mechanisms()``): tests/server/test_mechanisms.py checks that both name the
# same mechanisms. ``auto`` is a chooser, not a registered mechanism.
MECHANISMS: dict[str, type] = {
    cls.name: cls
    for cls in (
        BoltOn,
        DPSGD,
        DPSGDF,
        DPSGDFAlg2,
        SCS13,
        BST14,
        DPAMBSSGD,
        DPSSGD,
        DPGD,
        AdaSSP,
        ObjectivePerturbation,
        OutputPerturbation,
        FrankWolfe,
        ExponentialMechanism,
        DPFTRL,
    )
}


def mechanism_class(name: str) -> type:
    """The class of a server mechanism name, or of ``"auto"``; ValueError names the choices."""
    classes: dict[str, type] = {**MECHANISMS, Auto.name: Auto}
    if name not in classes:
        raise ValueError(f"dpsql: no mechanism {name!r}; one of {', '.join(sorted(classes))}")
    return classes[name]
