"""`dpsql demo` end to end on the test server."""

from __future__ import annotations

import re

from dpsql import demo


def test_demo_trains_and_reports(server_uri, capsys) -> None:
    assert demo.main(["--dsn", server_uri, "--epochs", "5"]) == 0
    out = capsys.readouterr().out
    accs = [float(a) for a in re.findall(r"test accuracy (\d\.\d+)", out)]
    majority = float(re.search(r"majority class: (\d\.\d+)", out).group(1))
    assert len(accs) == 2 and accs[0] > majority + 0.15
    assert accs[1] > majority  # the private model, (1, 1e-6)-DP, still learns something
    assert "(eps, delta) = (1, 1e-06)" in out and "budget left on demo_houses" in out
    r2 = float(re.search(r"R\^2 (-?\d\.\d+)", out).group(1))
    assert r2 > 0.5
