"""The install script is sql/install/*.sql in file-name order (sql/Makefile): one number per
file, so that the order is the one the numbers say and never the names' tie-break."""

from __future__ import annotations

import collections
from pathlib import Path

INSTALL = Path(__file__).resolve().parents[2] / "sql" / "install"


def test_install_files_have_distinct_numbers() -> None:
    by_number = collections.defaultdict(list)
    for path in INSTALL.glob("*.sql"):
        number, _, _ = path.name.partition("_")
        assert number.isdigit(), path.name
        by_number[number].append(path.name)
    shared = {n: names for n, names in by_number.items() if len(names) > 1}
    assert not shared, shared
