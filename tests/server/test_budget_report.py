"""Re-accounting the ledger (issue 16, docs/privacy.md): every entry's DpEvent, the budget report
next to dp-accounting computed here, who may read it, and datasets charged by PLD composition
instead of summation. A real server; the accountant runs as the server runs it."""

from __future__ import annotations

import json
import uuid

import numpy as np
import psycopg
import pytest
from psycopg import errors
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from dpsql.pld_settings import dp_accounting_version
from tests.pg_helpers import load

dpa = pytest.importorskip("dp_accounting")
from dp_accounting.pld import PLDAccountant  # noqa: E402
from dp_accounting.pld import common as pld_common  # noqa: E402
from dp_accounting.pld import privacy_loss_distribution as pld_lib  # noqa: E402
from dp_accounting.rdp import RdpAccountant  # noqa: E402

NR = dpa.NeighboringRelation
BUDGET_EXCEEDED = "DP001"


@pytest.fixture
def make_dataset(conn, scratch_schema):
    """Factory: a fresh registered table; returns (dataset_id, name)."""

    def make(epsilon_budget: float, delta_budget: float, composition: str | None = None):
        name = f"t_{uuid.uuid4().hex[:10]}"
        conn.execute(
            f"CREATE TABLE {name} AS SELECT g::float8 AS f, (g % 2) * 2 - 1 AS y"
            " FROM generate_series(1, 10) g"
        )
        (ds,) = conn.execute(
            "SELECT dpsql.register_dataset(%s, '{f}', 'y', %s, %s, name => %s, composition => %s)",
            (f"{scratch_schema}.{name}", epsilon_budget, delta_budget, name, composition),
        ).fetchone()
        return ds, name

    return make


def _charge(conn, ds, epsilon, delta, event=None, mechanism="test") -> int:
    return conn.execute(
        "SELECT dpsql_internal._charge(%s, %s, %s, %s, dp_event => %s)",
        (ds, epsilon, delta, mechanism, None if event is None else Jsonb(event)),
    ).fetchone()[0]


def _report(c: psycopg.Connection, name: str) -> dict:
    with c.cursor(row_factory=dict_row) as cur:
        return cur.execute("SELECT * FROM dpsql.budget_report(%s)", (name,)).fetchone()


def _entries(conn, ds) -> int:
    return conn.execute(
        "SELECT count(*) FROM dpsql.ledger_entries WHERE dataset_id = %s", (ds,)
    ).fetchone()[0]


def _gaussian(z: float, count: int = 1) -> dict:
    g = {"type": "Gaussian", "noise_multiplier": z}
    return g if count == 1 else {"type": "SelfComposed", "event": g, "count": count}


def _pld_gaussians(z: float, n: int, delta: float) -> float:
    """dp-accounting's replace-one PLD epsilon of n Gaussian releases of multiplier z."""
    acc = PLDAccountant(NR.REPLACE_ONE).compose(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(z), n))
    return float(acc.get_epsilon(delta))


# --------------------------------------------------------------------------------------------
# Events in the ledger


def test_a_charge_records_its_event_and_the_ledger_shows_it(conn, make_dataset) -> None:
    ds, name = make_dataset(5.0, 1e-5)
    plain = _charge(conn, ds, 0.5, 1e-6)
    gauss = _charge(conn, ds, 1.0, 1e-6, _gaussian(4.0, 3))
    rows = dict(
        conn.execute(
            "SELECT entry_id, dp_event FROM dpsql.ledger WHERE dataset_id = %s", (ds,)
        ).fetchall()
    )
    assert rows == {
        plain: {"type": "EpsilonDelta", "epsilon": 0.5, "delta": 1e-6},
        gauss: _gaussian(4.0, 3),
    }
    # Not an event: refused before anything is written.
    with pytest.raises(psycopg.Error, match="dpsql: a charge's dp_event must be") as err:
        _charge(conn, ds, 0.1, 0, [1, 2])
    assert err.value.sqlstate == "22023"
    assert _entries(conn, ds) == 2


def test_the_report_matches_dp_accounting(conn, make_dataset) -> None:
    delta = 1e-5
    ds, name = make_dataset(50.0, delta)
    # each release charged what its Gaussians give alone at delta 1e-6
    eps3, eps2 = _pld_gaussians(3.0, 1, 1e-6), _pld_gaussians(2.0, 2, 1e-6)
    for _ in range(5):
        _charge(conn, ds, eps3, 1e-6, _gaussian(3.0))
    _charge(conn, ds, eps2, 1e-6, _gaussian(2.0, 2))
    rep = _report(conn, name)
    # Gaussians only: dp-accounting's PLD and (exact, factor 2 folded) RDP accountants.
    event = dpa.ComposedDpEvent(
        [dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(3.0), 5), dpa.GaussianDpEvent(2.0 / 2**0.5)]
    )
    pld = PLDAccountant(NR.REPLACE_ONE).compose(event).get_epsilon(delta)
    halved = dpa.ComposedDpEvent(
        [dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(1.5), 5), dpa.GaussianDpEvent(1.0 / 2**0.5)]
    )
    rdp = (
        RdpAccountant(neighboring_relation=NR.ADD_OR_REMOVE_ONE).compose(halved).get_epsilon(delta)
    )
    assert rep["name"] == name and rep["dataset_id"] == ds and rep["composition"] == "sum"
    assert rep["entries"] == 6
    assert (rep["epsilon_budget"], rep["delta_budget"]) == (50.0, delta)
    assert rep["epsilon_spent"] == pytest.approx(5 * eps3 + eps2)
    assert rep["delta_spent"] == pytest.approx(6e-6)
    assert rep["epsilon_pld"] == pytest.approx(pld, rel=1e-6)
    assert rep["epsilon_rdp"] == pytest.approx(rdp, rel=1e-3)
    assert rep["epsilon_pld"] < rep["epsilon_rdp"]
    assert rep["epsilon_saving"] == pytest.approx(rep["epsilon_spent"] - rep["epsilon_pld"])
    assert rep["epsilon_saving"] > 0 and rep["dp_accounting"] == dp_accounting_version()
    # Asked once: the same ledger is answered from dpsql.accountant_answers.
    cached = conn.execute(
        "SELECT count(*) FROM dpsql.accountant_answers WHERE request->>'op' = 'compose'"
        " AND request->'delta' = to_jsonb(%s::float8)",
        (delta,),
    ).fetchone()[0]
    assert cached >= 1
    assert _report(conn, name) == rep


def test_plain_releases_compose_by_the_pld_of_their_privacy_parameters(conn, make_dataset) -> None:
    delta = 1e-5
    ds, name = make_dataset(100.0, delta)
    for _ in range(6):
        _charge(conn, ds, 0.5, 1e-7)
    _charge(conn, ds, 1.0, 0.0)
    _charge(conn, ds, _pld_gaussians(4.0, 1, 1e-6), 1e-6, _gaussian(4.0))
    rep = _report(conn, name)

    def params(eps: float, d: float):
        return pld_lib.from_privacy_parameters(pld_common.DifferentialPrivacyParameters(eps, d))

    want = (
        params(0.5, 1e-7)
        .self_compose(6)
        .compose(params(1.0, 0.0))
        .compose(pld_lib.from_gaussian_mechanism(4.0, neighboring_relation=NR.REPLACE_ONE))
        .get_epsilon_for_delta(delta)
    )
    assert rep["epsilon_pld"] == pytest.approx(want, rel=1e-6)
    assert rep["epsilon_rdp"] is None  # an (epsilon, delta) release has no RDP curve
    assert rep["epsilon_pld"] < rep["epsilon_spent"]
    # An empty ledger: nothing spent, no call.
    _, empty = make_dataset(1.0, delta)
    rep = _report(conn, empty)
    assert (rep["entries"], rep["epsilon_spent"], rep["epsilon_pld"], rep["epsilon_saving"]) == (
        0,
        0,
        0,
        0,
    )


def test_dpsgd_runs_record_the_event_they_were_accounted_by(conn, scratch_schema) -> None:
    m, delta, z = 200, 1e-5, 1.5
    rng = np.random.default_rng(0)
    X = rng.normal(size=(m, 3)) / 3
    y = (X[:, 0] > 0).astype(float)
    source = load(conn, scratch_schema, "pts", X, y)
    name = f"dpsgd_{uuid.uuid4().hex[:8]}"
    conn.execute(
        "SELECT dpsql.register_dataset(%s, '{x}', 'y', 1e3, %s, labels => '{0,1}', name => %s)",
        (source, 2 * delta, name),  # two runs of delta each
    )
    charged = {}
    for sampling in ("shuffle", "poisson"):
        (mid,) = conn.execute(
            "SELECT dpsql.train(%s, NULL, NULL, 'logistic', epochs => 2, batch_size => 10,"
            " privacy => 'dpsgd', noise_multiplier => %s, delta => %s, sampling => %s)",
            (name, z, delta, sampling),
        ).fetchone()
        charged[sampling] = conn.execute(
            "SELECT epsilon, dp_event FROM dpsql.ledger WHERE model_id = %s", (mid,)
        ).fetchone()
    q, steps = 10 / m, 2 * (m // 10)
    assert charged["shuffle"][1] == _gaussian(z, 2)
    assert charged["poisson"][1] == {
        "type": "SelfComposed",
        "event": {"type": "PoissonSampled", "sampling_probability": q, "event": _gaussian(z)},
        "count": steps,
    }
    # Re-accounted, each run gives what it was charged; together, less than the sum.
    shuffle = dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(z), 2)
    poisson = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), steps)
    for sampling, event in (("shuffle", shuffle), ("poisson", poisson)):
        alone = PLDAccountant(NR.REPLACE_ONE).compose(event).get_epsilon(delta)
        assert alone == pytest.approx(charged[sampling][0], rel=1e-6)
    both = PLDAccountant(NR.REPLACE_ONE).compose(dpa.ComposedDpEvent([shuffle, poisson]))
    rep = _report(conn, name)
    assert rep["epsilon_pld"] == pytest.approx(both.get_epsilon(2 * delta), rel=1e-6)
    assert rep["epsilon_pld"] < rep["epsilon_spent"]
    assert rep["epsilon_rdp"] > rep["epsilon_pld"]


def test_dpsgd_f_records_the_mean_and_the_steps(conn, scratch_schema) -> None:
    rng = np.random.default_rng(1)
    X = rng.normal(size=(400, 3)) / 3 + 0.5
    y = (X[:, 0] > 0.5).astype(float)
    source = load(conn, scratch_schema, "ptsf", X, y)
    name = f"dpsgdf_{uuid.uuid4().hex[:8]}"
    conn.execute(
        "SELECT dpsql.register_dataset(%s, '{x}', 'y', 1e3, 1e-5, labels => '{0,1}', name => %s)",
        (source, name),
    )
    (mid,) = conn.execute(
        "SELECT dpsql.train(%s, NULL, NULL, 'logistic', privacy => 'dpsgd_f', epsilon => 1,"
        " delta => 1e-5, epochs => 1, batch_size => 50)",
        (name,),
    ).fetchone()
    (event, params) = conn.execute(
        "SELECT l.dp_event, m.params->'privacy' FROM dpsql.ledger l"
        " JOIN dpsql.models m USING (model_id) WHERE l.model_id = %s",
        (mid,),
    ).fetchone()
    z = params["noise_multiplier"]
    prefix = params["preprocessing"]["mean_noise_std"]
    assert event == {
        "type": "Composed",
        "events": [
            _gaussian(prefix),
            {
                "type": "SelfComposed",
                "event": {
                    "type": "PoissonSampled",
                    "sampling_probability": 50 / 400,
                    "event": _gaussian(z),
                },
                "count": 400 // 50,
            },
        ],
    }
    # The composition the run was calibrated to: at most the charged epsilon, and close to it.
    rep = _report(conn, name)
    assert 0.99 < rep["epsilon_pld"] <= 1.0 + 1e-6


def test_dpsgd_charges_the_event_its_accountant_composed(conn, scratch_schema) -> None:
    """Issue 26: the ledger's dp_event is the accountant's answer's ledger_event, stored as it
    is (no longer rebuilt in SQL from the plan); the model's provenance keeps the rest of the
    answer. An answer without it (an accountant older than the extension) is refused before
    anything is charged."""
    rng = np.random.default_rng(2)
    X = rng.normal(size=(300, 3)) / 3
    y = (X[:, 0] > 0).astype(float)
    source = load(conn, scratch_schema, "pts_acct", X, y)
    name = f"acct_{uuid.uuid4().hex[:8]}"
    conn.execute(
        "SELECT dpsql.register_dataset(%s, '{x}', 'y', 1e3, 0.5, labels => '{0,1}', name => %s)",
        (source, name),
    )
    train = (
        "SELECT dpsql.train(%s, NULL, NULL, 'logistic', privacy => 'dpsgd', epsilon => 1.25,"
        " delta => 1e-5, epochs => 1, batch_size => 30, sampling => 'poisson')"
    )
    (mid,) = conn.execute(train, (name,)).fetchone()
    event, text, provenance = conn.execute(
        "SELECT l.dp_event, l.dp_event::text, m.params->'privacy'->'accountant'"
        "  FROM dpsql.ledger l JOIN dpsql.models m USING (model_id) WHERE l.model_id = %s",
        (mid,),
    ).fetchone()
    request, answer, answer_text = conn.execute(
        "SELECT request, answer, (answer->'ledger_event')::text FROM dpsql.accountant_answers"
        " WHERE answer - 'ledger_event' = %s",
        (Jsonb(provenance),),
    ).fetchone()
    assert event == answer["ledger_event"] and text == answer_text
    assert "ledger_event" not in provenance
    assert event["event"]["sampling_probability"] == 30 / 300 and event["count"] == 10
    entries = conn.execute("SELECT count(*) FROM dpsql.ledger_entries").fetchone()
    conn.execute(
        "UPDATE dpsql.accountant_answers SET answer = answer - 'ledger_event' WHERE request = %s",
        (Jsonb(request),),
    )
    try:
        with pytest.raises(errors.ObjectNotInPrerequisiteState, match="older than the extension"):
            conn.execute(train, (name,))
    finally:
        conn.execute(
            "UPDATE dpsql.accountant_answers SET answer = %s WHERE request = %s",
            (Jsonb(answer), Jsonb(request)),
        )
    assert conn.execute("SELECT count(*) FROM dpsql.ledger_entries").fetchone() == entries


# --------------------------------------------------------------------------------------------
# Who may read a report, and bad input


def test_analysts_see_reports_of_granted_datasets_only(conn, make_dataset, make_role) -> None:
    ds, name = make_dataset(3.0, 1e-5)
    _charge(conn, ds, 0.5, 0.0)
    analyst, connect = make_role("analyst", "dpsql_analyst")
    with connect() as a:
        with pytest.raises(psycopg.Error, match="dpsql: no dataset") as err:
            _report(a, name)
        assert err.value.sqlstate == "42704"
        # An ungranted dataset and an unknown one read the same.
        assert str(err.value).replace(name, "?") == _message(a, "no_such_dataset_x").replace(
            "no_such_dataset_x", "?"
        )
        conn.execute("SELECT dpsql.grant_dataset(%s, %s)", (ds, analyst))
        rep = _report(a, name)
        assert (rep["entries"], rep["epsilon_spent"]) == (1, 0.5)
        assert rep["epsilon_pld"] == pytest.approx(0.5, abs=1e-3)
        # What dpsql.budgets shows, and no more: the ledger's tables stay closed.
        with pytest.raises(errors.InsufficientPrivilege):
            a.execute("SELECT * FROM dpsql.accountant_answers")


def _message(c: psycopg.Connection, name: str) -> str:
    with pytest.raises(psycopg.Error) as err:
        _report(c, name)
    return str(err.value)


def test_bad_input_gives_a_clear_error(conn) -> None:
    with pytest.raises(psycopg.Error) as err:
        conn.execute("SELECT * FROM dpsql.budget_report(NULL)")
    assert err.value.sqlstate == "22004"
    assert str(err.value).startswith("dpsql: budget_report needs a dataset name")
    with pytest.raises(psycopg.Error) as err:
        _report(conn, f"missing_{uuid.uuid4().hex[:6]}")
    assert err.value.sqlstate == "42704" and str(err.value).startswith("dpsql: no dataset")
    assert err.value.diag.message_hint == "dpsql.budgets lists the datasets you can use."


# --------------------------------------------------------------------------------------------
# Charging by PLD composition


def test_pld_charging_admits_what_summation_refuses_up_to_dp_accountings_bound(
    conn, make_dataset
) -> None:
    """Releases of one Gaussian each (z = 4), charged (epsilon, 1e-6) as the Gaussian alone
    gives them: a budget of the PLD epsilon of n = 8 releases admits 8 by composition and
    refuses the ninth; summation refuses the third."""
    z, n, delta = 4.0, 8, 1e-5
    eps_one = _pld_gaussians(z, 1, 1e-6)
    budget = _pld_gaussians(z, n, delta) * (1 + 1e-9)
    assert 2 * eps_one < budget < 3 * eps_one  # summation allows two
    ds_sum, _ = make_dataset(budget, delta)
    ds_pld, name = make_dataset(budget, delta, "pld")
    for i in range(n):
        _charge(conn, ds_pld, eps_one, 1e-6, _gaussian(z))
        if i < 2:
            _charge(conn, ds_sum, eps_one, 1e-6, _gaussian(z))
    with pytest.raises(psycopg.Error) as err:
        _charge(conn, ds_sum, eps_one, 1e-6, _gaussian(z))
    assert err.value.sqlstate == BUDGET_EXCEEDED
    with pytest.raises(psycopg.Error) as err:
        _charge(conn, ds_pld, eps_one, 1e-6, _gaussian(z))
    assert err.value.sqlstate == BUDGET_EXCEEDED
    message = str(err.value)
    assert message.startswith(
        f"dpsql: privacy budget of dataset '{name}' exceeded: composed by PLD"
    )
    assert err.value.diag.message_hint.startswith("Nothing was charged.")
    assert _entries(conn, ds_pld) == n and _entries(conn, ds_sum) == 2
    rep = _report(conn, name)
    assert rep["composition"] == "pld"
    assert rep["epsilon_pld"] <= budget and rep["epsilon_spent"] == pytest.approx(n * eps_one)
    assert conn.execute(
        "SELECT composition, epsilon_spent > epsilon_budget FROM dpsql.budgets"
        " WHERE dataset_id = %s",
        (ds_pld,),
    ).fetchone() == ("pld", True)


@pytest.mark.parametrize(("factor", "admitted"), [(1 + 1e-9, True), (1 - 1e-9, False)])
def test_pld_charging_refuses_exactly_at_dp_accountings_boundary(
    conn, make_dataset, factor, admitted
) -> None:
    z, n, delta = 3.0, 6, 1e-5
    ds, _ = make_dataset(_pld_gaussians(z, n, delta) * factor, delta, "pld")
    _charge(conn, ds, 1.0, 1e-6, _gaussian(z, n - 1))  # n - 1 releases, recorded as one
    if admitted:
        _charge(conn, ds, 1.0, 1e-6, _gaussian(z))
        assert _entries(conn, ds) == 2
    else:
        with pytest.raises(psycopg.Error) as err:
            _charge(conn, ds, 1.0, 1e-6, _gaussian(z))
        assert err.value.sqlstate == BUDGET_EXCEEDED
        assert _entries(conn, ds) == 1


def test_pld_charging_of_plain_releases_stays_sound(conn, make_dataset) -> None:
    """(epsilon, delta) releases compose by the PLD of their parameters; a release whose delta
    exceeds the delta budget has no finite epsilon there and is refused."""
    delta, budget = 1e-5, 3.0
    ds, _ = make_dataset(budget, delta, "pld")
    with pytest.raises(psycopg.Error, match="ε=Infinity at δ=1e-05") as err:
        _charge(conn, ds, 0.1, 2e-5)
    assert err.value.sqlstate == BUDGET_EXCEEDED and _entries(conn, ds) == 0
    # Releases of epsilon 0.1: summation admits 30, composition as many as dp-accounting's PLD
    # of the worst (0.1, 0)-DP pair allows: k - 1 of them recorded as one entry, then one plain
    # charge admitted and the next refused.
    params = pld_lib.from_privacy_parameters(pld_common.DifferentialPrivacyParameters(0.1, 0.0))
    k = 30
    while params.self_compose(k + 1).get_epsilon_for_delta(delta) <= budget:
        k += 1
    assert k > 40
    assert params.self_compose(k).get_epsilon_for_delta(delta) < budget * (1 - 1e-9)
    assert params.self_compose(k + 1).get_epsilon_for_delta(delta) > budget * (1 + 1e-9)
    plain = {"type": "EpsilonDelta", "epsilon": 0.1, "delta": 0.0}
    _charge(conn, ds, 0.1 * (k - 1), 0.0, {"type": "SelfComposed", "event": plain, "count": k - 1})
    _charge(conn, ds, 0.1, 0.0)
    with pytest.raises(psycopg.Error) as err:
        _charge(conn, ds, 0.1, 0.0)
    assert err.value.sqlstate == BUDGET_EXCEEDED
    assert _entries(conn, ds) == 2


def test_composition_is_declared_at_registration_or_by_the_extension_owner(
    conn, make_dataset
) -> None:
    with pytest.raises(psycopg.Error, match="dpsql: composition must be sum or pld") as err:
        make_dataset(1.0, 1e-5, "rdp")
    assert err.value.sqlstate == "22023"
    ds, name = make_dataset(1.0, 1e-5)
    assert _report(conn, name)["composition"] == "sum"
    conn.execute("UPDATE dpsql.datasets SET composition = 'pld' WHERE dataset_id = %s", (ds,))
    assert _report(conn, name)["composition"] == "pld"
    with pytest.raises(errors.CheckViolation):
        conn.execute("UPDATE dpsql.datasets SET composition = 'max' WHERE dataset_id = %s", (ds,))


def test_the_events_are_plain_json_the_accountant_command_accepts(conn, make_dataset) -> None:
    """What the server sends is what dpsql.ledger_events reads back (jsonb's own spelling)."""
    ds, _ = make_dataset(5.0, 1e-5)
    _charge(conn, ds, 1.0, 1e-6, _gaussian(2.5, 4))
    _charge(conn, ds, 0.25, 0.0)
    (text,) = conn.execute(
        "SELECT jsonb_agg(dp_event ORDER BY entry_id)::text FROM dpsql.ledger_entries"
        " WHERE dataset_id = %s",
        (ds,),
    ).fetchone()
    from dpsql import ledger_events

    events = [ledger_events.from_json(e) for e in json.loads(text)]
    assert events == [
        dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(2.5), 4),
        ledger_events.EpsilonDeltaDpEvent(0.25, 0.0),
    ]
