"""kill -9 a real sweep as soon as its workers exist; seconds until the last worker is gone (issue 34).

    python scripts/measure/worker_boot.py 5      # from the repository root; 5 repeats
"""
import os, signal, sys, time, uuid, tempfile
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.harness.test_harness_trust import NO_WANDB, processes_with, start, wait_for
out = []
for k in range(int(sys.argv[1])):
    results, marker = Path(tempfile.mkdtemp()), uuid.uuid4().hex
    p = start(results, "+exp=tiny_fake", NO_WANDB, "n_jobs=2", "backend.sleep_s=4.0", "seed=0,1", marker=marker)
    wait_for(lambda: len(processes_with(marker)) >= 3, 120, "workers")
    workers = [x for x in processes_with(marker) if x != p.pid]
    os.kill(p.pid, signal.SIGKILL); p.wait(); t0 = time.monotonic()
    wait_for(lambda: not any(x in processes_with(marker) for x in workers), 60, "gone")
    out.append(time.monotonic() - t0)
print("worker lifetime after kill -9 of the parent (s):", " ".join(f"{x:.2f}" for x in out))
