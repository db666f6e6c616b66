"""`kpgo study compiler`: which kernels it builds and measures, the checks it makes before its first build, and its
table computed from a recorded bench (tests/data/report: real runs, unedited), checked against the bench's own figures
and a golden Markdown file beside it."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from conftest import MICRO_OPS, assert_one_line_error, kpgo
from kpgo import bench, records, study, variants
from kpgo.errors import UserError

DATA = Path(__file__).parent / "data" / "report" / "tiny-cross-sim"
GOLDEN = Path(__file__).parent / "data" / "compiler-study-tiny-cross-sim.md"


def labels(plan: list[study.VariantBuild]) -> list[tuple[str, str, str | None]]:
    return [(b.variant.name, b.label, b.workload) for b in plan]


def test_plan_baseline_first_and_pgo_per_workload() -> None:
    plan = study.compiler_plan(variants.parse_names("o3,pgo-o3,optimized,vanilla"), ["redis", "micro"])
    assert labels(plan) == [
        ("vanilla", "vanilla", None), ("o3", "o3", None),
        ("pgo-o3", "pgo-o3-redis", "redis"), ("pgo-o3", "pgo-o3-micro", "micro"),
        ("optimized", "optimized-redis", "redis"), ("optimized", "optimized-micro", "micro"),  # the run's own kernels
    ]
    # vanilla is the baseline whether named or not
    assert labels(study.compiler_plan(variants.parse_names("os"), ["redis"]))[0] == ("vanilla", "vanilla", None)


def test_plan_refuses_the_instrumented_kernel_and_clashing_labels(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="instrumented kernel"):
        study.compiler_plan(variants.parse_names("instrumented"), ["redis"])
    mine = tmp_path / "pgo-o3-redis.toml"
    mine.write_text('name = "pgo-o3-redis"\ndescription = "d"\ncompiler = "gcc-12"\nopt = "O2"\n')
    with pytest.raises(UserError, match="pgo-o3-redis"):
        study.compiler_plan(variants.parse_names("pgo-o3,pgo-o3-redis", [mine]), ["redis"])


def recorded() -> tuple[records.Results, dict]:
    # recorded by a bench of schema 2: its intervals computed again as the report does (kpgo.bench.restate, as it is read)
    path = DATA / "bench" / "results.json"
    return records.Results.from_json(json.loads(path.read_text()), path), json.loads((DATA / "run.json").read_text())


def recorded_table() -> dict:
    # The recorded run measured vanilla and each workload's optimized kernel on both workloads: exactly the kernels a
    # study of the `optimized` variant measures (plus the cross cells, which the study's table does not read).
    res, run = recorded()
    plan = study.compiler_plan([variants.get("optimized")], list(res.workloads))
    return study.compiler_table(res, plan, {label: b["sizes"] for label, b in run["builds"].items()})


def test_table_takes_the_bench_figures() -> None:
    res, run = recorded()
    table = recorded_table()
    assert table["headline"] == "simulated" and table["metrics"][0] == "kernel_insns_per_op"
    opt = next(v for v in table["variants"] if v["variant"] == "optimized")
    for n, w in res.raw["workloads"].items():  # the bench's own figures, as restated
        assert opt["kernels"][n] == f"optimized-{n}"
        for m in ("kernel_insns_per_op", "kernel_l1i_misses_per_op"):
            assert opt["workloads"][n][m]["ratio"] == w["sim"][f"optimized-{n}"][m]["ratio"]
        row = next(r for r in w["summary"] if r["kernel"] == f"optimized-{n}")
        assert opt["workloads"][n]["speedup"]["ratio"] == row["speedup"]
    # the variant's geomean pairs each per-workload kernel with its own workload: the run's app-specific geomean
    own = bench.own_sim_geomean(res.raw)
    for m, g in own.items():
        assert math.isclose(opt["geomean"][m]["ratio"], g["ratio"]) and opt["geomean"][m]["workloads"] == g["workloads"]
    sizes = [run["builds"][f"optimized-{n}"]["sizes"]["text_unlikely"] for n in res.workloads]
    assert opt["size"]["text_unlikely"] == {"mean": sum(sizes) / 2, "min": min(sizes), "max": max(sizes), "builds": 2}
    assert "geomean" in opt and not next(v for v in table["variants"] if v["variant"] == "vanilla")["geomean"]


def test_tables_match_golden() -> None:
    text = study.format_compiler(recorded_table())
    # micro, redis, geomean: 2 boots a side each (Welch's interval at n = 2; the bootstrap's was [0.917, 0.960] ...)
    assert "optimized | 0.938 [0.875, 1.007]\\* | 0.936 [0.840, 1.043]\\* | 0.937 [0.905, 0.970]" in text
    assert text + "\n" == GOLDEN.read_text()


def finished_run(tmp_path: Path) -> Path:
    """A run directory as the study reads it: the recorded run.json (its request) and fixed profiles' markers."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    shutil.copy(DATA / "run.json", run_dir / "run.json")
    # Recorded when micro ran each step for a time (--set micro.seconds=1); it runs fixed counts now, and a study
    # re-applies the run's --set, so the request names today's parameters instead.
    run = json.loads((run_dir / "run.json").read_text())
    run["request"]["set"] = [o for s in run["request"]["set"] for o in ([f"micro.{m}" for m in MICRO_OPS] if s == "micro.seconds=1" else [s])]
    (run_dir / "run.json").write_text(json.dumps(run))
    return run_dir


def test_cli_checks_before_any_build(tmp_path: Path) -> None:
    run_dir = finished_run(tmp_path)
    before = sorted(p.name for p in run_dir.iterdir())
    assert_one_line_error(kpgo("study", "compiler", tmp_path / "nope"), 1, "no finished kpgo run")
    assert_one_line_error(kpgo("study", "compiler", run_dir, "--variants", "o4"), 1, "unknown variant 'o4'")
    assert_one_line_error(kpgo("study", "compiler", run_dir, "--variants", "instrumented"), 1, "instrumented kernel")
    assert_one_line_error(kpgo("study", "compiler", run_dir, "--variants", "o3", "--workload", "nginx"), 1, "nginx: not a workload of the run")
    assert_one_line_error(kpgo("study", "compiler", run_dir, "--variants", "o3", "--boots", "0"), 1, "--boots")
    # a compiler that is not installed: named with its packages, before anything is built
    clang = tmp_path / "clang99.toml"
    clang.write_text('name = "clang99"\ndescription = "d"\ncompiler = "clang-99"\nopt = "O2"\n')
    assert_one_line_error(kpgo("study", "compiler", run_dir, "--variants", "clang99", "--variant-file", clang), 1, "needs clang-99", "clang-99 lld-99 llvm-99")
    # a flag the compiler rejects
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "bad"\ndescription = "d"\ncompiler = "gcc-12"\nopt = "O2"\nflags = ["-fkpgo-no-such-flag"]\n')
    assert_one_line_error(kpgo("study", "compiler", run_dir, "--variants", "bad", "--variant-file", bad), 1, "rejects its flags")
    # a PGO variant without the run's profile of a workload
    assert_one_line_error(kpgo("study", "compiler", run_dir, "--variants", "pgo-o3"), 1, "has no profile of")
    assert sorted(p.name for p in run_dir.iterdir()) == before  # nothing built, nothing written
