"""Issue 24, finding 1: the charge outlives the caller's transaction (docs/architecture.md, privacy
rule 3).

Each attack is replayed as the role that found it: an analyst trains, reads the model, and
undoes the transaction (ROLLBACK, ROLLBACK TO SAVEPOINT, a PL/pgSQL exception block, a Python
transaction block); a data owner does the same with the estimates on a table they cannot
read. The charge must stay, for every mechanism, and the ledger says the output was lost."""

from __future__ import annotations

import json
import threading
import time
import uuid

import psutil
import psycopg
import pytest
from psycopg import sql

import dpsql
from dpsql import mechanism_spec, server

BUDGET_EXCEEDED = "DP001"
EPSILON = 1.0


@pytest.fixture
def tables(conn, scratch_schema) -> dict[str, str]:
    """A classification table (labels -1/1, 2,000 rows) and a regression one (|y| <= 1, 6,000)."""
    conn.execute(
        "CREATE TABLE cls AS SELECT g AS rid, (g % 10) / 10.0 AS a, -(g % 7) / 7.0 AS b,"
        " CASE WHEN (g % 10) / 10.0 - (g % 7) / 14.0 > 0.2 THEN 1 ELSE -1 END AS y"
        " FROM generate_series(1, 2000) g"
    )
    conn.execute(
        "CREATE TABLE reg AS SELECT g AS rid, (g % 10) / 10.0 AS a, -(g % 7) / 7.0 AS b,"
        " ((g % 10) / 10.0 + (g % 7) / 14.0) / 2 AS y FROM generate_series(1, 6000) g"
    )
    return {"cls": f"{scratch_schema}.cls", "reg": f"{scratch_schema}.reg"}


def _register(conn, source: str, *, budget: float = 100.0, **kw) -> tuple[int, str]:
    name = f"dc_{uuid.uuid4().hex[:8]}"
    extra = "".join(f", {k} => %({k})s" for k in kw)
    (ds,) = conn.execute(
        f"SELECT dpsql.register_dataset(%(source)s, '{{a,b}}', 'y', %(budget)s, 1e-3,"
        f" name => %(name)s, row_norm => 'clip'{extra})",
        {"source": source, "name": name, "budget": budget, **kw},
    ).fetchone()
    return ds, name


def _ledger(conn, ds: int) -> list[tuple]:
    return conn.execute(
        "SELECT entry_id, model_id, mechanism, epsilon, role FROM dpsql.ledger_entries"
        " WHERE dataset_id = %s ORDER BY entry_id",
        (ds,),
    ).fetchall()


def _outcomes(conn, ds: int) -> list[str]:
    return [
        r[0]
        for r in conn.execute(
            "SELECT outcome FROM dpsql.ledger WHERE dataset_id = %s ORDER BY entry_id", (ds,)
        )
    ]


@pytest.fixture
def analyst(conn, tables, make_role):
    """An analyst granted both datasets: (connect, {kind: (dataset_id, name)})."""
    name, connect = make_role("analyst", "dpsql_analyst")
    datasets = {
        "cls": _register(conn, tables["cls"]),
        "reg": _register(conn, tables["reg"], labels=None, label_bound=1.0, row_bound=1.5),
    }
    for ds, _ in datasets.values():
        conn.execute("SELECT dpsql.grant_dataset(%s, %s)", (ds, name))
    return name, connect, datasets


def _sql_argument(name: str, value: object) -> str:
    return f", {name} => " + (f"'{json.dumps(value)}'" if isinstance(value, dict) else str(value))


# What a mechanism needs beyond its defaults to train on these tables at epsilon 1: its
# spec's [small_table] (sql/mechanisms/*.toml), as dpsql.train's named arguments.
EXTRA = {
    name: "".join(_sql_argument(k, v) for k, v in spec.small_table.items())
    for name, spec in mechanism_spec.load_specs().items()
    if spec.small_table
}


def _train_sql(privacy: str, model: str) -> str:
    delta = "" if privacy in EXTRA and "delta" in EXTRA[privacy] else ", delta => 1e-6"
    return (
        f"SELECT dpsql.train(%s, NULL, NULL, model => '{model}', privacy => '{privacy}',"
        f" epsilon => {EPSILON}{delta}{EXTRA.get(privacy, '')})"
    )


def _mechanisms(conn) -> list[tuple[str, str, str]]:
    out = []
    for name, task, models in conn.execute("SELECT name, task, models FROM dpsql.mechanisms()"):
        if task == "regression" or (task == "any" and "logistic" not in models):
            out.append((name, "reg", "lasso" if "lasso" in models else "linear"))
        else:
            out.append((name, "cls", "logistic"))
    return out


# Every mechanism of the specs (sql/mechanisms/*.toml), and auto.
MECHANISMS = [*mechanism_spec.load_specs(), "auto"]


def test_the_server_registers_every_mechanism_tested_here(conn) -> None:
    """The rollback test below runs every spec: the server's registry has the same ones."""
    assert {m for m, _, _ in _mechanisms(conn)} | {"auto"} == set(MECHANISMS)


@pytest.mark.parametrize("privacy", MECHANISMS)
def test_rollback_after_reading_the_model_keeps_the_charge(conn, analyst, privacy) -> None:
    _, connect, datasets = analyst
    kinds = {m: (k, model) for m, k, model in _mechanisms(conn)} | {"auto": ("cls", "logistic")}
    kind, model = kinds[privacy]
    ds, name = datasets[kind]
    before = _ledger(conn, ds)
    with connect() as a:
        a.execute("BEGIN")
        row = a.execute(_train_sql(privacy, model), (name,)).fetchone()
        coef = a.execute("SELECT coef FROM dpsql.models WHERE model_id = %s", row).fetchone()
        assert coef is not None and coef[0] is not None  # the analyst saw the release
        a.execute("ROLLBACK")
    after = _ledger(conn, ds)
    assert len(after) == len(before) + 1, "the rollback took the charge back"
    entry = after[-1]
    assert entry[1] is None and entry[3] > 0  # no model kept; charged
    assert _outcomes(conn, ds)[-1] == "charged, output rolled back"
    kept = conn.execute("SELECT count(*) FROM dpsql.model_store WHERE model_id = %s", row)
    assert kept.fetchone()[0] == 0


def test_a_committed_release_says_released(conn, analyst) -> None:
    user, connect, datasets = analyst
    ds, name = datasets["cls"]
    with connect() as a:
        (mid,) = a.execute(_train_sql("bolton", "logistic"), (name,)).fetchone()
        assert a.execute(
            "SELECT model_id, role, outcome FROM dpsql.ledger WHERE dataset_id = %s", (ds,)
        ).fetchall() == [(mid, user, "released")]


def test_rollback_to_a_savepoint_keeps_the_charge(conn, analyst) -> None:
    _, connect, datasets = analyst
    ds, name = datasets["cls"]
    with connect() as a:
        a.execute("BEGIN")
        a.execute("SAVEPOINT s")
        row = a.execute(_train_sql("bolton", "logistic"), (name,)).fetchone()
        assert a.execute("SELECT coef FROM dpsql.models WHERE model_id = %s", row).fetchone()
        a.execute("ROLLBACK TO SAVEPOINT s")
        a.execute("COMMIT")
    assert [e[3] for e in _ledger(conn, ds)] == [EPSILON]
    assert _outcomes(conn, ds) == ["charged, output not kept"]


def test_an_exception_block_keeps_the_charge(conn, analyst) -> None:
    """RAISE NOTICE the coefficients, then RAISE EXCEPTION inside BEGIN ... EXCEPTION."""
    _, connect, datasets = analyst
    ds, name = datasets["cls"]
    notices: list[str] = []
    with connect() as a:
        a.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        a.execute(
            sql.SQL(
                """DO $$
                DECLARE m bigint;
                BEGIN
                    BEGIN
                        m := dpsql.train({name}, NULL, NULL, privacy => 'bolton', epsilon => 1);
                        RAISE NOTICE 'stolen %', (SELECT coef FROM dpsql.models WHERE model_id = m);
                        RAISE EXCEPTION 'undo';
                    EXCEPTION WHEN raise_exception THEN NULL;
                    END;
                END $$"""
            ).format(name=sql.Literal(name))
        )
    assert any(n.startswith("stolen {") for n in notices)
    assert [e[3] for e in _ledger(conn, ds)] == [EPSILON]


def test_python_transaction_block_keeps_the_charge(conn, analyst) -> None:
    _, connect, datasets = analyst
    ds, name = datasets["cls"]
    with connect() as a:
        db = dpsql.connect(a, install=False)
        with pytest.raises(RuntimeError), a.transaction():
            privacy = dpsql.BoltOn(epsilon=EPSILON)
            model = db.train(name, None, None, privacy=privacy, progress=False)
            assert model.coef_ is not None
            raise RuntimeError("undo")
    assert [e[3] for e in _ledger(conn, ds)] == [EPSILON]


def test_rolled_back_releases_exhaust_the_budget(conn, tables, make_role) -> None:
    """The red team's averaging attack: free releases until the budget is gone, then none."""
    user, connect = make_role("analyst", "dpsql_analyst")
    ds, name = _register(conn, tables["cls"], budget=3 * EPSILON)
    conn.execute("SELECT dpsql.grant_dataset(%s, %s)", (ds, user))
    with connect() as a:
        for _ in range(3):
            a.execute("BEGIN")
            a.execute(_train_sql("bolton", "logistic"), (name,))
            a.execute("ROLLBACK")
        a.execute("BEGIN")
        with pytest.raises(psycopg.Error) as err:
            a.execute(_train_sql("bolton", "logistic"), (name,))
        assert err.value.sqlstate == BUDGET_EXCEEDED
        a.execute("ROLLBACK")
    assert len(_ledger(conn, ds)) == 3


# ------------------------------------------------------------------------ data owners


@pytest.fixture
def foreign_dataset(conn, scratch_schema, make_role):
    """A regression dataset registered without a label bound or feature bounds by one owner,
    granted to a second owner who cannot read its table: (connect as the second, name, id,
    connect as the registering owner)."""
    conn.execute(
        "CREATE TABLE secret AS SELECT g AS rid, (g % 10)::float8 AS a, (g % 7)::float8 AS b,"
        " (g % 13)::float8 AS y FROM generate_series(1, 2000) g"
    )
    owner, connect_owner = make_role("owner", "dpsql_admin")
    other, connect = make_role("other", "dpsql_admin")
    conn.execute(f"GRANT USAGE ON SCHEMA {scratch_schema} TO {owner}")
    conn.execute(f"GRANT SELECT ON {scratch_schema}.secret TO {owner}")
    name = f"secret_{uuid.uuid4().hex[:8]}"
    with connect_owner() as o:
        (ds,) = o.execute(
            "SELECT dpsql.register_dataset(%s, '{a,b}', 'y', 100, 1e-3, name => %s,"
            " labels => NULL, regression => true)",
            (f"{scratch_schema}.secret", name),
        ).fetchone()
        o.execute("SELECT dpsql.grant_dataset(%s, %s)", (ds, other))
    return connect, name, ds, connect_owner


@pytest.mark.parametrize(
    "call",
    [
        "SELECT dpsql.estimate_label_bound(%s, 1, '{0,100}')",
        "SELECT dpsql.estimate_bounds(%s, 1, '{-100,100}')",
    ],
)
def test_an_owner_cannot_roll_back_an_estimate(conn, foreign_dataset, call) -> None:
    connect, name, ds, connect_owner = foreign_dataset
    with connect() as x, pytest.raises(psycopg.errors.InsufficientPrivilege, match="registered by"):
        x.execute(call, (name,))  # another data owner's estimate (issue 41)
    with connect_owner() as o:
        o.execute("BEGIN")
        assert o.execute(call, (name,)).fetchone()[0] is not None
        o.execute("ROLLBACK")
    assert [e[3] for e in _ledger(conn, ds)] == [1.0]
    assert _outcomes(conn, ds) == ["charged, output rolled back"]


@pytest.mark.parametrize(
    "call",
    [
        "SELECT dpsql.estimate_label_bound(%s, 1, '{0,100}', noise_seed => 1)",
        "SELECT dpsql.estimate_bounds(%s, 1, '{-100,100}', noise_seed => 1)",
        "SELECT dpsql.train(%s, NULL, NULL, 'linear', privacy => 'adassp', epsilon => 1,"
        " delta => 1e-6, noise_seed => 1)",
    ],
)
def test_noise_seed_needs_the_right_to_read_the_rows(conn, foreign_dataset, call) -> None:
    connect, name, ds, _ = foreign_dataset
    if "train" in call:  # training needs the label bound (the superuser reads the rows)
        conn.execute("SELECT dpsql.estimate_label_bound(%s, 1, '{0,100}')", (name,))
    before = _ledger(conn, ds)
    with connect() as o, pytest.raises(psycopg.Error) as err:
        o.execute(call, (name,))
    # (estimates are the registering owner's only, issue 41)
    assert err.value.sqlstate == "42501"
    assert ("noise_seed" if "train" in call else "registered by") in str(err.value)
    assert _ledger(conn, ds) == before


def test_registration_with_estimates_charges_with_the_dataset(conn, tables) -> None:
    """The one charge in the caller's transaction: the dataset it is charged to is created by
    that transaction (by an owner who reads every row), so both stay or neither exists."""
    name = f"est_{uuid.uuid4().hex[:8]}"
    conn.execute("BEGIN")
    (ds,) = conn.execute(
        "SELECT dpsql.register_dataset(%s, '{a,b}', 'y', 10, 0, name => %s, labels => NULL,"
        ' regression => true, estimate => \'{"label_bound": {"epsilon": 0.5,'
        ' "search_range": [0, 10]}}\')',
        (tables["reg"], name),
    ).fetchone()
    assert [e[3] for e in _ledger(conn, ds)] == [0.5]
    conn.execute("ROLLBACK")
    gone = conn.execute("SELECT count(*) FROM dpsql.datasets WHERE name = %s", (name,))
    assert gone.fetchone()[0] == 0
    conn.execute(
        "SELECT dpsql.register_dataset(%s, '{a,b}', 'y', 10, 0, name => %s, labels => NULL,"
        ' regression => true, estimate => \'{"label_bound": {"epsilon": 0.5,'
        ' "search_range": [0, 10]}}\')',
        (tables["reg"], name),
    )
    assert conn.execute(
        "SELECT l.epsilon, l.outcome FROM dpsql.ledger l WHERE l.dataset = %s",
        (name,),
    ).fetchall() == [(0.5, "released")]


# ------------------------------------------------------------------------ the charge path


def test_a_charge_that_waits_on_its_own_transaction_is_refused(conn, analyst) -> None:
    """The caller changed the dataset's row and did not commit: the charge's transaction would
    wait for it forever; it is refused at once instead, and nothing is charged."""
    _, _, datasets = analyst
    ds, name = datasets["cls"]
    conn.execute("BEGIN")
    conn.execute("UPDATE dpsql.datasets SET epsilon_budget = 50 WHERE dataset_id = %s", (ds,))
    with pytest.raises(psycopg.Error) as err:
        conn.execute(_train_sql("bolton", "logistic"), (name,))
    assert err.value.sqlstate == "55P03" and "your own transaction" in str(err.value)
    conn.execute("ROLLBACK")
    assert _ledger(conn, ds) == []


def test_a_read_only_transaction_is_refused_before_the_charge(conn, analyst) -> None:
    _, connect, datasets = analyst
    ds, name = datasets["cls"]
    with connect() as a:
        a.execute("BEGIN READ ONLY")
        with pytest.raises(psycopg.Error) as err:
            a.execute(_train_sql("bolton", "logistic"), (name,))
        assert err.value.sqlstate == "25006"
        a.execute("ROLLBACK")
    assert _ledger(conn, ds) == []


def test_the_charge_function_is_not_callable_by_analysts_or_owners(conn, make_role) -> None:
    for group in ("dpsql_analyst", "dpsql_admin"):
        _, connect = make_role("probe", group)
        with connect() as c:
            for call in (
                "SELECT dpsql_internal._charge_durably('{}')",
                "SELECT dpsql_internal._charge_committed('{}')",
                "SELECT dpsql_internal._charge(1, 1, 0, 'x')",
            ):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    c.execute(call)


def _local_pid(conn, pid: int) -> psutil.Process:
    """The server process pid, or a skip when the server's processes are not on this machine."""
    path = str(conn.execute("SHOW data_directory").fetchone()[0])
    try:
        process = psutil.Process(pid)
        if process.cwd() == path:
            return process
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass
    pytest.skip("the server's processes are not visible from here")


def _kill_9(process: psutil.Process) -> None:
    """SIGKILL a backend, and return once the postmaster has begun restarting the server: its
    checkpointer from before the kill is gone. Until then the server still answers, and a
    connection made in that moment dies in the restart (a CI run on 2026-11-29 saw it)."""
    postmaster = process.parent()
    old = [p for p in postmaster.children() if "checkpointer" in " ".join(p.cmdline())]
    assert old, "no checkpointer among the postmaster's children"
    process.kill()
    deadline = time.monotonic() + 180
    while any(p.is_running() for p in old):
        assert time.monotonic() < deadline, "the postmaster did not restart the server"
        time.sleep(0.05)


def _reconnect(server_uri: str) -> psycopg.Connection:
    """A connection once crash recovery is over (longer on a loaded machine). The server may
    still answer for a moment after the kill, before the postmaster restarts it: a connection
    that fails then is tried again, up to three minutes in all."""
    deadline = time.monotonic() + 180
    while True:
        server.wait_until_ready(server_uri, max(1, int(deadline - time.monotonic())))
        try:
            conn = psycopg.connect(server_uri, autocommit=True)
            conn.execute("SELECT 1")
            return conn
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@pytest.mark.crash
def test_kill_9_mid_release_leaves_the_charge(own_server_uri) -> None:
    """A backend killed after its charge committed, while it trains: the server restarts
    (crash recovery), the charge stands, no model exists, and the ledger says the output was
    lost. On a server of its own (the shared one would replay its WAL under every other test)."""
    server_uri = own_server_uri
    conn = psycopg.connect(server_uri, autocommit=True)
    conn.execute(
        "CREATE TABLE big AS SELECT g AS rid, (g % 10) / 10.0 AS a, -(g % 7) / 7.0 AS b,"
        " CASE WHEN g % 3 = 0 THEN 1 ELSE -1 END AS y FROM generate_series(1, 50000) g"
    )
    conn.execute("CHECKPOINT")  # a short recovery after the kill, loaded machine or not
    ds, name = _register(conn, "public.big")
    victim = psycopg.connect(server_uri, autocommit=True)
    pid = victim.execute("SELECT pg_backend_pid()").fetchone()[0]
    process = _local_pid(conn, pid)
    errors: list[BaseException] = []

    def release() -> None:
        try:
            victim.execute(
                "SELECT dpsql.train(%s, NULL, NULL, privacy => 'bolton', epsilon => 1,"
                " epochs => 200)",
                (name,),
            )
        except psycopg.Error as err:
            errors.append(err)

    thread = threading.Thread(target=release)
    thread.start()
    for _ in range(600):
        if _ledger(conn, ds):
            break
        time.sleep(0.05)
    assert _ledger(conn, ds), "no charge committed while the release ran"
    _kill_9(process)  # the postmaster restarts the whole server
    thread.join(60)
    assert errors, "the release finished before the kill: make it longer"
    conn.close()
    with _reconnect(server_uri) as after:
        entries = _ledger(after, ds)
        assert [(e[1], e[3]) for e in entries] == [(None, 1.0)]
        assert _outcomes(after, ds) == ["charged, output rolled back"]
        models = "SELECT count(*) FROM dpsql.model_store WHERE dataset_id = %s"
        assert after.execute(models, (ds,)).fetchone()[0] == 0


# ------------------------------------------------------- every variant, every entry point

VARIANTS = ["rollback", "savepoint", "exception_block", "python"]


def _undo(c: psycopg.Connection, variant: str, call: str, args: tuple) -> None:
    """Run call (returning a value), look at its output, and undo the caller's transaction."""
    if variant == "rollback":
        c.execute("BEGIN")
        assert c.execute(call, args).fetchone()[0] is not None
        c.execute("ROLLBACK")
    elif variant == "savepoint":
        c.execute("BEGIN")
        c.execute("SAVEPOINT s")
        assert c.execute(call, args).fetchone()[0] is not None
        c.execute("ROLLBACK TO SAVEPOINT s")
        c.execute("COMMIT")
    elif variant == "exception_block":
        body = call.replace("SELECT ", "", 1).replace("{", "{{").replace("}", "}}")
        body = body.replace("%s", "{}")
        c.execute(
            sql.SQL(
                "DO $$ BEGIN BEGIN RAISE NOTICE 'out %', " + body + "; RAISE EXCEPTION 'undo';"
                " EXCEPTION WHEN raise_exception THEN NULL; END; END $$"
            ).format(*(sql.Literal(a) for a in args))
        )
    else:
        with pytest.raises(RuntimeError), c.transaction():
            assert c.execute(call, args).fetchone()[0] is not None
            raise RuntimeError("undo")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(
    "call",
    [
        "SELECT dpsql.train(%s, NULL, NULL, privacy => 'bolton', epsilon => 1)",
        "SELECT dpsql.train(%s, NULL, NULL, privacy => 'auto', epsilon => 1, delta => 1e-6)",
    ],
)
def test_no_variant_takes_an_analysts_charge_back(conn, analyst, variant, call) -> None:
    _, connect, datasets = analyst
    ds, name = datasets["cls"]
    with connect() as a:
        _undo(a, variant, call, (name,))
    assert [e[3] for e in _ledger(conn, ds)] == [1.0]
    assert _outcomes(conn, ds)[0].startswith("charged, ")


@pytest.mark.parametrize("variant", VARIANTS)
def test_no_variant_takes_a_describe_charge_back(conn, analyst, variant) -> None:
    """dpsql.describe (issue 44): the charge stays; its output is the rows it returned, so a
    committed transaction says released (the classification label: no bounds needed)."""
    _, connect, datasets = analyst
    ds, name = datasets["cls"]
    with connect() as a:
        _undo(a, variant, "SELECT count(*) FROM dpsql.describe(%s, 1, features => '{y}')", (name,))
    assert [(e[2], e[3]) for e in _ledger(conn, ds)] == [("describe", 1.0)]
    assert _outcomes(conn, ds)[0] in ("released", "charged, output rolled back")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(
    "call",
    [
        "SELECT dpsql.estimate_label_bound(%s, 1, '{0,100}')",
        "SELECT dpsql.estimate_bounds(%s, 1, '{-100,100}')",
    ],
)
def test_no_variant_takes_an_owners_charge_back(conn, foreign_dataset, variant, call) -> None:
    _, name, ds, connect_owner = foreign_dataset
    with connect_owner() as o:
        _undo(o, variant, call, (name,))
    assert [e[3] for e in _ledger(conn, ds)] == [1.0]
    assert _outcomes(conn, ds)[0].startswith("charged, ")
