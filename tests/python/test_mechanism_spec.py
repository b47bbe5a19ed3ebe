"""The mechanisms' specs (sql/mechanisms/*.toml) and what is generated from them: the files are
up to date, and a broken spec is refused with its file and reason."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from dpsql import mechanism_spec
from dpsql.privacy import MECHANISMS

REPO = Path(__file__).resolve().parents[2]
SPECS = REPO / "sql" / "mechanisms"


def test_the_generated_files_are_up_to_date() -> None:
    stale = [
        str(path.relative_to(REPO))
        for path, content in mechanism_spec.generated_files(REPO).items()
        if not path.exists() or path.read_text() != content
    ]
    assert not stale, f"run `make generate`: {stale} differ from sql/mechanisms/*.toml"


def test_every_spec_is_a_python_class_with_its_fields_and_defaults() -> None:
    specs = mechanism_spec.load_specs(SPECS)
    assert set(specs) == set(MECHANISMS)
    for name, spec in specs.items():
        cls = MECHANISMS[name]
        fields = {f.name: f for f in dataclasses.fields(cls)}
        expected = ["epsilon", "delta"]
        expected += [spec.parameters[p].attribute for p in spec.python_fields] + ["noise_seed"]
        assert list(fields) == expected, name
        assert fields["delta"].default is None  # the server's default, recorded with the model
        for p in spec.python_fields:
            assert fields[spec.parameters[p].attribute].default == spec.parameters[p].sql_default
        # (every generated class takes epsilon; their base, the registry's type, does not)
        args = cls(epsilon=1.0).sql_args()  # type: ignore[call-arg]
        assert args == {"privacy": name, "epsilon": 1.0} | {
            p: spec.parameters[p].sql_default
            for p in spec.python_fields
            if spec.parameters[p].sql_default is not None
        }


def _broken(tmp_path: Path, name: str, text: str) -> Path:
    folder = tmp_path / "mechanisms"
    shutil.copytree(SPECS, folder)
    (folder / name).write_text(text)
    return folder


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('name = "bolton"\nsurprise = 1\n', "surprise"),
        (
            (SPECS / "bolton.toml").read_text() + "\n[parameters.no_such]\n",
            "not in parameters.toml",
        ),
        (
            (SPECS / "bolton.toml")
            .read_text()
            .replace("sgd_defaults = true", 'sgd_defaults = "yes"'),
            "sgd_defaults must be bool",
        ),
        (
            (SPECS / "bolton.toml").read_text().replace('"gaussian", "permutation"', '"clip_norm"'),
            "python field clip_norm",
        ),
        (
            (SPECS / "bolton.toml").read_text().replace('rule = "ten"', 'rule = "eleven"'),
            "no server rule 'eleven'",
        ),
        (
            (SPECS / "scs13.toml").read_text().replace("batch_size = 50", "grid_points = 50"),
            "small_table argument grid_points",
        ),
        (
            (SPECS / "bolton.toml").read_text().replace('rule = "fifty"', 'rule = "quiet_steps"'),
            "quiet_steps needs a step_noise_function",
        ),
        (
            (SPECS / "bolton.toml").read_text() + "\n[[variants]]\ngrid_points = 3\n",
            r"variants\[2\] argument grid_points",
        ),
        ((SPECS / "bolton.toml").read_text() + "\n[[variants]]\n", r"variants\[2\] must be"),
        (
            (SPECS / "bolton.toml").read_text() + '\n[[audit]]\nlabel = "b"\nsurprise = 1\n',
            r"audit\[2\] has unknown key surprise",
        ),
        (
            (SPECS / "bolton.toml").read_text() + '\n[[audit]]\nlabel = "b"\nrows = "many"\n',
            r"audit\[2\].rows must be int",
        ),
        (
            (SPECS / "bolton.toml").read_text()
            + '\n[[audit]]\nlabel = "b"\ntrain = { grid_points = 3 }\n',
            r"audit\[2\] argument grid_points",
        ),
        (
            (SPECS / "bolton.toml").read_text() + "\n[[audit]]\ndelta = 0\n",
            r"audit\[2\] needs a label",
        ),
        (
            (SPECS / "bolton.toml").read_text().replace("(Gaussian)", "(epsilon-DP)"),
            "audit label 'bolton \\(epsilon-DP\\)' is used twice",
        ),
    ],
)
def test_a_broken_spec_names_its_file_and_fault(tmp_path: Path, text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason) as err:
        mechanism_spec.load_specs(_broken(tmp_path, "bolton.toml", text))
    assert "bolton.toml" in str(err.value)


def test_an_audit_label_is_one_mechanism_s(tmp_path: Path) -> None:
    """bench/audit.py's --only names an audit by its label: two specs may not share one."""
    text = (SPECS / "adassp.toml").read_text()
    folder = _broken(tmp_path, "adassp.toml", text + '\n[[audit]]\nlabel = "bolton (Gaussian)"\n')
    with pytest.raises(ValueError, match=r"more than one spec: \['bolton \(Gaussian\)'\]"):
        mechanism_spec.load_specs(folder)
    # (a spec without [[audit]] is audited once under its own name)
    text = (SPECS / "dpgd.toml").read_text()
    folder = _broken(tmp_path / "b", "dpgd.toml", text + '\n[[audit]]\nlabel = "adassp"\n')
    with pytest.raises(ValueError, match=r"more than one spec: \['adassp'\]"):
        mechanism_spec.load_specs(folder)


def test_the_surface_test_compares_the_registry_with_every_spec() -> None:
    """sql/test/sql/surface.sql (and its expected output, which echoes it) holds every spec's
    row between its generated markers, which make generate rewrites."""
    specs = mechanism_spec.load_specs(SPECS)
    (region,) = mechanism_spec.spec_regions(specs).values()
    for path in (REPO / "sql/test/sql/surface.sql", REPO / "sql/test/expected/surface.out"):
        text = path.read_text()
        for name, spec in specs.items():
            models = "{" + ",".join(spec.trained_models) + "}"
            assert f"('{name}', '{spec.task}', '{models}', " in text, (path.name, name)
        assert "\n".join(region) in text, path.name


def test_database_train_keywords_are_the_parameters_of_the_specs() -> None:
    """The training keywords of ``Database.train`` (parameters.toml: python = "train") have
    dpsql.train's defaults, so that Python and SQL fill in the same values."""
    import inspect

    from dpsql.connection import Database

    keywords = inspect.signature(Database.train).parameters
    for name, entry in mechanism_spec.load_parameters().items():
        if entry.get("python") != "train":
            continue
        keyword = keywords[entry.get("python_name", name)]
        assert keyword.default == entry.get("sql_default"), name


def test_every_generated_class_is_exported() -> None:
    """A new spec's class is importable as dpsql.<Class> and dpsql.privacy.<Class>: both
    re-export dpsql._mechanisms.__all__, which the specs generate (no hand list)."""
    import dpsql
    import dpsql.privacy

    for name, spec in mechanism_spec.load_specs(SPECS).items():
        for module in (dpsql, dpsql.privacy):
            assert spec.python_class in module.__all__, (module.__name__, name)
            assert getattr(module, spec.python_class) is MECHANISMS[name]


@pytest.mark.parametrize(
    ("old", "new", "reason"),
    [
        ('"burn_in", "options"', '"burn_in"', "options is not in arguments"),
        ('"validation",\n]', '"validation", "no_such",\n]', "no_such is neither"),
        ('"label", "model"', '"model", "label"', "required arguments must come first"),
        ('[run.seed]\nsql = "bigint"', '[run.seed]\nsql = "bigint"\nsurprise = 1', "run.seed"),
    ],
)
def test_a_broken_argument_list_is_refused(tmp_path: Path, old: str, new: str, reason: str) -> None:
    text = (SPECS / "parameters.toml").read_text()
    assert old in text
    folder = _broken(tmp_path, "parameters.toml", text.replace(old, new))
    with pytest.raises(ValueError, match=reason):
        mechanism_spec.load_arguments(folder)


def test_a_generated_region_is_rewritten_between_its_markers() -> None:
    """The region's lines replace what is between the markers (indented as the BEGIN line);
    an unknown region or a missing END is an error."""
    begin = "-- BEGIN GENERATED: _given_params (make generate; sql/mechanisms/parameters.toml)"
    text = f"a\n  {begin}\n  stale\n  -- END GENERATED: _given_params\nb"
    spliced = mechanism_spec.splice(text, {"_given_params": ["x", "", "y"]})
    assert spliced == f"a\n  {begin}\n  x\n\n  y\n  -- END GENERATED: _given_params\nb"
    with pytest.raises(ValueError, match="unknown generated region"):
        mechanism_spec.splice(text, {})
    with pytest.raises(ValueError, match="no '-- END GENERATED"):
        mechanism_spec.splice(text.replace("END", "FIN"), {"_given_params": []})
    # (a region from the specs names them as its source)
    specs_begin = "-- BEGIN GENERATED: mechanism list (make generate; sql/mechanisms/*.toml)"
    text = f"{specs_begin}\nstale\n-- END GENERATED: mechanism list"
    spliced = mechanism_spec.splice(text, {"mechanism list": ["x"]})
    assert spliced == f"{specs_begin}\nx\n-- END GENERATED: mechanism list"
