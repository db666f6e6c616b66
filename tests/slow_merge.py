"""A Ray worker setup hook for the fleet merge's fault test (runtime_env {"worker_process_setup_hook":
"slow_merge.install"}, with this directory on the nodes' PYTHONPATH): every fold of the merge leaves a mark naming
its node in KPGO_TEST_MARKS when it starts and when it ends and then takes KPGO_TEST_FOLD_SECONDS longer, so a test can kill a node
once it holds a finished partial and while the merge still needs it; or fails (KPGO_TEST_FOLD_FAILS)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

MARKS = "KPGO_TEST_MARKS"
SECONDS = "KPGO_TEST_FOLD_SECONDS"
FAIL = "KPGO_TEST_FOLD_FAILS"  # set: every fold fails as kpgo never does, with an exception it does not expect


def install() -> None:
    from kpgo.gcov import merge

    real = merge.fold_inputs

    def slow_fold(plan: Any, lo: int, hi: int, template: Any = None) -> Any:
        import ray

        node = ray.get_runtime_context().get_node_id()
        Path(os.environ[MARKS], f"{node}.{lo}.start").touch()
        time.sleep(float(os.environ.get(SECONDS, "1")))
        if os.environ.get(FAIL):
            raise ZeroDivisionError("a bug in a fold, for the test")
        out = real(plan, lo, hi, template)
        Path(os.environ[MARKS], f"{node}.{lo}.end").touch()
        return out

    merge.fold_inputs = slow_fold
