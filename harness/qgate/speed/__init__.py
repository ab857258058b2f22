"""The speed gate's workload: workload.py runs inside the engine child (prompt, warmup, timed reps after a
prefix-cache reset); run.py is the `qgate run speed` core on the arm spine (qgate.engine.arms)."""
