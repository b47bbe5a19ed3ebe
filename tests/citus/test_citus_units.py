"""Issue 46 on Citus: privacy units on a table distributed by the unit column (conftest.py's
real cluster). The training table holds exactly the bounded read's k slots per unit, filled on
the shards; releases are planned at row level and charged at unit level as on one node; a unit
spread over shards (a table distributed by another column) is refused before anything is read
or charged."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import numpy as np
import psycopg
import pytest

from tests.citus.test_citus import _analyst, _private, _refused
from tests.server.test_durable_charge import EPSILON, MECHANISMS, _mechanisms, _train_sql
from tests.server.test_privacy_units import (
    FAR_CORNER,
    PEOPLE,
    _neighbour,
    _same_secret,
    _visits,
)

SHARDS = 4
K = 3


def _visits_distributed(conn: psycopg.Connection, by: str = "person") -> str:
    """The one-node test's visits table (4,000 people with 1-5 visits, person 0 with 300),
    distributed by the unit (person) or by its row id (visit)."""
    name = f"v_{uuid.uuid4().hex[:8]}"
    _visits(conn, name)
    if by == "person":  # a unique constraint must hold the distribution column
        conn.execute(f"ALTER TABLE {name} DROP CONSTRAINT {name}_pkey")
    conn.execute("SELECT create_distributed_table(%s, %s, shard_count => %s)", (name, by, SHARDS))
    return name


def _register(conn: psycopg.Connection, table: str, **kw: Any) -> str:
    name = f"cu_{uuid.uuid4().hex[:8]}"
    extra = "".join(f", {k} => %({k})s" for k in kw)
    conn.execute(
        f"SELECT dpsql.register_dataset(%(t)s, '{{a,b}}', 'y', 100, 1e-4,"
        f" feature_bounds => '{{{{0,1}},{{-1,0}}}}', name => %(n)s{extra})",
        {"t": table, "n": name, **kw},
    )
    return name


def _ledger(conn: psycopg.Connection, dataset: str) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT epsilon, delta FROM dpsql.ledger WHERE dataset = %s ORDER BY entry_id", (dataset,)
    ).fetchall()


def _worker_tables(cluster: Any, pattern: str) -> list[str]:
    found = []
    for node in cluster.workers:
        with psycopg.connect(node.uri, autocommit=True) as w:
            found += [
                r[0]
                for r in w.execute(
                    "SELECT relname FROM pg_class WHERE relname LIKE %s", (pattern,)
                ).fetchall()
            ]
    return found


def test_the_training_table_holds_the_bounded_slots(cluster, coord) -> None:
    """A private run's training table on the shards: U * k rows, k per unit (row_id = the
    unit), each unit's slots exactly the bounded read's (the one-node rule, same secret), slot
    numbers 0..k-1 in rid's low bits; nothing of the fill is left on the workers. The keyed
    Poisson draws give each slot its own stream: a unit's slots are not drawn together."""
    table = _visits_distributed(coord)
    name = _register(coord, table, privacy_unit="person", max_rows_per_unit=K)
    ds = coord.execute("SELECT dpsql_internal._lookup_dataset(%s)", (name,)).fetchone()[0]
    # (its rows are read after the charge: here at once)
    run = coord.execute(
        "SELECT dpsql_internal._start_run(dpsql_internal._read_rows("
        "dpsql_internal._prepare_private(%s::dpsql.datasets, 'logistic', '{\"seed\": 7}')))",
        (ds,),
    ).fetchone()[0]
    try:
        train, rows, spec = coord.execute(
            "SELECT train_table, rows, spec FROM dpsql.runs WHERE run_id = %s", (run,)
        ).fetchone()
        assert rows == PEOPLE * K
        layout = spec["distributed"]
        assert layout["privacy_unit"] == "person" and layout["slots_per_unit"] == K
        assert layout["distribution_column"] == "person"
        slots = coord.execute(f"SELECT row_id, rid & 1023, x, y FROM {train}").fetchall()
        assert len(slots) == PEOPLE * K
        per_unit: dict[int, list[tuple[float, float, float]]] = {}
        numbers: dict[int, set[int]] = {}
        for unit, slot, x, y in slots:  # x: the features on [-1, 1] (feature_bounds)
            per_unit.setdefault(unit, []).append(
                (round((x[0] + 1) / 2, 9), round((x[1] - 1) / 2, 9), y)
            )
            numbers.setdefault(unit, set()).add(slot)
        assert len(per_unit) == PEOPLE
        assert all(len(v) == K for v in per_unit.values())
        assert all(v == set(range(K)) for v in numbers.values())
        # the one-node bounded read (pushed down: its windows are partitioned by the unit)
        src = coord.execute(
            "SELECT dpsql_internal._private_from(%s::dpsql.datasets, with_unit => true)", (ds,)
        ).fetchone()[0]
        read: dict[int, list[tuple[float, float, float]]] = {}
        for a, b, y, unit in coord.execute(f'SELECT a, b, y, "dpsql unit" FROM {src}'):
            read.setdefault(int(unit), []).append((round(a, 9), round(b, 9), y))
        assert {u: Counter(v) for u, v in per_unit.items()} == {
            u: Counter(v) for u, v in read.items()
        }
        # each unit's slots are its own rows
        own = {
            (p, round(a, 9), round(b, 9), float(y))
            for p, a, b, y in coord.execute(f"SELECT person, a, b, y FROM {table}").fetchall()
        }
        assert all((u, a, b, y) in own for u, v in per_unit.items() for a, b, y in v)
        assert _worker_tables(cluster, f"train_{run}_s%") == []
        # Poisson draws keyed per slot: 200 steps at q = 0.05
        seed_sql, id_sql = coord.execute(
            "SELECT * FROM dpsql_internal._draw_key_sql(%s, 12345)", (train,)
        ).fetchone()
        assert "rid" in seed_sql
        draws = coord.execute(
            f"SELECT t.row_id, dpsql_internal._poisson_batches({seed_sql}, {id_sql}, 200, 0.05)"
            f" FROM {train} t"
        ).fetchall()
        by_unit: dict[int, list[tuple[int, ...]]] = {}
        for unit, steps in draws:
            by_unit.setdefault(unit, []).append(tuple(steps))
        together = sum(1 for v in by_unit.values() if len(set(v)) == 1)
        assert together == 0  # (identical lists of ~10 steps in 200: never by chance)
        mean = sum(len(s) for _, s in draws) / len(draws)
        assert mean == pytest.approx(200 * 0.05, rel=0.03)
    finally:
        coord.execute("SELECT dpsql_internal._abort(%s)", (run,))


# The releases whose models record the sensitivity of the released vector, with their calls
# and person 0's rows in the neighbour: the bolt-on averaged over shards (convex, constant step:
# its bound 2kL eta T / b is loose, so the rows move against the original ones' gradient) and
# output perturbation (sums; the one-node test's far corner, label flipped).
RELEASES = {
    "bolton": (
        "cls",
        "privacy => 'bolton', epsilon => 1, delta => 0, epochs => 1, shard_parallel => true",
        "a = 0, b = 0, y = 1",
    ),
    "output_perturbation": (
        "reg",
        "model => 'linear', privacy => 'output_perturbation', epsilon => 1, delta => 0,"
        " lambda => 0.05",
        FAR_CORNER,
    ),
}


def _release_pair(conn: psycopg.Connection, privacy: str, unit: bool) -> tuple[np.ndarray, float]:
    """Same-seed releases on the visits table and on its neighbour in which all of person 0's
    300 rows changed (tests/server/test_privacy_units.py's construction), on the cluster:
    distributed by the unit (its rows on one shard) with the unit declared, else by the row id
    (its rows spread over the shards) without it. Returns the models' difference and the
    recorded sensitivity."""
    kind, call, moved = RELEASES[privacy]
    coefs: list[np.ndarray] = []
    sens: list[float] = []
    names: list[str] = []
    for variant in ("d0", "d1"):
        table = f"{variant}_{uuid.uuid4().hex[:6]}"
        _neighbour(conn, table, kind, moved if variant == "d1" else None)
        if unit:
            conn.execute(f"ALTER TABLE {table} DROP CONSTRAINT {table}_pkey")
        conn.execute(
            "SELECT create_distributed_table(%s, %s, shard_count => %s)",
            (table, "person" if unit else "visit", SHARDS),
        )
        declare: dict[str, Any] = {"privacy_unit": "person", "max_rows_per_unit": 5} if unit else {}
        if kind == "reg":
            declare |= {"labels": None, "label_bound": 1.0, "row_bound": 1.5}
        name = _register(conn, table, **declare)
        if unit and variant == "d1":
            _same_secret(conn, names[0], name)
        names.append(name)
        (mid,) = conn.execute(
            f"SELECT dpsql.train(%s, NULL, NULL, {call}, seed => 7, noise_seed => 11)", (name,)
        ).fetchone()
        w, s, params = conn.execute(
            "SELECT weights, sensitivity, params FROM dpsql.models WHERE model_id = %s", (mid,)
        ).fetchone()
        if unit:
            assert params["privacy_unit"]["max_rows_per_unit"] == 5
            assert s == pytest.approx(5 * params["privacy_unit"]["row_sensitivity"], rel=1e-12)
        coefs.append(np.array(w))
        sens.append(s)
    assert sens[0] == sens[1]
    return coefs[0] - coefs[1], sens[0]


@pytest.mark.parametrize("privacy", sorted(RELEASES))
def test_neighbours_in_one_persons_rows_stay_within_the_unit_sensitivity(coord, privacy) -> None:
    """Neighbours that differ in all 300 rows of person 0: with the unit (k = 5, the table
    distributed by it, person 0 on one shard) the same-seed releases are at most the recorded
    unit sensitivity apart (the noise cancels); without it (distributed by the row id, person
    0's rows on every shard) further apart than the recorded row sensitivity."""
    diff, sens = _release_pair(coord, privacy, unit=True)
    print(f"{privacy}: unit level |w - w'| = {np.linalg.norm(diff):.6g} <= {sens:.6g}")
    assert np.linalg.norm(diff) <= sens * (1 + 1e-9)
    diff_row, sens_row = _release_pair(coord, privacy, unit=False)
    print(f"{privacy}: row level |w - w'| = {np.linalg.norm(diff_row):.6g} > {sens_row:.6g}")
    assert np.linalg.norm(diff_row) > sens_row


def test_dpsgd_poisson_on_units_is_charged_at_unit_level(coord) -> None:
    """DP-SGD with Poisson batches on the shards of a unit dataset: planned at row level for
    epsilon / k, charged epsilon at unit level, its row-level plan recorded."""
    name = _register(coord, _visits_distributed(coord), privacy_unit="person", max_rows_per_unit=K)
    mid = _private(
        coord, name, privacy="dpsgd", sampling="poisson", epsilon=1.0, delta=1e-5, epochs=2,
        batch_size=200,
    )  # fmt: skip
    eps, delta, rows, params = coord.execute(
        "SELECT epsilon, delta, rows, params FROM dpsql.models WHERE model_id = %s", (mid,)
    ).fetchone()
    assert rows == PEOPLE * K
    assert eps == pytest.approx(1.0, rel=1e-9) and delta == pytest.approx(1e-5, rel=1e-9)
    unit = params["privacy_unit"]
    assert unit["column"] == "person" and unit["max_rows_per_unit"] == K
    assert unit["row_epsilon"] == pytest.approx(1.0 / K, rel=1e-12)
    ledger = _ledger(coord, name)
    assert len(ledger) == 1
    assert ledger[0][0] == pytest.approx(1.0, rel=1e-12)
    assert ledger[0][1] == pytest.approx(1e-5, rel=1e-12)


@pytest.fixture(scope="module")
def unit_tables(cluster: Any) -> dict[str, str]:
    """tests/server/test_privacy_units.py's unit_tables on the cluster, distributed by the
    unit: 500 people of 4 rows (classification), 8,000 of 3 rows (regression), k = 3."""
    out = {}
    with psycopg.connect(cluster.coordinator.uri, autocommit=True) as conn:
        for kind, n, people, label in [
            (
                "cls",
                2000,
                500,
                "CASE WHEN (g % 10) / 10.0 - (g % 7) / 14.0 > 0.2 THEN 1 ELSE -1 END",
            ),
            ("reg", 24000, 8000, "((g % 10) / 10.0 + (g % 7) / 14.0) / 2"),
        ]:
            table = f"u{kind}_{uuid.uuid4().hex[:6]}"
            conn.execute(
                f"CREATE TABLE {table} AS SELECT g AS rid, g % {people} AS person,"
                f" ((g % 10) / 10.0)::float8 AS a, (-(g % 7) / 7.0)::float8 AS b,"
                f" ({label})::float8 AS y FROM generate_series(1, {n}) g"
            )
            conn.execute(
                "SELECT create_distributed_table(%s, 'person', shard_count => %s)",
                (table, SHARDS),
            )
            name = f"cm_{uuid.uuid4().hex[:8]}"
            extra = (
                ", labels => NULL, label_bound => 1.0, row_bound => 1.5" if kind == "reg" else ""
            )
            conn.execute(
                f"SELECT dpsql.register_dataset(%s, '{{a,b}}', 'y', 100, 1e-3, name => %s,"
                f" row_norm => 'clip', privacy_unit => 'person', max_rows_per_unit => 3{extra})",
                (table, name),
            )
            out[kind] = name
    return out


DISTRIBUTED = [m for m in MECHANISMS if m not in ("dp_ssgd", "auto")]


@pytest.mark.parametrize("privacy", DISTRIBUTED)
def test_every_distributed_mechanism_is_charged_at_unit_level(coord, unit_tables, privacy) -> None:
    """Every mechanism that runs on Citus, on units of 3 rows distributed by the unit: it reads
    U * 3 slots on the shards, is planned at row level for epsilon / 3 and charged epsilon."""
    kinds = {m: (k, model) for m, k, model in _mechanisms(coord)}
    kind, model = kinds[privacy]
    extra = {"bst14": ", batch_size => 50", "bolton": ", shard_parallel => true"}
    sql = _train_sql(privacy, model)[:-1] + extra.get(privacy, "") + ")"
    before = len(_ledger(coord, unit_tables[kind]))
    (mid,) = coord.execute(sql, (unit_tables[kind],)).fetchone()
    ledger = _ledger(coord, unit_tables[kind])
    assert len(ledger) == before + 1
    assert ledger[-1][0] == pytest.approx(EPSILON, rel=1e-9)
    if mid is not None:
        m_eps, unit, m_rows = coord.execute(
            "SELECT epsilon, params->'privacy_unit', rows FROM dpsql.models WHERE model_id = %s",
            (mid,),
        ).fetchone()
        assert m_eps <= EPSILON * (1 + 1e-9)
        assert unit["max_rows_per_unit"] == 3
        assert unit["row_epsilon"] <= EPSILON / 3 * (1 + 1e-9)
        assert m_rows == (1500 if kind == "cls" else 24000)


def test_units_spread_over_shards_are_refused_before_any_read(coord) -> None:
    """A unit on a table distributed by another column (its rows spread over shards) is
    refused at registration, and, for a table distributed after registration, at every release
    before anything is read or charged; sampled SGD needs an integer unit (its stream key)."""
    by_visit = _visits_distributed(coord, by="visit")
    before = coord.execute("SELECT count(*) FROM dpsql.datasets").fetchone()[0]
    err = _refused(
        coord,
        "SELECT dpsql.register_dataset(%s, '{a,b}', 'y', 10, privacy_unit => 'person',"
        " max_rows_per_unit => 2)",
        (by_visit,),
    )
    assert "is not its distribution column" in err and "spread over shards" in err
    assert coord.execute("SELECT count(*) FROM dpsql.datasets").fetchone()[0] == before
    # registered on a local table, distributed by the row id since
    local = f"l_{uuid.uuid4().hex[:8]}"
    _visits(coord, local)
    name = _register(coord, local, privacy_unit="person", max_rows_per_unit=2)
    coord.execute(
        "SELECT create_distributed_table(%s, 'visit', shard_count => %s)", (local, SHARDS)
    )
    err = _refused(
        coord,
        "SELECT dpsql.train(%s, NULL, NULL, privacy => 'output_perturbation', epsilon => 1,"
        " delta => 0, lambda => 0.1)",
        (name,),
    )
    assert "spread over shards" in err
    assert _ledger(coord, name) == []
    # registered on a local table, distributed by the unit since: the workers lack the secret
    later = f"l_{uuid.uuid4().hex[:8]}"
    _visits(coord, later)
    coord.execute(f"ALTER TABLE {later} DROP CONSTRAINT {later}_pkey")
    late = _register(coord, later, privacy_unit="person", max_rows_per_unit=2)
    coord.execute(
        "SELECT create_distributed_table(%s, 'person', shard_count => %s)", (later, SHARDS)
    )
    err = _refused(
        coord,
        "SELECT dpsql.train(%s, NULL, NULL, privacy => 'output_perturbation', epsilon => 1,"
        " delta => 0, lambda => 0.1)",
        (late,),
    )
    assert "do not have its unit secret" in err
    assert _ledger(coord, late) == []
    # a text unit: the sums and averaged mechanisms run, sampled SGD (keyed by an integer) not
    text = f"t_{uuid.uuid4().hex[:8]}"
    _visits(coord, text)
    coord.execute(f"ALTER TABLE {text} DROP CONSTRAINT {text}_pkey")
    coord.execute(f"ALTER TABLE {text} ALTER COLUMN person TYPE text")
    coord.execute(
        "SELECT create_distributed_table(%s, 'person', shard_count => %s)", (text, SHARDS)
    )
    tname = _register(coord, text, privacy_unit="person", max_rows_per_unit=2)
    _refused(
        coord,
        "SELECT dpsql.train(%s, NULL, NULL, privacy => 'dpsgd', sampling => 'poisson',"
        " epsilon => 1, delta => 1e-5)",
        (tname,),
    )
    assert _ledger(coord, tname) == []
    mid = _private(coord, tname, privacy="output_perturbation", epsilon=1.0, delta=0.0,
                   **{"lambda": 0.1})  # fmt: skip
    assert len(_ledger(coord, tname)) == 1 and mid > 0


def test_the_secret_stays_the_owners_on_the_workers(cluster, coord) -> None:
    """Registration shares the unit secret with the workers by INSERT ... SELECT into
    dpsql_work.unit_secrets, a reference table in the definer's schema: no statement any node
    logs (registration and a DP-SGD run, log_statement = all) holds it, an analyst reads
    neither it nor dpsql_internal.unit_secrets on a worker, and the run leaves nothing on them."""
    nodes = [cluster.coordinator, *cluster.workers]
    logs = [getattr(n, "pgdata", None) for n in nodes]
    local = all(p is not None for p in logs)  # (docker-test's nodes: no log file here)
    offsets = [(p / "log").stat().st_size if p is not None else 0 for p in logs]

    def log_statements(value: str) -> None:
        for node in nodes:
            with psycopg.connect(node.uri, autocommit=True) as c:
                c.execute(f"ALTER SYSTEM SET log_statement = '{value}'")
                c.execute("SELECT pg_reload_conf()")

    if local:
        log_statements("all")
    try:
        table = _visits_distributed(coord)
        name = _register(coord, table, privacy_unit="person", max_rows_per_unit=K)
        login = _analyst(coord, name)
        with login(cluster.coordinator) as a:
            _private(a, name, privacy="dpsgd", sampling="poisson", epsilon=1.0, delta=1e-5,
                     epochs=1, batch_size=400)  # fmt: skip
    finally:
        if local:
            log_statements("none")
    (secret,) = coord.execute(
        "SELECT encode(u.secret, 'hex') FROM dpsql_internal.unit_secrets u"
        " JOIN dpsql.datasets d USING (dataset_id) WHERE d.name = %s",
        (name,),
    ).fetchone()
    for path, offset in zip(logs, offsets, strict=True):
        if path is not None:
            with open(path / "log", "rb") as f:
                f.seek(offset)
                text = f.read().decode(errors="replace").lower()
            assert "unit_secrets" in text  # the statements were logged
            assert secret[:24] not in text
    assert _worker_tables(cluster, "train_%") == []
    for node in cluster.workers:
        with psycopg.connect(node.uri, autocommit=True) as w:  # the superuser's copy
            assert w.execute(
                "SELECT encode(secret, 'hex') FROM dpsql_work.unit_secrets WHERE dataset_id = %s",
                (_dataset_id(coord, name),),
            ).fetchone() == (secret,)
        with login(node) as aw:
            for statement in (
                "SELECT secret FROM dpsql_internal.unit_secrets",
                "SELECT secret FROM dpsql_work.unit_secrets",
            ):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    aw.execute(statement)


def _dataset_id(conn: psycopg.Connection, name: str) -> int:
    return int(
        conn.execute("SELECT dataset_id FROM dpsql.datasets WHERE name = %s", (name,)).fetchone()[0]
    )


def test_describe_and_private_evaluate_read_the_bounded_slots(coord) -> None:
    """describe and private evaluate on a unit dataset of the cluster: they read the U k slots
    (describe's noisy row count is about U k, not the table's rows) and are charged the epsilon
    asked, at unit level."""
    table = _visits_distributed(coord)
    name = _register(coord, table, privacy_unit="person", max_rows_per_unit=K)
    table_rows = coord.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    assert table_rows != PEOPLE * K
    rows = coord.execute(
        "SELECT value, noise_sd FROM dpsql.describe(%s, 2.0, features => '{a}')"
        " WHERE statistic = 'rows'",
        (name,),
    ).fetchone()
    assert rows is not None and abs(rows[0] - PEOPLE * K) <= 10 * rows[1] + 1
    mid = _private(coord, name, privacy="bolton", epsilon=1.0, delta=0.0, shard_parallel=True)
    metric = coord.execute(
        "SELECT metric, value, rows FROM dpsql.evaluate(%s, %s, epsilon => 1.0)", (mid, name)
    ).fetchone()
    assert metric[2] == PEOPLE * K and 0 <= metric[1] <= 1
    charges = _ledger(coord, name)
    assert [round(e, 9) for e, _ in charges] == [2.0, 1.0, 1.0]


def test_an_audit_of_a_unit_dataset_copies_its_units(coord) -> None:
    """dpsql.audit on a unit dataset of the cluster audits the unit claim as on one node: its
    copy (a local table, read through the bounded read) keeps the units, each canary a unit
    of k rows (details.privacy_unit), and the dataset is charged nothing."""
    table = _visits_distributed(coord)
    name = _register(coord, table, privacy_unit="person", max_rows_per_unit=K)
    row = coord.execute(
        "SELECT epsilon_claimed, epsilon_lower, runs, method FROM dpsql.audit(%s, 'bolton', 1.0,"
        ' 0.0, options => \'{"canaries": 100, "seed": 1}\')',
        (name,),
    ).fetchone()
    assert row[0] == 1.0 and 0 <= row[1] <= 1.0 and row[3] == "one_run"
    details = coord.execute(
        "SELECT details FROM dpsql.audits ORDER BY audit_id DESC LIMIT 1"
    ).fetchone()[0]
    assert details["privacy_unit"]["max_rows_per_unit"] == K
    assert _ledger(coord, name) == []
