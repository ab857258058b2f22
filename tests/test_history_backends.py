"""qgate.history on both backends: a SQLite file and a real Postgres (tests/postgres_server.py).

The append-only rules are checked twice: through qgate.history, and by writing to the database
directly (raw SQL, as a client that is not qgate would), which the database itself must refuse.
Then several processes appending at once, the one-line errors of a Postgres store, and a Postgres store
on a really full disk.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import shutil
import sqlite3
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from postgres_server import Server, pg_url, postgres  # noqa: F401  (fixtures)
from test_full_disk import _mount
from test_history import contract, make_night  # noqa: F401  (the fixture and the night builder)
from typer.testing import CliRunner

from qgate import history
from qgate.cli import app as qgate_app
from qgate.cli.history import app
from qgate.fleet import ARTIFACT_PREFIX

runner = CliRunner()


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "store" / "history.sqlite")
    return request.getfixturevalue("pg_url")


def execute(store: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """One statement straight to the database (autocommit), `?` placeholders; its rows."""
    if store.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(store, autocommit=True) as conn:
            cur = conn.execute(sql.replace("?", "%s"), params)
            return cur.fetchall() if cur.description else []
    conn = sqlite3.connect(store, isolation_level=None)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def refused(store: str) -> type[Exception] | tuple[type[Exception], ...]:
    if store.startswith("postgresql://"):
        import psycopg

        return psycopg.Error
    return sqlite3.DatabaseError


def test_append_no_op_and_refusal(tmp_path: Path, contract: Path, store: str) -> None:  # noqa: F811
    run, _ = make_night(tmp_path / "a", contract, "2026-12-01", "a" * 40, misses=1)
    assert history.append(store, run).status == "appended"
    before = history.read_rows(store)
    assert history.append(store, run).status == "already recorded"
    other, _ = make_night(tmp_path / "b", contract, "2026-12-01", "b" * 40, scale=0.9)
    with pytest.raises(history.HistoryError, match=r"night 2026-12-01 is already recorded .* append-only"):
        history.append(store, other)
    with pytest.raises(history.HistoryError, match="already recorded as night 2026-12-01"):
        history.append(store, run, night="2026-12-05")
    assert history.read_rows(store) == before
    assert history.append(store, other, night="2026-12-02").status == "appended"
    assert [r["night"] for r in history.read_rows(store)] == ["2026-12-01"] * 2 + ["2026-12-02"] * 2


def test_both_backends_return_the_same_rows(tmp_path: Path, contract: Path, pg_url: str) -> None:  # noqa: F811
    lite = str(tmp_path / "h.sqlite")
    for i, night in enumerate(("2026-12-01", "2026-12-02")):
        run, _ = make_night(tmp_path / night, contract, night, f"{i + 1}" * 40, 1 - i / 10, misses=i)
        history.append(lite, run)
        history.append(pg_url, run)
    a, b = history.read_rows(lite), history.read_rows(pg_url)
    for rows in (a, b):
        for row in rows:
            assert row.pop("appended_at")
    assert a == b and len(a) == 4
    assert {type(v).__name__ for row in b for v in row.values()} <= {"str", "int", "float", "NoneType"}


def test_the_database_refuses_what_breaks_the_rules(
    tmp_path: Path,
    contract: Path,  # noqa: F811
    store: str,
) -> None:
    run, _ = make_night(tmp_path, contract, "2026-12-01", "a" * 40, misses=1)
    history.append(store, run)
    rows = history.read_rows(store)
    error = refused(store)
    for stmt in ("UPDATE nights SET verdict = 'PASS'", "DELETE FROM nights"):
        with pytest.raises(error, match="append-only"):
            execute(store, stmt)
    if store.startswith("postgresql://"):
        with pytest.raises(error, match="append-only"):
            execute(store, "TRUNCATE nights")
    cols = history.COLUMN_NAMES
    insert = f"INSERT INTO nights ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})"

    def row_with(**changes: Any) -> tuple[Any, ...]:
        return tuple({**rows[0], **changes}[c] for c in cols)

    fresh = {"appended_at": "2026-12-09T00:00:00.000001+00:00", "source": "/elsewhere"}
    cases = [
        # a night without verdicts, or without the verdict of one of its kinds
        (row_with(**fresh, night="2026-12-09", verdict=None), "without verdicts|nights_judged"),
        (
            row_with(**fresh, night="2026-12-09", verdicts=json.dumps({"speed": {}})),
            "without verdicts|judged",
        ),
        # the run folder of night 2026-12-01 as another night
        (row_with(night="2026-12-08", appended_at=fresh["appended_at"]), "another night"),
        # a row added to a night that an earlier append recorded (its stamp and folder or not)
        (row_with(**fresh, arm="candidate-2"), "night already recorded"),
        *(
            [(row_with(arm="candidate-2"), "night already recorded")]
            if store.startswith("postgresql://")  # Postgres knows the writer (xmin); SQLite the stamp
            else []
        ),
    ]
    for values, message in cases:
        with pytest.raises(error, match=message):
            execute(store, insert, values)
    assert history.read_rows(store) == rows
    # The same refusals through qgate: the database's rule, worded for the user.
    unjudged = [{**r, "verdict": None, "night": "2026-12-09", "source": "/x"} for r in rows]
    with pytest.raises(history.HistoryError, match="night 2026-12-09: qgate: a night without verdicts"):
        history.open_store(store).append(unjudged)


class _Logged(logging.Handler):
    """What the database driver logs in a racer (psycopg logs a failed pipeline's exit as a warning,
    which reaches stderr of a process that otherwise succeeded)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname}: {record.getMessage()}")


def _append(args: tuple[str, str, Any]) -> str:
    store, folder, barrier = args
    logged = _Logged()
    driver = logging.getLogger("psycopg")
    driver.addHandler(logged)
    driver.setLevel(logging.WARNING)
    barrier.wait(timeout=60)
    try:
        status = history.append(store, folder).status
    except history.HistoryError as exc:
        status = f"refused: {exc}"
    finally:
        driver.removeHandler(logged)
    return status + "".join(f" [logged {line}]" for line in logged.lines)


def test_concurrent_appends_record_every_night_once(
    tmp_path: Path,
    contract: Path,  # noqa: F811
    store: str,
) -> None:
    nights = [make_night(tmp_path / f"n{i}", contract, f"2026-12-0{i}", f"{i}" * 40)[0] for i in (1, 2, 3)]
    rival, _ = make_night(tmp_path / "rival", contract, "2026-12-03", "9" * 40, scale=0.8)
    # Every night at once, the first one three times, the third one against a rival with other figures;
    # the store does not exist yet (SQLite: the creators race too).
    folders = [nights[0], nights[0], nights[1], nights[0], nights[2], rival]
    # spawn, not fork: a forked racer inherits the test process's state (a SIGTERM handler an engine test
    # left, the attestation's at-fork flusher thread), and one such racer that outlived Pool.terminate
    # hung the suite once (2026-12-05); the timeout makes a stuck racer a failure, not a hang
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Manager().Barrier(len(folders))
    with ctx.Pool(len(folders)) as pool:
        out = pool.map_async(_append, [(store, str(f), barrier) for f in folders], chunksize=1).get(240)
    # Nothing logged by the driver in any racer: "already recorded" is a success, silent on stderr.
    assert not [s for s in out if "[logged " in s], out
    by_folder: dict[str, list[str]] = {}
    for folder, status in zip(folders, out, strict=True):
        by_folder.setdefault(str(folder), []).append(status)
    assert sorted(by_folder[str(nights[0])]) == ["already recorded", "already recorded", "appended"]
    assert by_folder[str(nights[1])] == ["appended"]
    third = by_folder[str(nights[2])] + by_folder[str(rival)]
    assert sorted(s.split(":")[0] for s in third) == ["appended", "refused"], third
    assert "is already recorded" in next(s for s in third if s.startswith("refused"))
    rows = history.read_rows(store)
    assert sorted((r["night"], r["arm"]) for r in rows) == sorted(
        (f"2026-12-0{i}", arm) for i in (1, 2, 3) for arm in ("control", "candidate")
    )
    assert len({r["source"] for r in rows if r["night"] == "2026-12-03"}) == 1


def test_fleet_entries_have_their_own_history(tmp_path: Path, contract: Path, store: str) -> None:  # noqa: F811
    run, _ = make_night(tmp_path / "a", contract, "2026-12-01", "a" * 40)
    other, _ = make_night(tmp_path / "b", contract, "2026-12-01", "b" * 40, scale=0.9)
    assert history.append(store, run, entry="v100-fp16").status == "appended"
    assert history.append(store, other, entry="v100-bf16").status == "appended"  # the same night
    assert [r["source"] for r in history.read_rows(store, entry="v100-bf16")] == [str(other)] * 2
    with pytest.raises(history.HistoryError, match="no such history store|no qgate history store"):
        history.read_rows(store)
    with pytest.raises(history.HistoryError, match="fleet entry 'Bad Name'"):
        history.append(store, run, entry="Bad Name")


# ------------------------------------------------------------------ Postgres: the one-line errors


def _cli_append(run: Path, store: str) -> Any:
    return runner.invoke(app, ["append", str(run), "--store", store])


def _one_line(res: Any, *needles: str) -> None:
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.output, res.output
    for needle in needles:
        assert needle in lines[0], lines[0]


def _wait_for_password_auth(wrong: str) -> None:
    """pg_reload_conf() only signals the server: wait until it has read the new pg_hba.conf."""
    import psycopg

    for _ in range(300):  # 30 s: on a loaded 2-core machine the reload once took longer than 10 s
        try:
            psycopg.connect(wrong).close()
        except psycopg.OperationalError:
            return
        time.sleep(0.1)
    raise AssertionError("the server never asked qgate_pw for a password (pg_hba.conf not reloaded)")


def test_postgres_connection_errors_are_one_line(
    tmp_path: Path,
    contract: Path,  # noqa: F811
    postgres: Server,  # noqa: F811
    pg_url: str,  # noqa: F811
) -> None:
    import psycopg

    run, _ = make_night(tmp_path, contract, "2026-12-01", "a" * 40)
    # A database that does not exist, a host that does not resolve, a malformed URL.
    nope = pg_url.replace("/t_", "/nope_", 1)
    _one_line(_cli_append(run, nope), "cannot connect", "does not exist")
    _one_line(_cli_append(run, "postgresql://qgate@no-such-host.invalid/db"), "cannot connect")
    _one_line(_cli_append(run, "postgresql://x@/db?nosuchoption=1"), "cannot connect")
    _one_line(_cli_append(run, "mysql://x@host/db"), "a store is a SQLite path or a postgresql://")
    # A refused password: a role that must give one (scram-sha-256 on the server's socket).
    with psycopg.connect(postgres.url(), autocommit=True) as conn:
        conn.execute("DO $$ BEGIN CREATE ROLE qgate_pw LOGIN PASSWORD 'right'; "
                     "EXCEPTION WHEN duplicate_object THEN NULL; END $$")  # fmt: skip
        hba = postgres.pgdata / "pg_hba.conf"
        if "qgate_pw" not in hba.read_text():
            hba.write_text("local all qgate_pw scram-sha-256\n" + hba.read_text())
            conn.execute("SELECT pg_reload_conf()")
    socket_url = postgres.url().replace("postgres:@", "qgate_pw:wrong@", 1)
    _wait_for_password_auth(socket_url)
    res = _cli_append(run, socket_url)
    _one_line(res, "cannot connect", "password authentication failed", "qgate_pw:***@")
    assert "wrong" not in res.output
    in_query = postgres.url().replace("postgres:@", "qgate_pw@", 1) + "&password=wrong"
    res = _cli_append(run, in_query)
    _one_line(res, "password authentication failed", "password=***")
    assert "wrong" not in res.output
    right = socket_url.replace(":wrong@", ":right@")
    with psycopg.connect(right) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("qgate_pw",)


def test_postgres_foreign_or_newer_store_is_refused_unchanged(
    tmp_path: Path,
    contract: Path,  # noqa: F811
    pg_url: str,  # noqa: F811
) -> None:
    run, _ = make_night(tmp_path, contract, "2026-12-01", "a" * 40)
    execute(pg_url, "CREATE TABLE users (name TEXT)")
    _one_line(_cli_append(run, pg_url), "not a qgate history store (tables: users)")
    res = runner.invoke(app, ["append", str(run), "--store", pg_url, "--entry", "fp16"])
    _one_line(res, "not a qgate history store (tables: users)")
    assert execute(pg_url, "SELECT count(*) FROM pg_namespace WHERE nspname = 'qgate_fp16'") == [(0,)]
    assert execute(pg_url, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'") == [("users",)]
    execute(pg_url, "DROP TABLE users")
    assert history.append(pg_url, run).status == "appended"
    execute(pg_url, "UPDATE qgate_history SET value = '99' WHERE key = 'schema_version'")
    later, _ = make_night(tmp_path / "b", contract, "2026-12-02", "b" * 40)
    res = _cli_append(later, pg_url)
    _one_line(res, "schema_version = '99'", "written by a newer qgate", "nothing was changed")
    assert execute(pg_url, "SELECT count(*) FROM nights") == [(2,)]
    res = runner.invoke(app, ["report", "--out", str(tmp_path / "rep")], env={"QGATE_HISTORY_STORE": pg_url})
    _one_line(res, "schema_version = '99'")


def test_postgres_report_from_the_env_store(tmp_path: Path, contract: Path, pg_url: str) -> None:  # noqa: F811
    for i, night in enumerate(("2026-12-01", "2026-12-02")):
        run, _ = make_night(tmp_path / night, contract, night, f"{i + 1}" * 40, 1 - 0.15 * i)  # FAIL: floor
        res = runner.invoke(app, ["append", str(run)], env={"QGATE_HISTORY_STORE": pg_url})
        assert res.exit_code == 0 and res.output.startswith("appended: night"), res.output
    res = runner.invoke(app, ["report", "--out", str(tmp_path / "rep")], env={"QGATE_HISTORY_STORE": pg_url})
    assert res.exit_code == 0, res.output
    text = (tmp_path / "rep" / "history.md").read_text()
    assert "**regression came in** (speed)" in text and (tmp_path / "rep" / "history.png").is_file()


def test_an_older_store_is_read_and_upgraded_by_its_next_append(
    tmp_path: Path,
    contract: Path,  # noqa: F811
    store: str,
) -> None:
    run, _ = make_night(tmp_path / "a", contract, "2026-12-01", "a" * 40, misses=1)
    history.append(store, run)
    # Make it what schema 1 wrote: no V2 columns (the triggers would refuse an UPDATE of nights, not
    # of qgate_history). The upgrade adds whatever night.COLUMNS has beyond the store's columns.
    for col in (*history.V2_COLUMNS, *history.V3_COLUMNS, *history.V4_COLUMNS):
        execute(store, f"ALTER TABLE nights DROP COLUMN {col}")
    execute(store, "UPDATE qgate_history SET value = '1' WHERE key = 'schema_version'")
    old = history.read_rows(store)
    assert len(old) == 2 and all(r["quality_seeds"] is None for r in old)
    assert history.append(store, run).status == "already recorded"  # a no-op: nothing upgraded either
    assert execute(store, "SELECT value FROM qgate_history WHERE key = 'schema_version'") == [("1",)]
    later, _ = make_night(tmp_path / "b", contract, "2026-12-02", "b" * 40)
    assert history.append(store, later).status == "appended"
    version = str(history.HISTORY_SCHEMA_VERSION)
    assert execute(store, "SELECT value FROM qgate_history WHERE key = 'schema_version'") == [(version,)]
    assert [r["night"] for r in history.read_rows(store)] == ["2026-12-01"] * 2 + ["2026-12-02"] * 2


# A Postgres store on a really full disk (issue 63). The disk: a small tmpfs, mounted where the test may
# (root, as CI is), made a tablespace of this module's real server and the default tablespace of a fresh
# database, so every table qgate makes there lives on it; a file fills it. No second server starts (a
# pgserver start costs seconds) and nothing is injected at the driver: the server itself meets ENOSPC.
# Without a mount the test skips (tests/test_full_disk.py injects ENOSPC for the file writers only).
PLANTED_PW = "pw-planted-9f3c"  # the socket's trust auth takes any: only qgate's output can leak it
REPO = Path(__file__).resolve().parents[1]


@dataclass
class PgDisk:
    """A tmpfs holding the tables of one database of a real Postgres; full from `fill()` to `free()`."""

    path: Path
    url: str  # with PLANTED_PW in it

    def fill(self) -> None:
        with open(self.path / "filler", "ab", buffering=0) as fh:
            try:
                while True:
                    fh.write(b"\0" * (64 << 10))
            except OSError:
                pass  # ENOSPC: the disk is full
        assert shutil.disk_usage(self.path).free < 8192  # not one page of a table fits

    def free(self) -> None:
        (self.path / "filler").unlink()


@pytest.fixture
def pg_disk(tmp_path_factory: pytest.TempPathFactory, postgres: Server, pg_url: str) -> Iterator[PgDisk]:  # noqa: F811
    import psycopg

    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("no tmpfs can be mounted here (not root): a real Postgres on a full disk needs one")
    # Beside the server's data folder (whose parents pgserver opened to its system user), owned by the
    # server's user as a tablespace must be.
    path = tmp_path_factory.mktemp("pgdisk")
    owner = postgres.pgdata.stat()
    if not _mount(path, f"size=1m,uid={owner.st_uid},gid={owner.st_gid},mode=0700"):
        pytest.skip(f"mount -t tmpfs on {path} failed")
    space, database = f"full_{uuid.uuid4().hex[:8]}", urlsplit(pg_url).path.lstrip("/")
    try:
        with psycopg.connect(postgres.url(), autocommit=True) as conn:
            conn.execute(f"CREATE TABLESPACE {space} LOCATION '{path}'")
            conn.execute(f"ALTER DATABASE {database} SET default_tablespace = {space}")
        yield PgDisk(path, pg_url.replace("postgres:@", f"postgres:{PLANTED_PW}@", 1))
    finally:
        with psycopg.connect(postgres.url(), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
            conn.execute(f"DROP TABLESPACE IF EXISTS {space}")
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=10)


def test_a_postgres_store_on_a_full_disk_is_one_line_and_stays_whole(
    tmp_path: Path,
    contract: Path,  # noqa: F811
    pg_disk: PgDisk,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import psycopg

    store, masked = pg_disk.url, "postgresql://postgres:***@"
    assert PLANTED_PW in store
    first, _ = make_night(tmp_path / "a", contract, "2026-12-01", "1" * 40)
    second, _ = make_night(tmp_path / "b", contract, "2026-12-02", "2" * 40)
    # The store's first append, on a full disk: its tables cannot take a page.
    pg_disk.fill()
    res = _cli_append(first, store)
    _one_line(res, f"qgate: error: {masked}", "No space left on device", "; nothing was changed")
    assert PLANTED_PW not in res.output
    with pytest.raises(history.HistoryError, match="no qgate history store here yet"):
        history.read_rows(store)  # the half-made store was rolled back whole
    pg_disk.free()
    res = _cli_append(first, store)
    assert res.exit_code == 0 and res.output.startswith("appended: night 2026-12-01"), res.output
    before = history.read_rows(store)
    # A store that holds a night: the next one on a full disk. Its first page has room for another
    # night's rows; fillfactor 10 (a DBA's setting qgate leaves alone) makes them need a new page, as
    # a store whose last page is full does.
    with psycopg.connect(store, autocommit=True) as conn:
        conn.execute("ALTER TABLE nights SET (fillfactor = 10)")
    pg_disk.fill()
    res = _cli_append(second, store)
    _one_line(res, f"qgate: error: {masked}", "No space left on device", "; nothing was changed")
    assert PLANTED_PW not in res.output
    assert history.read_rows(store) == before  # nothing half-written is read
    # fleet gather appends each entry's night to the entry's own schema: refused in the entry's line.
    shutil.copytree(second, tmp_path / "art" / f"{ARTIFACT_PREFIX}a")
    fleet = tmp_path / "fleet.yaml"
    entries = [{"name": "a", "runs-on": ["cpu"], "speed_contract": "contracts/smoke-cpu.yaml"}]
    fleet.write_text(yaml.safe_dump({"schema_version": 1, "entries": entries}))
    monkeypatch.chdir(REPO)  # the list's contract path is the repository's
    gather = ["fleet", "gather", str(fleet), str(tmp_path / "art"), "--out", str(tmp_path / "rep")]
    res = runner.invoke(qgate_app, [*gather, "--store", store])
    assert res.exit_code == 2 and PLANTED_PW not in res.output and "Traceback" not in res.output, res.output
    said = res.stdout.splitlines()[0]
    assert said.startswith(f"a: refused: {masked}") and "No space left on device" in said, said
    pg_disk.free()
    res = _cli_append(second, store)
    assert res.exit_code == 0 and res.output.startswith("appended: night 2026-12-02"), res.output
    assert [r["night"] for r in history.read_rows(store)] == ["2026-12-01"] * 2 + ["2026-12-02"] * 2
    res = runner.invoke(qgate_app, [*gather, "--store", store])
    assert res.exit_code == 0 and res.stdout.startswith("a: appended: night 2026-12-02"), res.output
