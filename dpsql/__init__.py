"""dpsql: differentially private machine learning inside PostgreSQL.

>>> import dpsql
>>> db = dpsql.connect()          # embedded server unless a DSN or DPSQL_DSN is given
>>> m = db.train("protein", features="x", label="y", model="logistic", epochs=5, seed=1)
>>> m.coef_, m.evaluate("protein_test")

The server's refusals are raised as the classes of dpsql.errors (also exported here), e.g.
``dpsql.BudgetExceeded``; each is a ``psycopg.Error`` too.
"""

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
    UnsuitableRelation,
    WrongType,
)
from dpsql.load_table import ColumnReport, LoadReport, TableExists
from dpsql.models import Model
from dpsql.privacy import (
    BST14,
    DPAMBSSGD,
    DPFTRL,
    DPGD,
    DPSGD,
    DPSGDF,
    DPSSGD,
    SCS13,
    AdaSSP,
    Auto,
    BoltOn,
    DPSGDFAlg2,
    ExponentialMechanism,
    FrankWolfe,
    ObjectivePerturbation,
    OutputPerturbation,
)

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
    "UnsuitableRelation",
    "WrongType",
    "BST14",
    "DPAMBSSGD",
    "DPGD",
    "DPSGD",
    "DPSGDF",
    "DPSGDFAlg2",
    "DPSSGD",
    "SCS13",
    "AdaSSP",
    "ExponentialMechanism",
    "FrankWolfe",
    "Auto",
    "BoltOn",
    "ObjectivePerturbation",
    "OutputPerturbation",
    "DPFTRL",
    "Database",
    "Model",
    "connect",
    "ColumnReport",
    "LoadReport",
    "TableExists",
]
__version__ = "0.8.0"
