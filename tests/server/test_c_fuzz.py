"""Fuzz of every C entry point with forged states (red team, issue 9 F2).

A state is a plain float8[]: a superuser's call, a pg_temp aggregate's INITCOND or an edited
array can hand any C function any array. Each forged state must give a clean ERROR, never a
crash: a segfault resets every connection, so after each call the connection must still answer
(and, at the end of each group, a second connection too).

The states are real ones from the init functions (and the documented layouts of the DP-GD and
AdaSSP accumulators) with header fields set to NaN/Inf/huge/negative/off-by-one values, lengths
truncated or extended, and the generator's position word overwritten. Seeded; a few seconds.
"""

from __future__ import annotations

import math
import random
import struct
import uuid
from collections.abc import Callable, Iterator, Sequence

import psycopg
import pytest
from psycopg import errors

SEED = 20240611
MUTANTS_PER_STATE = 28

SPECIAL = [
    math.nan,
    math.inf,
    -math.inf,
    -1.0,
    0.0,
    1.0,
    2.0,
    0.5,
    1e300,
    -1e300,
    2.0**31,
    2.0**31 - 1,
    2.0**40,
    2.0**53,
    2.0**63,
    1e15,
    4472.0,
    4473.0,
    4474.0,
    4433.0,
    5e-324,
]

# DpsqlRng is key[8], nonce[3], counter, block[128], used (uint32): `used` is the low half of the
# tail's double 70 (little-endian), the index the generator reads its next word at.
RNG_USED_DOUBLE = 70


def _literal(values: Sequence[float]) -> str:
    """An array literal for INITCOND (NaN and infinities spelled as float8 input does)."""

    def one(v: float) -> str:
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "Infinity" if v > 0 else "-Infinity"
        return repr(float(v))

    return "{" + ",".join(one(v) for v in values) + "}"


def _with_used(value: float, used: int) -> float:
    lo, hi = struct.unpack("<II", struct.pack("<d", value))
    return struct.unpack("<d", struct.pack("<II", used & 0xFFFFFFFF, hi))[0]


def mutants(
    base: list[float],
    header_len: int,
    rng: random.Random,
    rng_tail: int | None,
    count: int = MUTANTS_PER_STATE,
) -> Iterator[list[float]]:
    """Forged variants of a real state: edited header fields, lengths, generator position."""
    for k in range(count):
        s = list(base)
        kind = k % 7
        if kind in (0, 1):
            for _ in range(1 + rng.randrange(3)):
                s[rng.randrange(header_len)] = rng.choice(SPECIAL)
        elif kind == 2:
            i = rng.randrange(header_len)
            s[i] = s[i] + rng.choice([-1.0, 1.0, 2.0, 1e6])
        elif kind == 3:
            s = s[: rng.randrange(len(s))]
        elif kind == 4:
            s = s + [rng.choice(SPECIAL) for _ in range(1 + rng.randrange(40))]
        elif kind == 5:
            if rng_tail is not None:
                i = rng_tail + RNG_USED_DOUBLE
                s[i] = _with_used(s[i], rng.choice([129, 1000, 2**20, 2**31, 2**32 - 1]))
            else:
                s[rng.randrange(len(s))] = rng.choice(SPECIAL)
        else:
            # anywhere, header and body alike
            for _ in range(1 + rng.randrange(6)):
                s[rng.randrange(len(s))] = rng.choice(SPECIAL)
        yield s


@pytest.fixture
def fuzz_conn(conn: psycopg.Connection) -> psycopg.Connection:
    # a long call is not what this test looks for (tests/server/test_interrupts.py is)
    conn.execute("SET statement_timeout = '2s'")
    conn.execute("SET client_min_messages = warning")
    return conn


class Prober:
    """Runs one forged call and checks that the server survived it."""

    def __init__(self, conn: psycopg.Connection, server_uri: str) -> None:
        self.conn = conn
        self.server_uri = server_uri
        self.calls = 0
        self.errors: dict[str, int] = {}

    def call(self, query: str, params: tuple = ()) -> None:
        self.calls += 1
        try:
            self.conn.execute(query, params).fetchall()
        except errors.QueryCanceled:
            pass
        except psycopg.OperationalError as err:
            pytest.fail(f"the server crashed on:\n{query}\n{params!r}\n{err}")
        except psycopg.DatabaseError as err:
            state = err.sqlstate or "?"
            self.errors[state] = self.errors.get(state, 0) + 1
            # Internal errors are not clean errors on input, except the allocator's own limit.
            if state == "XX000":
                assert "memory alloc request size" in str(err), (query, params, str(err))
        try:
            self.conn.execute("SELECT 1").fetchone()
        except psycopg.OperationalError as err:
            pytest.fail(f"the connection died after:\n{query}\n{params!r}\n{err}")

    def survived(self) -> None:
        with psycopg.connect(self.server_uri, autocommit=True) as other:
            assert other.execute("SELECT 1").fetchone() == (1,)


def _aggregate(
    prober: Prober,
    sfunc: str,
    arg_types: str,
    initcond: list[float],
    rows_sql: str,
    finalfunc: str | None = None,
) -> None:
    name = f"pg_temp.fz_{uuid.uuid4().hex[:10]}"
    final = f", FINALFUNC = {finalfunc}" if finalfunc else ""
    prober.conn.execute(
        f"CREATE AGGREGATE {name}({arg_types}) (SFUNC = {sfunc}, STYPE = float8[], "
        f"INITCOND = '{_literal(initcond)}'{final})"
    )
    try:
        args, rest = rows_sql.split(" FROM ", 1)
        prober.call(f"SELECT {name}({args}) FROM {rest}")
    finally:
        prober.conn.execute(f"DROP AGGREGATE IF EXISTS {name}({arg_types})")


def _state(conn: psycopg.Connection, sql: str) -> list[float]:
    return list(conn.execute(sql).fetchone()[0])


RED_TEAM_STATE = [
    0,
    0,
    0,
    0,
    1000000,
    1000,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    5,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
]


def test_red_team_final_of_forged_state(fuzz_conn: psycopg.Connection, server_uri: str) -> None:
    """Issue 9 F2: _sgd_final of a forged array was a segfault; now a clean 22023."""
    with pytest.raises(errors.InvalidParameterValue, match="dpsql: malformed state"):
        fuzz_conn.execute("SELECT dpsql_internal._sgd_final(%s::float8[])", (RED_TEAM_STATE,))
    Prober(fuzz_conn, server_uri).survived()


def test_red_team_bogus_initcond(fuzz_conn: psycopg.Connection, server_uri: str) -> None:
    """Issue 9 F2: a pg_temp aggregate over _sgd_transition with a forged INITCOND."""
    fuzz_conn.execute(
        "CREATE AGGREGATE pg_temp.forged(float8[], float8, float8[]) (SFUNC = "
        f"dpsql_internal._sgd_transition, STYPE = float8[], INITCOND ="
        f" '{_literal(RED_TEAM_STATE)}')"
    )
    with pytest.raises(errors.InvalidParameterValue, match="dpsql: malformed state"):
        fuzz_conn.execute(
            "SELECT pg_temp.forged(ARRAY[1, 2]::float8[], 1, NULL) FROM generate_series(1, 3)"
        )
    Prober(fuzz_conn, server_uri).survived()


SGD_INITS = {
    "plain": "SELECT dpsql_internal._sgd_init('logistic', 3, 2, 0.01, 'constant', 0.1, 0, 0, "
    "0.1, 1, 0)",
    "multinomial": "SELECT dpsql_internal._sgd_init('multinomial', 3, 3, 0.01, 'constant', 0.1, "
    "0, 1, 0.1, 2, 5)",
    "noise": "SELECT dpsql_internal._sgd_init('logistic', 3, 2, 0.01, 'constant', 0.1, 0, 0, "
    "0.1, 2, 1, 1.0, 'gaussian', 1.0, 0, 0, 7)",
    "batched": "SELECT dpsql_internal._sgd_init('huber', 3, 2, 0.01, 'sqrt', 0.1, 1, 1, 0.1, 1, 1, "
    "1.0, 'gamma_norm', 1.0, 2, 4, 7)",
    # audits' Dirac canary rows (flag 16): every row below with a nonzero last feature is one
    "canary": "SELECT dpsql_internal._sgd_init('logistic', 3, 2, 0.01, 'constant', 0.1, 0, 0, "
    "0.1, 2, 16, 1.0, 'gaussian', 1.0, 0, 0, 7)",
    "canary_bolton": "SELECT dpsql_internal._sgd_init('huber', 3, 2, 0.01, 'constant', 0.1, 0, 0, "
    "0.1, 1, 24)",
}
SGD_HEADER = 29

ROWS3 = (
    "x, y FROM (VALUES (ARRAY[0.5, -0.25, 1]::float8[], 1.0::float8), "
    "(ARRAY[1, 2, 3]::float8[], -1.0), (ARRAY[0.1, 0.1, 0.1]::float8[], 1.0), "
    "(NULL::float8[], NULL::float8)) AS r(x, y)"
)


def test_fuzz_sgd_states(fuzz_conn: psycopg.Connection, server_uri: str) -> None:
    rng = random.Random(SEED)
    p = Prober(fuzz_conn, server_uri)
    for name, init in SGD_INITS.items():
        base = _state(fuzz_conn, init)
        real = _literal(base)
        tail = len(base) - 72 if name in ("noise", "batched", "canary") else None
        for s in mutants(base, SGD_HEADER, rng, tail):
            p.call("SELECT dpsql_internal._sgd_final(%s::float8[])", (s,))
            p.call("SELECT * FROM dpsql_internal._sgd_info(%s::float8[])", (s,))
            p.call("SELECT dpsql_internal._sgd_weights(%s::float8[])", (s,))
            p.call(
                "SELECT * FROM dpsql_internal._bolton_release(%s::float8[], 1.0, 1.0, 0.0, true, "
                "'analytic', 1)",
                (s,),
            )
            rows = ROWS3.replace("x, y FROM", f"x, y, '{real}'::float8[] FROM")
            _aggregate(
                p,
                "dpsql_internal._sgd_transition",
                "float8[], float8, float8[]",
                s,
                rows,
                "dpsql_internal._sgd_final",
            )
            batched = ROWS3.replace("x, y FROM", f"x, y, b, '{real}'::float8[] FROM").replace(
                "AS r(x, y)", "AS r(x, y) CROSS JOIN (VALUES (1::bigint), (3)) AS bb(b)"
            )
            _aggregate(
                p,
                "dpsql_internal._sgd_transition_batch",
                "float8[], float8, bigint, float8[]",
                s,
                batched,
                "dpsql_internal._sgd_final",
            )
            # the combine function as a transition: a forged state meets a real one, and back
            _aggregate(
                p,
                "dpsql_internal._sgd_combine",
                "float8[]",
                s,
                f"v FROM (VALUES ('{real}'::float8[])) AS t(v)",
            )
            _aggregate(
                p,
                "dpsql_internal._sgd_combine",
                "float8[]",
                base,
                f"v FROM (VALUES ('{_literal(s)}'::float8[])) AS t(v)",
            )
        p.survived()
    assert p.calls > 0


AMBSSGD_INIT = (
    "SELECT dpsql_internal._ambssgd_init(3, false, 1.0, 40, 2, 5, 5, 1.0, 0.1, 1.0, 1.0, "
    "1.0, 4, 2.0, 2.0, 0, 7)"
)
AMBSSGD_FIXED_INIT = (
    "SELECT dpsql_internal._ambssgd_init(3, true, 1.0, 40, 4, 5, 0, 1.0, 0.1, 0, 0, 0, 0, 0, 0,"
    " 0.5, 7)"
)
AMBSSGD_HEADER = 25


def test_fuzz_ambssgd_states(fuzz_conn: psycopg.Connection, server_uri: str) -> None:
    rng = random.Random(SEED + 1)
    p = Prober(fuzz_conn, server_uri)
    for init, p_len in ((AMBSSGD_INIT, 3), (AMBSSGD_FIXED_INIT, 4)):
        base = _state(fuzz_conn, init)
        real = _literal(base)
        probe = list(
            fuzz_conn.execute("SELECT dpsql_internal._ambssgd_probe(%s)", (base,)).fetchone()[0]
        )
        counts = [5.0, 5.0] + [0.0] * 5  # s = 5 rows in bucket 0 of L + 2 = 6
        sums = [5.0, 0.0] + [0.1] * p_len
        for s in mutants(base, AMBSSGD_HEADER, rng, len(base) - 72):
            p.call("SELECT * FROM dpsql_internal._ambssgd_result(%s::float8[])", (s,))
            rows = ROWS3.replace("x, y FROM", f"x, y, '{real}'::float8[] FROM")
            _aggregate(
                p, "dpsql_internal._ambssgd_transition", "float8[], float8, float8[]", s, rows
            )
            # the pass on shards: the coordinator's calls, and forged probes on the shards
            p.call("SELECT dpsql_internal._ambssgd_probe(%s::float8[])", (s,))
            for fn, arg in (("_ambssgd_block_stat", counts), ("_ambssgd_block_step", sums)):
                p.call(f"SELECT dpsql_internal.{fn}(%s::float8[], %s::float8[])", (s, arg))
                p.call(f"SELECT dpsql_internal.{fn}(%s::float8[], %s::float8[])", (base, s))
        for forged in mutants(probe, 7, rng, None):
            for agg in ("_ambssgd_stat_counts", "_ambssgd_gradient_sum"):
                rows = ROWS3.replace("x, y FROM", f"x, y, '{_literal(forged)}'::float8[] FROM")
                p.call(f"SELECT dpsql_internal.{agg}({rows})")
        p.survived()


def _dpgd_base(p: int, intercept: bool) -> list[float]:
    # DpsqlDpgdHeader: magic, p, intercept, gamma, x_bound, n, clipped, invalid | theta | sum
    return (
        [4473.0, float(p), 1.0 if intercept else 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]
        + [0.1] * p
        + [0.0] * p
    )


def _adassp_base(dim: int) -> list[float]:
    # magic, n, p, dim, x_bound, y_bound | S (p*p) | Xty (p)
    return [4433.0, 0.0, float(dim), float(dim), 1.0, 1.0] + [0.0] * (dim * dim + dim)


def test_fuzz_linear_states(fuzz_conn: psycopg.Connection, server_uri: str) -> None:
    rng = random.Random(SEED + 2)
    p = Prober(fuzz_conn, server_uri)
    dpgd = _dpgd_base(3, False)
    for s in mutants(dpgd, 8, rng, None):
        p.call("SELECT dpsql_internal._dpgd_gradient_final(%s::float8[])", (s,))
        rows = ROWS3.replace(
            "x, y FROM",
            "x, y, ARRAY[0.1, 0.1, 0.1]::float8[], 1.0::float8, false, 0.0::float8 FROM",
        )
        _aggregate(
            p,
            "dpsql_internal._dpgd_gradient_transition",
            "float8[], float8, float8[], float8, boolean, float8",
            s,
            rows,
            "dpsql_internal._dpgd_gradient_final",
        )
        _aggregate(
            p,
            "dpsql_internal._dpgd_gradient_combine",
            "float8[]",
            s,
            f"v FROM (VALUES ('{_literal(dpgd)}'::float8[])) AS t(v)",
        )
        p.call(
            "SELECT dpsql_internal._dpgd_step(ARRAY[0.1, 0.1, 0.1]::float8[], %s::float8[], 0.1,"
            " 1.0, 1, 0)",
            (s[8:13],),
        )
    adassp = _adassp_base(3)
    for s in mutants(adassp, 6, rng, None):
        p.call("SELECT dpsql_internal._adassp_gram_final(%s::float8[])", (s,))
        p.call(
            "SELECT * FROM dpsql_internal._adassp_release(%s::float8[], 1, 1, 1, 0, 1, 1)",
            ([5.0, 3.0] + s[6:],),
        )
        rows = ROWS3.replace("x, y FROM", "x, y, 1.0::float8, 1.0::float8, false, 3 FROM")
        _aggregate(
            p,
            "dpsql_internal._adassp_gram_transition",
            "float8[], float8, float8, float8, boolean, int",
            s,
            rows,
            "dpsql_internal._adassp_gram_final",
        )
        _aggregate(
            p,
            "dpsql_internal._adassp_gram_combine",
            "float8[]",
            s,
            f"v FROM (VALUES ('{_literal(adassp)}'::float8[])) AS t(v)",
        )
    # objective perturbation's GLM sums: [p, loss, param, y_bound, x_bound, intercept, theta,
    # n, loss, gradient, Hessian]
    glm = [3.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.1, 0.1, 0.1] + [0.0] * (2 + 3 + 9)
    glm_rows = ROWS3.replace(
        "x, y FROM",
        "x, y, ARRAY[0.1, 0.1, 0.1]::float8[], 1, 0.0::float8, 1.0::float8, 1.0::float8,"
        " false FROM",
    )
    for s in mutants(glm, 9, rng, None):
        p.call("SELECT dpsql_internal._glm_sums_final(%s::float8[])", (s,))
        _aggregate(
            p,
            "dpsql_internal._glm_sums_transition",
            "float8[], float8, float8[], int, float8, float8, float8, boolean",
            s,
            glm_rows,
            "dpsql_internal._glm_sums_final",
        )
        _aggregate(
            p,
            "dpsql_internal._glm_sums_combine",
            "float8[]",
            s,
            f"v FROM (VALUES ('{_literal(glm)}'::float8[])) AS t(v)",
        )
        p.call(
            "SELECT * FROM dpsql_internal._glm_newton(%s::float8[], ARRAY[0.1, 0.1, 0.1]::float8[],"
            " 1.0, NULL)",
            (s[9:],),
        )
    # the fixed-work solver's line-search state: [p, loss, param, y_bound, x_bound, intercept,
    # theta, direction, n, 16 losses, gradient]
    line = [3.0, 1.0, 0.0, 1.0, 1.0, 0.0] + [0.1] * 3 + [0.05] * 3 + [0.0] * (1 + 16 + 3)
    line_rows = ROWS3.replace(
        "x, y FROM",
        "x, y, ARRAY[0.1, 0.1, 0.1]::float8[], ARRAY[0.05, 0.05, 0.05]::float8[], 1,"
        " 0.0::float8, 1.0::float8, 1.0::float8, false FROM",
    )
    for s in mutants(line, 12, rng, None):
        p.call("SELECT dpsql_internal._glm_line_final(%s::float8[])", (s,))
        _aggregate(
            p,
            "dpsql_internal._glm_line_transition",
            "float8[], float8, float8[], float8[], int, float8, float8, float8, boolean",
            s,
            line_rows,
            "dpsql_internal._glm_line_final",
        )
        _aggregate(
            p,
            "dpsql_internal._glm_line_combine",
            "float8[]",
            s,
            f"v FROM (VALUES ('{_literal(line)}'::float8[])) AS t(v)",
        )
        p.call(
            "SELECT dpsql_internal._glm_line_choose(%s::float8[], ARRAY[0.1, 0.1, 0.1]::float8[],"
            " ARRAY[0.05, 0.05, 0.05]::float8[], 1.0, NULL, 1.0, 1.0, -1.0, 1)",
            (s[12:],),
        )
    p.survived()


# Values for the generic fuzz of every C function, by argument type.
def _value_makers(rng: random.Random) -> dict[str, Callable[[], object]]:
    def floats() -> float:
        return rng.choice(SPECIAL + [rng.uniform(-10, 10)])

    def ints() -> int:
        return rng.choice([-1, 0, 1, 2, 3, 7, 1000, 2**31 - 1, -(2**31)])

    def bigints() -> int:
        return rng.choice([-1, 0, 1, 2, 3, 7, 1000, 2**31, 2**40, 2**62, -(2**63)])

    def arrays() -> list[float]:
        return [floats() for _ in range(rng.choice([0, 1, 2, 3, 5, 40]))]

    def texts() -> str:
        return rng.choice(
            [
                "constant",
                "sqrt",
                "logistic",
                "multinomial",
                "analytic",
                "classic",
                "checkpoints",
                "batch_means",
                "independent_runs",
                "gaussian",
                "x",
                "",
            ]
        )

    return {
        "float8": floats,
        "int4": ints,
        "int8": bigints,
        "_float8": arrays,
        "text": texts,
        "bool": lambda: rng.choice([True, False]),
    }


# Not fuzzed here: _accountant runs a program (its input is checked character by character),
# _fail raises the SQLSTATE it is given by design (test_error_messages.py checks it), and
# aggregates' support functions need an aggregate (the tests above build them).
SKIP = {"dpsql_internal._accountant", "dpsql_internal._fail"}


def test_fuzz_every_c_function(fuzz_conn: psycopg.Connection, server_uri: str) -> None:
    rng = random.Random(SEED + 3)
    makers = _value_makers(rng)
    functions = fuzz_conn.execute(
        """
        SELECT n.nspname || '.' || p.proname, p.oid::regprocedure::text,
               array(SELECT t::regtype::text FROM unnest(p.proargtypes::oid[]) AS t),
               array(SELECT typname FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY AS u(t, i)
                     JOIN pg_type ON pg_type.oid = u.t ORDER BY i)
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        JOIN pg_language l ON l.oid = p.prolang
        WHERE n.nspname IN ('dpsql', 'dpsql_internal') AND l.lanname = 'c' AND p.prokind = 'f'
        ORDER BY 1
        """
    ).fetchall()
    assert len(functions) > 20
    p = Prober(fuzz_conn, server_uri)
    for name, _sig, types, typnames in functions:
        if name in SKIP or not all(t in makers for t in typnames):
            continue
        for _ in range(12):
            args = tuple(makers[t]() if rng.random() > 0.05 else None for t in typnames)
            placeholders = ", ".join(f"%s::{t}" for t in types)
            p.call(f"SELECT * FROM {name}({placeholders})", args)
    p.survived()


def _raw_state(conn: psycopg.Connection, sfunc: str, arg_types: str, rows_sql: str) -> list[float]:
    """A real transition state: the aggregate's rows folded by a temporary aggregate with no
    final function."""
    name = f"pg_temp.raw_{uuid.uuid4().hex[:10]}"
    conn.execute(f"CREATE AGGREGATE {name}({arg_types}) (SFUNC = {sfunc}, STYPE = float8[])")
    try:
        args, rest = rows_sql.split(" FROM ", 1)
        return list(conn.execute(f"SELECT {name}({args}) FROM {rest}").fetchone()[0])
    finally:
        conn.execute(f"DROP AGGREGATE IF EXISTS {name}({arg_types})")


def test_fuzz_erm_toolbox_states(fuzz_conn: psycopg.Connection, server_uri: str) -> None:
    """Frank-Wolfe's gradient and the exponential mechanism's grid-loss states, forged."""
    rng = random.Random(SEED + 4)
    p = Prober(fuzz_conn, server_uri)
    fw_types = "float8[], float8, float8[], float8, boolean, float8"
    fw_rows = ROWS3.replace(
        "x, y FROM", "x, y, ARRAY[0.1, 0.1, 0.1]::float8[], 1.0::float8, false, 1.0::float8 FROM"
    )
    fw = _raw_state(fuzz_conn, "dpsql_internal._fw_gradient_transition", fw_types, fw_rows)
    for s in mutants(fw, 6, rng, None):
        p.call("SELECT dpsql_internal._fw_gradient_final(%s::float8[])", (s,))
        _aggregate(
            p,
            "dpsql_internal._fw_gradient_transition",
            fw_types,
            s,
            fw_rows,
            "dpsql_internal._fw_gradient_final",
        )
        _aggregate(
            p,
            "dpsql_internal._fw_gradient_combine",
            "float8[]",
            s,
            f"v FROM (VALUES ('{_literal(fw)}'::float8[])) AS t(v)",
        )
    em_types = "float8[], float8, text, int, boolean, float8, float8, float8, float8, int"
    em_rows = ROWS3.replace(
        "x, y FROM",
        "x, y, 'logistic'::text, 3, false, 1.0::float8, 0.0::float8, 1.0::float8, 0.1::float8,"
        " 64 FROM",
    )
    em = _raw_state(fuzz_conn, "dpsql_internal._em_losses_transition", em_types, em_rows)
    for s in mutants(em, 10, rng, None):
        p.call("SELECT * FROM dpsql_internal._em_release(%s::float8[], 1, 1, 1)", (s,))
        _aggregate(p, "dpsql_internal._em_losses_transition", em_types, s, em_rows)
        _aggregate(
            p,
            "dpsql_internal._em_losses_combine",
            "float8[]",
            s,
            f"v FROM (VALUES ('{_literal(em)}'::float8[])) AS t(v)",
        )
    p.survived()
