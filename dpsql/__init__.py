"""dpsql: differentially private machine learning inside PostgreSQL.

>>> import dpsql
>>> db = dpsql.connect()          # embedded server unless a DSN or DPSQL_DSN is given
>>> m = db.train("protein", features="x", label="y", model="logistic", epochs=5, seed=1)
>>> m.coef_, m.evaluate("protein_test")

The server's refusals are raised as the classes of dpsql.errors (also exported here), e.g.
``dpsql.BudgetExceeded``; each is a ``psycopg.Error`` too.
"""

from dpsql import _mechanisms
from dpsql._mechanisms import *  # noqa: F403 (every spec's class: _mechanisms.__all__)
from dpsql.connection import Database, connect
from dpsql.errors import (
    AccountantFailed,
    AlreadyRegistered,
    AmbiguousDataset,
    BudgetExceeded,
    DpsqlError,
    InvalidData,
    InvalidParameter,
    LimitExceeded,
    NoSuchColumn,
    NoSuchModel,
    NoSuchRelation,
    NotFound,
    NothingReleased,
    NotReady,
    NotRegistered,
    NotSupported,
    PermissionDenied,
    RowsChanged,
    UnsuitableRelation,
    WrongType,
)
from dpsql.load_table import ColumnReport, LoadReport, TableExists
from dpsql.models import Model
from dpsql.privacy import Auto

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
    "NotSupported",
    "NothingReleased",
    "NotRegistered",
    "PermissionDenied",
    "RowsChanged",
    "UnsuitableRelation",
    "WrongType",
    "Auto",
    "Database",
    "Model",
    "connect",
    "ColumnReport",
    "LoadReport",
    "TableExists",
]
__all__ += _mechanisms.__all__  # the mechanisms' classes, generated from their specs
__version__ = "0.8.0"
