"""The C core through its Cython bindings (dpsql._core), against tests/reference.py."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from dpsql import _core
from tests.reference import psgd

H = _core.HEADER_LEN


def _data(m: int, d: int, model: str, seed: int = 0, n_classes: int = 3):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(m, d)) * 0.7
    if model == "multinomial":
        y = rng.integers(0, n_classes, size=m).astype(float)
    elif model == "linear":
        y = X @ rng.normal(size=d) + 0.1 * rng.normal(size=m)
    else:
        y = np.where(rng.random(m) < 0.5, -1.0, 1.0)
    return X, y


def _with_weights(state: np.ndarray, W: np.ndarray) -> np.ndarray:
    s = state.copy()
    s[H : H + W.size] = W.ravel()
    return s


@pytest.mark.parametrize("model", ["logistic", "linear", "huber", "multinomial"])
@pytest.mark.parametrize("intercept,row_norm", [(False, "none"), (True, "clip"), (False, "unit")])
def test_gradient_matches_finite_differences(model: str, intercept: bool, row_norm: str) -> None:
    rng = np.random.default_rng(1)
    d, lam, k = 5, 0.3, 3
    flags = {"none": 0, "clip": _core.FLAG_CLIP_ROWS, "unit": _core.FLAG_UNIT_ROWS}[row_norm]
    flags |= _core.FLAG_INTERCEPT if intercept else 0
    n_classes = k if model == "multinomial" else 1
    state = _core.init_state(model, d, n_classes=n_classes, lambda_=lam, flags=flags, huber_h=0.3)
    dim = d + intercept
    x = rng.normal(size=d) * 1.5
    for trial in range(5):
        W = rng.normal(size=(n_classes, dim)) * 0.5
        y = float(trial % k) if model == "multinomial" else (1.0 if trial % 2 else -1.0)
        s = _with_weights(state, W)

        def objective(Wf: np.ndarray, y: float = y) -> float:
            loss, _ = _core.example_gradient(_with_weights(state, Wf), x, y)
            return loss + 0.5 * lam * float(np.sum(Wf**2))

        _, grad = _core.example_gradient(s, x, y)
        num = np.zeros_like(W)
        eps = 1e-6
        for idx in np.ndindex(W.shape):
            e = np.zeros_like(W)
            e[idx] = eps
            num[idx] = (objective(W + e) - objective(W - e)) / (2 * eps)
        np.testing.assert_allclose(grad, num, rtol=1e-6, atol=1e-7)


CASES = [
    # model, schedule, b, lam, radius, intercept, row_norm
    ("logistic", "constant", 1, 0.0, 0.0, False, "none"),
    ("logistic", "decreasing", 7, 0.01, 100.0, True, "clip"),
    ("logistic", "sqrt", 3, 0.001, 0.0, False, "unit"),
    ("linear", "constant", 1, 0.0, 0.0, True, "none"),
    ("linear", "inverse", 5, 0.1, 2.0, False, "clip"),
    ("huber", "constant", 10, 0.0, 0.0, False, "unit"),
    ("huber", "decreasing", 1, 0.05, 20.0, True, "none"),
    ("multinomial", "constant", 4, 0.01, 0.0, True, "clip"),
    ("multinomial", "decreasing", 1, 0.1, 10.0, False, "none"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_epochs_match_numpy_reference(case: tuple) -> None:
    model, schedule, b, lam, radius, intercept, row_norm = case
    X, y = _data(103, 6, model)
    flags = {"none": 0, "clip": _core.FLAG_CLIP_ROWS, "unit": _core.FLAG_UNIT_ROWS}[row_norm]
    flags |= _core.FLAG_INTERCEPT if intercept else 0
    n_classes = 3 if model == "multinomial" else 1
    eta, offset = (0.3, 2.0) if schedule in ("inverse", "sqrt") else (0.05, 0.0)
    state = _core.init_state(
        model,
        6,
        n_classes=n_classes,
        lambda_=lam,
        schedule=schedule,
        eta=eta,
        offset=offset,
        radius=radius,
        batch_size=b,
        flags=flags,
    )
    beta = _core.header(state)["beta"]
    for _ in range(3):  # three epochs as three calls: the step counter must carry over
        state = _core.run_epoch(state, X, y)
    W, steps = psgd(
        X,
        y,
        model=model,
        epochs=3,
        b=b,
        lam=lam,
        schedule=schedule,
        eta=eta,
        offset=offset,
        beta=beta,
        radius=radius,
        n_classes=n_classes,
        intercept=intercept,
        row_norm=row_norm,
    )
    np.testing.assert_allclose(_core.weights(state), W, rtol=1e-10, atol=1e-12)
    h = _core.header(state)
    assert h["step"] == steps == 3 * (103 // b)
    assert h["dropped"] == 103 % b
    if radius > 0:
        assert np.linalg.norm(_core.weights(state)) <= radius * (1 + 1e-12)


def test_minibatch_is_an_average_not_a_sum() -> None:
    x = np.array([[0.3, -0.2, 0.5]])
    single = _core.run_epoch(_core.init_state("logistic", 3, eta=0.5), x, [1.0])
    batch = _core.run_epoch(
        _core.init_state("logistic", 3, eta=0.5, batch_size=8), np.repeat(x, 8, axis=0), np.ones(8)
    )
    np.testing.assert_allclose(_core.weights(batch), _core.weights(single), rtol=1e-15)


def test_step_counter_is_global_across_epochs() -> None:
    X, y = _data(40, 3, "logistic")
    s1 = _core.init_state("logistic", 3, lambda_=0.1, schedule="decreasing", radius=10.0)
    s1 = _core.run_epoch(_core.run_epoch(s1, X, y), X, y)
    W, _ = psgd(X, y, epochs=2, lam=0.1, schedule="decreasing", beta=1.1, radius=10.0)
    np.testing.assert_allclose(_core.weights(s1), W, rtol=1e-12)
    # Restarting the counter would be a different model.
    W_reset, _ = psgd(
        X,
        y,
        epochs=1,
        lam=0.1,
        schedule="decreasing",
        beta=1.1,
        radius=10.0,
        W0=psgd(X, y, epochs=1, lam=0.1, schedule="decreasing", beta=1.1, radius=10.0)[0],
    )
    assert not np.allclose(W_reset, W)


def test_decreasing_schedule_is_capped_by_one_over_beta() -> None:
    lam = 0.01
    state = _core.init_state("logistic", 2, lambda_=lam, schedule="decreasing", radius=1 / lam)
    beta = 1 + lam
    for s in [1, 2, 10, 50, 101, 102, 1000, 10**6]:
        eta = _core.step_size(state, s)
        assert eta <= 1 / beta
        if s >= beta / lam:
            assert eta == pytest.approx(1 / (lam * s), rel=1e-15)


def test_loss_constants_match_spec_table() -> None:
    lam = 1e-4
    c = _core.loss_constants("logistic", lam, 1 / lam)
    assert c["lipschitz"] == pytest.approx(2.0)
    assert c["smoothness"] == pytest.approx(1 + lam)
    assert c["strong_convexity"] == lam
    assert _core.loss_constants("logistic")["lipschitz"] == 1.0
    assert _core.loss_constants("huber", 0.0, 0.0, 0.1)["smoothness"] == pytest.approx(5.0)


def test_combine_is_row_weighted_model_average() -> None:
    X, y = _data(50, 4, "logistic")
    init = _core.init_state("logistic", 4, eta=0.2, batch_size=3)
    a = _core.run_epoch(init, X[:30], y[:30])
    b = _core.run_epoch(init, X[30:], y[30:])
    c = _core.combine(a, b)
    wa, wb = _core.weights(a), _core.weights(b)
    np.testing.assert_allclose(_core.weights(c), (30 * wa + 20 * wb) / 50, rtol=1e-15)
    h = _core.header(c)
    assert h["rows"] == 50 and h["shards"] == 2
    assert h["step"] == max(_core.header(a)["step"], _core.header(b)["step"])
    # A plain (unweighted) average would differ.
    assert not np.allclose(_core.weights(c), (wa + wb) / 2)
    with pytest.raises(ValueError, match="combine"):
        _core.combine(a, _core.run_epoch(_core.init_state("logistic", 4, eta=0.3), X, y))


@pytest.mark.parametrize(
    "x,y,message",
    [
        ([0.1, 0.2], 1.0, "length"),
        ([0.1, np.nan, 0.0], 1.0, "NaN or Infinity"),
        ([0.1, np.inf, 0.0], 1.0, "NaN or Infinity"),
        ([0.1, 0.2, 0.3], 0.0, "label outside"),
        ([0.1, 0.2, 0.3], np.nan, "label is NaN"),
    ],
)
def test_bad_rows_are_rejected(x: list, y: float, message: str) -> None:
    state = _core.init_state("logistic", 3)
    X = np.array([[0.0, 0.0, 0.0], x[:3] + [0.0] * (3 - len(x))])
    if len(x) != 3:
        with pytest.raises(ValueError, match=message):
            _core.run_epoch(state, np.array([x]), [y])
        return
    with pytest.raises(ValueError, match=rf"{message}.*row 2"):
        _core.run_epoch(state, X, [1.0, y])


def test_multinomial_labels_must_be_class_indices() -> None:
    state = _core.init_state("multinomial", 2, n_classes=3)
    for bad in (3.0, -1.0, 1.5):
        with pytest.raises(ValueError, match="label outside"):
            _core.run_epoch(state, [[0.1, 0.2]], [bad])


def test_malformed_states_are_rejected() -> None:
    good = _core.init_state("logistic", 3, batch_size=4)
    _core.check_state(good)
    for field, value in [
        ("magic", 1.0),
        ("loss", 9.0),
        ("dim", 2.5),
        ("batch_size", 0.0),
        ("in_batch", 4.0),
        ("lambda", -1.0),
        ("eta", np.nan),
        ("flags", 64.0),
    ]:
        bad = good.copy()
        bad[_core.HEADER_FIELDS.index(field)] = value
        with pytest.raises(ValueError):
            _core.check_state(bad)
    with pytest.raises(ValueError):
        _core.check_state(good[:-1])
    bad = good.copy()
    bad[H] = np.inf
    with pytest.raises(ValueError):
        _core.check_state(bad)


def test_divergence_is_reported() -> None:
    X = np.full((200, 2), 50.0)
    with pytest.raises(ValueError, match="diverged"):
        _core.run_epoch(_core.init_state("linear", 2, eta=10.0), X, np.ones(200))


def test_invalid_hyperparameters() -> None:
    with pytest.raises(ValueError):
        _core.init_state("logistic", 3, schedule="decreasing")  # needs lambda > 0
    with pytest.raises(ValueError):
        _core.init_state("logistic", 3, eta=-1.0)
    with pytest.raises(ValueError):
        _core.init_state("multinomial", 3, n_classes=1)
    with pytest.raises(ValueError, match="unknown loss"):
        _core.init_state("hinge", 3)


def test_predict_uses_the_same_row_transform() -> None:
    rng = np.random.default_rng(3)
    W = rng.normal(size=(1, 4))
    X = rng.normal(size=(10, 3)) * 3
    flags = _core.FLAG_INTERCEPT | _core.FLAG_CLIP_ROWS
    V = np.hstack([X, np.ones((10, 1))])
    V = V / np.maximum(1, np.linalg.norm(V, axis=1))[:, None]
    np.testing.assert_allclose(_core.predict("linear", flags, W, X), V @ W[0], rtol=1e-13)
    p = _core.predict("logistic", flags, W, X)
    np.testing.assert_allclose(p, 1 / (1 + np.exp(-V @ W[0])), rtol=1e-13)
    Wm = rng.normal(size=(3, 4))
    np.testing.assert_array_equal(
        _core.predict("multinomial", flags, Wm, X), np.argmax(V @ Wm.T, axis=1)
    )


def test_shuffle_keys_form_a_seeded_permutation() -> None:
    keys = [[_core.shuffle_key(seed, pos) for pos in range(1, 1001)] for seed in (1, 1, 2)]
    assert keys[0] == keys[1] and keys[0] != keys[2]
    order = np.argsort(keys[0])
    assert sorted(order) == list(range(1000))
    # Positions land uniformly: mean rank of the first half is about the middle.
    assert abs(np.argsort(order)[:500].mean() - 499.5) < 60


def test_all_losses_and_schedules_have_names() -> None:
    """Every loss and schedule code of sgd.h has a distinct name that builds a state carrying
    that code (the name tables and the codes agree)."""
    assert sorted(_core.LOSSES.values()) == [1, 2, 3, 4]
    assert sorted(_core.SCHEDULES.values()) == [1, 2, 3, 4]
    for loss, schedule in itertools.product(_core.LOSSES, _core.SCHEDULES):
        kw: dict[str, Any] = {"lambda_": 0.1} if schedule == "decreasing" else {}
        n = 3 if loss == "multinomial" else 1
        h = _core.header(_core.init_state(loss, 2, n_classes=n, schedule=schedule, **kw))
        assert (h["loss"], h["schedule"]) == (_core.LOSSES[loss], _core.SCHEDULES[schedule])
        assert _core.loss_code(loss) == _core.LOSSES[loss]
