"""The suite's result does not depend on which test file ran first.

The flow tests share one Prefect API per session (``prefect_harness`` in tests/conftest.py,
``prefect_api`` in tests/scaleout/conftest.py), so a test that read "the latest run" would
read whichever file's run came last. Each reads its own run (by the id its run's summary
carries), and ``make test-order`` runs these files in the reverse of pytest's order (CI runs
its fast tier after ``make test``). These checks keep that target's list whole and reversed,
and keep tests from reading the shared API's newest run or artifact.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tests.helpers.code import REPO

SHARED_API_FIXTURES = re.compile(r"\b(prefect_harness|prefect_api)\b")
# reading calls that answer "the newest", whoever made it
LATEST_READS = ("read_latest_artifacts(", "FlowRunSort.START_TIME_DESC", "FlowRunSort.EXPECTED_START_TIME_DESC")


def _makefile_list() -> list[str]:
    """The test files ``make test-order`` hands pytest (make -n: printed, not run)."""
    out = subprocess.run(["make", "-n", "-s", "test-order"], cwd=REPO, capture_output=True,
                         text=True, check=True, timeout=60).stdout
    line = next(line for line in out.splitlines() if " pytest " in line)
    return [word for word in line.split() if word.startswith("tests/")]


def _test_files() -> list[str]:
    return sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("test_*.py"))


def test_make_test_order_lists_every_file_on_the_shared_api_in_reverse_order():
    users = [f for f in _test_files() if SHARED_API_FIXTURES.search((REPO / f).read_text(encoding="utf-8"))
             and f != "tests/code/test_test_order.py"]
    listed = _makefile_list()
    assert sorted(listed) == users, f"make test-order must run exactly {users}"
    assert listed == sorted(listed, reverse=True)  # pytest's own order is the sorted paths


def test_no_test_reads_the_shared_apis_newest_run():
    offenders = [f"{f}: {what}" for f in _test_files() if f != "tests/code/test_test_order.py"
                 for what in LATEST_READS if what in (REPO / f).read_text(encoding="utf-8")]
    assert not offenders, "read the test's own run by its id instead:\n" + "\n".join(offenders)


def test_ci_runs_the_suite_and_the_other_order_from_an_empty_home(tmp_path):
    """.ci/run with ``make`` standing in for itself: what each make call sees."""
    bin_dir, home, seen = tmp_path / "bin", tmp_path / "home", tmp_path / "seen"
    bin_dir.mkdir()
    (home / ".config" / "pip").mkdir(parents=True)
    (home / ".config" / "pip" / "pip.conf").write_text("[global]\n")
    (home / ".prefect").mkdir()  # state an earlier run left: must not be seen
    (bin_dir / "make").write_text('#!/usr/bin/env bash\n'
                                  f'{{ echo "$* $HOME $PIP_CACHE_DIR ${{PREFECT_HOME:-}}"; '
                                  f'(cd "$HOME" && find . | sort); }} >> {seen}\n')
    (bin_dir / "make").chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(home), "PREFECT_HOME": str(home / "p"),
           "PIP_CACHE_DIR": str(tmp_path / "pip-cache")}
    subprocess.run(["bash", str(REPO / ".ci" / "run")], env=env, check=True, timeout=60)
    calls = [line.split() for line in seen.read_text().splitlines() if not line.startswith(".")]
    assert [c[0] for c in calls] == ["test", "test-order"]
    fresh = {c[1] for c in calls}
    assert len(fresh) == 1 and all(c[2] == str(tmp_path / "pip-cache") and len(c) == 3 for c in calls)
    listed = [line for line in seen.read_text().splitlines() if line.startswith(".")]
    assert sorted(set(listed)) == [".", "./.config", "./.config/pip", "./.config/pip/pip.conf"]
    assert not Path(fresh.pop()).exists()  # removed at exit
