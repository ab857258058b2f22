"""No secret in any file or message qgate writes (issue 63): the recorded environment is redacted by name,
a store URL's password (in its user part, its query, `options=`, or behind a bad percent escape) stays
out of verdict.json, reports, the store and every one-line error.

The planted secrets go through the real CLI (compare --history, history append / report, fleet gather)
on the hand-made fixture results, with a real Postgres role that must give its password; the engine run's
own records are checked in test_speed_e2e (test_planted_secrets_stay_out_of_the_run), which rides on
that module's A/A run.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from postgres_server import Server, postgres  # noqa: F401  (fixtures)
from test_fleet import QUALITY, entry, fleet_file
from test_history import contract, make_night, support  # noqa: F401
from test_history_backends import _wait_for_password_auth
from typer.testing import CliRunner

from qgate.cli import app
from qgate.engine.preflight import arm_env
from qgate.fleet import ARTIFACT_PREFIX
from qgate.redact import REDACTED, redact_env, redact_url, scrub

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()
PASSWORD = "Pl4ntedPassw0rd"
ENV_SECRETS = {
    "HF_TOKEN": "hf_Pl4ntedTok3n",
    "VLLM_API_KEY": "Pl4ntedApiK3y",
    "AWS_SECRET_ACCESS_KEY": "Pl4ntedAws",
}
PLANTED = (PASSWORD, *ENV_SECRETS.values())


def test_the_recorded_env_is_redacted_by_name() -> None:
    environ = {
        **ENV_SECRETS,
        "TOKENIZERS_PARALLELISM": "false",  # a setting, not a token
        "HF_ENDPOINT": f"https://mirror:{PASSWORD}@hf.example/",
        "OMP_NUM_THREADS": "2",
    }
    record = arm_env("candidate", {"VLLM_SM70_QWEN38_FP16_GEMV": "1"}, environ).record()
    assert record["inherited_env"] == {
        "HF_ENDPOINT": "https://mirror:***@hf.example/",
        "HF_TOKEN": REDACTED,
        "OMP_NUM_THREADS": "2",
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_API_KEY": REDACTED,
    }
    assert record["env"] == {"VLLM_SM70_QWEN38_FP16_GEMV": "1"}  # the contract's own keys: as written
    # The engine still gets the real values: only the record is redacted.
    assert arm_env("candidate", {}, environ).process["HF_TOKEN"] == ENV_SECRETS["HF_TOKEN"]
    assert redact_env({"PGPASSWORD": "x", "GH_AUTH": "y", "MY_COOKIE": "z"}) == dict.fromkeys(
        ("PGPASSWORD", "GH_AUTH", "MY_COOKIE"), REDACTED
    )


@pytest.mark.parametrize(
    ("url", "shown", "quoted"),
    [
        (f"postgresql://u:{PASSWORD}@h:5432/db", "postgresql://u:***@h:5432/db", PASSWORD),
        # a bad percent escape: libpq quotes the password as written, or may stop at the escape
        (f"postgresql://u:{PASSWORD}%ZZ@h/db", "postgresql://u:***@h/db", PASSWORD),
        (f"postgresql://u:a@b{PASSWORD}@h/db", "postgresql://u:***@h/db", f"a@b{PASSWORD}"),  # '@' in it
        (
            f"postgresql://u@h/db?sslmode=require&password={PASSWORD}",
            "postgresql://u@h/db?sslmode=require&password=***",
            PASSWORD,
        ),
        (
            f"postgresql://u@h/db?options=-c%20password%3D{PASSWORD}",
            "postgresql://u@h/db?options=***",
            PASSWORD,
        ),
        (
            f"postgresql://u@h/db?options=-c password={PASSWORD}&x",
            "postgresql://u@h/db?options=***&x",
            PASSWORD,
        ),
        (
            "postgresql://u@h/db?application_name=nightly",
            "postgresql://u@h/db?application_name=nightly",
            None,
        ),
    ],
)
def test_a_store_url_is_shown_without_its_secrets(url: str, shown: str, quoted: str | None) -> None:
    assert redact_url(url) == shown
    # A driver's message may quote the URL, or the secret alone.
    for said in (url, quoted or ""):
        assert PASSWORD not in scrub(f"cannot connect: invalid token {said!r}", [url])


def _secret_role(postgres: Server) -> str:  # noqa: F811
    """A database owned by a role that must give PASSWORD (scram on the server's socket): its URL."""
    import psycopg

    with psycopg.connect(postgres.url(), autocommit=True) as conn:
        conn.execute(
            f"DO $$ BEGIN CREATE ROLE qgate_secret LOGIN PASSWORD '{PASSWORD}'; "
            "EXCEPTION WHEN duplicate_object THEN NULL; END $$"
        )
        conn.execute("DROP DATABASE IF EXISTS secret_store")
        conn.execute("CREATE DATABASE secret_store OWNER qgate_secret")
        hba = postgres.pgdata / "pg_hba.conf"
        if "qgate_secret" not in hba.read_text():
            hba.write_text("local all qgate_secret scram-sha-256\n" + hba.read_text())
            conn.execute("SELECT pg_reload_conf()")
    url = postgres.url("secret_store").replace("postgres:@", f"qgate_secret:{PASSWORD}@", 1)
    _wait_for_password_auth(url.replace(PASSWORD, "wrong"))
    return url


def _one_launch_pair(root: Path, contract: Path) -> Path:  # noqa: F811
    """A run folder of one engine start per arm (compare reads the history's rows for it)."""
    run = root / "one-launch"
    for arm, res in zip(("control", "candidate"), support.load_pair(), strict=True):
        res = support.rehash(support.one_launch(res), contract)
        res["inherited_env"] = {}  # recorded by a run (tests/test_speed_e2e.py checks the run's own)
        support.write_json(run / "speed" / f"{arm}.json", res)
    return run


def test_planted_secrets_stay_out_of_every_output(
    tmp_path: Path,
    contract: Path,  # noqa: F811
    postgres: Server,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = _secret_role(postgres)
    for key, value in ENV_SECRETS.items():
        monkeypatch.setenv(key, value)
    said = []

    def cli(*args: str, codes: tuple[int, ...] = (0,)) -> None:
        res = runner.invoke(app, list(args))
        said.append(res.output)
        assert res.exit_code in codes, res.output
        assert "Traceback" not in res.output

    night, _ = make_night(tmp_path / "runs", contract, "2026-12-01", "a" * 40, misses=1)
    cli("history", "append", str(night), "--store", url)
    cli("history", "report", "--store", url, "--out", str(tmp_path / "history"))
    run = _one_launch_pair(tmp_path / "runs", contract)
    cmp = tmp_path / "cmp"
    args = ("compare", str(run), str(run), "--contract", str(contract), "--history")
    cli(*args, url, "--out", str(cmp), codes=(0, 1, 3, 4))
    assert (cmp / "verdict.json").is_file() and "qgate_secret:***@" in (cmp / "verdict.json").read_text()
    # The store refuses, or cannot be reached: each one line, without the secret.
    for bad in (
        url.replace(PASSWORD, "Pl4ntedPassw0rd%ZZ"),
        url.replace(f":{PASSWORD}@", "@", 1) + f"&options=-c%20password%3D{PASSWORD}",
        url.replace(f":{PASSWORD}@", "@", 1) + f"&password={PASSWORD}x",
        url.replace(PASSWORD, PASSWORD[::-1]),
    ):
        cli(*args, bad, "--out", str(tmp_path / "refused"), codes=(2,))
        assert len(said[-1].strip().splitlines()) == 1
        cli("history", "append", str(night), "--store", bad, codes=(2,))
        assert len(said[-1].strip().splitlines()) == 1
    # The fleet's gather: one entry, its own history in the store.
    art = tmp_path / "art" / f"{ARTIFACT_PREFIX}a"
    shutil.copytree(night, art)
    fleet = fleet_file(tmp_path, [entry("a", quality_contract=QUALITY)])
    monkeypatch.chdir(REPO)
    cli(
        "fleet", "gather", str(fleet), str(tmp_path / "art"), "--out", str(tmp_path / "fleet"), "--store", url
    )
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(written) > 10
    for text in [*said, *(p.read_bytes().decode("utf-8", "replace") for p in written)]:
        for secret in PLANTED:
            assert secret not in text
