"""The history on a Postgres server (psycopg 3): one store for many writers, e.g. a fleet's runners.

The same two tables as the SQLite store, built from the same qgate.night.COLUMNS (TEXT, BIGINT,
DOUBLE PRECISION), in one Postgres schema of the database: `public`, or `qgate_<entry>` for a fleet
entry's history (qgate.history.store_for). The rules are the database's:
- `nights_judged`, a CHECK constraint: a row carries the verdict of each kind it has figures of;
- `qgate_nights_insert`, a BEFORE INSERT trigger that first takes a transaction-level advisory lock
  (every writer of the store queues there, as SQLite's BEGIN IMMEDIATE makes them) and then refuses a
  run folder already recorded as another night, and a row for a night that holds rows another
  transaction wrote (by their xmin: the night is recorded once, by one append; the Python side tells
  an identical night, a no-op, from a different one, refused);
- `qgate_append_only`: UPDATE, DELETE and TRUNCATE of `nights` are refused.
The trigger functions pin their search_path (SET search_path FROM CURRENT), so a client with another
search_path cannot point them at other tables. Every append is one transaction (READ COMMITTED: each
statement of the trigger, run after the lock, sees every append committed before it).

Only a database schema holding no table is made a store (on the first append); one that holds other
tables is not a qgate store and is left as it is. Connection problems (a wrong URL, a refused
password, a server that is down) are one line naming the URL without its password.
"""

from __future__ import annotations

import re
from typing import Any

from qgate.history import schema
from qgate.history.rows import check_rows
from qgate.night import COLUMN_NAMES, COLUMNS, HistoryError
from qgate.redact import redact_url, scrub

# pg_advisory_xact_lock's key: "qgate" in ASCII, so that other users of advisory locks can tell it.
LOCK_KEY = 0x7167617465
CONNECT_TIMEOUT_S = 10
_PG_TYPES = {"TEXT": "TEXT", "INTEGER": "BIGINT", "REAL": "DOUBLE PRECISION"}


def is_url(store: object) -> bool:
    return isinstance(store, str) and store.startswith(("postgresql://", "postgres://"))


def _pg_type(sql: str) -> str:
    """night.COLUMNS' SQLite type -> Postgres, constraints kept ("INTEGER NOT NULL" -> "BIGINT NOT NULL")."""
    first, _, rest = sql.partition(" ")
    return f"{_PG_TYPES[first]} {rest}".strip()


def _schema_sql() -> list[str]:
    cols = ",\n  ".join(f"{name} {_pg_type(sql)}" for name, sql in COLUMNS)
    judged = (
        "verdict IS NOT NULL AND (speed_contract IS NULL OR verdicts::jsonb ? 'speed') "
        "AND (quality_contract IS NULL OR verdicts::jsonb ? 'quality')"
    )
    return [
        "CREATE TABLE qgate_history (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        f"CREATE TABLE nights (\n  {cols},\n  PRIMARY KEY (night, arm),\n"
        f"  CONSTRAINT nights_judged CHECK ({judged})\n)",
        f"""CREATE FUNCTION qgate_nights_insert() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $f$
BEGIN
  PERFORM pg_advisory_xact_lock({LOCK_KEY});
  IF EXISTS (SELECT 1 FROM nights WHERE source = NEW.source AND night <> NEW.night) THEN
    RAISE EXCEPTION '{schema.OTHER_NIGHT}' USING ERRCODE = 'integrity_constraint_violation';
  END IF;
  -- A row of this night that another transaction wrote: xmin, the writer's transaction id (the
  -- 32-bit one: txid_current() modulo 2^32), not a stamp the client gives.
  IF EXISTS (SELECT 1 FROM nights WHERE night = NEW.night
             AND xmin <> (txid_current() % 4294967296)::text::xid) THEN
    RAISE EXCEPTION '{schema.RECORDED}' USING ERRCODE = 'integrity_constraint_violation';
  END IF;
  RETURN NEW;
END $f$""",
        f"""CREATE FUNCTION qgate_append_only() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
  RAISE EXCEPTION '{schema.APPEND_ONLY}' USING ERRCODE = 'integrity_constraint_violation';
END $f$""",
        "CREATE TRIGGER nights_insert BEFORE INSERT ON nights FOR EACH ROW "
        "EXECUTE FUNCTION qgate_nights_insert()",
        "CREATE TRIGGER nights_no_change BEFORE UPDATE OR DELETE ON nights FOR EACH ROW "
        "EXECUTE FUNCTION qgate_append_only()",
        "CREATE TRIGGER nights_no_truncate BEFORE TRUNCATE ON nights FOR EACH STATEMENT "
        "EXECUTE FUNCTION qgate_append_only()",
    ]


class PostgresStore:
    """One Postgres schema of one database; `append` and `read_rows` as SqliteStore's."""

    def __init__(self, url: str, namespace: str = "public") -> None:
        if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", namespace):
            raise HistoryError(f"history namespace {namespace!r}: expected [a-z_][a-z0-9_]*")
        self.url, self.namespace = url, namespace
        self.label = redact_url(url) + ("" if namespace == "public" else f" (schema {namespace})")

    def _connect(self) -> Any:
        try:
            import psycopg
        except ImportError:
            raise HistoryError(
                f"{self.label}: a postgresql:// store needs psycopg 3: pip install 'qgate[postgres]'"
            ) from None
        try:
            return psycopg.connect(self.url, connect_timeout=CONNECT_TIMEOUT_S)
        except psycopg.Error as exc:
            raise HistoryError(
                f"{self.label}: cannot connect to the history store: {_reason(exc, self.url)}"
            ) from None

    def _tables(self, cur: Any) -> set[str]:
        cur.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", (self.namespace,))
        return {r[0] for r in cur.fetchall()}

    def _validate(self, cur: Any, tables: set[str]) -> tuple[str, ...]:
        """The columns the store lacks (empty at the current version); HistoryError when not ours."""
        if not {"qgate_history", "nights"} <= tables:
            raise HistoryError(
                f"{self.label}: a database that is not a qgate history store (tables: "
                f"{', '.join(sorted(tables)) or 'none'}); nothing was changed"
            )
        cur.execute("SELECT key, value FROM qgate_history")
        version = schema.check_meta(dict(cur.fetchall()), self.label)
        cur.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = %s "
            "AND table_name = 'nights' ORDER BY ordinal_position",
            (self.namespace,),
        )
        cols = tuple(r[0] for r in cur.fetchall())
        missing = schema.check_columns(cols, version, self.label)
        return missing if version < schema.HISTORY_SCHEMA_VERSION else ()

    def _check_database(self, cur: Any) -> None:
        """Before a fleet entry's schema is made a store: the database's own (public) schema must be
        empty or a qgate store, so that qgate never settles into another application's database."""
        if self.namespace == "public":
            return
        cur.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        public = {r[0] for r in cur.fetchall()}
        if public and not {"qgate_history", "nights"} <= public:
            raise HistoryError(
                f"{redact_url(self.url)}: a database that is not a qgate history store (tables: "
                f"{', '.join(sorted(public))}); nothing was changed"
            )

    def _create(self, cur: Any) -> None:
        for stmt in _schema_sql():
            cur.execute(stmt)
        for key, value in schema.new_meta():  # one statement each: no pipeline (append, below)
            cur.execute("INSERT INTO qgate_history (key, value) VALUES (%s, %s)", (key, value))

    @staticmethod
    def _upgrade(cur: Any, missing: tuple[str, ...]) -> None:
        """Inside the append's transaction: the columns an older store lacks, added at the end."""
        for stmt in schema.upgrade_statements(missing, _pg_type):
            cur.execute(stmt)

    def _use_namespace(self, cur: Any, create: bool) -> None:
        from psycopg import sql

        if create and self.namespace != "public":
            cur.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.namespace)))
        cur.execute(sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(self.namespace)))

    def append(self, rows: list[dict[str, Any]]) -> str:
        """Insert one night's rows in one transaction: "appended", or "already recorded" when the
        database refused them as a night it holds with the same content; HistoryError otherwise."""
        import psycopg

        conn = self._connect()
        try:
            try:
                with conn.transaction(), conn.cursor() as cur:
                    # Creation and upgrade queue with the appends (the trigger takes the same lock).
                    cur.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
                    self._use_namespace(cur, create=True)
                    tables = self._tables(cur)
                    if not tables:
                        self._check_database(cur)
                        self._create(cur)
                    else:
                        self._upgrade(cur, self._validate(cur, tables))
                    # One statement for the night's rows, not executemany: psycopg runs executemany
                    # in libpq's pipeline mode, and a racer refused there (the night another append
                    # recorded: "already recorded", exit 0) could log "error ignored terminating
                    # <psycopg.Pipeline ...>: pipeline aborted" on stderr while leaving the pipeline.
                    marks = "(" + ", ".join("%s" for _ in COLUMN_NAMES) + ")"
                    cur.execute(
                        f"INSERT INTO nights ({', '.join(COLUMN_NAMES)}) VALUES "
                        + ", ".join(marks for _ in rows),
                        [row[k] for row in rows for k in COLUMN_NAMES],
                    )
                return "appended"
            except psycopg.errors.IntegrityError as exc:
                message = (exc.diag.message_primary or str(exc)).strip()
            return self._explain(conn, message, rows)
        except psycopg.Error as exc:
            # Whatever the server or the connection met (a full disk: "could not extend file ...: No
            # space left on device", a server that went down mid-append, in the append or in reading
            # why it was refused): the transaction was rolled back (a connection lost in the COMMIT
            # itself aside, which no client can tell from one lost before it).
            raise HistoryError(f"{self.label}: {_one_line(exc, self.url)}; nothing was changed") from None
        finally:
            conn.close()

    def _explain(self, conn: Any, message: str, rows: list[dict[str, Any]]) -> str:
        """What a refused append means, read after the refusal (the transaction wrote nothing)."""
        night = rows[0]["night"]
        if message.startswith('new row for relation "nights" violates check constraint'):
            raise HistoryError(f"{self.label}: night {night}: {schema.UNJUDGED}; nothing was changed")
        with conn.transaction(), conn.cursor() as cur:
            self._use_namespace(cur, create=False)
            if message.startswith(schema.OTHER_NIGHT):
                cur.execute(
                    "SELECT night FROM nights WHERE source = %s AND night <> %s LIMIT 1",
                    (rows[0]["source"], night),
                )
                other = cur.fetchone()
                raise HistoryError(
                    f"{self.label}: {rows[0]['source']} is already recorded as night "
                    f"{other[0] if other else '?'}: one run folder is one night; nothing was changed"
                )
            cur.execute(
                "SELECT arm, content_sha256, commit_sha, appended_at FROM nights WHERE night = %s",
                (night,),
            )
            existing = {r[0]: (r[1], r[2], r[3]) for r in cur.fetchall()}
        if not existing:
            raise HistoryError(f"{self.label}: {message}; nothing was changed")
        if schema.same_night(existing, rows):
            return "already recorded"
        raise HistoryError(schema.refusal(self.label, night, existing, [r["arm"] for r in rows]))

    def read_rows(self) -> list[dict[str, Any]]:
        import psycopg

        conn = self._connect()
        try:
            with conn.transaction(), conn.cursor() as cur:
                self._use_namespace(cur, create=False)
                tables = self._tables(cur)
                if not tables:
                    raise HistoryError(f"{self.label}: no qgate history store here yet (no tables)")
                self._validate(cur, tables)
                cur.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_schema = %s "
                    "AND table_name = 'nights'",
                    (self.namespace,),
                )
                have = {r[0] for r in cur.fetchall()}
                cols = [c for c in COLUMN_NAMES if c in have]
                cur.execute(f"SELECT {', '.join(cols)} FROM nights ORDER BY {schema.ROW_ORDER}")
                rows = [{**dict.fromkeys(COLUMN_NAMES), **dict(zip(cols, r, strict=True))} for r in cur]
        except psycopg.Error as exc:
            raise HistoryError(f"{self.label}: {_one_line(exc, self.url)}") from None
        finally:
            conn.close()
        return check_rows(rows, self.label)


def _one_line(exc: BaseException, url: str) -> str:
    """The driver's first line, without the URL's secrets (libpq may quote the connection string)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return scrub(lines[0], [url]) if lines else type(exc).__name__


def _reason(exc: BaseException, url: str) -> str:
    """The server's own words when it gave some (FATAL: ...), else the driver's first line."""
    text = str(exc)
    if "FATAL:" in text:
        return scrub(" ".join(text.rsplit("FATAL:", 1)[1].split()), [url])
    return _one_line(exc, url)
