"""Issue 44, item 3: dpsql.tune selects privately among candidates, releases only the best
model, and charges each dataset once, before any row is read, within the epsilon given."""

from __future__ import annotations

import uuid

import psycopg
import pytest

CANDIDATES = '[{"privacy": "bolton"}, {"privacy": "bolton", "epochs": 1, "step_size": 1e-4}]'


@pytest.fixture
def split(conn, scratch_schema) -> tuple[int, str, int, str]:
    """A 6,000-row classification table split 0.25 into (train id, name, holdout id, name)."""
    conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, a float8, b float8, y int)")
    conn.execute(
        "INSERT INTO t SELECT g, (g % 10) / 10.0, -(g % 7) / 7.0,"
        " CASE WHEN (g % 10) / 10.0 - (g % 7) / 14.0 > 0.2 THEN 1 ELSE -1 END"
        " FROM generate_series(1, 6000) g"
    )
    name = f"tu_{uuid.uuid4().hex[:8]}"
    (ds,) = conn.execute(
        "SELECT dpsql.register_dataset(%s, '{a,b}', 'y', 10, 1e-5,"
        " feature_bounds => '{{0,1},{-1,0}}', name => %s, holdout => 0.25)",
        (f"{scratch_schema}.t", name),
    ).fetchone()
    (hold,) = conn.execute(
        "SELECT dataset_id FROM dpsql.datasets WHERE name = %s", (name + "_holdout",)
    ).fetchone()
    return ds, name, hold, name + "_holdout"


@pytest.fixture
def analyst(conn, split, make_role):
    ds, name, hold, hname = split
    role, connect = make_role("analyst", "dpsql_analyst")
    for d in (ds, hold):
        conn.execute("SELECT dpsql.grant_dataset(%s, %s)", (d, role))
    return role, connect


def _entries(conn, ds: int) -> list[tuple]:
    return conn.execute(
        "SELECT mechanism, epsilon, delta, model_id FROM dpsql.ledger_entries"
        " WHERE dataset_id = %s ORDER BY entry_id",
        (ds,),
    ).fetchall()


def test_tune_releases_one_model_and_charges_each_dataset_once(conn, split, analyst) -> None:
    ds, name, hold, hname = split
    _, connect = analyst
    with connect() as a:
        (m,) = a.execute(
            "SELECT dpsql.tune(%s, %s, 1.5, 0, candidates => %s)", (name, hname, CANDIDATES)
        ).fetchone()
        info = a.execute(
            "SELECT privacy, params->'tune' FROM dpsql.models WHERE model_id = %s", (m,)
        ).fetchone()
        # only the winner is visible: no other model of this dataset exists
        models = a.execute(
            "SELECT model_id FROM dpsql.models WHERE dataset_id = %s", (ds,)
        ).fetchall()
    assert models == [(m,)]
    assert info[0] == "bolton"
    tune = info[1]
    assert tune["metric"] == "accuracy" and tune["candidate"] in (1, 2) and tune["runs"] >= 1
    assert 0 <= tune["score"] <= 1.2
    # Liu-Talwar: 3 x 0.5 on each side, delta 0; the ledger links the winner
    assert _entries(conn, ds) == [("tune", pytest.approx(1.5), 0.0, m)]
    assert _entries(conn, hold) == [("tune", pytest.approx(1.5), 0.0, m)]
    assert conn.execute("SELECT count(*) FROM dpsql_internal.tune_prepaid").fetchone()[0] == 0


def test_the_best_candidate_wins_when_the_scores_are_clear(conn, split, analyst) -> None:
    """A candidate that cannot learn (one epoch at a step of 1e-6) against the default bolt-on:
    with 20 epsilon per side the noisy accuracies are far apart, so every selection that
    tried the good one keeps it (seeded: the runs and noise are fixed)."""
    ds, name, hold, hname = split
    for d in (name, hname):
        conn.execute("SELECT dpsql.alter_dataset(%s, epsilon_budget => 100)", (d,))
    for seed in range(3):
        (m,) = conn.execute(
            "SELECT dpsql.tune(%s, %s, 20, 0, candidates => %s, noise_seed => %s)",
            (
                name,
                hname,
                '[{"privacy": "bolton", "epochs": 1, "step_size": 1e-6}, {"privacy": "bolton"}]',
                seed,
            ),
        ).fetchone()
        tune = conn.execute(
            "SELECT params->'tune' FROM dpsql.models WHERE model_id = %s", (m,)
        ).fetchone()[0]
        assert tune["candidate"] == 2, tune


def test_refusals_come_before_any_charge(conn, split, analyst) -> None:
    ds, name, hold, hname = split
    _, connect = analyst
    cases = [
        ((name, name, 1.0, 0, CANDIDATES), "validation dataset other than"),
        ((name, hname, -1.0, 0, CANDIDATES), "epsilon must be a finite number"),
        ((name, hname, 1.0, 0, '{"privacy": "bolton"}'), "candidates must be a JSON array"),
        ((name, hname, 1.0, 0, '[{"epochs": 3}]'), "must be an object of dpsql.train arguments"),
        ((name, hname, 1.0, 0, '[{"privacy": "bolton", "epsilon": 3}]'), "may set"),
        ((name, hname, 1.0, 0, '[{"privacy": "bolton", "source": "x"}]'), "may set"),
        ((name, hname, 1.0, 0, '[{"privacy": "bolton", "nope\\"; --": 1}]'), "may set"),
        ((name, hname, 1.0, 0, '[{"privacy": "dpsgd"}]'), "needs delta > 0"),
        ((name, hname, 1.0, 0, '[{"privacy": "nonesuch"}]'), "privacy must be auto or a mechanism"),
        ((name, hname, 1.0, 0, '[{"privacy": "none"}]'), "privacy must be auto or a mechanism"),
        ((name, hname, 1.0, 0, '[{"privacy": ["bolton"]}]'), "privacy must be auto or a mechanism"),
        ((name, hname, 1.0, 0, '[{"privacy": "bolton", "epochs": "x"}]'), "is refused|invalid"),
        ((name, hname, 100.0, 0, CANDIDATES), "budget"),
    ]
    # the training dataset's budget too, before the validation's charge
    conn.execute("SELECT dpsql.alter_dataset(%s, epsilon_budget => 200)", (hname,))
    cases.append(((name, hname, 100.0, 0, CANDIDATES), f"budget of dataset '{name}' exceeded"))
    with connect() as a:
        for args, message in cases:
            with pytest.raises(psycopg.Error, match=message):
                a.execute("SELECT dpsql.tune(%s, %s, %s, %s, candidates => %s)", args)
        with pytest.raises(psycopg.Error, match="noise_seed"):
            a.execute(
                "SELECT dpsql.tune(%s, %s, 1, 0, candidates => %s, noise_seed => 1)",
                (name, hname, CANDIDATES),
            )
        with pytest.raises(psycopg.Error, match="selects on"):
            a.execute(
                "SELECT dpsql.tune(%s, %s, 1, 0, candidates => %s, metric => 'mse')",
                (name, hname, CANDIDATES),
            )
    assert _entries(conn, ds) == [] and _entries(conn, hold) == []


def test_preview_tune_says_what_tune_charges(conn, split, analyst) -> None:
    ds, name, hold, hname = split
    _, connect = analyst
    with connect() as a:
        (p,) = a.execute(
            "SELECT dpsql.preview_tune(%s, %s, 1.5, 0, candidates => %s)", (name, hname, CANDIDATES)
        ).fetchone()
        (refused,) = a.execute(
            "SELECT dpsql.preview_tune(%s, %s, 100, 0, candidates => %s)", (name, hname, CANDIDATES)
        ).fetchone()
    assert "refused" not in p, p
    assert [c["dataset"] for c in p["charges"]] == [hname, name]
    assert [c["epsilon"] for c in p["charges"]] == [pytest.approx(1.5), pytest.approx(1.5)]
    assert p["run_epsilon"] == pytest.approx(0.5) and len(p["candidates"]) == 2
    assert all(b["exceeded"] is False for b in p["budgets"])
    assert any(b["exceeded"] for b in refused["budgets"])
    assert _entries(conn, ds) == [] and _entries(conn, hold) == []


def test_approximate_selection_fits_its_epsilon(conn, split, analyst) -> None:
    """delta > 0: the training side's charge is Papernot-Steinke's bound over the candidates'
    curves, at most epsilon; the validation side stays pure."""
    ds, name, hold, hname = split
    _, connect = analyst
    with connect() as a:
        (p,) = a.execute(
            "SELECT dpsql.preview_tune(%s, %s, 2, 1e-6, candidates => %s)",
            (name, hname, '[{"privacy": "dpsgd", "sampling": "poisson"}, {"privacy": "bolton"}]'),
        ).fetchone()
    train = p["charges"][1]
    assert 0.97 * 2 <= train["epsilon"] <= 2 and train["delta"] == 1e-6
    assert p["run_epsilon"] < 2 / 3 * 1.2
    assert p["charges"][0]["epsilon"] == pytest.approx(2) and p["charges"][0]["delta"] == 0


def test_a_rollback_keeps_the_charges(conn, split, analyst) -> None:
    ds, name, hold, hname = split
    _, connect = analyst
    with connect() as a:
        a.execute("BEGIN")
        assert a.execute(
            "SELECT dpsql.tune(%s, %s, 1.5, 0, candidates => %s)", (name, hname, CANDIDATES)
        ).fetchone()[0]
        a.execute("ROLLBACK")
    assert [e[:3] for e in _entries(conn, ds)] == [("tune", pytest.approx(1.5), 0.0)]
    assert [e[:3] for e in _entries(conn, hold)] == [("tune", pytest.approx(1.5), 0.0)]
    assert (
        conn.execute(
            "SELECT count(*) FROM dpsql.model_store WHERE dataset_id = %s", (ds,)
        ).fetchone()[0]
        == 0
    )


def test_a_forged_prepaid_row_is_out_of_reach(split, analyst) -> None:
    _, connect = analyst
    with connect() as a:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            a.execute(
                "INSERT INTO dpsql_internal.tune_prepaid VALUES"
                " (pg_backend_pid(), pg_current_xact_id(), 1, 1, 100, 0)"
            )
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            a.execute("SELECT dpsql_internal._tune_prepaid_entry(1, 1, 0)")


def test_train_auto_with_validation_runs_the_selection(conn, split, analyst) -> None:
    """privacy => 'auto', validation => the holdout: auto's candidates through tune."""
    ds, name, hold, hname = split
    _, connect = analyst
    with connect() as a:
        (m,) = a.execute(
            "SELECT dpsql.train(%s, NULL, NULL, privacy => 'auto', epsilon => 1.5, delta => 0,"
            " validation => %s)",
            (name, hname),
        ).fetchone()
        tune = a.execute(
            "SELECT params->'tune' FROM dpsql.models WHERE model_id = %s", (m,)
        ).fetchone()[0]
        with pytest.raises(psycopg.Error, match="privacy => 'auto' only"):
            a.execute(
                "SELECT dpsql.train(%s, NULL, NULL, privacy => 'bolton', epsilon => 1,"
                " validation => %s)",
                (name, hname),
            )
        with pytest.raises(psycopg.Error, match="chooses epochs itself"):
            a.execute(
                "SELECT dpsql.train(%s, NULL, NULL, privacy => 'auto', epsilon => 1, epochs => 3,"
                " validation => %s)",
                (name, hname),
            )
    assert [c["privacy"] for c in tune["candidates"]][:2] == ["auto", "objective_perturbation"]
    assert [e[:3] for e in _entries(conn, ds)] == [("tune", pytest.approx(1.5), 0.0)]


@pytest.mark.parametrize("variant", ["savepoint", "exception_block", "python"])
def test_no_variant_takes_the_selections_charges_back(conn, split, analyst, variant) -> None:
    """As tests/server/test_durable_charge.py does for every release: a savepoint rolled back,
    a PL/pgSQL exception block, a Python transaction block that raises."""
    from tests.server.test_durable_charge import _undo

    ds, name, hold, hname = split
    _, connect = analyst
    with connect() as a:
        _undo(a, variant, "SELECT dpsql.tune(%s, %s, 1.5, 0, candidates => %s)",
              (name, hname, CANDIDATES))  # fmt: skip
    assert [e[:3] for e in _entries(conn, ds)] == [("tune", pytest.approx(1.5), 0.0)]
    assert [e[:3] for e in _entries(conn, hold)] == [("tune", pytest.approx(1.5), 0.0)]
    assert (
        conn.execute(
            "SELECT count(*) FROM dpsql.model_store WHERE dataset_id = %s", (ds,)
        ).fetchone()[0]
        == 0
    )
    outcomes = conn.execute(
        "SELECT outcome FROM dpsql.ledger WHERE dataset_id IN (%s, %s)", (ds, hold)
    ).fetchall()
    assert {o for (o,) in outcomes} <= {"charged, output rolled back", "charged, output not kept"}


def test_hostile_session_settings_change_nothing(conn, server_uri, split) -> None:
    """The same seeded selection, bit for bit (the winner, its score, its weights), in a calm
    session and under test_pinned_settings' hostile settings."""
    from psycopg.rows import dict_row

    from tests.server.test_pinned_settings import _set_hostile

    ds, name, hold, hname = split
    for d in (name, hname):
        conn.execute("SELECT dpsql.alter_dataset(%s, epsilon_budget => 100)", (d,))
    results = []
    for hostile in (False, True):
        with psycopg.connect(server_uri, autocommit=True) as c:
            if hostile:
                _set_hostile(c)
            (m,) = c.execute(
                "SELECT dpsql.tune(%s, %s, 3, 0, candidates => %s, noise_seed => 7)",
                (name, hname, CANDIDATES),
            ).fetchone()
            with c.cursor(row_factory=dict_row, binary=True) as cur:
                row = cur.execute(
                    "SELECT weights, params->'tune' AS tune FROM dpsql.model_store"
                    " WHERE model_id = %s",
                    (m,),
                ).fetchone()
            results.append(row)
    assert results[0] == results[1]


def test_regression_defaults_reach_every_candidate(conn, scratch_schema) -> None:
    """The default regression candidates name the linear model (they were previewed as
    logistic, refused and left out), auto's own choice first, and the per-run epsilon is
    searched over a fixed set: the training side's charge is close to epsilon."""
    conn.execute("CREATE TABLE r (id bigint PRIMARY KEY, a float8, b float8, y float8)")
    conn.execute(
        "INSERT INTO r SELECT g, (g % 10) / 10.0, -(g % 7) / 7.0,"
        " (g % 10) / 10.0 - (g % 7) / 14.0 + 0.1 * sin(g) FROM generate_series(1, 20000) g"
    )
    name = f"tr_{uuid.uuid4().hex[:8]}"
    conn.execute(
        "SELECT dpsql.register_dataset(%s, '{a,b}', 'y', 10, 1e-5, labels => NULL,"
        " label_bound => 2, feature_bounds => '{{0,1},{-1,0}}', name => %s, holdout => 0.25)",
        (f"{scratch_schema}.r", name),
    )
    (p,) = conn.execute(
        "SELECT dpsql.preview_tune(%s, %s, 1, 1e-6)", (name, name + "_holdout")
    ).fetchone()
    assert "refused" not in p, p
    privacy = [c["candidate"]["privacy"] for c in p["candidates"]]
    # (AdaSSP, known only as (epsilon, delta)-DP, has no Renyi curve: left out of the default set)
    assert privacy[0] == "auto" and "adassp" not in privacy and len(privacy) >= 2, privacy
    assert p["candidates"][0]["mechanism"] in ("dpgd", "dpsgd_f")
    assert 0.97 <= p["charges"][1]["epsilon"] <= 1.0
    # Gaussian candidates only (no flat pure curve in the maximum): each run gets about half
    assert p["run_epsilon"] > 0.45, p["run_epsilon"]


@pytest.mark.crash
def test_kill_9_mid_selection_leaves_both_charges(own_server_uri) -> None:
    """A backend killed while tune trains its candidates, after both charges committed: the
    server restarts, both charges stand, the ledger says the output was lost, no model exists
    and no prepaid row survives. On a server of its own (as test_durable_charge's kill test)."""
    import threading
    import time

    from tests.server.test_durable_charge import _kill_9, _local_pid, _outcomes, _reconnect

    conn = psycopg.connect(own_server_uri, autocommit=True)
    conn.execute("CREATE TABLE big (id bigint PRIMARY KEY, a float8, b float8, y int)")
    conn.execute(
        "INSERT INTO big SELECT g, (g % 10) / 10.0, -(g % 7) / 7.0,"
        " CASE WHEN g % 3 = 0 THEN 1 ELSE -1 END FROM generate_series(1, 50000) g"
    )
    conn.execute(
        "SELECT dpsql.register_dataset('public.big', '{a,b}', 'y', 100, 0, name => 'big',"
        " feature_bounds => '{{0,1},{-1,0}}', holdout => 0.2)"
    )
    conn.execute("CHECKPOINT")  # a short recovery after the kill, loaded machine or not
    ids: dict[str, int] = dict(
        conn.execute("SELECT name, dataset_id FROM dpsql.datasets").fetchall()
    )
    victim = psycopg.connect(own_server_uri, autocommit=True)
    process = _local_pid(conn, victim.execute("SELECT pg_backend_pid()").fetchone()[0])
    errors: list[BaseException] = []

    def release() -> None:
        try:
            victim.execute(
                "SELECT dpsql.tune('big', 'big_holdout', 3, 0, candidates =>"
                ' \'[{"privacy": "bolton", "epochs": 200}, {"privacy": "bolton", "epochs": 150}]\')'
            )
        except psycopg.Error as err:
            errors.append(err)

    thread = threading.Thread(target=release)
    thread.start()
    for _ in range(600):
        if len(_entries(conn, ids["big"])) == 1:
            break
        time.sleep(0.05)
    assert _entries(conn, ids["big"]), "no charge committed while the selection ran"
    _kill_9(process)  # the postmaster restarts the whole server
    thread.join(60)
    assert errors, "the selection finished before the kill: make it longer"
    conn.close()
    with _reconnect(own_server_uri) as after:
        for name in ("big", "big_holdout"):
            assert [e[:3] for e in _entries(after, ids[name])] == [
                ("tune", pytest.approx(3.0), 0.0)
            ]
            assert _outcomes(after, ids[name]) == ["charged, output rolled back"]
        assert after.execute("SELECT count(*) FROM dpsql.model_store").fetchone()[0] == 0
        assert after.execute("SELECT count(*) FROM dpsql_internal.tune_prepaid").fetchone()[0] == 0
