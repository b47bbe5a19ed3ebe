"""Rows of a table as a registered dataset's features, encoded as the server encodes them
(docs/registration.md): numbers as they are, booleans as 0/1, each categorical column one-hot
over its public categories, a value not among them (or missing) as all zeros. The server's
``dpsql_internal._feature_sql`` and ``_encode_row`` are the reference; a test holds the two
equal. The estimators' ``fit(X, y)`` encodes its rows with the same functions (by column name,
or by position for arrays), so that an estimator and its ``model_`` predict alike."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["categorical_bounds", "encode_columns", "encode_rows", "has_columns"]


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


def _numbers(values: np.ndarray, name: str | int) -> np.ndarray:
    """A numeric column as float64: booleans 0/1, None and NaN as NaN (the server drops such
    rows in training and predicts NULL). Text is refused naming its column: it is encoded only
    over public categories, which must be declared (never read from the rows)."""
    if values.dtype.kind in "biuf":
        return values.astype(np.float64)
    out = np.empty(len(values))
    for i, v in enumerate(values):
        if v is None:
            out[i] = np.nan
            continue
        try:
            out[i] = float(v)  # a dict or a list: float()'s own TypeError
        except ValueError:
            raise ValueError(
                f"dpsql: column {name!r} holds text ({v!r}): a text column is encoded one-hot "
                f"over its public values; give the estimator categories={{{name!r}: [...]}} "
                "(register_dataset's meaning: a value not listed becomes all zeros)"
            ) from None
    return out


def encode_rows(
    rows: np.ndarray, names: Sequence[str | int], categories: Mapping[int, Sequence[Any]]
) -> np.ndarray:
    """The (n, d') feature matrix of a 2-D array of rows (numbers, or objects with text):
    column ``j`` one-hot over ``categories[j]`` when given, else a number. ``names`` name the
    columns in errors (a DataFrame's names, or the positions)."""
    blocks = [
        _one_hot(rows[:, j], categories[j])
        if j in categories
        else _numbers(rows[:, j], name)[:, None]
        for j, name in enumerate(names)
    ]
    return np.hstack(blocks) if blocks else np.empty((len(rows), 0))


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
            blocks.append(_numbers(values, name)[:, None])
    return np.hstack(blocks) if blocks else np.empty((0, 0))


def categorical_bounds(
    bounds: Sequence[Sequence[float]], columns: int, categories: Mapping[int, Sequence[Any]]
) -> list[list[float]]:
    """Feature bounds of the encoded columns, as ``dpsql_internal._categorical_bounds``
    completes a registration's: bounds given for the non-categorical columns only get (-1, 1)
    for each one-hot coordinate (the identity on [-1, 1]: a 0/1 coordinate is kept as is);
    bounds of another length are returned as given (the server checks their number)."""
    given = [list(map(float, b)) for b in bounds]
    if not categories or len(given) != columns - len(categories):
        return given
    numeric = iter(given)
    out: list[list[float]] = []
    for j in range(columns):
        out.extend([[-1.0, 1.0]] * len(categories[j]) if j in categories else [next(numeric)])
    return out
