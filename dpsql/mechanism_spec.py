"""The mechanisms' declarative specs (``sql/mechanisms/*.toml``) and what is generated from them.

One TOML file per mechanism holds its registration (task, models, train/plan/fit functions,
distributed mode, intercept and delta defaults, docs) and the ``dpsql.train`` parameters it
takes, each with its default rule and range on top of ``sql/mechanisms/parameters.toml`` (type,
signature default, meaning). From them come, committed and checked up to date by
``tests/python/test_mechanism_spec.py`` (the way psycopg generates its error classes):

- ``sql/install/53_mechanisms.sql``: the server's registry rows (``dpsql.mechanism_catalog``),
  which drive dispatch, the parameter checks (``_check_params``) and ``dpsql.mechanisms()``;
- ``dpsql/_mechanisms.py``: the Python mechanism classes (``dpsql.privacy``);
- ``docs/mechanisms.md``: the table of mechanisms and their parameters;
- from ``parameters.toml``'s ``arguments`` (dpsql.train's, in order), between GENERATED markers
  in hand-written files: the signatures of ``dpsql.train`` (``54_api.sql``, with the drop of
  the signature before the last argument added) and ``dpsql.preview`` (``57_preview.sql``),
  ``dpsql_internal._private_params`` and the argument lists that call it (``54_api.sql``,
  ``57_preview.sql``) and ``dpsql_internal._given_params`` (``31_mechanisms.sql``);
- from the specs, between GENERATED markers: the mechanism list that the SQL surface's
  regression test compares with the server's registry (``sql/test/sql/surface.sql`` and its
  expected output ``sql/test/expected/surface.out``, which echoes it).

The specs also say what their tests and benchmarks run (no hand list of mechanisms elsewhere):
``small_table`` and ``variants`` (tests/server/test_durable_charge.py,
test_owner_code_never_runs.py, test_pinned_settings.py) and ``audit`` (bench/audit.py).

``python -m dpsql.mechanism_spec`` rewrites them (``make generate``); ``--check`` fails if
one is stale.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

__all__ = [
    "Argument",
    "Parameter",
    "Spec",
    "generated_files",
    "load_arguments",
    "load_parameters",
    "load_specs",
]

# The keys a mechanism's spec may hold; every other one is a mistake.
_SPEC_KEYS = {
    "name": str,
    "python_class": str,
    "summary": str,
    "docs": str,
    "recommended": str,
    "task": str,
    "models": list,
    "train_function": str,
    "plan_function": str,
    "fit_function": str,
    "step_noise_function": str,
    "sgd_plan_function": str,
    "sgd_defaults": bool,
    "distributed": str,
    "intercept_default": bool,
    "needs_delta": bool,
    "delta_default": float,
    "python_fields": list,
    "doc": str,
    "parameters": dict,
    # what its tests' small tables (2,000 rows of 2 features, epsilon 1) need beyond its
    # defaults: dpsql.train's arguments (tests/server/test_durable_charge.py,
    # test_owner_code_never_runs.py and test_pinned_settings.py read them)
    "small_table": dict,
    # ([[variants]]) further argument sets on the same tables, each over small_table's: the
    # paths its defaults do not take (Gaussian noise, Poisson sampling, a given lambda, ...);
    # tests/server/test_pinned_settings.py replays each under hostile session settings
    "variants": list,
    # ([[audit]]) the thorough audit's runs on its worst-case dataset (bench/audit.py, whose
    # docstring says what it derives); none: one run at its defaults. Keys: _AUDIT_KEYS.
    "audit": list,
}
# An [[audit]] entry's keys: label (its name in the tables and in --only; required when the
# spec has more than one, and unique over the specs; default the mechanism's name), delta (the
# claimed delta; default bench/audit.py's 1e-5 for a mechanism that needs delta > 0, else 0),
# rows (the worst-case dataset's rows; default 100) and train (dpsql.train's arguments).
_AUDIT_KEYS = {"label": str, "delta": float, "rows": int, "train": dict}
_REQUIRED = {"name", "python_class", "summary", "docs", "recommended", "task", "train_function"}
_PARAMETER_KEYS = {
    "sql",
    "sql_default",
    "python",
    "python_name",
    "python_type",
    "doc",
    "who",
    "min",
    "exclusive_min",
    "max",
    "choices",
    "default",
    "rule",
    "alternative",
    "keys",
    "max_features",
}
# The server's default rules (sql/install/34_defaults.sql) a spec may name, by parameter.
_RULES = {
    "epochs": {"ten", "one", "epsilon", "epsilon_if_poisson"},
    "clip_norm": {"gradient_bound"},
    "step_size": {"half_inverse_smoothness", "bolton_noise_target"},
    "radius": {"ten_without_lambda"},
    "batch_size": {"fifty", "quiet_steps"},
    # an intercept unless the registration centres every feature (feature_bounds): 35_private.sql
    "intercept": {"uncentred"},
}
# Every mechanism takes these; they are not listed in its spec.
COMMON = ("epsilon", "delta", "noise_seed")
# ... and these too (intercept: a spec lists it for its rule only): not in the registry's
# params, nor among the arguments _given_params reports.
EVERY_MECHANISM = (*COMMON, "intercept")
# parameters.toml's keys that are not parameters: dpsql.train's argument order and the run's
# own arguments.
_NOT_PARAMETERS = ("arguments", "run")
_RUN_KEYS = {
    "sql",
    "sql_default",
    "required",
    "preview",
    "preview_default",
    "packed",
    "null_if_default",
    "given",
    "since",
    "doc",
}
_TASK_MODELS = {
    "classification": ["logistic", "huber", "multinomial"],
    "regression": ["linear"],
}


@dataclass(frozen=True)
class Parameter:
    """A ``dpsql.train`` parameter as one mechanism takes it."""

    name: str
    sql: str
    python_type: str
    doc: str
    python: str = "mechanism"  # a field of the class, or "train": Database.train's keyword
    python_name: str = ""
    sql_default: Any = None
    who: str = "analyst"
    default: str | None = None  # what the server fills in when it is left NULL, in words
    rule: str | None = None  # the name of the server's rule that does (34_defaults.sql)
    alternative: str | None = None  # a parameter that, given, lets this one be left NULL
    min: float | None = None
    exclusive_min: float | None = None
    max: float | None = None
    choices: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()  # options => {...}: the keys it accepts
    # (intercept rule uncentred) the most features at which the rule adds the intercept
    max_features: int | None = None

    @property
    def attribute(self) -> str:
        """The name in Python (``lambda`` is ``lambda_``)."""
        return self.python_name or self.name

    def constraint(self) -> str:
        """The range in words (docs)."""
        if self.choices:
            return " | ".join(f"`{c}`" for c in self.choices)
        parts = []
        if self.exclusive_min is not None:
            parts.append(f"> {self.exclusive_min:g}")
        if self.min is not None:
            parts.append(f"≥ {self.min:g}")
        if self.max is not None:
            parts.append(f"≤ {self.max:g}")
        if self.keys:
            parts.append("keys " + ", ".join(f"`{k}`" for k in self.keys))
        return ", ".join(parts)

    def server_json(self) -> dict[str, Any]:
        """What the server's registry keeps: the checks and the docs of ``dpsql.mechanisms()``."""
        out: dict[str, Any] = {"type": self.sql, "who": self.who, "doc": self.doc}
        for key in (
            "sql_default",
            "default",
            "rule",
            "alternative",
            "min",
            "exclusive_min",
            "max",
            "max_features",
        ):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.choices:
            out["choices"] = list(self.choices)
        if self.keys:
            out["keys"] = list(self.keys)
        return out


@dataclass(frozen=True)
class Spec:
    """One mechanism's spec: ``sql/mechanisms/<name>.toml``."""

    name: str
    python_class: str
    summary: str
    docs: str
    recommended: str
    task: str
    train_function: str
    doc: str = ""
    models: tuple[str, ...] = ()
    plan_function: str | None = None
    fit_function: str | None = None
    step_noise_function: str | None = None
    sgd_plan_function: str | None = None
    sgd_defaults: bool = False
    distributed: str | None = None
    intercept_default: bool = True
    needs_delta: bool = False
    delta_default: float = 0.0
    python_fields: tuple[str, ...] = ()
    parameters: dict[str, Parameter] = field(default_factory=dict)
    small_table: dict[str, Any] = field(default_factory=dict)
    variants: tuple[dict[str, Any], ...] = ()
    audit: tuple[dict[str, Any], ...] = ()

    @property
    def trained_models(self) -> list[str]:
        """The models it trains (the task's when the spec names none)."""
        return list(self.models) or _TASK_MODELS.get(
            self.task, [*_TASK_MODELS["classification"], "linear"]
        )

    @property
    def options(self) -> list[str]:
        return list(self.parameters["options"].keys) if "options" in self.parameters else []

    def registry_json(self) -> dict[str, Any]:
        """The registry row (``dpsql_internal._register_mechanism``)."""
        return {
            "name": self.name,
            "train_function": self.train_function,
            "task": self.task,
            "sgd_defaults": self.sgd_defaults,
            "needs_delta": self.needs_delta,
            "delta_default": self.delta_default,
            "summary": self.summary,
            "docs": self.docs,
            "options": self.options,
            "plan_function": self.plan_function,
            "fit_function": self.fit_function,
            "models": list(self.models) or None,
            # (intercept is every mechanism's, like COMMON: a spec lists it for its rule only)
            "params": [p for p in self.parameters if p not in EVERY_MECHANISM],
            "distributed": self.distributed,
            "intercept_default": self.intercept_default,
            "recommended": self.recommended,
            "parameters": {k: p.server_json() for k, p in self.parameters.items()},
            "step_noise_function": self.step_noise_function,
            "sgd_plan_function": self.sgd_plan_function,
        }


def spec_dir() -> Path:
    """``sql/mechanisms`` of the extension's sources (a checkout or a built package)."""
    from dpsql.extension import source_dir

    return source_dir() / "mechanisms"


def load_parameters(folder: Path | None = None) -> dict[str, dict[str, Any]]:
    """``parameters.toml``: every parameter a mechanism may take, by name."""
    path = (folder or spec_dir()) / "parameters.toml"
    table: dict[str, dict[str, Any]] = {
        k: v for k, v in tomllib.loads(path.read_text()).items() if k not in _NOT_PARAMETERS
    }
    for name, entry in table.items():
        unknown = set(entry) - _PARAMETER_KEYS
        if unknown or "sql" not in entry or "python_type" not in entry:
            raise ValueError(
                f"{path}: [{name}] has unknown keys {sorted(unknown)} or lacks sql/python_type"
            )
    return table


@dataclass(frozen=True)
class Argument:
    """One argument of ``dpsql.train`` (parameters.toml's ``arguments``, in their order)."""

    name: str
    sql: str
    sql_default: Any = None
    required: bool = False  # no default
    preview: bool = True  # also dpsql.preview's
    preview_default: Any = None  # dpsql.preview's default, where it differs
    packed: bool = True  # in _private_params' jsonb (else passed beside it)
    null_if_default: bool = False  # packed as NULL at its default
    given: bool = False  # reported by _given_params when set away from its default
    since: str | None = None  # the version that added it
    doc: str = ""

    def sql_literal(self, preview: bool = False) -> str:
        """Its default in the signature."""
        value = self.preview_default if preview and self.preview_default is not None else None
        return _sql_literal(self.sql_default if value is None else value)

    def declaration(self, preview: bool = False) -> str:
        if self.required:
            return f"{self.name} {self.sql}"
        return f"{self.name} {self.sql} DEFAULT {self.sql_literal(preview)}"


def _sql_literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value)


def load_arguments(folder: Path | None = None) -> list[Argument]:
    """dpsql.train's arguments in the order of its signature: parameters.toml's ``arguments``,
    each a parameter (type and default from its entry) or one of the run's own (``[run.*]``)."""
    path = (folder or spec_dir()) / "parameters.toml"
    raw = tomllib.loads(path.read_text())
    order: list[str] = raw.get("arguments", [])
    run: dict[str, dict[str, Any]] = raw.get("run", {})
    parameters = load_parameters(folder)
    problems = [f"[run.{n}] is also a parameter" for n in run if n in parameters]
    problems += [f"{n} is in arguments twice" for n in order if order.count(n) > 1][:1]
    problems += [f"{n} is not in arguments" for n in [*parameters, *run] if n not in order]
    arguments = []
    for name in order:
        if name in run:
            unknown = set(run[name]) - _RUN_KEYS
            if unknown or "sql" not in run[name]:
                problems.append(f"[run.{name}] has unknown keys {sorted(unknown)} or lacks sql")
                continue
            arguments.append(Argument(name=name, **run[name]))
        elif name in parameters:
            entry = parameters[name]
            arguments.append(
                Argument(
                    name=name,
                    sql=entry["sql"],
                    sql_default=entry.get("sql_default"),
                    given=name not in EVERY_MECHANISM,
                    doc=entry.get("doc", ""),
                )
            )
        else:
            problems.append(f"argument {name} is neither a parameter nor in [run]")
    required = [a.required for a in arguments]
    if required != sorted(required, reverse=True):
        problems.append("the required arguments must come first")
    if problems:
        raise ValueError(f"{path}: " + "; ".join(problems))
    return arguments


def _spec_problems(raw: dict[str, Any], stem: str) -> list[str]:
    """What is wrong with a spec's own keys."""
    problems = [k for k in raw if k not in _SPEC_KEYS]
    problems += [f"missing {k}" for k in sorted(_REQUIRED - set(raw))]
    problems += [
        f"{k} must be {t.__name__}"
        for k, t in _SPEC_KEYS.items()
        if k in raw and not isinstance(raw[k], t) and not (t is float and isinstance(raw[k], int))
    ]
    if raw.get("name") != stem:
        problems.append(f"name must be the file's, {stem!r}")
    return problems


def _parameters(
    raw: dict[str, Any], common: dict[str, dict[str, Any]], problems: list[str]
) -> dict[str, Parameter]:
    """A spec's parameters over parameters.toml; what is wrong goes to ``problems``."""
    parameters: dict[str, Parameter] = {}
    for name in [*COMMON, *raw.get("parameters", {})]:
        if name not in common:
            problems.append(f"parameter {name} is not in parameters.toml")
            continue
        own = raw.get("parameters", {}).get(name, {})
        bad = set(own) - _PARAMETER_KEYS
        if bad:
            problems.append(f"parameter {name}: unknown keys {sorted(bad)}")
            continue
        if own.get("alternative") not in (None, *raw.get("parameters", {})):
            problems.append(f"parameter {name}: its alternative is not one of its parameters")
        if "rule" in own and own["rule"] not in _RULES.get(name, ()):
            problems.append(f"parameter {name}: no server rule {own['rule']!r}")
        merged = {**common[name], **own}
        for key in ("choices", "keys"):
            merged[key] = tuple(merged.get(key, ()))
        parameters[name] = Parameter(name=name, **merged)
    batch = parameters.get("batch_size")
    if batch is not None and batch.rule == "quiet_steps" and "step_noise_function" not in raw:
        problems.append("batch_size rule quiet_steps needs a step_noise_function")
    missing = [f for f in raw.get("python_fields", []) if f not in parameters]
    problems += [f"python field {f} is not one of its parameters" for f in missing]
    strange = [a for a in raw.get("small_table", {}) if a not in parameters]
    problems += [f"small_table argument {a} is not one of its parameters" for a in strange]
    variants = raw.get("variants", [])
    for n, variant in enumerate(variants if isinstance(variants, list) else []):
        if not isinstance(variant, dict) or not variant:
            problems.append(f"variants[{n}] must be a table of dpsql.train's arguments")
            continue
        strange = [a for a in variant if a not in parameters]
        problems += [f"variants[{n}] argument {a} is not one of its parameters" for a in strange]
    problems += _audit_problems(raw.get("audit", []), parameters)
    return parameters


def _is_a(value: Any, t: type) -> bool:
    """TOML's value of type ``t`` (an integer is a float too, a boolean is no number)."""
    if isinstance(value, bool):
        return t is bool
    return isinstance(value, t) or (t is float and isinstance(value, int))


def _audit_problems(audit: Any, parameters: dict[str, Parameter]) -> list[str]:
    """What is wrong with a spec's [[audit]] entries."""
    if not isinstance(audit, list):
        return []  # (_spec_problems: audit must be list)
    problems = []
    labels = []
    for n, entry in enumerate(audit):
        if not isinstance(entry, dict):
            problems.append(f"audit[{n}] must be a table")
            continue
        problems += [f"audit[{n}] has unknown key {k}" for k in entry if k not in _AUDIT_KEYS]
        problems += [
            f"audit[{n}].{k} must be {t.__name__}"
            for k, t in _AUDIT_KEYS.items()
            if k in entry and not _is_a(entry[k], t)
        ]
        strange = [a for a in entry.get("train", {}) if a not in parameters]
        problems += [f"audit[{n}] argument {a} is not one of its parameters" for a in strange]
        if len(audit) > 1 and "label" not in entry:
            problems.append(f"audit[{n}] needs a label (the spec has {len(audit)} audits)")
        labels.append(entry.get("label"))
    problems += [f"audit label {x!r} is used twice" for x in set(labels) if labels.count(x) > 1]
    return problems


def load_specs(folder: Path | None = None) -> dict[str, Spec]:
    """Every mechanism's spec, by name, checked for unknown keys and parameters."""
    folder = folder or spec_dir()
    common = load_parameters(folder)
    specs: dict[str, Spec] = {}
    for path in sorted(folder.glob("*.toml")):
        if path.name == "parameters.toml":
            continue
        raw = tomllib.loads(path.read_text())
        problems = _spec_problems(raw, path.stem)
        parameters = _parameters(raw, common, problems)
        if problems:
            raise ValueError(f"{path}: " + "; ".join(problems))
        raw = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
        raw["parameters"] = parameters
        raw["delta_default"] = float(raw.get("delta_default", 0.0))
        specs[path.stem] = Spec(**raw)
    labels = [e.get("label", s.name) for s in specs.values() for e in s.audit or [{}]]
    twice = sorted({x for x in labels if labels.count(x) > 1})
    if twice:
        raise ValueError(f"{folder}: audit labels used by more than one spec: {twice}")
    return specs


# ---------------------------------------------------------------------------------------------
# What is generated.

_HEADER = "Generated by `python -m dpsql.mechanism_spec` from sql/mechanisms/*.toml: do not edit."


def _json(value: Any, indent: int = 0) -> str:
    """Readable JSON: an object a key a line; a list on one line when it fits in 100 columns."""
    pad = " " * (indent + 4)
    if isinstance(value, dict) and value:
        items = [f"{pad}{json.dumps(k)}: {_json(v, indent + 4)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    flat = json.dumps(value, ensure_ascii=False)
    if isinstance(value, list) and len(flat) + indent > 80:
        items = [pad + json.dumps(v, ensure_ascii=False) for v in value]
        return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"
    return flat


def render_sql(specs: dict[str, Spec]) -> str:
    out = [
        "-" * 90,
        f"-- {_HEADER}",
        "-- The registry rows of every mechanism (31_mechanisms.sql): dispatch, parameter checks,",
        "-- defaults and dpsql.mechanisms().",
        "-" * 90,
        "",
    ]
    for spec in specs.values():
        body = _json(spec.registry_json())
        out.append(f"SELECT dpsql_internal._register_mechanism($spec${body}$spec$::jsonb);")
        out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# Generated regions of hand-written SQL files: the lines between
#   -- BEGIN GENERATED: <region> (make generate; sql/mechanisms/parameters.toml)
#   -- END GENERATED: <region>
# are rewritten from parameters.toml (indented as the BEGIN line), or from the specs where the
# BEGIN line ends "(make generate; sql/mechanisms/*.toml)".

_SOURCE = "(make generate; sql/mechanisms/parameters.toml)"
_SPECS_SOURCE = "(make generate; sql/mechanisms/*.toml)"
_WIDTH = 100


def _wrapped(items: list[str], indent: int, last: str = "") -> list[str]:
    """``items`` comma-separated, wrapped at _WIDTH columns."""
    text = ", ".join(items) + last
    return textwrap.wrap(text, _WIDTH - indent, break_long_words=False, break_on_hyphens=False)


def _signature(function: str, arguments: list[Argument], preview: bool = False) -> list[str]:
    decls = [a.declaration(preview) for a in arguments]
    lines = [f"CREATE OR REPLACE FUNCTION {function}("]
    lines += [f"    {d}," for d in decls[:-1]] + [f"    {decls[-1]})"]
    return lines


def _drops(function: str, arguments: list[Argument]) -> list[str]:
    """Drops of the signatures before each version that added arguments (an upgrade replays
    the install script: CREATE OR REPLACE would add an overload beside the old signature)."""
    lines = []
    for version in sorted({a.since for a in arguments if a.since}):
        added = [a.name for a in arguments if a.since == version]
        before = [a.sql for a in arguments if not a.since or a.since < version]
        lines.append(f"-- ({version}: {', '.join(added)} added)")
        lines.append(f"DROP FUNCTION IF EXISTS {function}(")
        lines += ["    " + w for w in _wrapped(before, 4, ");")]
    return lines


def _private_params(arguments: list[Argument]) -> list[str]:
    packed = [a for a in arguments if a.packed]
    declarations = ",\n".join(f"    {a.name} {a.sql}" for a in packed)
    pairs = ",\n".join(
        f"        '{a.name}', "
        + (f"nullif({a.name}, {a.sql_literal()})" if a.null_if_default else a.name)
        for a in packed
    )
    return [
        "CREATE OR REPLACE FUNCTION dpsql_internal._private_params(",
        declarations + ")",
        "RETURNS jsonb LANGUAGE sql IMMUTABLE",
        "SET search_path = pg_catalog, pg_temp  -- (called in the caller's session: no operator"
        " of theirs)",
        "AS $$",
        "    SELECT jsonb_build_object(",
        pairs + ")",
        "$$;",
    ]


def _given_expression(a: Argument) -> str:
    if a.sql_default is None:
        if a.sql == "jsonb" or a.sql.endswith("[]"):
            return f"coalesce(params->'{a.name}', 'null') <> 'null'"
        return f"params->>'{a.name}' IS NOT NULL"
    default = a.sql_literal()
    value = f"params->>'{a.name}'" if a.sql == "text" else f"(params->>'{a.name}')::{a.sql}"
    return f"coalesce({value}, {default}) <> {default}"


def _given_params(arguments: list[Argument]) -> list[str]:
    given = [a for a in arguments if a.given]
    rows = [f"                ('{a.name}', {_given_expression(a)})" for a in given]
    return [
        "CREATE OR REPLACE FUNCTION dpsql_internal._given_params(params jsonb)",
        "RETURNS text[] LANGUAGE sql IMMUTABLE AS $$",
        """    SELECT coalesce(array_agg(k ORDER BY k COLLATE "C"), '{}')""",
        "      FROM (VALUES",
        ",\n".join(rows) + ")",
        "           AS t(k, set_by_caller)",
        "     WHERE set_by_caller",
        "$$;",
    ]


def generated_regions(arguments: list[Argument]) -> dict[str, list[str]]:
    """Each generated region's lines (unindented), by its name in the markers."""
    previewed = [a for a in arguments if a.preview]
    return {
        "train signature": _drops("dpsql.train", arguments) + _signature("dpsql.train", arguments),
        "preview signature": _drops("dpsql.preview", previewed)
        + _signature("dpsql.preview", previewed, preview=True),
        "_private_params": _private_params(arguments),
        # (the calls of dpsql.train and dpsql.preview, indented 8)
        "_private_params arguments": _wrapped([a.name for a in arguments if a.packed], 8),
        "_given_params": _given_params(arguments),
    }


def _sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def spec_regions(specs: dict[str, Spec]) -> dict[str, list[str]]:
    """The generated regions from the specs, by name: the mechanism list of the SQL surface's
    regression test (sql/test/sql/surface.sql, echoed in its expected output), which the test
    compares with the server's registry (``dpsql.mechanisms()``)."""
    rows = [
        f"    ({_sql_text(s.name)}, {_sql_text(s.task)},"
        f" {_sql_text('{' + ','.join(s.trained_models) + '}')}, {str(s.needs_delta).lower()})"
        for s in specs.values()
    ]
    return {
        "mechanism list": [
            "INSERT INTO specs (name, task, models, needs_delta) VALUES",
            ",\n".join(rows) + ";",
        ]
    }


def splice(text: str, regions: dict[str, list[str]], where: str = "") -> str:
    """``text`` with every generated region rewritten (a region may occur more than once)."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        i += 1
        stripped = line.strip()
        if not stripped.startswith("-- BEGIN GENERATED: "):
            continue
        name = stripped.removeprefix("-- BEGIN GENERATED: ")
        name = name.removesuffix(_SOURCE).removesuffix(_SPECS_SOURCE).strip()
        if name not in regions:
            raise ValueError(f"{where}: unknown generated region {name!r}")
        end = f"-- END GENERATED: {name}"
        while i < len(lines) and lines[i].strip() != end:
            i += 1
        if i == len(lines):
            raise ValueError(f"{where}: no {end!r}")
        indent = line[: len(line) - len(line.lstrip())]
        out += [indent + x if x else x for r in regions[name] for x in r.split("\n")]
    return "\n".join(out)


def _python_type(p: Parameter) -> str:
    return f"{p.python_type} | None"


def _python_default(p: Parameter) -> str:
    return repr(p.sql_default) if p.sql_default is not None else "None"


def _render_class(spec: Spec) -> str:
    doc = textwrap.indent(spec.doc.strip() + "\n", "    ").rstrip()
    fields = []
    eps = spec.parameters["epsilon"]
    fields.append(
        f"    epsilon: {_python_type(eps)} = None" if eps.alternative else "    epsilon: float"
    )
    fields.append(
        f"    delta: float | None = None  # the mechanism's default: {spec.delta_default:g}"
    )
    for name in spec.python_fields:
        p = spec.parameters[name]
        fields.append(f"    {p.attribute}: {_python_type(p)} = {_python_default(p)}")
    fields.append("    noise_seed: int | None = None")
    renamed = [(spec.parameters[n].attribute, n) for n in spec.python_fields]
    sql_names = ", ".join(f"({a!r}, {n!r})" for a, n in renamed if a != n)
    return (
        f"@dataclass(frozen=True)\nclass {spec.python_class}(_Mechanism):\n"
        f'    """{doc.lstrip()}\n    """\n\n'
        + "\n".join(fields)
        + f"\n\n    name: ClassVar[str] = {spec.name!r}\n"
        f"    _sql_names: ClassVar[tuple[tuple[str, str], ...]] = "
        f"({sql_names}{',' if sql_names else ''})\n"
    )


def _field_table(specs: dict[str, Spec]) -> str:
    """The mechanisms' class fields for the CLI's flags: attribute -> (type, choices, help)."""
    table: dict[str, tuple[str, tuple[str, ...], str]] = {}
    takers: dict[str, list[str]] = {}
    for spec in specs.values():
        for name in spec.python_fields:
            p = spec.parameters[name]
            table[p.attribute] = (p.python_type, p.choices, p.doc)
            takers.setdefault(p.attribute, []).append(spec.name)
    rows = [
        f"    {a!r}: ({t!r}, {c!r}, {(d + ' (' + ', '.join(takers[a]) + ')')!r}),"
        for a, (t, c, d) in sorted(table.items())
    ]
    return "\n".join(rows)


def render_python(specs: dict[str, Spec]) -> str:
    classes = "\n\n".join(_render_class(s) for s in specs.values())
    field_table = _field_table(specs)
    names = ", ".join(f'"{s.python_class}"' for s in specs.values())
    registry = "\n".join(f"        {s.python_class}," for s in specs.values())
    return f'''"""The server's privacy mechanisms, for ``Database.train(privacy=...)``.

{_HEADER}
A field left ``None`` takes the server's default (docs/mechanisms.md, docs/defaults.md).
"""

# ruff: noqa: E501 (generated: the specs' texts)
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar

# (the classes only: dpsql and dpsql.privacy re-export them all, a new spec's class with them)
__all__ = [{names}]


@dataclass(frozen=True)
class _Mechanism:
    """Named arguments of ``dpsql.train`` from the fields; None leaves the server's default."""

    name: ClassVar[str] = ""
    _sql_names: ClassVar[tuple[tuple[str, str], ...]] = ()

    def sql_args(self) -> dict[str, Any]:
        """Named arguments of ``dpsql.train`` for this mechanism."""
        from psycopg.types.json import Jsonb

        renamed = dict(self._sql_names)
        args: dict[str, Any] = {{"privacy": self.name}}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            args[renamed.get(f.name, f.name)] = Jsonb(value) if isinstance(value, dict) else value
        return args


{classes}

# Every field the classes take beyond epsilon, delta and noise_seed, for the CLI's flags
# (``dpsql train --clip-norm ...``): attribute -> (Python type, choices, help and takers).
FIELDS: dict[str, tuple[str, tuple[str, ...], str]] = {{
{field_table}
}}

# The server's registry, as classes (``SELECT * FROM dpsql.mechanisms()``).
MECHANISMS: dict[str, type[_Mechanism]] = {{
    cls.name: cls
    for cls in (
{registry}
    )
}}
'''


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_docs(specs: dict[str, Spec]) -> str:
    out = [
        "# The mechanisms",
        "",
        f"<!-- {_HEADER} -->",
        "",
        "Every mechanism `dpsql.train(..., privacy => name)` accepts, from its spec in",
        "`sql/mechanisms/<name>.toml` (also `SELECT * FROM dpsql.mechanisms()` and `dpsql",
        "mechanisms`). A parameter left `NULL` (SQL) or `None` (Python) takes the default below;",
        "docs/defaults.md gives the SGD family's rules in full. A parameter a mechanism does not",
        "list is refused. Python: the mechanism's class holds the fields marked *class*; the",
        "others are keywords of `Database.train`.",
        "",
        "| mechanism | Python | task | models | δ default | Citus | recommended |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in specs.values():
        delta = f"{s.delta_default:g}" + (" (needs > 0)" if s.needs_delta else "")
        out.append(
            f"| [`{s.name}`](#{s.name}) | `{s.python_class}` | {s.task} | "
            f"{', '.join(s.trained_models)} | {delta} | {s.distributed or 'refused'} | "
            f"{_cell(s.recommended)} |"
        )
    for s in specs.values():
        out += ["", f"## {s.name}", "", f"{_cell(s.summary)} ({s.docs}).", ""]
        out += ["| parameter | in Python | default | range | who |", "|---|---|---|---|---|"]
        for p in s.parameters.values():
            where = "class" if p.name in (*COMMON, *s.python_fields) else "`Database.train`"
            if p.name == "delta":
                default = f"{s.delta_default:g}"
            elif p.name == "epsilon":
                default = "required" + (f" (or {p.alternative})" if p.alternative else "")
            else:
                default = p.default or (repr(p.sql_default) if p.sql_default is not None else "—")
            out.append(
                f"| `{p.name}` | {where} `{p.attribute}` | {_cell(default)} | "
                f"{_cell(p.constraint())} | {p.who} |"
            )
    return "\n".join(out) + "\n"


# The hand-written files with generated regions (from the source tree's root).
_SPLICED = (
    Path("sql", "install", "31_mechanisms.sql"),
    Path("sql", "install", "54_api.sql"),
    Path("sql", "install", "57_preview.sql"),
    Path("sql", "test", "sql", "surface.sql"),
    Path("sql", "test", "expected", "surface.out"),
)


def generated_files(root: Path, specs: dict[str, Spec] | None = None) -> dict[Path, str]:
    """Each generated file of the source tree at ``root`` and its content (for the files with
    generated regions: the file as it is, its regions rewritten)."""
    folder = root / "sql" / "mechanisms"
    specs = specs if specs is not None else load_specs(folder)
    regions = generated_regions(load_arguments(folder)) | spec_regions(specs)
    files = {
        root / "sql" / "install" / "53_mechanisms.sql": render_sql(specs),
        root / "dpsql" / "_mechanisms.py": _format_python(render_python(specs)),
        root / "docs" / "mechanisms.md": render_docs(specs),
    }
    for relative in _SPLICED:
        path = root / relative
        if path.exists():
            files[path] = splice(path.read_text(), regions, str(relative))
    return files


def _format_python(source: str) -> str:
    """``ruff format`` of the generated module, so that the checked-in file is lint clean."""
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", "_mechanisms.py", "-"],
        input=source,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dpsql.mechanism_spec", description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if a generated file is stale")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    args = parser.parse_args(argv)
    stale = []
    for path, content in generated_files(args.root).items():
        if not path.exists() or path.read_text() != content:
            stale.append(path)
            if not args.check:
                path.write_text(content)
    for path in stale:
        print(f"{'stale' if args.check else 'wrote'}: {path}")
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    raise SystemExit(main())
