"""What `qgate` imports before any command runs: not the statistics (scipy, ~2 s of import on 2 cores,
once in every qgate process: a test suite's hundred CLI calls, a nightly's every step). The commands
that need them (compare, ablate, history, run speed --until-decided) import them when they run."""

from __future__ import annotations

import subprocess
import sys

from qgate.ablate import DEFAULT_DESIGN
from qgate.cli.ablate import _DEFAULT


def test_the_cli_and_a_plain_speed_run_import_no_statistics() -> None:
    probe = (
        "import sys, qgate.cli, qgate.speed.run\n"
        "print(sorted(m for m in ('scipy', 'qgate.stats') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_cli_default_design_is_the_ablation_default() -> None:
    assert _DEFAULT.value == DEFAULT_DESIGN
