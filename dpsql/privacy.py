"""Privacy mechanisms as Python objects, passed to ``Database.train(privacy=...)``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["BoltOn"]


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
