"""No import cycle among the project's modules (qgate, qgate_kernels), lazy imports included
(tools/import_cycles.py reads the sources with ast)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("import_cycles", REPO / "tools" / "import_cycles.py")
assert _spec is not None and _spec.loader is not None
import_cycles = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(import_cycles)


def test_the_project_has_no_import_cycle() -> None:
    assert import_cycles.cycles(import_cycles.graph(REPO)) == []


def test_no_import_runs_up_across_a_boundary() -> None:
    """qgate_kernels imports nothing of qgate (the vocabulary they share is qgate_route_env, below both),
    contract/ nothing of engine/ (the launcher's env names are qgate.launch_env's), and engine/ nothing
    of the workloads or models.py above it."""
    assert import_cycles.upward(import_cycles.graph(REPO)) == []


def test_an_upward_import_is_found(tmp_path: Path) -> None:
    (tmp_path / "harness" / "qgate" / "contract").mkdir(parents=True)
    (tmp_path / "harness" / "qgate" / "engine").mkdir(parents=True)
    (tmp_path / "kernels_ext" / "qgate_kernels").mkdir(parents=True)
    for init in ("qgate", "qgate/contract", "qgate/engine"):
        (tmp_path / "harness" / init / "__init__.py").write_text("")
    (tmp_path / "harness" / "qgate" / "engine" / "procs.py").write_text("RUN = 1\n")
    (tmp_path / "harness" / "qgate" / "contract" / "__init__.py").write_text(
        "def f():\n    from qgate.engine.procs import RUN  # lazy\n"
    )
    (tmp_path / "kernels_ext" / "qgate_kernels" / "__init__.py").write_text("import qgate\n")
    assert import_cycles.upward(import_cycles.graph(tmp_path)) == [
        "qgate.contract -> qgate.engine.procs",
        "qgate_kernels -> qgate",
    ]


def test_the_engine_importing_a_workload_or_the_models_is_found(tmp_path: Path) -> None:
    """What the engine child and the spine imported before the workload was named in the spec."""
    pkg = tmp_path / "harness" / "qgate"
    for sub in ("engine", "speed", "quality"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "models.py").write_text("def resolve_model():\n    pass\n")
    (pkg / "speed" / "workload.py").write_text("def run_reps():\n    pass\n")
    (pkg / "quality" / "workload.py").write_text("def run_items():\n    pass\n")
    (pkg / "engine" / "arms.py").write_text("from qgate.models import resolve_model\n")
    (pkg / "engine" / "child.py").write_text(
        "def run():\n    from qgate.speed.workload import run_reps  # lazy\n"
        "    from qgate.quality import workload\n"
    )
    assert import_cycles.upward(import_cycles.graph(tmp_path)) == [
        "qgate.engine.arms -> qgate.models",
        "qgate.engine.child -> qgate.quality.workload",
        "qgate.engine.child -> qgate.speed.workload",
    ]


def test_the_harness_reaches_kernels_ext_only_from_the_operator_screen(tmp_path: Path) -> None:
    pkg = tmp_path / "harness" / "qgate"
    (pkg / "ops").mkdir(parents=True)
    (tmp_path / "kernels_ext" / "qgate_kernels").mkdir(parents=True)
    (tmp_path / "route_env" / "qgate_route_env").mkdir(parents=True)
    (tmp_path / "route_env" / "qgate_route_env" / "__init__.py").write_text("SWITCH = 1\n")
    kernels = tmp_path / "kernels_ext" / "qgate_kernels"
    (kernels / "__init__.py").write_text("from qgate_route_env import SWITCH\n")
    (kernels / "reference.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "ops" / "__init__.py").write_text("")
    (pkg / "ops" / "screen.py").write_text("from qgate_kernels import reference\n")
    (pkg / "compare.py").write_text("def f():\n    import qgate_kernels  # lazy\n")
    assert import_cycles.upward(import_cycles.graph(tmp_path)) == ["qgate.compare -> qgate_kernels"]


def test_a_cycle_through_a_lazy_import_is_found(tmp_path: Path) -> None:
    pkg = tmp_path / "harness" / "qgate"
    (pkg / "sub").mkdir(parents=True)
    (tmp_path / "kernels_ext" / "qgate_kernels").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from qgate.sub.b import f\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from qgate import a  # lazy\n    return a\n")
    (pkg / "c.py").write_text("from . import a\n")  # relative, one way: no cycle
    assert import_cycles.cycles(import_cycles.graph(tmp_path)) == [["qgate.a", "qgate.sub.b"]]


def test_the_tiny_models_importing_the_quality_gate_is_found(tmp_path: Path) -> None:
    """quality/run.py -> models.py -> tiny/: the trained tiny model reading the frozen items from
    quality/ (where they lived before qgate.gsm8k) closed a circle through the rooms."""
    pkg = tmp_path / "harness" / "qgate"
    for sub in ("tiny", "quality"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "quality" / "gsm8k.py").write_text("FROZEN = 1\n")
    (pkg / "gsm8k.py").write_text("FROZEN = 1\n")
    (pkg / "tiny" / "train.py").write_text("from qgate.quality.gsm8k import FROZEN\n")
    (pkg / "tiny" / "wide.py").write_text("from qgate.gsm8k import FROZEN\n")
    assert import_cycles.upward(import_cycles.graph(tmp_path)) == ["qgate.tiny.train -> qgate.quality.gsm8k"]
