"""A frozen worker behind our router (tests/live/test_live_router_faults.py frozen_worker_run), default
health settings, stall exclusion off (0) / on (1): when it is marked down and excluded, what was sent to it.

    python scripts/measure/frozen_worker.py 0 1   # from the repository root
"""
import sys, tempfile, statistics
from pathlib import Path
ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "live")]
from test_live_router_faults import frozen_worker_run
for on in (sys.argv[1:] or ["0", "1"]):
    out = frozen_worker_run(Path(tempfile.mkdtemp()), interval_s=1.0, timeout_s=2.0, threshold=2, n=200,
                            stall_exclude=on == "1")
    lat = [l for _, l in out["sent_to_frozen"]]
    ok = sum(1 for r in out["results"] if r[0] == 200 and r[1] is None)
    print(f"RESULT stall_exclude={on}: down {out['detect_s']:.2f}s, excluded {out['excluded_s']}, "
          f"sent to frozen after freeze {len(lat)}, their latency mean {statistics.fmean(lat) if lat else 0:.2f}s "
          f"max {max(lat, default=0):.2f}s; ok {ok}/200; stall stats {out['stats']['stall']}; "
          f"all-request mean latency {statistics.fmean(r[2] for r in out['results']):.2f}s")
