"""Negative control for test_rlt_spawn.py: patches only under `if __name__ == "__main__"`.

A spawned child re-imports this module as `__mp_main__`, where that block does not run, so the
child must NOT see `rlt` -- which shows that the check in the positive test can fail.
"""

import json

from repro.backends.sglang import rlt_patch

if __name__ == "__main__":
    rlt_patch.apply()
    print(json.dumps(rlt_patch.spawn_check()))
