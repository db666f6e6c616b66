"""kpgo.records: the typed records of build.json, profile.json, results.json and run.json read every recorded file,
and read what the files hold (the report's and the run's readers take them instead of string keys)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kpgo import records
from kpgo.errors import UserError

ROOT = Path(__file__).parent.parent
RESULTS = sorted(p for p in [*ROOT.glob("docs/results/**/*results.json"), *ROOT.glob("tests/data/**/results.json")]
                 if json.loads(p.read_text()).get("schema") in records.RESULTS_SCHEMAS)
RUNS = sorted(ROOT.glob("tests/data/**/run.json"))


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_recorded_results_json_loads(path: Path) -> None:
    res = records.Results.from_json(json.loads(path.read_text()), path)
    raw = res.raw  # restated (schema 2 -> 3): the dict the bench's own functions take
    assert res.schema == raw["schema"] == 3 and res.baseline == raw["baseline"]
    assert list(res.workloads) == list(raw["workloads"]) and len(res.samples) == len(raw.get("samples") or [])
    for name, w in res.workloads.items():
        rw = raw["workloads"][name]
        assert [r.kernel for r in w.summary] == [r["kernel"] for r in rw["summary"]] and w.unit == rw.get("unit")
        for r, d in zip(w.summary, rw["summary"]):
            assert r.raw is d and r.as_speedup().ratio == d.get("speedup", d.get("ratio"))
            assert r.ci_includes_1 == d.get("ci_includes_1", True)
        assert {k: {m: s.raw for m, s in ms.items()} for k, ms in w.sim.items()} == (rw.get("sim") or {})
    for k, g in res.geomean.items():
        speedup = g.as_speedup().ratio
        assert speedup is not None and (math.isnan(speedup) or speedup == raw["geomean"][k]["speedup"])
        assert list(g.workloads) == raw["geomean"][k].get("workloads", [])
    assert res.design.boots == len(raw.get("design", {}).get("sequence") or [])
    assert res.measurement.accelerator == (raw.get("measurement") or {}).get("accelerator")


@pytest.mark.parametrize("path", RUNS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_recorded_run_json_loads(path: Path) -> None:
    raw = json.loads(path.read_text())
    run = records.Run.from_json(raw, path)
    assert run.kernel.config == raw["kernel"]["config"] and run.host is not None and run.host.cpu == raw["host"]["cpu"]
    assert list(run.proofs()) == [n for n, w in raw["workloads"].items() if "proof" in w] + [n for n, u in raw.get("universal", {}).items() if "proof" in u]
    for n, w in run.workloads.items():
        assert w.proof is not None and w.proof.objects_used == raw["workloads"][n]["proof"]["objects_used"]
        assert w.collected.arcs_sum == raw["workloads"][n]["profile"]["collected"]["arcs_sum"]
    assert {b: r.seconds for b, r in run.builds.items()} == {b: r["seconds"] for b, r in raw["builds"].items()}


def test_optional_keys_of_older_files_are_none() -> None:
    """A summary row without a verdict shows no difference (as before); keys older kpgo did not write are None."""
    s = records.Stat.from_json({"kernel": "k", "ratio": 1.1})
    assert s.ci_includes_1 is True and s.ci_low is None and s.as_speedup().ratio == 1.1 and s.workloads == ()
    run = records.Run.from_json({"kernel": {"version": "6.12"}}, "run.json")
    assert run.request is None and run.host is None and run.proofs() == {} and run.kernel.config is None
    res = records.Results.from_json({"schema": 3, "baseline": "vanilla", "workloads": {}}, "results.json")
    assert res.design == records.Design() and res.measurement.ops_methods is None and res.host is None and not res.has_sim


def test_build_and_profile_records() -> None:
    build = {"ok": True, "key": "k1", "variant": "optimized", "kernel_release": "6.12.117", "sizes": {"functions_size": 10},
             "seconds": {"total": 2.5}, "proof": {"ok": True, "ratio": 0.99, "objects_used": 99, "objects_nonempty": 100}, "other": 1}
    b = records.Build.from_json(build, "build.json")
    assert b.proof is not None and b.proof.objects_used == 99 and b.seconds["total"] == 2.5 and b.raw is build
    p = records.Profile.from_json({"build_key": "k0", "workload": {"params": {"n": 1}, "client": "host"}, "fixed": {"runs": 1}}, "profile.json")
    assert (p.build_key, p.params, p.client, p.fixed) == ("k0", {"n": 1}, "host", {"runs": 1})
    with pytest.raises(UserError, match="build.json: key is the number 3, expected a string"):
        records.Build.from_json(build | {"key": 3}, "build.json")


def test_one_home_per_shape() -> None:
    """The shapes the readers check are the records' (kpgo.records), wherever else they are named."""
    from kpgo.gcov import profile
    from kpgo.kernel import kbuild
    from kpgo.report import load

    assert kbuild.BUILD_SHAPE is records.BUILD_SHAPE and profile.PROFILE_SHAPE is records.PROFILE_SHAPE
    assert load.RESULTS_SHAPE is records.RESULTS_SHAPE and load.RUN_SHAPE is records.RUN_SHAPE
