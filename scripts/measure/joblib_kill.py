"""kill -9 a `-m hydra/launcher=joblib` sweep while both loky workers run a cell; seconds until no
process of it is left (its workers and resource trackers), and what the cells left (issue 34).

    python scripts/measure/joblib_kill.py 3                   # from the repository root; 3 repeats
    python scripts/measure/joblib_kill.py 1 submitit_local    # the same for submitit's local launcher
"""
import os, signal, sys, time, uuid, tempfile
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.harness.test_harness_trust import NO_WANDB, processes_with, start, wait_for
out = []
launcher = sys.argv[2] if len(sys.argv) > 2 else "joblib"
extra = ["hydra.launcher.n_jobs=2"] if launcher == "joblib" else ["hydra.launcher.timeout_min=5"]
for k in range(int(sys.argv[1])):
    results, marker = Path(tempfile.mkdtemp()), uuid.uuid4().hex
    p = start(results, "-m", "+exp=tiny_fake", NO_WANDB, f"hydra/launcher={launcher}", *extra,
              "backend.sleep_s=30.0", marker=marker)
    wait_for(lambda: len(processes_with(marker)) >= 3 and len(list(results.glob("tiny_fake/*/config.yaml"))) >= 2,
             180, "both workers in a cell")
    others = [x for x in processes_with(marker) if x != p.pid]
    os.kill(p.pid, signal.SIGKILL); p.wait(); t0 = time.monotonic()
    while any(x in processes_with(marker) for x in others) and time.monotonic() - t0 < 60:
        time.sleep(0.01)
    left = [x for x in others if x in processes_with(marker)]
    for x in left:
        os.kill(x, signal.SIGKILL)
    files = sorted(str(f.relative_to(results)) for f in results.glob("tiny_fake/**/*") if f.is_file())
    out.append(f"{time.monotonic() - t0:.2f}" + (f" ({len(left)} still alive, killed)" if left else ""))
    print(f"run {k}: {len(others)} processes besides the sweep; cell files left: {files or 'none'}")
print("seconds until none is left after kill -9 of the sweep:", " ".join(out))
