"""Privacy mechanisms as Python objects, passed to ``Database.train(privacy=...)``.

The server's mechanisms are generated from their specs (``sql/mechanisms/*.toml``) into
``dpsql._mechanisms``; ``Auto`` asks the server to choose one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dpsql import _mechanisms
from dpsql._mechanisms import *  # noqa: F403 (every spec's class: _mechanisms.__all__)
from dpsql._mechanisms import MECHANISMS

__all__ = ["Auto", "MECHANISMS", "mechanism_class"]
__all__ += _mechanisms.__all__


@dataclass(frozen=True)
class Auto:
    """The server chooses the mechanism and its hyperparameters from public quantities only
    (the registration, the model, epsilon and delta): nothing is spent on the choice, and the
    model's record says what was chosen and why (docs/auto.md). Leave the other training
    arguments at their defaults: auto refuses to override what you set."""

    epsilon: float
    delta: float | None = None  # the server's: 1e-6 if the dataset's delta budget allows, else 0
    noise_seed: int | None = None

    name = "auto"

    def sql_args(self) -> dict[str, Any]:
        args = {"privacy": self.name, "epsilon": self.epsilon}
        args.update(
            {
                k: v
                for k, v in (("delta", self.delta), ("noise_seed", self.noise_seed))
                if v is not None
            }
        )
        return args


def mechanism_class(name: str) -> type:
    """The class of a server mechanism name, or of ``"auto"``; ValueError names the choices."""
    classes: dict[str, type] = {**MECHANISMS, Auto.name: Auto}
    if name not in classes:
        raise ValueError(f"dpsql: no mechanism {name!r}; one of {', '.join(sorted(classes))}")
    return classes[name]
