"""Finding PostgreSQL's server binaries where distributions put them (Debian: /usr/lib/postgresql/<v>/bin, off
PATH), and the store-down fault test failing instead of skipping when CI says PostgreSQL must be there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "postgres-bindir.sh"
NO_PG_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"  # Debian's postgresql package puts no pg_ctl here


def _bindir(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=30)


def _fake_server(bindir: Path) -> None:
    bindir.mkdir(parents=True)
    for name in ("pg_ctl", "initdb"):
        (bindir / name).write_text("#!/bin/sh\n")
        (bindir / name).chmod(0o755)


def test_finds_the_newest_debian_version_off_path(tmp_path: Path) -> None:
    _fake_server(tmp_path / "9.6" / "bin")
    _fake_server(tmp_path / "16" / "bin")
    (tmp_path / "17" / "bin").mkdir(parents=True)  # a client-only version: no server binaries
    found = _bindir({"PATH": NO_PG_PATH, "SESSIONGATE_PG_LIB_ROOT": str(tmp_path)})
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == str(tmp_path / "16" / "bin")


def test_explicit_bindir_wins_and_a_wrong_one_is_an_error(tmp_path: Path) -> None:
    _fake_server(tmp_path / "custom")
    env = {"PATH": NO_PG_PATH, "SESSIONGATE_PG_LIB_ROOT": str(tmp_path / "none")}
    assert _bindir({**env, "SESSIONGATE_PG_BINDIR": str(tmp_path / "custom")}).stdout.strip() == str(
        tmp_path / "custom"
    )
    wrong = _bindir({**env, "SESSIONGATE_PG_BINDIR": str(tmp_path)})
    assert wrong.returncode == 1
    assert "SESSIONGATE_PG_BINDIR" in wrong.stderr


def test_nothing_installed_is_exit_1(tmp_path: Path) -> None:
    missing = _bindir({"PATH": NO_PG_PATH, "SESSIONGATE_PG_LIB_ROOT": str(tmp_path)})
    assert missing.returncode == 1
    assert missing.stdout == ""


def test_this_machines_postgresql_is_found_without_path() -> None:
    """The machine's apt-installed PostgreSQL (scripts/ensure-postgres.sh installs it), found with no help."""
    found = _bindir({"PATH": NO_PG_PATH})
    assert found.returncode == 0, found.stderr
    assert (Path(found.stdout.strip()) / "pg_ctl").is_file()


def _store_down_test(tmp_path: Path, **env: str) -> str:
    run = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            str(REPO / "tests" / "faults" / "test_store_down.py") + "::test_postgres_down_then_back",
        ],
        cwd=REPO,
        env={**os.environ, "PATH": NO_PG_PATH, "SESSIONGATE_PG_LIB_ROOT": str(tmp_path), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    return run.stdout


def test_store_down_skips_without_postgres_unless_required(tmp_path: Path) -> None:
    assert "1 skipped" in _store_down_test(tmp_path, SESSIONGATE_REQUIRE_POSTGRES="0")
    required = _store_down_test(tmp_path, SESSIONGATE_REQUIRE_POSTGRES="1")
    assert "1 error" in required  # the fixture failed the test: not a skip
    assert "no PostgreSQL server binaries" in required
