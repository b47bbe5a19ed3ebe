"""Privacy mechanisms as Python objects, passed to ``Database.train(privacy=...)``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["BST14", "BoltOn", "DPSGD", "SCS13"]


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
    clip_norm: float = 1.0
    sampling: str = "shuffle"
    noise_multiplier: float | None = None
    noise_seed: int | None = None

    name = "dpsgd"

    def sql_args(self) -> dict[str, Any]:
        return {
            "privacy": self.name,
            "epsilon": None if self.epsilon is None else float(self.epsilon),
            "delta": float(self.delta),
            "clip_norm": float(self.clip_norm),
            "sampling": self.sampling,
            "noise_multiplier": self.noise_multiplier,
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
