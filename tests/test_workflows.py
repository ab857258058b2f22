"""The GitHub workflows parse and name commands that exist.

Every `qgate ...` command line in a `run:` script is split into words (shlex, as the shell would, with
`$VARS` left unexpanded) and walked through the real CLI (typer.main.get_command(qgate.cli.app)): the
command path must exist and end at a command, each --option used must be one of that command's, an
option that takes a value must have one, the positional arguments must fit, required options must be
given. Then the nightly's structure: triggers, runner labels, one-at-a-time concurrency, a time limit
on every step, sm_70 build, the production contracts, summary, artifacts, history; the fleet's matrix,
its entries' artifacts and the gather job; and the two tools `nox -s tests` runs on every workflow
(check-jsonschema with GitHub's workflow schema, zizmor), which must pass ours and catch a broken one.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from qgate.cli import app as qgate_app
from qgate.contract import load_contract
from qgate.fleet import ARTIFACT_PREFIX

REPO = Path(__file__).resolve().parents[1]
WORKFLOWS = REPO / ".github" / "workflows"
NIGHTLY, CI, FLEET = WORKFLOWS / "nightly.yml", WORKFLOWS / "ci.yml", WORKFLOWS / "fleet.yml"

_OPERATORS = {";", "&&", "||", "|", "&", "(", ")", "<", ">", ">>", ">&", "<&", "2>", "&>"}


def _is_group(cmd: Any) -> bool:
    # Typer builds its own click classes (typer._click): duck-typed, not isinstance checks.
    return isinstance(getattr(cmd, "commands", None), dict)


def _params(cmd: Any, kind: str) -> list[Any]:
    return [p for p in cmd.params if p.param_type_name == kind]


def load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    # YAML 1.1 reads the key `on` as True.
    if True in data:
        data["on"] = data.pop(True)
    return data


def steps(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [step for job in data["jobs"].values() for step in job.get("steps", [])]


def qgate_commands(script: str) -> list[list[str]]:
    """The words after `qgate` (or `python -m qgate`) of every qgate command in a shell script."""
    found = []
    for line in script.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>()")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        try:
            words = list(lexer)
        except ValueError as exc:  # an unclosed quote
            raise AssertionError(f"cannot split shell line {line!r}: {exc}") from None
        for i, word in enumerate(words):
            start = None
            if word == "qgate" or word.endswith("/qgate"):
                start = i + 1
            elif (
                word == "-m"
                and i + 1 < len(words)
                and words[i + 1] == "qgate"
                and i
                and "python" in words[i - 1]
            ):
                start = i + 2
            if start is None or (i and words[i - 1] in ("-m",)):
                continue
            cmd = []
            for w in words[start:]:
                if w in _OPERATORS or set(w) <= set(";&|<>()"):
                    break
                cmd.append(w)
            found.append(cmd)
    return found


def _resolve(words: list[str]) -> tuple[Any, list[str], list[str]]:
    """(command, its path, the remaining words), via the real app."""
    root = typer.main.get_command(qgate_app)
    cmd, path, i = root, [], 0
    while _is_group(cmd) and i < len(words) and not words[i].startswith("-"):
        sub = cmd.commands.get(words[i])
        if sub is None:
            raise AssertionError(f"no command `qgate {' '.join([*path, words[i]])}` in qgate.cli.app")
        cmd, path, i = sub, [*path, words[i]], i + 1
    return cmd, path, words[i:]


def problems(words: list[str]) -> list[str]:
    """What is wrong with `qgate <words>` against the CLI; empty when the line would parse."""
    try:
        cmd, path, rest = _resolve(words)
    except AssertionError as exc:
        return [str(exc)]
    name = "qgate " + " ".join(path)
    if _is_group(cmd):
        return [f"`{name}` is a command group: it names no command ({', '.join(sorted(cmd.commands))})"]
    options = {o: p for p in _params(cmd, "option") for o in (*p.opts, *p.secondary_opts)}
    found, used, positional, j = [], set(), [], 0
    while j < len(rest):
        word = rest[j]
        if word == "--help":
            return []
        if word.startswith("-") and word != "-":
            flag, eq, _ = word.partition("=")
            opt = options.get(flag)
            if opt is None:
                found.append(f"`{name}` has no option {flag} (it has {', '.join(sorted(options))})")
            else:
                used.add(opt.name)
                if not opt.is_flag and not eq:
                    j += 1
                    if j >= len(rest):
                        found.append(f"`{name}`: option {flag} needs a value")
            j += 1
            continue
        positional.append(word)
        j += 1
    arguments = _params(cmd, "argument")
    least = sum(1 for a in arguments if a.required)
    most = sum(a.nargs if a.nargs > 0 else 10**6 for a in arguments)
    if not least <= len(positional) <= most:
        found.append(f"`{name}` takes {least}..{most} arguments, got {len(positional)}: {positional}")
    for p in _params(cmd, "option"):
        if p.required and p.name not in used:
            found.append(f"`{name}`: required option {p.opts[0]} is missing")
    return found


def _cases() -> list[Any]:
    cases = []
    for path in (NIGHTLY, CI, FLEET):
        for step in steps(load(path)):
            for words in qgate_commands(str(step.get("run", ""))):
                label = f"{path.name}:{step.get('name', '?')}:qgate {' '.join(words)}"
                cases.append(pytest.param(words, id=label))
    return cases


@pytest.mark.parametrize("words", _cases())
def test_each_qgate_command_line_exists_in_the_cli(words: list[str]) -> None:
    assert problems(words) == []


def test_the_checker_catches_wrong_lines() -> None:
    assert problems(["run", "speed", "--contract", "c.yaml", "--out", "d"]) == []
    assert "no command `qgate run sped`" in problems(["run", "sped", "--out", "d"])[0]
    assert "has no option --output" in problems(["run", "speed", "--contract", "c", "--output", "d"])[0]
    assert "option --out needs a value" in problems(["run", "speed", "--contract", "c", "--out"])[0]
    assert "required option --out is missing" in problems(["run", "speed", "--contract", "c"])[0]
    assert "takes 2..2 arguments, got 1" in problems(["compare", "a", "--out", "d"])[0]
    assert "is a command group" in problems(["run"])[0]
    assert problems(["history", "append", "DIR", "--store", "s", "--night", "2026-12-01"]) == []
    assert "has no option --db" in problems(["history", "report", "--db", "s", "--out", "o"])[0]
    assert qgate_commands('x=1; "$VENV/bin/qgate" compare "$A" b --out "$O" && echo ok # qgate nope') == [
        ["compare", "$A", "b", "--out", "$O"]
    ]


def test_nightly_runs_every_gate_and_the_history() -> None:
    lines = [" ".join(w) for s in steps(load(NIGHTLY)) for w in qgate_commands(str(s.get("run", "")))]
    starts = ("run ops ", "run speed ", "run quality ", "compare ", "history append ", "history report ",
              "history publish ")  # fmt: skip
    for start in starts:
        assert any(line.startswith(start) for line in lines), f"no `qgate {start.strip()}` in the nightly"
    compares = [line for line in lines if line.startswith("compare ")]
    assert len(compares) == 2 and {"$SPEED_CONTRACT", "$QUALITY_CONTRACT"} <= {
        w for line in compares for w in line.split()
    }


def test_nightly_triggers_runner_concurrency_and_time_limits() -> None:
    data = load(NIGHTLY)
    assert "workflow_dispatch" in data["on"]
    assert all(re.fullmatch(r"[\d*/,-]+( [\d*/,-]+){4}", s["cron"]) for s in data["on"]["schedule"])
    job = data["jobs"]["nightly"]
    assert set(job["runs-on"]) == {"self-hosted", "v100"}
    assert data["concurrency"]["group"] and data["concurrency"]["cancel-in-progress"] is False
    assert all(isinstance(s.get("timeout-minutes"), int) for s in job["steps"]), "a step without a time limit"
    assert job["env"]["TORCH_CUDA_ARCH_LIST"] == "7.0"
    assert job["env"]["SPEED_CONTRACT"] == "contracts/qwen38-sm70-tp4-decode.yaml"
    assert job["env"]["QUALITY_CONTRACT"] == "contracts/qwen38-sm70-tp4-quality.yaml"
    build = " ".join(str(s.get("run", "")) for s in job["steps"])
    assert "--no-build-isolation -e kernels_ext" in build


def test_nightly_reports_uploads_and_fails_on_fail_or_error() -> None:
    job = load(NIGHTLY)["jobs"]["nightly"]
    names = [s.get("name", "") for s in job["steps"]]
    by_name = dict(zip(names, job["steps"], strict=True))
    first_compare = names.index("Speed verdict")
    # A compare exit 1 (FAIL) / 3 (ERROR) must fail the job: no step may swallow an exit code ...
    assert not any(s.get("continue-on-error") for s in job["steps"])
    assert not any("|| true" in str(s.get("run", "")) for s in job["steps"])
    # ... while everything after the gates still runs to report it.
    for step in job["steps"][first_compare:]:
        assert str(step.get("if", "")).replace(" ", "") in ("${{!cancelled()}}", "always()") or (
            "!cancelled()" in str(step.get("if", ""))
        ), f"step {step.get('name')!r} would not run after a failed gate"
    assert "GITHUB_STEP_SUMMARY" in by_name["Verdicts to the job summary"]["run"]
    upload = by_name["Upload results, reports and plots"]
    assert upload["uses"].startswith("actions/upload-artifact@") and upload["if"] == "always()"
    assert upload["with"]["path"].strip("/") == "nightly"
    # Untrusted inputs reach scripts through env, never pasted into them.
    assert not any("${{ inputs." in str(s.get("run", "")) for s in job["steps"])


def test_nightly_uploads_the_history_site_and_deploys_pages_only_where_enabled() -> None:
    data = load(NIGHTLY)
    job = data["jobs"]["nightly"]
    by_name = {s.get("name"): s for s in job["steps"]}
    site = by_name["Upload the history site"]
    assert site["if"] == "always()" and site["with"]["path"].startswith("${{ env.RUN_DIR }}/history/site")
    pages_artifact = by_name["Site to GitHub Pages (artifact)"]
    assert pages_artifact["uses"].startswith("actions/upload-pages-artifact@")
    assert "vars.QGATE_PAGES == 'true'" in pages_artifact["if"]
    pages = data["jobs"]["pages"]
    assert pages["needs"] == "nightly" and "vars.QGATE_PAGES == 'true'" in pages["if"]
    assert pages["permissions"] == {"pages": "write", "id-token": "write"}
    assert data["permissions"] == {"contents": "read"}  # the nightly job itself writes nothing
    assert pages["steps"][0]["uses"].startswith("actions/deploy-pages@")


def test_nightly_contracts_exist_and_validate() -> None:
    env = load(NIGHTLY)["jobs"]["nightly"]["env"]
    for key in ("SPEED_CONTRACT", "QUALITY_CONTRACT"):
        path = REPO / env[key]
        loaded = load_contract(path)
        section = "speed" if key == "SPEED_CONTRACT" else "quality"
        assert getattr(loaded.contract, section) is not None, f"{env[key]} has no {section} section"


def test_ci_runs_the_readme_test_command() -> None:
    data = load(CI)
    assert {"push", "pull_request"} <= set(data["on"])
    job = data["jobs"]["tests"]
    assert job["runs-on"] == "ubuntu-latest"
    runs = [str(s.get("run", "")) for s in job["steps"]]
    assert any(r.strip() == "bash .ci/run" for r in runs)
    ci_run = (REPO / ".ci" / "run").read_text()
    assert "nox -s tests" in ci_run and "pip install -q nox" in ci_run
    readme = REPO / "README.md"
    assert "pip install nox && nox -s tests" in readme.read_text(encoding="utf-8")


def test_nightly_ends_leftover_processes_before_and_after() -> None:
    job = load(NIGHTLY)["jobs"]["nightly"]
    runs = [str(s.get("run", "")) for s in job["steps"]]
    ends = [i for i, r in enumerate(runs) if "qgate run leftovers --all --kill" in r]
    first_gpu = next(i for i, r in enumerate(runs) if "qgate run ops" in r)
    upload = next(i for i, s in enumerate(job["steps"]) if "upload-artifact" in str(s.get("uses", "")))
    assert len(ends) == 2 and ends[0] < first_gpu and ends[1] < upload
    assert job["steps"][ends[1]]["if"] == "always()"  # after a cancel or a timeout too
    # The runs exec qgate: the runner's cancel signals reach it, not a shell that waits for it.
    for kind in ("speed", "quality"):
        assert any(r.strip().startswith(f"exec qgate run {kind} ") for r in runs), kind


def test_every_workflow_is_known_to_the_tests() -> None:
    assert sorted(WORKFLOWS.glob("*.y*ml")) == sorted([CI, FLEET, NIGHTLY])


@pytest.mark.parametrize("path", [CI, NIGHTLY, FLEET], ids=lambda p: p.name)
def test_actions_pinned_credentials_not_kept_inputs_through_env(path: Path) -> None:
    data = load(path)
    for job in data["jobs"].values():
        for step in job.get("steps", []):
            uses = step.get("uses")
            if uses:
                assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", uses), f"{uses}: pin to a commit SHA"
            if uses and uses.startswith("actions/checkout@"):
                assert step["with"]["persist-credentials"] is False
            assert "${{ inputs." not in str(step.get("run", "")), "untrusted input pasted into a script"
            assert "${{ matrix." not in str(step.get("run", "")), "matrix value pasted into a script"
            assert isinstance(step.get("timeout-minutes"), int), f"{step.get('name')}: no time limit"


def test_nightly_checks_the_runner_before_anything_long() -> None:
    for path, job in ((NIGHTLY, "nightly"), (FLEET, "entry")):
        runs = [str(s.get("run", "")) for s in load(path)["jobs"][job]["steps"]]
        check = next(i for i, r in enumerate(runs) if re.search(r'qgate"? check-runner', r))
        build = next(i for i, r in enumerate(runs) if "-e kernels_ext" in r)
        first_run = next(i for i, r in enumerate(runs) if "qgate run speed" in r)
        assert check < build < first_run, path.name
        setup = runs[check]
        assert setup.index('install "$QGATE_VLLM_SPEC"') < setup.index("check-runner")


def test_history_store_may_be_a_secret_url() -> None:
    env = load(NIGHTLY)["jobs"]["nightly"]["env"]
    assert "secrets.QGATE_HISTORY_STORE" in env["QGATE_HISTORY_STORE"]
    gather = load(FLEET)["jobs"]["gather"]
    assert gather["env"]["QGATE_HISTORY_STORE"] == "${{ secrets.QGATE_HISTORY_STORE }}"
    # A secret only in a job with an environment (zizmor: secrets-outside-env).
    assert gather["environment"] == load(NIGHTLY)["jobs"]["nightly"]["environment"] == "qgate-history"


def test_fleet_is_a_matrix_whose_entries_never_block_each_other() -> None:
    data = load(FLEET)
    jobs = data["jobs"]
    assert "workflow_dispatch" in data["on"] and data["concurrency"]["cancel-in-progress"] is False
    lines = [" ".join(w) for s in jobs["matrix"]["steps"] for w in qgate_commands(str(s.get("run", "")))]
    assert "fleet check $FLEET" in lines and "fleet matrix $FLEET" in lines
    assert data["env"]["FLEET"] == ".github/fleet.yaml" and (REPO / data["env"]["FLEET"]).is_file()
    entry = jobs["entry"]
    assert entry["strategy"]["fail-fast"] is False
    assert entry["strategy"]["matrix"] == "${{ fromJSON(needs.matrix.outputs.matrix) }}"
    assert entry["runs-on"] == "${{ matrix.runs-on }}"
    upload = next(s for s in entry["steps"] if "upload-artifact" in str(s.get("uses")))
    assert upload["if"] == "always()" and upload["with"]["name"] == ARTIFACT_PREFIX + "${{ matrix.name }}"
    gather = jobs["gather"]
    assert set(gather["needs"]) == {"matrix", "entry"} and "always()" in gather["if"]
    assert "ubuntu" in gather["runs-on"]  # a CPU runner
    download = next(s for s in gather["steps"] if "download-artifact" in str(s.get("uses")))
    assert download["with"]["pattern"] == ARTIFACT_PREFIX + "*"
    script = " ".join(str(s.get("run", "")) for s in gather["steps"])
    assert f'qgate fleet gather "$FLEET" {download["with"]["path"]} --out' in script
    assert "GITHUB_STEP_SUMMARY" in script
    report = [s for s in gather["steps"] if "upload-artifact" in str(s.get("uses"))]
    assert report and report[0]["if"] == "always()"


def _tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if not found:
        pytest.skip(f"{name} is not installed (the test extra has it; nox -s tests runs it on the workflows)")
    return found


def _check(tool: str, files: list[Path]) -> subprocess.CompletedProcess:
    args = {  # as noxfile.py runs them
        "check-jsonschema": ["--builtin-schema", "vendor.github-workflows"],
        "zizmor": ["--offline", "--persona=auditor"],
    }
    env = {**os.environ, "NO_COLOR": "1"}
    return subprocess.run(
        [_tool(tool), *args[tool], *map(str, files)], capture_output=True, text=True, timeout=120, env=env
    )


def test_workflow_tools_pass_ours_and_catch_a_broken_one(tmp_path: Path) -> None:
    ours = sorted(WORKFLOWS.glob("*.yml"))
    for tool in ("check-jsonschema", "zizmor"):
        proc = _check(tool, ours)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    broken = tmp_path / ".github" / "workflows" / "fleet.yml"
    broken.parent.mkdir(parents=True)
    text = FLEET.read_text()
    broken.write_text(text.replace("timeout-minutes: 30\n", "timeout-minutes: soon\n", 1))
    assert _check("check-jsonschema", [broken]).returncode != 0
    unpinned = text.replace(
        "actions/checkout@11d5960a326750d5838078e36cf38b85af677262", "actions/checkout@v4"
    )
    broken.write_text(
        unpinned.replace("ENTRY: ${{ matrix.name }}", "ENTRY: x", 1).replace(
            'echo "RUN_DIR=$GITHUB_WORKSPACE/fleet/$ENTRY"',
            'echo "RUN_DIR=$GITHUB_WORKSPACE/fleet/${{ matrix.name }}"',
        )
    )
    proc = _check("zizmor", [broken])
    assert proc.returncode != 0 and "unpinned-uses" in proc.stdout + proc.stderr
    assert "template-injection" in proc.stdout + proc.stderr
