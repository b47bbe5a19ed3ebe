"""Tables as they come (issue 27): text and boolean labels, categorical columns encoded one-hot
in the server, what registration finds in the rows, previews, and messages that name the
user's real mistake. Every refusal charges nothing."""

from __future__ import annotations

import re

import numpy as np
import psycopg
import pytest

WORK = ["private", "gov", "self"]


@pytest.fixture
def census(conn, scratch_schema) -> str:
    """A raw public-style table: a text categorical, a boolean, numbers and a text label."""
    conn.execute(
        """CREATE TABLE census AS
           SELECT g AS id, (18 + g % 50)::int AS age, (g % 7)::float8 / 7 AS hours,
                  (ARRAY['private', 'gov', 'self'])[1 + g % 3] AS work, (g % 5 = 0) AS married,
                  CASE WHEN g % 3 = 0 OR (g % 7 = 0 AND g % 5 = 0) THEN 'yes' ELSE 'no' END
                    AS income
             FROM generate_series(1, 1500) g"""
    )
    return f"{scratch_schema}.census"


def _register(conn, source: str, name: str, **kw) -> int:
    args = {
        "delta_budget": 1e-5,
        "labels": "{no,yes}",
        "categories": '{"work": ["private", "gov", "self"]}',
        "feature_bounds": "{{18,70},{0,1},{0,1}}",
        **kw,
    }
    named = ", ".join(f"{k} => %s" for k in args)
    (dataset_id,) = conn.execute(
        f"SELECT dpsql.register_dataset(%s, '{{age,hours,work,married}}', 'income', 10, "
        f"name => %s, {named})",
        (source, name, *args.values()),
    ).fetchone()
    return dataset_id


def _spent(conn, name: str) -> int:
    (n,) = conn.execute(
        "SELECT count(*) FROM dpsql.ledger_entries e JOIN dpsql.datasets d USING (dataset_id) "
        "WHERE d.name = %s",
        (name,),
    ).fetchone()
    return n


def _encode(age: float, hours: float, work: str | None, married: bool) -> list[float]:
    """The encoding the server documents: numbers, one-hot categories, booleans 0/1 (predict
    applies the registered bounds itself)."""
    one_hot = [1.0 if work == w else 0.0 for w in WORK]
    return [float(age), hours, *one_hot, float(married)]


def test_text_label_categorical_and_boolean_columns_train_evaluate_and_predict(
    conn, census, scratch_schema
) -> None:
    name = f"census_{scratch_schema}"
    _register(conn, census, name)
    ds = conn.execute(
        "SELECT dim, labels, label_values, feature_bounds FROM dpsql.datasets WHERE name = %s",
        (name,),
    ).fetchone()
    assert ds[0] == 6  # age, hours, 3 categories, married
    assert ds[1] == [0.0, 1.0] and ds[2] == ["no", "yes"]
    assert ds[3][2:5] == [[-1.0, 1.0]] * 3  # one-hot coordinates kept as they are
    (mid,) = conn.execute(
        "SELECT dpsql.train(%s, NULL, NULL, privacy => 'bolton', epsilon => 5, noise_seed => 1)",
        (name,),
    ).fetchone()
    metric, value, rows = conn.execute(
        "SELECT metric, value, rows FROM dpsql.evaluate(%s, %s)", (mid, census)
    ).fetchone()
    assert metric == "accuracy" and rows == 1500
    (majority,) = conn.execute("SELECT avg((income = 'no')::int) FROM census").fetchone()
    assert value > float(majority) + 0.1  # the categorical column carries the signal
    # predict by row (to_jsonb) equals predict on the documented encoding, and the label
    rows_ = conn.execute(
        "SELECT age, hours, work, married, dpsql.predict_row(%s, to_jsonb(c)), "
        "dpsql.predict_label(%s, to_jsonb(c)) FROM census c ORDER BY id LIMIT 40",
        (mid, mid),
    ).fetchall()
    for age, hours, work, married, p, label in rows_:
        (q,) = conn.execute(
            "SELECT dpsql.predict(%s, %s::float8[])", (mid, _encode(age, hours, work, married))
        ).fetchone()
        assert p == pytest.approx(q, abs=1e-12)
        assert label == ("yes" if p >= 0.5 else "no")
    # an unknown category is a zero vector, documented
    (p_unknown,) = conn.execute(
        """SELECT dpsql.predict_row(%s,
                 '{"age": 30, "hours": 0.5, "work": "army", "married": false}')""",
        (mid,),
    ).fetchone()
    (p_zero,) = conn.execute(
        "SELECT dpsql.predict(%s, %s::float8[])", (mid, _encode(30, 0.5, None, False))
    ).fetchone()
    assert p_unknown == pytest.approx(p_zero, abs=1e-12)


def test_registration_shows_values_that_differ_only_by_spaces(conn, census, scratch_schema) -> None:
    """Issue 42: a CSV read as it comes keeps the space after each comma (UCI Adult: ' <=50K');
    the refusal quotes the values it found, so the space shows, and says to trim."""
    conn.execute("UPDATE census SET income = ' ' || income WHERE id % 2 = 0")
    conn.execute("UPDATE census SET work = work || ' ' WHERE id % 3 = 0")
    with pytest.raises(psycopg.errors.DataException) as err:
        _register(conn, census, f"spaced_{scratch_schema}")
    message, hint = str(err.value), err.value.diag.message_hint or ""
    assert "' no' (" in message and "' yes' (" in message
    assert re.search(
        r"work outside its categories or NULL \(encoded as zeros\): '[a-z-]+ ' \(", message
    )
    assert "only by the spaces around them" in hint and "btrim" in hint


def test_registration_counts_what_training_would_drop_and_refuses_unless_accepted(
    conn, census, scratch_schema
) -> None:
    conn.execute("UPDATE census SET hours = NULL WHERE id % 500 = 0")  # 3 rows
    conn.execute("UPDATE census SET work = 'army' WHERE id % 300 = 1")  # 5 rows
    conn.execute("UPDATE census SET income = 'maybe' WHERE id % 250 = 2")  # 6 rows
    name = f"messy_{scratch_schema}"
    with pytest.raises(psycopg.errors.DataException) as err:
        _register(conn, census, name)
    message = str(err.value)
    assert "3 rows with a NULL" in message
    assert "6 rows with a label outside {no,yes} (training drops them): 'maybe' (6 rows)" in message
    assert (
        "5 rows with work outside its categories or NULL (encoded as zeros): 'army' (5 rows)"
        in (message)
    )
    assert "accept => true" in (err.value.diag.message_hint or "")
    assert (
        conn.execute("SELECT count(*) FROM dpsql.datasets WHERE name = %s", (name,)).fetchone()[0]
        == 0
    )
    _register(conn, census, name, accept=True)
    assert _spent(conn, name) == 0


def test_a_zero_one_label_registered_without_labels_is_caught_at_registration(
    conn, scratch_schema
) -> None:
    conn.execute(
        "CREATE TABLE t AS SELECT g::float8 / 100 AS a, (g % 2)::int AS y"
        " FROM generate_series(1, 100) g"
    )
    with pytest.raises(psycopg.errors.DataException) as err:
        conn.execute(f"SELECT dpsql.register_dataset('{scratch_schema}.t', '{{a}}', 'y', 1)")
    assert "outside {-1,1} (training drops them): 0 (50 rows)" in str(err.value)
    assert "labels => ARRAY[" in err.value.diag.message_hint
    # in the column's own type
    conn.execute(
        f"SELECT dpsql.register_dataset('{scratch_schema}.t', '{{a}}', 'y', 1,"
        " labels => ARRAY[0, 1], "
        f"name => 'zero_one_{scratch_schema}')"
    )
    with pytest.raises(psycopg.errors.DatatypeMismatch, match="not numbers"):
        conn.execute(
            f"SELECT dpsql.register_dataset('{scratch_schema}.t', '{{a}}', 'y', 1,"
            " labels => '{no,yes}', "
            f"name => 'x_{scratch_schema}')"
        )


def test_boolean_label_defaults_to_false_true_and_text_features_need_categories(
    conn, scratch_schema
) -> None:
    conn.execute(
        "CREATE TABLE b AS SELECT g::float8 / 200 AS a, 'x' || (g % 3) AS colour, g % 4 = 0 AS y "
        "FROM generate_series(1, 200) g"
    )
    with pytest.raises(psycopg.errors.DatatypeMismatch) as err:
        conn.execute(f"SELECT dpsql.register_dataset('{scratch_schema}.b', '{{a,colour}}', 'y', 1)")
    assert "categories =>" in err.value.diag.message_hint
    name = f"bool_{scratch_schema}"
    conn.execute(
        f"SELECT dpsql.register_dataset('{scratch_schema}.b', '{{a,colour}}', 'y', 1, name => %s, "
        """categories => '{"colour": ["x0", "x1", "x2"]}')""",
        (name,),
    )
    labels, values, dim = conn.execute(
        "SELECT labels, label_values, dim FROM dpsql.datasets WHERE name = %s", (name,)
    ).fetchone()
    assert labels == [0.0, 1.0] and values is None and dim == 4


def test_preview_charges_nothing_and_says_what_train_then_charges(
    conn, census, scratch_schema
) -> None:
    name = f"preview_{scratch_schema}"
    _register(conn, census, name)
    tables = "SELECT count(*) FROM pg_class WHERE relnamespace = 'dpsql_work'::regnamespace"
    (before,) = conn.execute(tables).fetchone()
    (plan,) = conn.execute(
        "SELECT dpsql.preview(%s, NULL, NULL, privacy => 'auto', epsilon => 1)", (name,)
    ).fetchone()
    assert _spent(conn, name) == 0 and conn.execute(tables).fetchone()[0] == before
    assert plan["rows"] == 1500 and plan["dim"] == 6 and "refused" not in plan
    assert plan["budget"]["epsilon_remaining"] == 10 and plan["auto"]["chosen"]
    (mid,) = conn.execute(
        "SELECT dpsql.train(%s, NULL, NULL, privacy => 'auto', epsilon => 1)", (name,)
    ).fetchone()
    mech, eps, delta = conn.execute(
        "SELECT privacy, epsilon, delta FROM dpsql.models WHERE model_id = %s", (mid,)
    ).fetchone()
    assert (mech, eps, delta) == (plan["mechanism"], plan["epsilon"], plan["delta"])
    assert _spent(conn, name) == 1
    # a refusal is part of the answer, and a warning that depends on public numbers only
    (plan,) = conn.execute(
        "SELECT dpsql.preview(%s, NULL, NULL, privacy => 'bolton', epsilon => 50)", (name,)
    ).fetchone()
    assert plan["refused"]["sqlstate"] == "DP001" and plan["budget"]["exceeded"] is True
    (plan,) = conn.execute(
        "SELECT dpsql.preview(%s, NULL, NULL, privacy => 'bolton', epsilon => 0.05,"
        " lambda => 0.01)",
        (name,),
    ).fetchone()
    assert any("mostly noise" in w["warning"] for w in plan["warnings"])
    (plan,) = conn.execute(
        "SELECT dpsql.preview(%s, NULL, NULL, privacy => 'bolton', epsilon => 1, clip_norm => 1)",
        (name,),
    ).fetchone()
    assert plan["refused"]["sqlstate"] == "22023" and "clip_norm" in plan["refused"]["message"]
    assert _spent(conn, name) == 1


def test_the_release_after_its_preview_asks_the_accountant_nothing_new(
    conn, census, scratch_schema
) -> None:
    """Issue 45: a preview runs the release's plan and keeps what it caches, the accountant's
    answer for a DP-SGD calibration (public numbers): the release then calibrates from it, to
    the same noise, without a new accountant call (the preview's rolled-back subtransaction
    used to discard it)."""
    name = f"cache_{scratch_schema}"
    _register(conn, census, name)
    answers = "SELECT count(*) FROM dpsql.accountant_answers"
    call = (
        "SELECT {}(%s, NULL, NULL, privacy => 'dpsgd', epsilon => 0.8123, delta => 1e-6,"
        " batch_size => 37, epochs => 3)"
    )
    notes: list[str] = []
    conn.add_notice_handler(lambda d: notes.append(d.message_primary or ""))
    (before,) = conn.execute(answers).fetchone()
    (plan,) = conn.execute(call.format("dpsql.preview"), (name,)).fetchone()
    (after_preview,) = conn.execute(answers).fetchone()
    assert after_preview == before + 1 and any("calibrating" in n for n in notes)
    notes.clear()
    (mid,) = conn.execute(call.format("dpsql.train"), (name,)).fetchone()
    assert conn.execute(answers).fetchone()[0] == after_preview
    assert not any("calibrating" in n for n in notes)
    (noise,) = conn.execute(
        "SELECT params->'privacy'->'noise_scale' FROM dpsql.models WHERE model_id = %s", (mid,)
    ).fetchone()
    assert noise == plan["plan"]["noise_scale"] and _spent(conn, name) == 1


@pytest.mark.parametrize("held", ["dpsql.preview", "dpsql.train"])
def test_an_open_transaction_that_asked_the_accountant_holds_no_other_release(
    conn, census, scratch_schema, make_role, held
) -> None:
    """Issue 45: a preview keeps its accountant answer, in its transaction. Another analyst's
    release of the same configuration meanwhile stores its own answer without waiting for that
    transaction to end (the insert would wait on the uncommitted row: 1 ms at most, then the
    answer is not stored). So was a release left open before."""
    name = f"held_{scratch_schema}"
    _register(conn, census, name)
    first, connect_first = make_role("analyst", "dpsql_analyst")
    second, connect_second = make_role("analyst", "dpsql_analyst")
    for role in (first, second):
        conn.execute("SELECT dpsql.grant_dataset(%s, %s)", (name, role))
    call = (
        "SELECT {}(%s, NULL, NULL, privacy => 'dpsgd', epsilon => 0.7321, delta => 1e-6,"
        " batch_size => 41, epochs => 2)"
    )
    with connect_first() as a, connect_second() as b:
        a.autocommit = False
        a.execute(call.format(held), (name,))  # its transaction stays open
        b.execute("SET statement_timeout = '30s'")  # (a wait for a would end here)
        (mid,) = b.execute(call.format("dpsql.train"), (name,)).fetchone()
        assert mid is not None
        a.rollback()


def test_the_preview_flag_set_by_a_caller_only_stops_a_release(
    conn, census, scratch_schema
) -> None:
    name = f"flag_{scratch_schema}"
    _register(conn, census, name)
    conn.execute("SELECT set_config('dpsql_preview.on', 'on', false)")
    conn.execute("SELECT set_config('dpsql_preview.rows', '7', false)")
    with pytest.raises(psycopg.Error, match="a preview charges nothing"):
        conn.execute(
            "SELECT dpsql.train(%s, NULL, NULL, privacy => 'bolton', epsilon => 1)", (name,)
        )
    conn.execute("SELECT set_config('dpsql_preview.on', 'off', false)")
    assert _spent(conn, name) == 0
    assert (
        conn.execute("SELECT count(*) FROM dpsql.models WHERE source = %s", (census,)).fetchone()[0]
        == 0
    )


def test_messages_name_the_real_mistake(conn, census, scratch_schema) -> None:
    name = f"nodelta_{scratch_schema}"
    _register(conn, census, name, delta_budget=0)
    with pytest.raises(psycopg.Error) as err:
        conn.execute(
            "SELECT dpsql.train(%s, NULL, NULL, privacy => 'dpsgd', epsilon => 1)", (name,)
        )
    assert err.value.sqlstate == "DP001" and "delta budget of 0" in str(err.value)
    assert "privacy => 'auto'" in err.value.diag.message_hint
    with pytest.raises(psycopg.Error) as err:
        conn.execute(
            "SELECT dpsql.train(%s, NULL, NULL, privacy => 'objective_perturbation', epsilon => 1, "
            "delta => 1e-6)",
            (name,),
        )
    assert "delta => 0" in err.value.diag.message_hint
    assert _spent(conn, name) == 0
    rng = np.random.default_rng(0)
    conn.execute("CREATE TABLE reg (a float8, b float8, y float8)")
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO reg VALUES (%s, %s, %s)",
            [(float(a), float(b), float(a + b)) for a, b in rng.uniform(-1, 1, (200, 2))],
        )
    reg = f"reg_{scratch_schema}"
    conn.execute(
        f"SELECT dpsql.register_dataset('{scratch_schema}.reg', '{{a,b}}', 'y', 5, 1e-5, "
        "label_bound => 2, name => %s)",
        (reg,),
    )
    for privacy in ("auto", "dpgd"):
        with pytest.raises(psycopg.Error, match="model => 'linear'"):
            conn.execute(
                "SELECT dpsql.train(%s, NULL, NULL, privacy => %s, epsilon => 1)", (reg, privacy)
            )
    assert _spent(conn, reg) == 0


def test_analysts_see_categories_and_predict_by_row(
    conn, census, scratch_schema, make_role
) -> None:
    name = f"shared_{scratch_schema}"
    _register(conn, census, name)
    analyst, connect = make_role("analyst", "dpsql_analyst")
    conn.execute(
        "SELECT dpsql.grant_dataset(%s, %s)",
        (
            conn.execute(
                "SELECT dataset_id FROM dpsql.datasets WHERE name = %s", (name,)
            ).fetchone()[0],
            analyst,
        ),
    )
    with connect() as a:
        (plan,) = a.execute(
            "SELECT dpsql.preview(%s, NULL, NULL, epsilon => 1)", (name,)
        ).fetchone()
        assert "refused" not in plan
        (mid,) = a.execute(
            "SELECT dpsql.train(%s, NULL, NULL, privacy => 'auto', epsilon => 1)", (name,)
        ).fetchone()
        (label,) = a.execute(
            """SELECT dpsql.predict_label(%s,
                     '{"age": 40, "hours": 0.2, "work": "gov", "married": true}')""",
            (mid,),
        ).fetchone()
        assert label in ("no", "yes")
        with pytest.raises(psycopg.Error, match="no column"):
            a.execute("""SELECT dpsql.predict_row(%s, '{"age": 40}')""", (mid,))


def test_an_analysts_preview_under_hostile_settings_charges_nothing(
    conn, census, scratch_schema, make_role
) -> None:
    """The preview as an analyst inside a transaction, a savepoint and a DO block with an
    exception handler, with a hostile search_path and float output: the same answer, no charge,
    no row reachable; and the preview flag set by the analyst only stops a release."""
    name = f"hostile_{scratch_schema}"
    _register(conn, census, name)
    analyst, connect = make_role("analyst", "dpsql_analyst")
    conn.execute("SELECT dpsql.grant_dataset(%s, %s)", (name, analyst))
    with connect() as a:
        a.execute("SET extra_float_digits = -15")
        a.execute("SET search_path = pg_temp, public")
        (plan,) = a.execute(
            "SELECT dpsql.preview(%s, NULL, NULL, privacy => 'bolton', epsilon => 1)", (name,)
        ).fetchone()
        assert plan["epsilon"] == 1 and plan["rows"] == 1500 and "refused" not in plan
        a.autocommit = False
        a.execute("SAVEPOINT s")
        a.execute("SELECT dpsql.preview(%s, NULL, NULL, epsilon => 1)", (name,))
        a.execute("ROLLBACK TO SAVEPOINT s")
        a.rollback()
        a.autocommit = True
        a.execute(
            f"DO $$ BEGIN PERFORM dpsql.preview('{name}', NULL, NULL, epsilon => 1);"
            " EXCEPTION WHEN OTHERS THEN NULL; END $$"
        )
        a.execute("SELECT set_config('dpsql_preview.on', 'on', false)")
        with pytest.raises(psycopg.Error, match="a preview charges nothing"):
            a.execute(
                "SELECT dpsql.train(%s, NULL, NULL, privacy => 'bolton', epsilon => 1)", (name,)
            )
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            a.execute(f"SELECT * FROM {census}")
    assert _spent(conn, name) == 0
