"""qgate installed from its wheel in a fresh venv outside the checkout (tools/wheel_venv.py): the wheel
holds the shipped contracts and the demo's gamed routes as files, and the installed `qgate` validates a
shipped contract, shows `demo --help` and plans a faulty demo from its own package data, never from the
checkout. The whole demo from the wheel costs minutes of engine time: .ci/run runs it
(`python tools/wheel_venv.py --demo`). ~14 s on 2 cores: a wheel build, a venv, five interpreter starts."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import zipfile
from pathlib import Path

import pytest

from qgate.demo import FAULTY_KINDS

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("wheel_venv", REPO / "tools" / "wheel_venv.py")
assert _spec is not None and _spec.loader is not None
wheel_venv = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(wheel_venv)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, str]]:
    """(the wheel, the venv's bin folder, its env): built once for the module."""
    work = tmp_path_factory.mktemp("wheel")
    wheel = wheel_venv.build_wheel(wheel_venv.copy_sources(work / "src"), work / "wheels")
    bin_dir = wheel_venv.make_venv(work / "venv", [wheel])
    return wheel, bin_dir, wheel_venv.venv_env(bin_dir)


def _qgate(installed: tuple[Path, Path, dict[str, str]], *args: str) -> subprocess.CompletedProcess:
    _, bin_dir, env = installed
    cwd = bin_dir.parent.parent  # outside the checkout: no contracts/ or tests/ to fall back on
    return subprocess.run([str(bin_dir / "qgate"), *args], cwd=cwd, env=env, capture_output=True, text=True)


def test_the_wheel_holds_every_contract_and_faulty_route_as_files(installed) -> None:
    wheel, _, _ = installed
    with zipfile.ZipFile(wheel) as z:
        members = {i.filename: i for i in z.infolist()}
    contracts = {p.name for p in (REPO / "contracts").glob("*.yaml")}
    assert {n.rpartition("/")[2] for n in members if n.startswith("qgate/data/contracts/")} == contracts
    routes = {f"qgate/data/faulty_routes/{k.impl.split(':')[0]}.py" for k in FAULTY_KINDS.values()}
    assert routes <= set(members), routes - set(members)
    for name in routes | {f"qgate/data/contracts/{c}" for c in contracts}:
        info = members[name]
        assert (info.external_attr >> 16) & 0o170000 == 0o100000, f"{name}: not a regular file"
    assert "qgate_route_env/__init__.py" in members and "qgate/py.typed" in members
    # every file of the packages that is not Python (a model config, py.typed) is package data too
    data = {
        f"{p.relative_to(root).as_posix()}"
        for root in (REPO / "harness", REPO / "route_env")
        for p in root.rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc") and "egg-info" not in str(p)
    }
    assert data <= set(members), sorted(data - set(members))


def test_the_installed_qgate_validates_a_shipped_contract_and_plans_the_demo_from_its_own_files(
    installed, tmp_path: Path
) -> None:
    _, bin_dir, env = installed
    site = bin_dir.parent / "lib"
    version = _qgate(installed, "--version")
    assert version.returncode == 0 and version.stdout.strip().startswith("qgate "), version.stderr
    listed = _qgate(installed, "contract", "shipped")
    assert listed.returncode == 0, listed.stderr
    paths = [Path(line) for line in listed.stdout.splitlines()]
    demo = next(p for p in paths if p.name == "demo-cpu.yaml")
    assert demo.is_relative_to(site) and REPO not in demo.resolve().parents, demo
    ok = _qgate(installed, "contract", "validate", str(demo))
    assert ok.returncode == 0 and ok.stdout.startswith(f"ok: {demo} (demo-cpu v"), ok.stdout + ok.stderr
    helped = _qgate(installed, "demo", "--help")
    assert helped.returncode == 0 and "--faulty-kind" in helped.stdout, helped.stderr
    # The faulty candidate's route module and the default contract, as the installed demo finds them.
    probe = (
        "import json, sys; from pathlib import Path; from qgate import demo; "
        "p = demo.make_plan(demo.default_contract(), Path(sys.argv[1]), faulty='stale'); "
        "print(json.dumps([p.loaded.path, p.plans[1].env['PYTHONPATH']]))"
    )
    out = subprocess.run(
        [str(bin_dir / "python"), "-c", probe, str(tmp_path / "out")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    contract, pythonpath = json.loads(out.stdout)
    routes = Path(pythonpath.split(":")[0])
    assert Path(contract) == demo and routes.is_relative_to(site) and (routes / "stale_routes.py").is_file()
