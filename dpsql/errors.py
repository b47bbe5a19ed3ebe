"""Exceptions of dpsql's Python API: one class per SQLSTATE that dpsql's server code raises.

The server reports every refusal with a ``dpsql:`` message, a SQLSTATE and often a hint
(``dpsql_internal._fail`` in sql/install/05_errors.sql; 22023 unless a call names another
code). The Python API (:class:`dpsql.Database`, :class:`dpsql.Model`) turns the psycopg
exception of each SQLSTATE below into the class of that SQLSTATE, at one place:
:func:`translate`, a decorator on the API's methods. Other SQLSTATEs (a lost connection, a
cancelled query, ...) keep psycopg's class.

Why subclasses of psycopg's exceptions rather than a separate hierarchy: code that caught
``psycopg.Error`` (or ``psycopg.errors.InsufficientPrivilege``, the class psycopg gives 42501)
around a dpsql call keeps working, and so do ``err.sqlstate`` and ``err.diag`` (the server's
message, detail and hint). Each class is ``(DpsqlError, <psycopg's class of its SQLSTATE>)``;
defining one does not register it with psycopg (``psycopg.errors.lookup`` is unchanged), so
plain psycopg code in the same process sees psycopg's own classes. The original exception is
the new one's ``__cause__``.

SQLSTATE 42704 (undefined_object) is every "does not exist" of dpsql (a dataset, a model, a
role). The API method knows what it named, so it picks :class:`NotRegistered` or
:class:`NoSuchModel`; a method that names several kinds of objects (``grant_dataset``: a
dataset and a role) raises their base class :class:`NotFound`.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar

import psycopg
import psycopg.errors as pg

__all__ = [
    "AccountantFailed",
    "AlreadyRegistered",
    "AmbiguousDataset",
    "BudgetExceeded",
    "DpsqlError",
    "InvalidData",
    "InvalidParameter",
    "LimitExceeded",
    "NoSuchColumn",
    "NoSuchModel",
    "NoSuchRelation",
    "NotFound",
    "NotReady",
    "NothingReleased",
    "NotRegistered",
    "PermissionDenied",
    "RowsChanged",
    "UnsuitableRelation",
    "WrongType",
    "class_for_sqlstate",
    "translate",
    "translated",
]


class DpsqlError(psycopg.Error):
    """Base class of the errors dpsql's Python API raises for the server's refusals.

    ``str(err)`` is the server's message (``dpsql: ...``); ``err.sqlstate`` its code;
    ``err.diag.message_hint`` and ``err.diag.message_detail`` its hint and detail.
    """


class BudgetExceeded(DpsqlError, psycopg.DatabaseError):
    """DP001: the release would spend more than the dataset's remaining (epsilon, delta)
    budget; nothing was released or charged."""

    sqlstate = "DP001"


class RowsChanged(DpsqlError, psycopg.DatabaseError):
    """DP003: the dataset's row count changed between the release's public count and its read
    (a data owner wrote rows meanwhile): nothing was released, and the charge stands. Not a
    transient error to retry automatically (as a serialization failure would be): every call
    is a new release with its own charge."""

    sqlstate = "DP003"


class PermissionDenied(DpsqlError, pg.InsufficientPrivilege):
    """42501: the role may not do this: the action is for data owners (``dpsql_admin``), or
    the option is for data owners' tests (``noise_seed``)."""


class InvalidParameter(DpsqlError, pg.InvalidParameterValue):
    """22023: an argument was refused (out of range, inconsistent with the dataset's
    registration or the mechanism); the hint usually says what is accepted."""


class NotFound(DpsqlError, pg.UndefinedObject):
    """42704: something the call names does not exist (a dataset, a model, a role)."""


class NotRegistered(NotFound):
    """42704 for a dataset: the source is not a registered dataset (private training and the
    private estimates need ``register_dataset`` by a data owner), or no dataset has that id.
    To an analyst a dataset not granted to them is the same: its name is not disclosed."""


class NoSuchModel(NotFound, LookupError):
    """42704 for a model: no stored model has that id (also a ``LookupError``)."""


class NotReady(DpsqlError, pg.ObjectNotInPrerequisiteState):
    """55000: a prerequisite is missing, e.g. a regression dataset whose label bound has not
    been set (``estimate_label_bound``) yet."""


class InvalidData(DpsqlError, pg.DataException):
    """22000: the data cannot be used as it is, e.g. the source or the dataset has no rows."""


class NoSuchRelation(DpsqlError, pg.UndefinedTable):
    """42P01: the table or view does not exist (or a dataset's relation was dropped)."""


class NoSuchColumn(DpsqlError, pg.UndefinedColumn):
    """42703: a feature or label column does not exist (or no longer does)."""


class WrongType(DpsqlError, pg.DatatypeMismatch):
    """42804: a column has the wrong type (features: numeric columns or one numeric array;
    the label: a number)."""


class UnsuitableRelation(DpsqlError, pg.WrongObjectType):
    """42809: the relation cannot be a dataset (not a table or view, temporary, a system
    relation)."""


class AlreadyRegistered(DpsqlError, pg.DuplicateObject):
    """42710: the relation, or a dataset of that name, is already registered."""


class AmbiguousDataset(DpsqlError, pg.AmbiguousAlias):
    """42P09: the source names several registered datasets; name one."""


class AccountantFailed(DpsqlError, pg.ExternalRoutineException):
    """38000: the server's privacy accountant (``python -m dpsql.accounting``) failed; the
    detail holds its output."""


class LimitExceeded(DpsqlError, pg.ProgramLimitExceeded):
    """54000: a run exceeds a limit of the core (steps per epoch, the sensitivity recursion's
    steps), or diverged."""


class NotSupported(DpsqlError, pg.FeatureNotSupported):
    """0A000: what dpsql does not do there, e.g. a sequential mechanism on a Citus distributed
    dataset, or SGD epochs on one without ``shard_parallel`` (docs/citus.md)."""


class NothingReleased(DpsqlError):
    """No SQLSTATE: ``dpsql.train`` returned no model. A mechanism whose proof needs an exact
    minimiser (objective and output perturbation) releases nothing when its solver cannot
    certify one; the call's budget stays spent (whether it converged depends on the data).
    Raised by the Python API itself, after the server's warning."""


_CLASSES: dict[str, type[DpsqlError]] = {
    cls.sqlstate: cls
    for cls in (
        BudgetExceeded,
        RowsChanged,
        PermissionDenied,
        InvalidParameter,
        NotFound,
        NotReady,
        InvalidData,
        NoSuchRelation,
        NoSuchColumn,
        WrongType,
        UnsuitableRelation,
        AlreadyRegistered,
        AmbiguousDataset,
        AccountantFailed,
        LimitExceeded,
        NotSupported,
    )
    if cls.sqlstate is not None
}


def class_for_sqlstate(sqlstate: str | None) -> type[DpsqlError] | None:
    """The dpsql class of a SQLSTATE, or None when dpsql has none (psycopg's class stands)."""
    return None if sqlstate is None else _CLASSES.get(sqlstate)


def _convert(exc: psycopg.Error, cls: type[DpsqlError]) -> DpsqlError:
    new = cls(*exc.args)
    # An error's state is its __dict__ (psycopg pickles it so): the server's result, read by
    # .diag and .pgresult, its encoding and, for codes psycopg has no class for, .sqlstate.
    new.__dict__.update(exc.__dict__)
    return new


@contextlib.contextmanager
def translated(*, not_found: type[NotFound] = NotFound) -> Iterator[None]:
    """Raise the psycopg errors of the block as their dpsql class (``from`` the original).

    ``not_found`` is the class for 42704: what the block's call names (see the module doc).
    Errors that are already dpsql's pass unchanged, so translated blocks may nest.
    """
    try:
        yield
    except DpsqlError:
        raise
    except psycopg.Error as exc:
        cls = class_for_sqlstate(exc.sqlstate)
        if cls is None:
            raise
        if cls is NotFound:
            cls = not_found
        raise _convert(exc, cls) from exc


_P = ParamSpec("_P")
_R = TypeVar("_R")


def translate(
    *, not_found: type[NotFound] = NotFound
) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Decorator: the method raises dpsql's classes (:func:`translated` around its body)."""

    def decorate(method: Callable[_P, _R]) -> Callable[_P, _R]:
        @functools.wraps(method)
        def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            with translated(not_found=not_found):
                return method(*args, **kwargs)

        return wrapper

    return decorate
