"""The packaging tests are one pytest-xdist group (tests/conftest.py): `make test` runs the suite
with `-n 2 --dist loadgroup`, and these tests install and purge packages of the one Debian
PostgreSQL 15, so they must run one after another on one worker (the Citus tests likewise share
one cluster). pytest 9.2 with pytest-xdist 3.8 lost the groups (xdist names a group by a suffix
of the item's `_nodeid`, which pytest 9.2's `nodeid` no longer reads): a CI run then failed
when another worker purged Debian's 15 package between this folder's install and its CREATE
EXTENSION. pyproject.toml pins pytest below 9.2; this test fails if the groups are lost again."""

from __future__ import annotations

import pytest


def test_this_folder_runs_as_one_xdist_group(request: pytest.FixtureRequest) -> None:
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not a worker of pytest-xdist's --dist loadgroup (make test runs one)")
    assert request.node.nodeid.endswith("@packaging"), request.node.nodeid
