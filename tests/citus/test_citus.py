"""dpsql on a real Citus cluster (coordinator + 2 workers, see conftest.py).

Every node runs with ``citus.coordinator_aggregation_strategy = 'disabled'``, so an aggregate
that Citus could not push down fails here instead of pulling the rows to the coordinator.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import psycopg
import pytest

from dpsql import citus
from dpsql.loading import load_numpy
from tests import definer_role
from tests.pg_helpers import await_waiter, prepare

# The container stage runs this module on compose.citus.yml (tests/container).
pytestmark = pytest.mark.smoke

SHARDS = 4


def _distributed(
    conn: psycopg.Connection, X: np.ndarray, y: np.ndarray, shards: int = SHARDS
) -> str:
    """A hash-distributed table (rid bigint PRIMARY KEY, x float8[], y float8) of (X, y)."""
    name = f"t_{uuid.uuid4().hex[:8]}"
    load_numpy(conn, name, X, y)
    conn.execute(f"ALTER TABLE {name} ADD PRIMARY KEY (rid)")
    conn.execute("SELECT create_distributed_table(%s, 'rid', shard_count => %s)", (name, shards))
    return name


def _binary(n: int = 2000, d: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) / 2
    X /= np.maximum(1.0, np.linalg.norm(X, axis=1))[:, None]  # ||x|| <= 1
    y = (X @ np.linspace(1.0, -1.0, d) + 0.2 * rng.normal(size=n) > 0).astype(float)
    return X, y


def _register(conn: psycopg.Connection, table: str, **kw: Any) -> str:
    name = f"ds_{uuid.uuid4().hex[:8]}"
    extra = "".join(f", {k} => %({k})s" for k in kw)
    conn.execute(
        f"SELECT dpsql.register_dataset(%(t)s, '{{x}}', 'y', epsilon_budget => 1000,"
        f" delta_budget => 0.5, name => %(n)s{extra})",
        {"t": table, "n": name, **kw},
    )
    return name


def _analyst(conn: psycopg.Connection, dataset: str) -> Callable[[citus.Node], psycopg.Connection]:
    """A new analyst granted the dataset (created on the coordinator, propagated by Citus);
    returns how it logs in to a node over TCP with its password."""
    role, password = f"an_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}' IN ROLE dpsql_analyst")
    conn.execute(
        "SELECT dpsql.grant_dataset(dataset_id, %s) FROM dpsql.datasets WHERE name = %s",
        (role, dataset),
    )

    def login(node: citus.Node) -> psycopg.Connection:
        return psycopg.connect(
            host="127.0.0.1", port=node.port, dbname="postgres", user=role, password=password,
            autocommit=True,
        )  # fmt: skip

    return login


def _first_shard(conn: psycopg.Connection, table: str) -> str:
    """The name of a distributed table's first shard (as the workers know it)."""
    row = conn.execute(
        "SELECT shard_name(%s::regclass, min(shardid)) FROM pg_dist_shard"
        " WHERE logicalrelid = %s::regclass",
        (table, table),
    ).fetchone()
    assert row is not None
    return str(row[0])


def _weights(conn: psycopg.Connection, model_id: int) -> np.ndarray:
    row = conn.execute(
        "SELECT weights FROM dpsql.model_store WHERE model_id = %s", (model_id,)
    ).fetchone()
    assert row is not None
    return np.asarray(row[0], dtype=np.float64)


def _train(conn: psycopg.Connection, source: str, **kw: Any) -> int:
    args = {"labels": [0, 1], **kw}
    names = ", ".join(f"{k} => %({k})s" for k in args)
    row = conn.execute(
        f"SELECT dpsql.train(%(src)s, '{{x}}', 'y', {names})", {"src": source, **args}
    )
    result = row.fetchone()
    assert result is not None
    return int(result[0])


def _private(conn: psycopg.Connection, dataset: str, **kw: Any) -> int:
    names = ", ".join(f"{k} => %({k})s" for k in kw)
    row = conn.execute(f"SELECT dpsql.train(%(ds)s, NULL, NULL, {names})", {"ds": dataset, **kw})
    result = row.fetchone()
    assert result is not None
    return int(result[0])


def _refused(conn: psycopg.Connection, query: str, params: Any = None, code: str = "0A000") -> str:
    with pytest.raises(psycopg.Error) as err:
        conn.execute(query, params)
    assert err.value.sqlstate == code, err.value
    return str(err.value)


def _ledger(conn: psycopg.Connection) -> int:
    return int(conn.execute("SELECT count(*) FROM dpsql.ledger").fetchone()[0])


# -- the definer role ---------------------------------------------------------------------


def test_the_definer_role_on_a_cluster(cluster, coord) -> None:
    """The definer code runs as dpsql_definer on every node, as on a single server: the role
    logs in (Citus connects to the workers as the current user) with a password only
    pg_dist_authinfo holds, and otherwise is what tests/definer_role.py checks everywhere."""
    definer_role.check_all(coord, login=True)
    for node in cluster.workers:
        with psycopg.connect(node.uri, autocommit=True) as conn:
            definer_role.check_role_attributes(conn, login=True)
            definer_role.check_definer_functions_owned(conn)
    (authinfo,) = coord.execute(
        "SELECT authinfo FROM pg_dist_authinfo WHERE rolename = 'dpsql_definer' AND nodeid = 0"
    ).fetchone()
    assert authinfo.startswith("password=") and len(authinfo) > 60
    # a data owner can neither read that password nor set a new one
    role, password = f"own_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    coord.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}' IN ROLE dpsql_admin")
    owner = psycopg.conninfo.make_conninfo(cluster.coordinator.uri, user=role, password=password)
    with psycopg.connect(owner, autocommit=True) as o:
        for attempt in (
            "SELECT authinfo FROM pg_dist_authinfo",
            "SELECT dpsql.citus_setup_definer()",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                o.execute(attempt)
    # nobody logs in as it without that password
    worker = cluster.workers[0].uri
    for password in ("", "dpsql_definer", "postgres"):
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(
                psycopg.conninfo.make_conninfo(worker, user="dpsql_definer", password=password)
            ).close()


def test_a_distributed_table_is_read_as_the_definer_role(coord) -> None:
    """As dpsql_definer, a registered distributed table's registered columns are readable on
    the shards (the column grant reached them) and its other columns are not."""
    coord.execute("CREATE TABLE definer_dist (id bigint PRIMARY KEY, a float8, y float8, s text)")
    try:
        coord.execute("SELECT create_distributed_table('definer_dist', 'id', shard_count => 4)")
        coord.execute(
            "INSERT INTO definer_dist SELECT g, g, g % 2, 'secret' || g"
            " FROM generate_series(1, 40) g"
        )
        coord.execute(
            "SELECT dpsql.register_dataset('definer_dist', '{a}', 'y', 1.0, labels => '{0,1}',"
            " feature_bounds => '{{0,40}}')"
        )
        with coord.transaction():
            coord.execute("SET LOCAL ROLE dpsql_definer")
            assert coord.execute("SELECT count(a), sum(y) FROM definer_dist").fetchone() == (40, 20)
        with pytest.raises(psycopg.errors.InsufficientPrivilege), coord.transaction():
            coord.execute("SET LOCAL ROLE dpsql_definer")
            coord.execute("SELECT s FROM definer_dist")
    finally:
        coord.execute("SELECT dpsql.drop_dataset('definer_dist')")
        coord.execute("DROP TABLE definer_dist")


# -- the training table ------------------------------------------------------------------


def test_training_table_is_distributed_colocated_and_stored_in_seeded_order(coord) -> None:
    X, y = _binary(3000)
    src = _distributed(coord, X, y)
    run = prepare(coord, src, labels=[0, 1], seed=5, shard_parallel=True)
    table, spec = coord.execute(
        "SELECT train_table, spec FROM dpsql.runs WHERE run_id = %s", (run.run_id,)
    ).fetchone()
    layout = spec["distributed"]
    assert layout["shard_count"] == SHARDS and layout["nodes"] == 2
    assert layout["distribution_column"] == "rid"
    colocated = coord.execute(
        "SELECT count(DISTINCT colocationid) FROM pg_dist_partition"
        " WHERE logicalrelid IN (%s::regclass, %s::regclass)",
        (table, src),
    ).fetchone()[0]
    assert colocated == 1
    # every shard is stored in the order of the seeded key, computed from the row id alone
    sorted_shards = coord.execute(
        "SELECT array_agg(result ORDER BY shardid) FROM run_command_on_shards(%s, $$"
        "SELECT coalesce(bool_and(d >= 0), true) FROM"
        " (SELECT rid - lag(rid) OVER () AS d FROM %%s) s$$)",
        (table,),
    ).fetchone()[0]
    assert sorted_shards == ["t"] * SHARDS
    mismatched = coord.execute(
        f"SELECT count(*) FROM {table} WHERE rid <> dpsql_internal._shuffle_key(5, row_id)"
    ).fetchone()[0]
    assert mismatched == 0
    assert coord.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 3000
    run.abort()


def test_same_seed_same_model_and_another_seed_another(coord) -> None:
    X, y = _binary(2000)
    src = _distributed(coord, X, y)
    a, b, c = (_train(coord, src, seed=s, epochs=2, shard_parallel=True) for s in (11, 11, 12))
    np.testing.assert_allclose(_weights(coord, a), _weights(coord, b), rtol=0, atol=1e-12)
    assert np.abs(_weights(coord, a) - _weights(coord, c)).max() > 1e-6
    params = coord.execute(
        "SELECT params FROM dpsql.model_store WHERE model_id = %s", (a,)
    ).fetchone()[0]
    assert params["distributed"]["shard_count"] == SHARDS and params["shard_parallel"] is True


def test_an_epoch_is_the_row_weighted_mean_of_sequential_shard_passes(coord) -> None:
    """The pushed-down epoch equals, per shard, a sequential pass in the stored order, averaged
    with weights n_s / m: the fill kept the order and the combine is the stated average."""
    X, y = _binary(3000, d=4, seed=1)
    src = _distributed(coord, X, y)
    run = prepare(coord, src, labels=[0, 1], seed=3, step_size=0.2, shard_parallel=True)
    table, init = coord.execute(
        "SELECT train_table, state FROM dpsql.runs WHERE run_id = %s", (run.run_id,)
    ).fetchone()
    run.run_epoch()
    got = np.asarray(
        coord.execute(
            "SELECT dpsql_internal._sgd_weights(state) FROM dpsql.runs WHERE run_id = %s",
            (run.run_id,),
        ).fetchone()[0]
    )
    # the reference: each shard's rows copied to the coordinator, one ordered pass each
    coord.execute(
        f"CREATE TEMP TABLE shard_rows AS SELECT get_shard_id_for_distribution_column("
        f"'{table}', row_id) AS shard, rid, x, y FROM {table}"
    )
    per_shard = coord.execute(
        "SELECT count(*), dpsql_internal._sgd_weights(dpsql.sgd_epoch(x, y, %s ORDER BY rid))"
        " FROM shard_rows GROUP BY shard",
        (init,),
    ).fetchall()
    coord.execute("DROP TABLE shard_rows")
    assert len(per_shard) == SHARDS
    counts = np.array([n for n, _ in per_shard], dtype=float)
    expected = sum(n * np.asarray(w) for n, w in per_shard) / counts.sum()
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-14)
    run.abort()


def test_the_guard_turns_a_pull_into_an_error(coord) -> None:
    """What would pull rows (an ordered aggregate) fails on this cluster: the other tests'
    successes are pushdowns."""
    X, y = _binary(500)
    src = _distributed(coord, X, y)
    run = prepare(coord, src, labels=[0, 1], shard_parallel=True)
    table, init = coord.execute(
        "SELECT train_table, state FROM dpsql.runs WHERE run_id = %s", (run.run_id,)
    ).fetchone()
    with pytest.raises(psycopg.Error):
        coord.execute(f"SELECT dpsql.sgd_epoch(x, y, %s ORDER BY rid) FROM {table}", (init,))
    run.abort()


# -- refusals -------------------------------------------------------------------------------


def _work_tables(conn: psycopg.Connection) -> int:
    return int(
        conn.execute(
            "SELECT (SELECT count(*) FROM pg_tables WHERE schemaname = 'dpsql_work')"
            " + (SELECT count(*) FROM dpsql.runs)"
        ).fetchone()[0]
    )


def test_owner_runs_refused_with_clear_errors(coord) -> None:
    X, y = _binary(300)
    src = _distributed(coord, X, y)
    before = _work_tables(coord)
    q = "SELECT dpsql.train(%s, '{x}', 'y', labels => '{0,1}'"
    msg = _refused(coord, q + ")", (src,))
    assert "shard_parallel => true" in msg and "4 shards" in msg
    _refused(coord, q + ", shard_parallel => true, parallel_workers => 2)", (src,))
    _refused(coord, q + ", shard_parallel => true, permutation => 'fresh')", (src,))
    coord.execute(f"CREATE VIEW v_{src} AS SELECT * FROM {src}")
    assert "query or view" in _refused(coord, q + ")", (f"v_{src}",))
    # a distribution column without a unique constraint is no row id
    coord.execute(f"CREATE TABLE nu_{src} (k int, x float8[], y float8)")
    coord.execute(f"SELECT create_distributed_table('nu_{src}', 'k')")
    coord.execute(f"INSERT INTO nu_{src} SELECT rid % 10, x, y FROM {src}")
    assert "unique row id" in _refused(coord, q + ", shard_parallel => true)", (f"nu_{src}",))
    local = f"l_{src}"
    load_numpy(coord, local, X, y)
    _refused(coord, q + ", shard_parallel => true)", (local,), code="22023")
    assert _work_tables(coord) == before


def test_private_mechanisms_on_a_distributed_dataset(coord) -> None:
    X, y = _binary(2000)
    src = _distributed(coord, X, y)
    ds = _register(coord, src, labels=[0, 1])
    before = _ledger(coord)
    hint = _refused(
        coord,
        "SELECT dpsql.train(%s, NULL, NULL, 'linear', privacy => 'dp_ssgd', epsilon => 1,"
        " delta => 1e-6)",
        (ds,),
    )
    assert "sequential" in hint and all(
        m in hint for m in ("scs13", "bst14", "dp_ftrl", "dp_ambssgd")
    )
    _refused(coord, "SELECT dpsql.train(%s, NULL, NULL, privacy => 'bolton', epsilon => 1)", (ds,))
    _refused(
        coord,
        "SELECT dpsql.train(%s, NULL, NULL, privacy => 'bolton', epsilon => 1,"
        " shard_parallel => true, tuning_lambdas => '{0.1}')",
        (ds,),
    )
    _refused(
        coord,
        "SELECT dpsql.train(%s, NULL, NULL, privacy => 'bolton', epsilon => 1,"
        " shard_parallel => true, lambda => 0.1)",
        (ds,),
        code="22023",
    )
    # a dataset registered on a view of the distributed table: refused, not pulled
    view = f"v_{uuid.uuid4().hex[:8]}"
    coord.execute(f"CREATE VIEW {view} AS SELECT * FROM {src}")
    on_view = _register(coord, view, labels=[0, 1])
    # refused before anything counts its rows (an SGD mechanism's defaults count them)
    for privacy in ("objective_perturbation", "dpsgd"):
        msg = _refused(
            coord,
            "SELECT dpsql.train(%s, NULL, NULL, privacy => %s, epsilon => 1, delta => 1e-5)",
            (on_view, privacy),
        )
        assert "through a view" in msg
    assert _ledger(coord) == before
    mid = _private(coord, ds, privacy="bolton", epsilon=1.0, shard_parallel=True)
    assert _ledger(coord) == before + 1
    params = coord.execute(
        "SELECT params FROM dpsql.model_store WHERE model_id = %s", (mid,)
    ).fetchone()[0]
    assert params["distributed"]["shard_count"] == SHARDS


def test_the_shards_are_read_after_the_charge(cluster, coord) -> None:
    """As on one node (tests/server/test_read_after_charge.py): the distributed training table
    is created empty before the charge and filled on the shards after it. Rows added while the
    charge waits for the dataset's row lock are read, so the release is refused (the count it
    was planned from changed), and its charge stands."""
    X, y = _binary(400)
    src = _distributed(coord, X, y)
    ds = _register(coord, src, labels=[0, 1])
    login = _analyst(coord, ds)
    before = _ledger(coord)
    outcome: dict[str, Any] = {}

    def release() -> None:
        with login(cluster.coordinator) as analyst:
            try:
                outcome["model"] = _private(
                    analyst, ds, privacy="bolton", epsilon=1.0, shard_parallel=True
                )
            except psycopg.Error as e:
                outcome["error"] = e

    with psycopg.connect(cluster.coordinator.uri) as holder:  # a transaction: holds the lock
        holder.execute("SELECT 1 FROM dpsql.datasets WHERE name = %s FOR UPDATE", (ds,))
        worker = threading.Thread(target=release)
        worker.start()
        # the charge waits for the dataset's row (its lock_timeout is 2 s: act at once)
        await_waiter(coord, holder, timeout=60)
        coord.execute(
            f"INSERT INTO {src} (rid, x, y)"
            " SELECT 100000 + g, '{0.1,0.1,0.1}', 1 FROM generate_series(1, 10) g"
        )
        holder.commit()
    worker.join(120)
    assert "model" not in outcome, "the release trained on rows read before its charge"
    assert outcome["error"].sqlstate == "DP003"
    assert "rows changed while this release was planned" in str(outcome["error"])
    assert _ledger(coord) == before + 1


@pytest.mark.parametrize("mechanism", ["dpgd", "adassp"])
def test_sum_mechanisms_match_the_local_table(coord, mechanism) -> None:
    """DP-GD and AdaSSP run as they are: exact sums over the shards, noise once. With the same
    (owner-only) noise seed the release on the cluster equals the one on a local copy."""
    rng = np.random.default_rng(4)
    X = rng.uniform(-1, 1, size=(3000, 3)) / np.sqrt(3)
    y = np.clip(X @ np.array([0.5, -0.3, 0.2]) + 0.05 * rng.normal(size=3000), -1, 1)
    local = f"l_{uuid.uuid4().hex[:8]}"
    load_numpy(coord, local, X, y)
    releases = []
    for table in (local, _distributed(coord, X, y)):
        ds = _register(
            coord, table, label_bound=1.0, feature_bounds="{{-1,1},{-1,1},{-1,1}}", row_norm="clip"
        )
        releases.append(
            _weights(
                coord,
                _private(
                    coord,
                    ds,
                    model="linear",
                    privacy=mechanism,
                    epsilon=1.0,
                    delta=1e-5,
                    noise_seed=99,
                ),  # fmt: skip
            )
        )
    np.testing.assert_allclose(releases[1], releases[0], rtol=1e-8, atol=1e-10)


# -- privacy of the averaged bolt-on --------------------------------------------------------


def test_bolton_sensitivity_holds_for_neighbours_in_every_shard(coord) -> None:
    """Replace-one neighbours (same row id, adversarial contents) placed in each shard: the
    noiseless shard-averaged models differ by at most 2kL eta / b."""
    X, y = _binary(400, d=3, seed=2)
    src = _distributed(coord, X, y)
    k, eta = 3, 0.2
    bound = coord.execute(
        "SELECT dpsql.bolton_sensitivity('constant', %s, 0, 1, 0.25, 0, 400, 1, %s, false)",
        (eta, k),
    ).fetchone()[0]
    assert bound == pytest.approx(2 * k * eta)
    # (no intercept: the adversarial row below is the model's direction, of the rows' length)
    fit = {"seed": 9, "epochs": k, "step_size": eta, "shard_parallel": True, "intercept": False}
    base = _weights(coord, _train(coord, src, **fit))
    shard_of = dict(
        coord.execute(
            f"SELECT rid, get_shard_id_for_distribution_column('{src}', rid) FROM {src}"
        ).fetchall()
    )
    targets: dict[int, int] = {}
    for rid, shard in sorted(shard_of.items()):
        targets.setdefault(shard, rid)
    assert len(targets) == SHARDS
    worst = 0.0
    for rid in targets.values():
        # the record pushed hardest against the model, label flipped
        direction = -base / np.linalg.norm(base)
        coord.execute(f"UPDATE {src} SET x = %s, y = 1 - y WHERE rid = %s", (list(direction), rid))
        w = _weights(coord, _train(coord, src, **fit))
        coord.execute(
            f"UPDATE {src} SET x = %s, y = %s WHERE rid = %s", (list(X[rid]), y[rid], rid)
        )
        dist = float(np.linalg.norm(w - base))
        assert 0 < dist <= bound
        worst = max(worst, dist)
    assert worst > 0


def test_bolton_noise_on_the_cluster_has_the_stated_scale(coord) -> None:
    """The released model minus the noiseless shard average is the bolt-on noise: its norm
    is Gamma(d, sensitivity / epsilon). Mean of 30 norms within 40% of d * scale: 3.8 standard
    errors (relative s.e. 1/sqrt(90)); the noise seeds are fixed, so the test is deterministic;
    under the null its false-failure rate is below 1e-3. No noise, half or double fails."""
    X, y = _binary(400, d=3, seed=5)
    src = _distributed(coord, X, y)
    ds = _register(coord, src, labels=[0, 1])
    noiseless = _weights(
        coord,
        _train(coord, src, seed=21, epochs=1, step_size=0.1, batch_size=1, shard_parallel=True),
    )
    norms, scale = [], None
    for s in range(30):
        mid = _private(
            coord, ds, privacy="bolton", epsilon=2.0, seed=21, epochs=1, step_size=0.1,
            batch_size=1, shard_parallel=True, noise_seed=1000 + s,
        )  # fmt: skip
        scale, sens = coord.execute(
            "SELECT noise_scale, sensitivity FROM dpsql.model_store WHERE model_id = %s", (mid,)
        ).fetchone()
        assert sens == pytest.approx(2 * 1 * 0.1)
        norms.append(float(np.linalg.norm(_weights(coord, mid) - noiseless)))
    assert scale == pytest.approx(0.2 / 2.0)
    ratio = np.mean(norms) / (3 * scale)
    assert 0.6 < ratio < 1.4, ratio


# -- one ledger, on the coordinator --------------------------------------------------------


def test_workers_refuse_runs_and_charges(cluster) -> None:
    with psycopg.connect(cluster.workers[0].uri, autocommit=True) as w:
        _refused(
            w,
            "SELECT dpsql.train('t', NULL, NULL, privacy => 'bolton', epsilon => 1)",
            code="55000",
        )
        _refused(w, "SELECT dpsql.train('t', '{x}', 'y')", code="55000")
        _refused(w, "SELECT dpsql_internal._charge(1, 1, 0, 'bolton')", code="55000")


def test_analyst_trains_privately_and_reaches_no_rows(cluster, coord) -> None:
    X, y = _binary(1000)
    src = _distributed(coord, X, y)
    ds = _register(coord, src, labels=[0, 1])
    login = _analyst(coord, ds)
    shard = _first_shard(coord, src)

    with login(cluster.coordinator) as a:
        mid = _private(a, ds, privacy="bolton", epsilon=1.0, shard_parallel=True)
        assert mid > 0
        _refused(a, f"SELECT * FROM {src} LIMIT 1", code="42501")
        _refused(a, "SELECT * FROM dpsql.model_store LIMIT 1", code="42501")
        _refused(a, "SELECT * FROM dpsql.runs LIMIT 1", code="42501")
    for node in cluster.workers:
        try:
            w = login(node)
        except psycopg.OperationalError:
            continue  # no login there at all: the route is closed
        with w:
            _refused(
                w,
                "SELECT dpsql.train(%s, NULL, NULL, privacy => 'bolton', epsilon => 1)",
                (ds,),
                code="55000",
            )
            visible = w.execute("SELECT to_regclass(%s)", (shard,)).fetchone()[0]
            if visible is not None:
                _refused(w, f"SELECT * FROM {shard} LIMIT 1", code="42501")


def test_a_worker_stopped_mid_training_keeps_the_charge(cluster, coord) -> None:
    """The charge commits before the scan (docs/privacy.md): a worker lost mid-training leaves
    it standing, with no model, and the ledger says the output was lost."""
    X, y = _binary(40000, d=8, seed=7)
    ds = _register(coord, _distributed(coord, X, y), labels=[0, 1])
    ledger, models = (
        _ledger(coord),
        coord.execute("SELECT count(*) FROM dpsql.model_store").fetchone()[0],
    )
    errors: list[BaseException] = []

    def train() -> None:
        try:
            with psycopg.connect(cluster.coordinator.uri, autocommit=True) as c:
                _private(c, ds, privacy="bolton", epsilon=1.0, epochs=200, shard_parallel=True)
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    thread = threading.Thread(target=train)
    thread.start()
    worker = cluster.workers[0]
    with psycopg.connect(worker.uri, autocommit=True) as w:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            busy = w.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE query LIKE '%worker_binary_partial_agg%' AND pid <> pg_backend_pid()"
            ).fetchone()[0]
            if busy:
                break
            time.sleep(0.05)
        else:
            pytest.fail("training never reached the worker")
    cluster.stop_node(worker, mode="immediate")
    thread.join(120)
    cluster.start_node(worker)
    assert errors and isinstance(errors[0], psycopg.Error), errors
    assert _ledger(coord) == ledger + 1
    assert coord.execute(
        "SELECT model_id, outcome FROM dpsql.ledger ORDER BY entry_id DESC LIMIT 1"
    ).fetchone() == (None, "charged, output rolled back")
    assert coord.execute("SELECT count(*) FROM dpsql.model_store").fetchone()[0] == models
    assert coord.execute("SELECT count(*) FROM dpsql.runs").fetchone()[0] == 0
    # the cluster trains again, and charges once more
    _private(coord, ds, privacy="bolton", epsilon=1.0, shard_parallel=True)
    assert _ledger(coord) == ledger + 2


@pytest.mark.parametrize(
    ("mechanism", "model", "regression"),
    [
        ("objective_perturbation", "logistic", False),
        ("output_perturbation", "logistic", False),
        ("exponential_mechanism", "logistic", False),
        ("frank_wolfe", "lasso", True),
    ],
)
def test_erm_toolbox_sums_match_the_local_table(coord, mechanism, model, regression) -> None:
    """The plan-and-fit ERM mechanisms scan exact sums (GLM loss, gradient and Hessian; the
    Frank-Wolfe gradient; the exponential mechanism's grid losses): the same release as on a
    local copy under the same (owner-only) noise seed."""
    rng = np.random.default_rng(8)
    X = rng.uniform(-1, 1, size=(2000, 2)) / np.sqrt(2)
    if regression:
        y = np.clip(X @ np.array([0.6, -0.4]) + 0.05 * rng.normal(size=2000), -1, 1)
        reg: dict[str, Any] = dict(
            label_bound=1.0, feature_bounds="{{-1,1},{-1,1}}", row_norm="clip"
        )
    else:
        y = (X @ np.array([1.0, -1.0]) + 0.2 * rng.normal(size=2000) > 0).astype(float)
        reg = dict(labels=[0, 1], row_norm="clip")
    local = f"l_{uuid.uuid4().hex[:8]}"
    load_numpy(coord, local, X, y)
    releases = []
    for table in (local, _distributed(coord, X, y)):
        ds = _register(coord, table, **reg)
        mid = _private(coord, ds, model=model, privacy=mechanism, epsilon=2.0, noise_seed=5)
        releases.append(_weights(coord, mid))
    np.testing.assert_allclose(releases[1], releases[0], rtol=1e-6, atol=1e-8)


def test_analyst_sees_no_worker_query_and_no_training_shard(cluster, coord) -> None:
    """The epoch queries carry the previous epoch's noiseless state as a constant. They run on
    the workers as the definer role (dpsql_definer), so an analyst's pg_stat_activity shows
    their text to nobody but the owner; the training table's shards refuse the analyst."""
    X, y = _binary(40000, d=8, seed=3)
    src = _distributed(coord, X, y)
    ds = _register(coord, src, labels=[0, 1])
    login = _analyst(coord, ds)

    done = threading.Event()

    def train() -> None:
        try:
            with login(cluster.coordinator) as a:
                _private(a, ds, privacy="bolton", epsilon=1.0, epochs=60, shard_parallel=True)
        finally:
            done.set()

    thread = threading.Thread(target=train)
    thread.start()
    users: set[str] = set()
    seen_by_analyst = 0
    with (
        psycopg.connect(cluster.workers[0].uri, autocommit=True) as w,
        login(cluster.workers[0]) as aw,
    ):
        while not done.is_set():
            users |= {
                u
                for (u,) in w.execute(
                    "SELECT usename FROM pg_stat_activity"
                    " WHERE query LIKE '%worker_binary_partial_agg%' AND pid <> pg_backend_pid()"
                ).fetchall()
            }
            seen_by_analyst += aw.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%sgd_epoch%'"
                " AND pid <> pg_backend_pid()"
            ).fetchone()[0]
            time.sleep(0.01)
    thread.join()
    assert users == {"dpsql_definer"}
    assert seen_by_analyst == 0
    # a run in progress: its training table's shards refuse the analyst on the coordinator
    # and on the workers
    run = prepare(coord, src, labels=[0, 1], shard_parallel=True)
    table = coord.execute(
        "SELECT train_table FROM dpsql.runs WHERE run_id = %s", (run.run_id,)
    ).fetchone()[0]
    shard = _first_shard(coord, table)
    with login(cluster.coordinator) as a:
        _refused(a, f"SELECT * FROM {table} LIMIT 1", code="42501")
    for node in cluster.workers:  # the shard lives on one of them; the schema refuses on both
        with login(node) as aw:
            _refused(aw, f"SELECT * FROM {shard} LIMIT 1", code="42501")
    run.abort()


def test_a_reference_table_trains_as_a_local_table(coord) -> None:
    X, y = _binary(500)
    name = f"r_{uuid.uuid4().hex[:8]}"
    load_numpy(coord, name, X, y)
    coord.execute("SELECT create_reference_table(%s)", (name,))
    mid = _train(coord, name, seed=1)
    assert (
        coord.execute(
            "SELECT params->'distributed' FROM dpsql.model_store WHERE model_id = %s", (mid,)
        ).fetchone()[0]
        is None
    )
    ds = _register(coord, name, labels=[0, 1])
    assert _private(coord, ds, privacy="bolton", epsilon=1.0) > 0


def test_python_api_on_the_cluster(cluster, coord) -> None:
    import dpsql

    X, y = _binary(1500)
    src = _distributed(coord, X, y)
    ds = _register(coord, src, labels=[0, 1])
    with dpsql.connect(cluster.coordinator.uri, install=False) as db:
        owner = db.train(src, "x", "y", labels=[0, 1], shard_parallel=True, progress=False)
        assert owner.row["params"]["distributed"]["shard_count"] == SHARDS
        private = db.train(ds, None, None, privacy=dpsql.BoltOn(epsilon=1.0), shard_parallel=True)
        assert private.row["privacy"] == "bolton"
        assert private.predict(X[:5]).shape == (5,)
        sampled = db.train(
            ds, None, None, privacy=dpsql.DPSGD(epsilon=1.0, delta=1e-6, sampling="poisson")
        )
        assert sampled.row["privacy"] == "dpsgd"
        np.testing.assert_allclose(
            sampled.predict(X[:5]), [sampled.predict(X[i : i + 1])[0] for i in range(5)]
        )


def test_evaluate_pushes_down_and_predict_reads_rows_on_the_coordinator(coord) -> None:
    X, y = _binary(1200)
    src = _distributed(coord, X, y)
    local = f"l_{uuid.uuid4().hex[:8]}"
    load_numpy(coord, local, X, y)
    mid = _train(coord, src, seed=4, shard_parallel=True)
    on_shards, on_local = (
        coord.execute("SELECT value, rows FROM dpsql.evaluate(%s, %s)", (mid, t)).fetchone()
        for t in (src, local)
    )
    assert on_shards[1] == on_local[1] == 1200
    assert on_shards[0] == pytest.approx(on_local[0], abs=1e-12)
    # models live on the coordinator: predict there, over the rows a materialized CTE brings
    with pytest.raises(psycopg.Error):
        coord.execute(f"SELECT dpsql.predict(%s, x) FROM {src}", (mid,)).fetchall()
    predicted = coord.execute(
        f"WITH r AS MATERIALIZED (SELECT rid, x FROM {src})"
        " SELECT count(*) FILTER (WHERE dpsql.predict(%s, x) IS NOT NULL) FROM r",
        (mid,),
    ).fetchone()[0]
    assert predicted == 1200


def test_categorical_columns_and_a_text_label_on_shards(coord) -> None:
    """Issue 27 on Citus: registration's findings, the one-hot encoding and the text label are
    expressions the shards evaluate; a release and its preview agree, and evaluate scores the
    distributed table as the same rows on a local table."""
    name = f"c_{uuid.uuid4().hex[:8]}"
    coord.execute(
        f"""CREATE TABLE {name} AS
            SELECT g AS rid, (g % 10)::float8 / 10 AS a,
                   (ARRAY['red', 'green', 'blue'])[1 + g % 3] AS colour,
                   CASE WHEN g % 3 = 0 THEN 'yes' ELSE 'no' END AS answer
              FROM generate_series(1, 1500) g"""
    )
    local = f"{name}_local"
    coord.execute(f"CREATE TABLE {local} AS SELECT * FROM {name}")
    coord.execute(f"ALTER TABLE {name} ADD PRIMARY KEY (rid)")
    coord.execute("SELECT create_distributed_table(%s, 'rid', shard_count => %s)", (name, SHARDS))
    ds = f"ds_{name}"
    coord.execute(
        "SELECT dpsql.register_dataset(%s, '{a,colour}', 'answer', 100, 0.5, name => %s,"
        """ labels => '{no,yes}', categories => '{"colour": ["red", "green", "blue"]}',"""
        " feature_bounds => '{{0,1}}')",
        (name, ds),
    )
    (plan,) = coord.execute(
        "SELECT dpsql.preview(%s, NULL, NULL, privacy => 'auto', epsilon => 2)", (ds,)
    ).fetchone()
    assert "refused" not in plan and plan["dim"] == 4 and plan["rows"] == 1500
    # the preview read no row: no shard of the source was scanned for values (only counted)
    assert plan["run"]["distributed"]["shard_count"] == SHARDS
    mid = _private(coord, ds, privacy="auto", epsilon=2.0)
    row = coord.execute(
        "SELECT privacy, epsilon FROM dpsql.model_store WHERE model_id = %s", (mid,)
    ).fetchone()
    assert row == (plan["mechanism"], plan["epsilon"])
    on_shards, on_local = (
        coord.execute("SELECT value, rows FROM dpsql.evaluate(%s, %s)", (mid, t)).fetchone()
        for t in (name, local)
    )
    assert on_shards[1] == on_local[1] == 1500
    assert on_shards[0] == pytest.approx(on_local[0], abs=1e-12)
    assert on_shards[0] > 0.9  # colour determines the answer


def test_a_holdout_of_a_distributed_table_is_refused(coord) -> None:
    """Issue 44: a split reads one side through the coordinator's filter, which the shard runs
    would bypass: refused at registration, nothing registered."""
    X, y = _binary(200)
    table = _distributed(coord, X, y)
    with pytest.raises(
        psycopg.errors.FeatureNotSupported, match="holdout of the Citus distributed"
    ):
        _register(coord, table, holdout=0.2)
    assert (
        coord.execute(
            "SELECT count(*) FROM dpsql.datasets WHERE source LIKE %s", (f"%{table}",)
        ).fetchone()[0]
        == 0
    )
