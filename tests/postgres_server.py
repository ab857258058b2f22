"""A real Postgres for the tests, started without root by pgserver (a wheel that bundles the server).

`postgres` (session scope: one server per pytest process, ~2 s) and `pg_url` (a fresh database per
test). When the server cannot be started the tests that need it skip with the reason, unless
QGATE_REQUIRE_POSTGRES=1 (.ci/run sets it): then they fail, so CI never passes without them.
(As root, pgserver runs the server as a system user `pgserver` it adds: Postgres refuses root.)
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REQUIRE = "QGATE_REQUIRE_POSTGRES"


@dataclass(frozen=True)
class Server:
    pgdata: Path
    handle: object

    def url(self, database: str = "postgres") -> str:
        return self.handle.get_uri(database)  # type: ignore[attr-defined]


def _unavailable(reason: str) -> None:
    if os.environ.get(REQUIRE) == "1":
        pytest.fail(f"{REQUIRE}=1 and no Postgres: {reason}", pytrace=False)
    pytest.skip(f"no Postgres for the history tests: {reason} (install the test extra: pgserver, psycopg)")


@pytest.fixture(scope="session")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    try:
        import pgserver
        import psycopg  # noqa: F401
    except ImportError as exc:
        _unavailable(f"cannot import {exc.name}")
    pgdata = tmp_path_factory.mktemp("pgdata")
    try:
        handle = pgserver.get_server(pgdata, cleanup_mode="delete")
    except Exception as exc:  # noqa: BLE001 (any failure to start is the reason to report)
        _unavailable(f"pgserver could not start it: {type(exc).__name__}: {exc}")
    yield Server(pgdata, handle)
    handle.cleanup()


@pytest.fixture
def pg_url(postgres: Server) -> str:
    """A new, empty database on the session's server."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres.url(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return postgres.url(name)
