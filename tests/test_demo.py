"""`dpsql demo` end to end on the test server."""

from __future__ import annotations

import re

from dpsql import demo


def test_demo_trains_and_reports(server_uri, capsys) -> None:
    assert demo.main(["--dsn", server_uri, "--epochs", "5"]) == 0
    out = capsys.readouterr().out
    acc = float(re.search(r"test accuracy (\d\.\d+)", out).group(1))
    majority = float(re.search(r"majority class: (\d\.\d+)", out).group(1))
    assert acc > majority + 0.15
    r2 = float(re.search(r"R\^2 (-?\d\.\d+)", out).group(1))
    assert r2 > 0.5
