"""Rows of a table as a registered dataset's features, encoded as the server encodes them
(docs/registration.md): numbers as they are, booleans as 0/1, each categorical column one-hot
over its public categories, a value not among them (or missing) as all zeros. The server's
``dpsql_internal._feature_sql`` and ``_encode_row`` are the reference; a test holds the two
equal."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["encode_columns", "has_columns"]


def has_columns(X: Any) -> bool:
    """Whether X names its columns (a pandas DataFrame, or a mapping of column to values)."""
    return isinstance(X, Mapping) or hasattr(X, "columns")


def _column(X: Any, name: str) -> np.ndarray:
    if name not in (X.keys() if isinstance(X, Mapping) else X.columns):
        raise ValueError(f"dpsql: the rows have no column {name!r}, a feature of the model")
    return np.asarray(X[name], dtype=object).reshape(-1)


def _one_hot(values: np.ndarray, categories: Sequence[Any]) -> np.ndarray:
    position = {str(c): i for i, c in enumerate(categories)}
    out = np.zeros((len(values), len(categories)))
    for row, value in enumerate(values):
        # the server compares the column's text form: an integer code 3 is "3"
        key = None if value is None or value != value else _text(value)
        if key in position:
            out[row, position[key]] = 1.0
    return out


def _text(value: Any) -> str:
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    return str(value)


def encode_columns(
    X: Any, features: Sequence[str], categories: Mapping[str, Sequence[Any]] | None
) -> np.ndarray:
    """The (n, d) feature matrix of rows with named columns, in the registered order."""
    categories = categories or {}
    blocks: list[np.ndarray] = []
    for name in features:
        values = _column(X, name)
        if name in categories:
            blocks.append(_one_hot(values, categories[name]))
        else:
            # booleans become 0/1; None and NaN stay NaN (the server drops such rows in
            # training and predicts NULL: here NaN)
            numbers = np.array(
                [np.nan if v is None else float(v) for v in values], dtype=np.float64
            )
            blocks.append(numbers[:, None])
    return np.hstack(blocks) if blocks else np.empty((0, 0))
