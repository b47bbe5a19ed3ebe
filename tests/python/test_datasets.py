"""Tests of dpsql.datasets (real datasets skip when absent) and dpsql.loading (real server)."""

from __future__ import annotations

import gzip
import hashlib
import re
from pathlib import Path

import numpy as np
import pytest
from psycopg import sql

from dpsql import datasets as ds
from dpsql import loading
from dpsql.loading import fetch_numpy, load_numpy


def _load_or_skip(loader, *args, **kwargs):
    try:
        return loader(*args, **kwargs)
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


# --------------------------------------------------------------------------------------------
# Locating data
# --------------------------------------------------------------------------------------------


def test_datasets_dir_env_override(monkeypatch, tmp_path):
    monkeypatch.setenv("DPSQL_DATASETS", str(tmp_path))
    assert ds.datasets_dir() == tmp_path
    monkeypatch.delenv("DPSQL_DATASETS")
    repo = Path(ds.__file__).resolve().parent.parent
    assert ds.datasets_dir() == repo.parent / "shared" / "datasets"


def test_missing_files_raise_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("DPSQL_DATASETS", str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="DPSQL_DATASETS"):
        ds.load_protein()
    with pytest.raises(FileNotFoundError, match="MNIST"):
        ds.load_mnist()
    with pytest.raises(FileNotFoundError):
        ds.load_cal_housing(tmp_path / "absent.gz")


# --------------------------------------------------------------------------------------------
# Parsers on small synthetic files (no dataset needed)
# --------------------------------------------------------------------------------------------


def test_protein_parser_on_small_file(tmp_path):
    rng = np.random.default_rng(1)
    feats = np.round(rng.normal(size=(5, 74)) * 100, 2)
    labels = np.array([0, 1, 0, 0, 1])
    lines = [
        "\t".join([str(279), str(1000 + i), str(labels[i])] + [f"{v:.2f}" for v in feats[i]])
        for i in range(5)
    ]
    p = tmp_path / "bio.dat.gz"
    p.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    X, y = ds.load_protein(p)
    assert X.shape == (5, 74) and X.dtype == np.float64
    np.testing.assert_array_equal(X, feats)
    np.testing.assert_array_equal(y, labels.astype(float))

    bad = tmp_path / "bad.dat.gz"
    bad.write_bytes(gzip.compress(b"1\t2\t0\t1.5\n"))
    with pytest.raises(ValueError, match="77 numeric columns"):
        ds.load_protein(bad)


def _write_idx(path: Path, arr: np.ndarray) -> None:
    header = (0x800 | arr.ndim).to_bytes(4, "big") + b"".join(
        int(s).to_bytes(4, "big") for s in arr.shape
    )
    path.write_bytes(gzip.compress(header + arr.astype(np.uint8).tobytes()))


def test_mnist_parser_on_small_files(tmp_path):
    imgs = np.arange(3 * 28 * 28, dtype=np.int64).reshape(3, 28, 28) % 256
    lbls = np.array([7, 0, 9])
    _write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", imgs)
    _write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", lbls)
    X, y = ds.load_mnist(tmp_path, split="test")
    assert X.shape == (3, 784)
    np.testing.assert_allclose(X, imgs.reshape(3, -1) / 255.0)
    np.testing.assert_array_equal(y, lbls)
    with pytest.raises(ValueError, match="split"):
        ds.load_mnist(tmp_path, split="validation")
    # Swapped files: the idx magic numbers disagree.
    _write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", lbls)
    with pytest.raises(ValueError, match="magic"):
        ds.load_mnist(tmp_path, split="test")


# --------------------------------------------------------------------------------------------
# Real datasets
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def protein():
    return _load_or_skip(ds.load_protein)


@pytest.mark.slow
def test_protein_shape_and_labels(protein):
    X, y = protein
    assert X.shape == (145_751, 74) and X.dtype == np.float64
    assert y.shape == (145_751,)
    assert set(np.unique(y)) == {0.0, 1.0}
    assert int(y.sum()) == 1_296
    assert np.isfinite(X).all()
    # Features are exact to 2 decimals in the file.
    np.testing.assert_allclose(X[:100] * 100, np.round(X[:100] * 100), atol=1e-6)


@pytest.mark.slow
def test_protein_bolt_on_preprocessing(protein):
    X, _ = protein
    Xn = ds.normalize_rows(X)
    np.testing.assert_allclose(np.linalg.norm(Xn, axis=1), 1.0, atol=1e-12)
    train, test = ds.train_test_split(X.shape[0], 0.5, seed=0)
    assert (len(train), len(test)) == (72_876, 72_875)


@pytest.mark.parametrize(("split", "n"), [("train", 60_000), ("test", 10_000)])
def test_mnist(split, n):
    X, y = _load_or_skip(ds.load_mnist, split=split)
    assert X.shape == (n, 784) and X.dtype == np.float64
    assert X.min() == 0.0 and X.max() == 1.0
    counts = np.bincount(y, minlength=10)
    assert len(counts) == 10 and counts.sum() == n and counts.min() > 0.08 * n
    Z = ds.random_projection(X[:1000], dim=50, seed=0)
    assert Z.shape == (1000, 50)


def test_cal_housing_vendored_and_features():
    X, y = ds.load_cal_housing()
    assert X.shape == (20_640, 8) and y.shape == (20_640,)
    assert y.min() > 0 and y.max() == 500_001.0
    F = ds.cal_housing_features(X)
    assert F.shape == (20_640, 8)
    assert F.min() >= -1.0 and F.max() <= 1.0
    # The bounds are public, not the data's min/max: some features do not reach +-1.
    assert not np.allclose(F.min(axis=0), -1.0)


def test_cal_housing_vendored_checksum_matches_readme():
    data_dir = Path(ds.__file__).resolve().parent / "data"
    readme = (data_dir / "README.md").read_text()
    digest = hashlib.sha256((data_dir / "cal_housing.data.gz").read_bytes()).hexdigest()
    assert digest in re.findall(r"[0-9a-f]{64}", readme)


def test_cal_housing_matches_shared_copy():
    shared = ds.datasets_dir() / "cal_housing" / "cal_housing.data.gz"
    X1, y1 = _load_or_skip(ds.load_cal_housing, shared)
    X0, y0 = ds.load_cal_housing()
    np.testing.assert_array_equal(X0, X1)
    np.testing.assert_array_equal(y0, y1)


def test_cal_housing_bounds_are_sane():
    for name, (lo, hi) in ds.CAL_HOUSING_BOUNDS.items():
        assert lo < hi, name
    # Values beyond the bounds are clipped, never extrapolated.
    X = np.array([[-200.0, 0.0, 999.0, 1e6, 1e6, 1e9, 1.0, 99.0]])
    F = ds.cal_housing_features(X)
    assert F.min() >= -1.0 and F.max() <= 1.0


# --------------------------------------------------------------------------------------------
# Data-independent transforms and synthetic data
# --------------------------------------------------------------------------------------------


def test_random_projection_reproducible_and_data_independent():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(40, 30))
    A = ds.random_projection(X, dim=5, seed=7)
    assert A.shape == (40, 5)
    np.testing.assert_array_equal(A, ds.random_projection(X, dim=5, seed=7))
    assert not np.allclose(A, ds.random_projection(X, dim=5, seed=8))
    # The matrix depends on the seed only: projecting a subset gives the same rows.
    np.testing.assert_allclose(ds.random_projection(X[:3], dim=5, seed=7), A[:3], rtol=1e-12)
    # Recover P from the identity: entries have variance 1/dim.
    P = ds.random_projection(np.eye(2000), dim=50, seed=0)
    assert abs(P.var() * 50 - 1.0) < 0.02


def test_normalize_rows():
    X = np.array([[3.0, 4.0], [0.0, 0.0], [-1e-200, 0.0], [1e200, 1e200]])
    N = ds.normalize_rows(X)
    np.testing.assert_allclose(N[0], [0.6, 0.8])
    np.testing.assert_array_equal(N[1], [0.0, 0.0])
    assert np.isfinite(N).all()
    norms = np.linalg.norm(N, axis=1)
    np.testing.assert_allclose(norms[[0, 2, 3]], 1.0)
    assert norms[1] == 0.0
    assert X[0, 0] == 3.0  # input untouched


def test_train_test_split():
    tr, te = ds.train_test_split(1001, 0.25, seed=4)
    assert len(te) == 250 and len(tr) == 751
    assert np.intersect1d(tr, te).size == 0
    np.testing.assert_array_equal(np.sort(np.concatenate([tr, te])), np.arange(1001))
    tr2, te2 = ds.train_test_split(1001, 0.25, seed=4)
    np.testing.assert_array_equal(te, te2)
    assert not np.array_equal(te, ds.train_test_split(1001, 0.25, seed=5)[1])
    with pytest.raises(ValueError):
        ds.train_test_split(10, 1.5, seed=0)


def test_synthetic_classification():
    X, y = ds.synthetic_classification(20_000, 50, seed=0)
    assert X.shape == (20_000, 50) and X.dtype == np.float64
    norms = np.linalg.norm(X, axis=1)
    assert norms.max() <= 1.0 + 1e-12 and norms.min() >= 0.5 - 1e-12
    assert set(np.unique(y)) == {-1.0, 1.0}
    assert 0.4 < (y > 0).mean() < 0.6
    X2, y2 = ds.synthetic_classification(20_000, 50, seed=0)
    np.testing.assert_array_equal(X, X2)
    np.testing.assert_array_equal(y, y2)
    # A linear model separates the noiseless version exactly.
    Xs, ys = ds.synthetic_classification(5_000, 10, seed=1, noise=0.0)
    w, *_ = np.linalg.lstsq(Xs, ys, rcond=None)
    assert (np.sign(Xs @ w) == ys).mean() > 0.9


# --------------------------------------------------------------------------------------------
# Bulk load / fetch against a real PostgreSQL server
# --------------------------------------------------------------------------------------------


@pytest.fixture
def schema(conn, scratch_schema):
    conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{scratch_schema}"')
    return scratch_schema


def _data(n=257, d=7, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    X[0, 0] = np.inf
    X[1, 1] = -0.0
    X[2, 2] = 1e-310  # subnormal: the binary path must be bit-exact
    return X, rng.integers(0, 2, size=n).astype(np.float64) * 2 - 1


@pytest.mark.parametrize("as_array", [True, False])
def test_load_fetch_round_trip(conn, schema, as_array):
    X, y = _data()
    n = load_numpy(conn, f"{schema}.rt", X, y, as_array=as_array)
    assert n == len(y)
    assert conn.execute(f'SELECT count(*) FROM "{schema}".rt').fetchone()[0] == n
    X2, y2 = fetch_numpy(conn, f"{schema}.rt")
    assert X2.dtype == np.float64 and X2.flags.c_contiguous
    np.testing.assert_array_equal(X2, X)
    np.testing.assert_array_equal(y2, y)
    assert np.signbit(X2[1, 1])
    cols = [
        r[0]
        for r in conn.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = %s AND table_name = 'rt' ORDER BY ordinal_position",
            [schema],
        )
    ]
    expected = ["rid", "x", "y"] if as_array else ["rid", *[f"f{j}" for j in range(1, 8)], "y"]
    assert cols == expected
    rids = [r[0] for r in conn.execute(f'SELECT rid FROM "{schema}".rt ORDER BY rid')]
    assert rids == list(range(n))


def test_load_matches_sql_values(conn, schema):
    X, y = _data(n=5, d=3)
    load_numpy(conn, "vals", X, y, schema=schema)
    row = conn.execute(f'SELECT x, y FROM "{schema}".vals WHERE rid = 3').fetchone()
    assert row[0] == list(X[3]) and row[1] == y[3]
    lower = conn.execute(f'SELECT array_lower(x, 1) FROM "{schema}".vals LIMIT 1').fetchone()
    assert lower == (1,)


def test_load_in_chunks_and_append(conn, schema, monkeypatch):
    monkeypatch.setattr(loading, "_CHUNK_BYTES", 1000)  # forces many COPY writes
    X, y = _data(n=300, d=4)
    load_numpy(conn, f"{schema}.chunks", X[:200], y[:200])
    load_numpy(conn, f"{schema}.chunks", X[200:], y[200:], create=False, rid_start=200)
    X2, y2 = fetch_numpy(conn, f"{schema}.chunks")
    np.testing.assert_array_equal(X2, X)
    np.testing.assert_array_equal(y2, y)
    with pytest.raises(Exception, match="already exists"):
        load_numpy(conn, f"{schema}.chunks", X, y)
    assert load_numpy(conn, f"{schema}.chunks", X[:10], y[:10], replace=True) == 10
    assert fetch_numpy(conn, f"{schema}.chunks")[0].shape == (10, 4)


def test_identifiers_are_quoted(conn, schema):
    X, y = _data(n=4, d=3)
    odd = sql.Identifier(schema, "Odd Name; DROP TABLE x")
    load_numpy(conn, odd, X, y)
    np.testing.assert_array_equal(fetch_numpy(conn, odd)[0], X)
    load_numpy(conn, "MixedCase", X, y, schema=schema)
    np.testing.assert_array_equal(fetch_numpy(conn, f"{schema}.MixedCase")[1], y)
    got = conn.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = %s "
        "AND table_name = 'Odd Name; DROP TABLE x'",
        [schema],
    ).fetchone()
    assert got == (1,)
    with pytest.raises(ValueError):
        loading.split_table_name("a.b.c")
    with pytest.raises(ValueError):
        loading.split_table_name("a.b", schema="s")
    with pytest.raises(ValueError):
        load_numpy(conn, "no spaces please", X, y, schema=schema)


def test_fetch_query_order_nulls_and_empty(conn, schema):
    X, y = _data(n=50, d=3)
    load_numpy(conn, f"{schema}.q", X, y)
    X2, y2 = fetch_numpy(conn, f'SELECT y, x, rid FROM "{schema}".q ORDER BY rid DESC')
    np.testing.assert_array_equal(X2, X[::-1])
    np.testing.assert_array_equal(y2, y[::-1])
    # NULL labels and NULL elements force the general path; they come back as NaN.
    conn.execute(f'INSERT INTO "{schema}".q VALUES (50, ARRAY[1, NULL, 3]::float8[], NULL)')
    X3, y3 = fetch_numpy(conn, f"{schema}.q")
    assert X3.shape == (51, 3) and np.isnan(X3[50, 1]) and np.isnan(y3[50])
    np.testing.assert_array_equal(X3[:50], X)
    X4, y4 = fetch_numpy(conn, f'SELECT x, y FROM "{schema}".q WHERE false')
    assert X4.shape[0] == 0 and y4.shape == (0,)
    with pytest.raises(ValueError, match="column y"):
        fetch_numpy(conn, f'SELECT x FROM "{schema}".q')


def test_load_rejects_bad_shapes(conn, schema):
    with pytest.raises(ValueError):
        load_numpy(conn, f"{schema}.bad", np.zeros(3), np.zeros(3))
    with pytest.raises(ValueError):
        load_numpy(conn, f"{schema}.bad", np.zeros((3, 2)), np.zeros(4))
    exists = conn.execute("SELECT to_regclass(%s)", [f'"{schema}".bad']).fetchone()[0]
    assert exists is None
