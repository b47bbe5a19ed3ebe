"""White-box private SGD: per-step noise inside the aggregate (SCS13, BST14, DP-SGD)."""

from __future__ import annotations

import numpy as np
import psycopg
import pytest
from psycopg.rows import dict_row
from scipy import stats

from dpsql import _core
from tests.pg_helpers import leftovers, load


def _model(conn, model_id):
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute("SELECT * FROM dpsql.models WHERE model_id = %s", (model_id,)).fetchone()


# ------------------------------------------------------------------------ the C core, in memory


def test_per_step_noise_is_present_and_scaled() -> None:
    """Zero features: the model is exactly -(eta/b) times the sum of the T noise draws, so each
    coordinate is N(0, T (eta sigma / b)^2). Chi-square on 400 seeded runs x 5 coordinates,
    two-sided alpha = 1e-3 (deterministic under the seeds); fails without noise (w = 0), with
    sigma off by 10%, or with noise per row instead of per step (b-fold variance)."""
    m, d, b, eta, sigma, epochs = 60, 5, 6, 0.3, 2.0, 2
    X, y = np.zeros((m, d)), np.ones(m)
    steps = epochs * (m // b)
    w = []
    for seed in range(400):
        s = _core.init_state(
            "logistic",
            d,
            eta=eta,
            batch_size=b,
            noise="gaussian",
            noise_scale=sigma,
            noise_seed=seed,
        )
        for _ in range(epochs):
            s = _core.run_epoch(s, X, y)
        w.append(_core.weights(s)[0])
    z = np.concatenate(w) / (np.sqrt(steps) * eta * sigma / b)
    chi2 = float(np.sum(z**2))
    assert stats.chi2(z.size).ppf(5e-4) < chi2 < stats.chi2(z.size).ppf(1 - 5e-4)
    assert stats.kstest(z, "norm").pvalue > 1e-3


def test_gamma_norm_step_noise() -> None:
    """SCS13's epsilon-DP step noise: one step from w = 0 on zero rows gives -(eta/b) kappa,
    with ||kappa|| ~ Gamma(d, scale) (KS at 1e-3, seeded)."""
    d, b, eta, scale = 4, 5, 1.0, 0.7
    norms = []
    for seed in range(2000):
        s = _core.init_state(
            "logistic",
            d,
            eta=eta,
            batch_size=b,
            noise="gamma_norm",
            noise_scale=scale,
            noise_seed=seed,
        )
        s = _core.run_epoch(s, np.zeros((b, d)), np.ones(b))
        norms.append(np.linalg.norm(_core.weights(s)) * b / eta)
    assert stats.kstest(norms, stats.gamma(d, scale=scale).cdf).pvalue > 1e-3


@pytest.mark.parametrize("model", ["logistic", "linear", "huber", "multinomial"])
def test_clipping_bounds_every_per_example_gradient(model) -> None:
    rng = np.random.default_rng(0)
    d, clip, eta = 4, 0.5, 0.1
    n_classes = 3 if model == "multinomial" else 1
    for trial in range(50):
        x = rng.normal(size=(1, d)) * rng.choice([0.01, 1, 100])
        y = (
            [float(trial % 3)]
            if model == "multinomial"
            else ([rng.normal() * 100] if model == "linear" else [rng.choice([-1.0, 1.0])])
        )
        w0 = rng.normal(size=(n_classes, d))
        s = _core.init_state(model, d, n_classes=n_classes, eta=eta, clip_norm=clip)
        s[_core.HEADER_LEN : _core.HEADER_LEN + w0.size] = w0.ravel()
        _, g = _core.example_gradient(s, x[0], y[0])
        after = _core.weights(_core.run_epoch(s, x, y))
        step = np.linalg.norm(after - w0) / eta
        assert step <= clip * (1 + 1e-12)
        np.testing.assert_allclose(step, min(clip, float(np.linalg.norm(g))), rtol=1e-9, atol=1e-14)


def test_empty_batches_still_step_with_noise() -> None:
    """Batched epochs (Poisson): batch numbers that no row carries are steps of noise only."""
    d = 3
    s = _core.init_state(
        "logistic",
        d,
        eta=1.0,
        batch_size=2,
        noise="gaussian",
        noise_scale=1.0,
        noise_divisor=2.0,
        steps_per_epoch=5,
        noise_seed=1,
    )
    out = _core.run_epoch(s, np.zeros((1, d)), [1.0], batches=[3])  # batches 1, 2, 4, 5 empty
    assert _core.header(out)["step"] == 5 and np.linalg.norm(_core.weights(out)) > 0
    with pytest.raises(ValueError):
        _core.run_epoch(s, np.zeros((2, d)), [1.0, 1.0], batches=[3, 2])  # out of order


def test_bst14_epsilon1_solves_the_composition_equation(conn) -> None:
    """Wu et al. 2017, Appendix F, Algorithm 4 lines 4-7 at the paper's settings (b = 1, delta =
    1/m^2, delta1 = delta/(km))."""
    for m, eps, k, sigma in [
        (60000, 0.01, 10, 182.9),
        (72876, 0.1, 10, 16.89),
        (498010, 0.1, 5, 9.08),
    ]:
        delta1 = (1 / m**2) / (k * m)
        steps = k * m
        (e1,) = conn.execute(
            "SELECT dpsql_internal._bst14_epsilon1(%s, %s, %s)", (eps, delta1, steps)
        ).fetchone()
        lhs = steps * e1 * np.expm1(e1) + np.sqrt(2 * steps * np.log(1 / delta1)) * e1
        assert abs(lhs - eps) < 1e-12 * eps
        e2 = min(1.0, m * e1 / 2)
        assert np.sqrt(2 * np.log(1.25 / delta1)) / e2 == pytest.approx(sigma, rel=2e-3)


# ----------------------------------------------------------------------------- in the server


@pytest.fixture
def zeros(conn, scratch_schema):
    """A registered dataset of zero features: released models are pure accumulated noise."""
    m, d = 100, 3
    load(conn, scratch_schema, "zeros", np.zeros((m, d)), np.ones(m))
    conn.execute(
        "SELECT dpsql.register_dataset(%s, '{x}', 'y', epsilon_budget => 1e9,"
        " delta_budget => 0.999, labels => '{0,1}', name => %s)",
        (f"{scratch_schema}.zeros", f"zeros_{scratch_schema}"),
    )
    return f"zeros_{scratch_schema}", m, d


def test_scs13_release_carries_its_per_step_noise(conn, zeros) -> None:
    """k = 2 passes, b = 10, steps 1/sqrt(t): each coordinate ~ N(0, sum_t eta_t^2 sigma^2/b^2).
    Chi-square over 80 seeded releases x 3 coordinates, alpha = 1e-3 two-sided."""
    name, m, d = zeros
    w, sig = [], None
    for seed in range(80):
        (mid,) = conn.execute(
            "SELECT dpsql.train(%s, NULL, NULL, 'logistic', epochs => 2, batch_size => 10,"
            " privacy => 'scs13', epsilon => 1, delta => 1e-5, noise_seed => %s)",
            (name, seed),
        ).fetchone()
        row = _model(conn, mid)
        sig = row["noise_scale"]
        w.append(np.asarray(row["weights"]))
    eps_p, delta_p = 0.5, 0.5e-5
    assert sig == pytest.approx(_core.gaussian_sigma(2.0, eps_p, delta_p), rel=1e-12)
    steps = np.arange(1, 2 * m // 10 + 1)
    var = np.sum((1 / np.sqrt(steps)) ** 2) * sig**2 / 100
    z = np.concatenate(w) / np.sqrt(var)
    chi2 = float(np.sum(z**2))
    assert stats.chi2(z.size).ppf(5e-4) < chi2 < stats.chi2(z.size).ppf(1 - 5e-4)
    assert row["params"]["privacy"]["algorithm"].startswith("SCS13")


def test_bst14_release_and_refusals(conn, zeros) -> None:
    name, m, d = zeros
    (mid,) = conn.execute(
        "SELECT dpsql.train(%s, NULL, NULL, 'logistic', epochs => 2, batch_size => 5,"
        " lambda => 0.01, privacy => 'bst14', epsilon => 1, delta => 1e-5)",
        (name,),
    ).fetchone()
    row = _model(conn, mid)
    p = row["params"]["privacy"]
    assert p["algorithm"].startswith("BST14 Algorithm 5") and row["schedule"] == "inverse"
    assert row["params"]["sampling"] == "replacement" and row["radius"] == pytest.approx(100)
    assert np.linalg.norm(row["weights"]) > 0  # noise, not the zero model
    before = leftovers(conn), conn.execute("SELECT count(*) FROM dpsql.ledger").fetchone()
    for args, msg in [
        ("privacy => 'bst14', epsilon => 1, delta => 0", "delta must be > 0"),
        ("privacy => 'scs13', epsilon => 1, tuning_lambdas => '{0.1}'", "tuning"),
        ("privacy => 'bst14', epsilon => 1e12, delta => 1e-5", "budget"),
    ]:
        with pytest.raises(psycopg.Error, match=msg):
            conn.execute(f"SELECT dpsql.train(%s, NULL, NULL, 'logistic', {args})", (name,))
    with pytest.raises(psycopg.Error, match="not 'linear'"):
        conn.execute(
            "SELECT dpsql.train(%s, NULL, NULL, 'linear', privacy => 'scs13', epsilon => 1)",
            (name,),
        )
    assert (leftovers(conn), conn.execute("SELECT count(*) FROM dpsql.ledger").fetchone()) == before


def test_poisson_batches_are_binomial(conn) -> None:
    """Realised batch sizes of the Poisson sampler: Binomial(m, q) by chi-square over 400
    batches (alpha = 1e-3; seeded), and each row joins Binomial(steps, q) batches."""
    m, steps, q = 2000, 400, 0.01
    sizes = [
        r[0]
        for r in conn.execute(
            "SELECT count(*) FROM generate_series(1, %s) rid,"
            " unnest(dpsql_internal._poisson_batches(42, rid, %s, %s)) b GROUP BY b ORDER BY b",
            (m, steps, q),
        ).fetchall()
    ]
    sizes += [0] * (steps - len(sizes))  # batches nobody joined
    assert abs(np.mean(sizes) - m * q) < 4 * np.sqrt(m * q * (1 - q) / steps)
    assert np.var(sizes, ddof=1) == pytest.approx(m * q * (1 - q), rel=0.25)
    per_row = [
        r[0]
        for r in conn.execute(
            "SELECT cardinality(dpsql_internal._poisson_batches(7, rid, %s, %s))"
            " FROM generate_series(1, %s) rid",
            (steps, q, m),
        ).fetchall()
    ]
    counts = np.bincount(per_row, minlength=12)[:12]
    expected = stats.binom(steps, q).pmf(np.arange(12)) * m
    keep = expected > 5
    assert (
        stats.chisquare(
            counts[keep], expected[keep] * counts[keep].sum() / expected[keep].sum()
        ).pvalue
        > 1e-3
    )


# ---------------------------------------------------------------- DP-SGD (needs the accountant)

accounting = pytest.importorskip("dpsql.accounting")


def test_dpsgd_calibrates_to_the_target_and_charges_it(conn, zeros) -> None:
    name, m, d = zeros
    (mid,) = conn.execute(
        "SELECT dpsql.train(%s, NULL, NULL, 'logistic', epochs => 3, batch_size => 10,"
        " privacy => 'dpsgd', epsilon => 2, delta => 1e-5, clip_norm => 0.5)",
        (name,),
    ).fetchone()
    row = _model(conn, mid)
    p = row["params"]["privacy"]
    z = p["noise_multiplier"]
    assert p["sampling"] == "shuffle" and p["accountant"]["epsilon_pld"] <= 2 + 1e-9
    # Shuffled disjoint batches: k Gaussian mechanisms per record, no amplification.
    assert accounting.epsilon(z, scheme="shuffle", epochs=3, delta=1e-5) <= 2 + 1e-9
    assert row["noise_scale"] == pytest.approx(z * 0.5) and row["epsilon"] == 2
    assert conn.execute(
        "SELECT epsilon, delta FROM dpsql.ledger WHERE model_id = %s", (mid,)
    ).fetchone() == (2.0, 1e-5)


def test_dpsgd_with_a_noise_multiplier_reports_and_charges_epsilon(conn, zeros) -> None:
    name, m, d = zeros
    eps = {}
    for sampling in ("shuffle", "poisson"):
        (mid,) = conn.execute(
            "SELECT dpsql.train(%s, NULL, NULL, 'logistic', epochs => 2, batch_size => 10,"
            " privacy => 'dpsgd', noise_multiplier => 1.5, delta => 1e-5, sampling => %s)",
            (name, sampling),
        ).fetchone()
        row = _model(conn, mid)
        eps[sampling] = row["epsilon"]
        kw = (
            dict(epochs=2)
            if sampling == "shuffle"
            else dict(steps=2 * (m // 10), sampling_rate=10 / m)
        )
        assert row["epsilon"] == pytest.approx(
            accounting.epsilon(1.5, scheme=sampling, delta=1e-5, **kw), rel=1e-6
        )
        assert row["params"]["privacy"]["accountant"]["epsilon_rdp"] > 0
    # Never present shuffled batches as Poisson: without amplification epsilon is larger.
    assert eps["shuffle"] > eps["poisson"]


def test_dpsgd_per_step_noise_in_the_server(conn, zeros) -> None:
    """Zero features, constant step eta: w = -(eta/b) sum of T Gaussian draws of std z C.
    Chi-square over 60 seeded releases x 3 coordinates, alpha = 1e-3 two-sided."""
    name, m, d = zeros
    z, clip, eta, b, k = 2.0, 0.5, 0.3, 10, 2
    w = []
    for seed in range(60):
        (mid,) = conn.execute(
            "SELECT dpsql.train(%s, NULL, NULL, 'logistic', epochs => %s, batch_size => %s,"
            " step_size => %s, privacy => 'dpsgd', noise_multiplier => %s, clip_norm => %s,"
            " delta => 1e-5, noise_seed => %s, intercept => false)",
            (name, k, b, eta, z, clip, seed),
        ).fetchone()
        w.append(np.asarray(_model(conn, mid)["weights"]))
    steps = k * (m // b)
    zs = np.concatenate(w) / (np.sqrt(steps) * eta * z * clip / b)
    chi2 = float(np.sum(zs**2))
    assert stats.chi2(zs.size).ppf(5e-4) < chi2 < stats.chi2(zs.size).ppf(1 - 5e-4)


def test_dpsgd_trains_any_loss_and_refuses_bad_input(conn, scratch_schema) -> None:
    rng = np.random.default_rng(1)
    X = rng.normal(size=(400, 3)) * 50  # huge norms: bolt-on's assumptions fail, clipping holds
    y = X @ [1.0, -1.0, 0.5] + rng.normal(size=400)
    load(conn, scratch_schema, "reg", X, y)
    conn.execute(
        "SELECT dpsql.register_dataset(%s, '{x}', 'y', epsilon_budget => 100,"
        " delta_budget => 0.1, labels => '{0,1}', row_norm => 'clip', name => %s,"
        " accept => true)",  # regression labels under a label set: on purpose
        (f"{scratch_schema}.reg", f"reg_{scratch_schema}"),
    )
    name = f"reg_{scratch_schema}"
    before = leftovers(conn), conn.execute("SELECT count(*) FROM dpsql.ledger").fetchone()
    for args, msg in [
        ("epsilon => 1, delta => 0", "delta must be > 0"),
        ("epsilon => 1, noise_multiplier => 1, delta => 1e-5", "either epsilon"),
        ("epsilon => 1, delta => 1e-5, clip_norm => 0", "clip_norm"),
        ("epsilon => 1, delta => 1e-5, sampling => 'bogus'", "sampling"),
        ("noise_multiplier => -1, delta => 1e-5", "noise_multiplier"),
    ]:
        with pytest.raises(psycopg.Error, match=msg):
            conn.execute(
                f"SELECT dpsql.train(%s, NULL, NULL, 'logistic', privacy => 'dpsgd', {args})",
                (name,),
            )
    assert (leftovers(conn), conn.execute("SELECT count(*) FROM dpsql.ledger").fetchone()) == before
    (mid,) = conn.execute(
        "SELECT dpsql.train(%s, NULL, NULL, 'linear', epochs => 5,"
        " batch_size => 10, step_size => 0.5, privacy => 'dpsgd', epsilon => 5,"
        " delta => 1e-5, clip_norm => 1)",
        (name,),
    ).fetchone()
    assert np.isfinite(_model(conn, mid)["weights"]).all()


def test_python_mechanism_objects(server_uri, zeros) -> None:
    import dpsql

    name, m, d = zeros
    with dpsql.connect(server_uri) as db:
        for mech in (
            dpsql.DPSGD(epsilon=3.0, delta=1e-5, sampling="poisson"),
            dpsql.SCS13(epsilon=1.0),
            dpsql.BST14(epsilon=1.0, delta=1e-5),
        ):
            model = db.train(
                name, None, None, model="logistic", epochs=1, batch_size=10, privacy=mech
            )
            assert model.row["privacy"] == mech.name and model.coef_.shape == (d,)
