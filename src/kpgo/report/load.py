"""What a run directory holds, read once and checked just enough that the sections can trust it.

RUN_DIR/run.json (kpgo run), RUN_DIR/bench/results.json (schema 3, or 2 restated: every kernel x workload of one
interleaved bench), RUN_DIR/studies/sensitivity/results.json (same schema), RUN_DIR/studies/compiler/results.json (same schema)
with its table compiler.json, RUN_DIR/profiles/NAME (fixed profiles) and
RUN_DIR/builds/LABEL (kernel builds). Everything but one of the two JSON files is optional."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kpgo import inputs
from kpgo.errors import UserError

RESULTS_SCHEMAS = (2, 3)


@dataclass
class RunData:
    run_dir: Path
    run: dict[str, Any] | None  # run.json
    results: dict[str, Any] | None  # bench/results.json
    sensitivity: dict[str, Any] | None  # studies/sensitivity/results.json
    compiler: dict[str, Any] | None = None  # studies/compiler/results.json
    compiler_table: dict[str, Any] | None = None  # studies/compiler/compiler.json (kpgo.study.compiler_table)

    @property
    def baseline(self) -> str:
        return str((self.results or {}).get("baseline") or "vanilla")

    def build_dir(self, label: str) -> Path:
        """Where a kernel's build lives: RUN_DIR/builds/LABEL (the run directory may have moved since the bench),
        else where the bench recorded it."""
        own = self.run_dir / "builds" / label
        if own.is_dir():
            return own
        for res in (self.results, self.sensitivity, self.compiler):
            k = ((res or {}).get("kernels") or {}).get(label) or {}
            if k.get("build_dir") and Path(k["build_dir"]).is_dir():
                return Path(k["build_dir"])
        return self.run_dir / "builds" / label

    def shown(self, path: str | Path | None) -> str | None:
        """A path as the report prints it: relative to the run directory when it lies inside it (the run directory
        itself is its name), else its last component. A report is read on other machines, where the absolute paths
        of the one it was made on name nothing; a relative path is kept as recorded."""
        if path is None or str(path) == "":
            return None if path is None else ""
        p = Path(path)
        if not p.is_absolute():
            return str(p)
        p = Path(os.path.normpath(p))
        for root in dict.fromkeys((Path(os.path.abspath(self.run_dir)), self.run_dir.resolve())):
            if p == root:
                return root.name
            if p.is_relative_to(root):
                return str(p.relative_to(root))
        return p.name or str(p)

    def workload_names(self) -> list[str]:
        names = list((self.results or {}).get("workloads") or {})
        return names + [n for n in ((self.run or {}).get("workloads") or {}) if n not in names]


# What the sections read of each file, as kpgo.inputs shapes: a file of another shape is refused in one line naming
# the place, instead of failing deep in a section. Optional keys ("?") are those older kpgo versions did not write.
NUM = (float, None)  # a statistic: null where it cannot be formed (one boot, a zero baseline)
STAT = {"mean?": NUM, "sd?": NUM, "cv?": NUM, "n?": int, "ratio?": NUM, "speedup?": NUM, "ci_low?": NUM, "ci_high?": NUM,
        "ci_includes_1?": (bool, None)}
SAMPLE = {"kernel": str, "workload": str, "mean": float, "values?": [float], "round?": int, "cell_key?": str,
          "sim_per_op?": ({str: float}, None), "sim?": ([dict], None), "ops?": [NUM], "kernel_share?": [NUM]}
DESIGN = {"order?": str, "order_name?": str, "seed?": (int, None), "boots_per_kernel?": int, "runs_per_boot?": int, "warmup_per_boot?": bool,
          "unit_of_replication?": str, "interval?": str, "sequence?": [{"kernel": str, "workload": str, "round?": int}]}
RESULTS_SHAPE = {
    "schema": int, "baseline": str,
    "kernels?": {str: {"build_dir?": (str, None), "kernel_release?": (str, None), "variant?": (str, None)}},
    "workloads": {str: {"summary": [{"kernel": str, **STAT}], "unit?": str, "higher_is_better?": bool, "params?": dict,
                        "kernels?": [str], "sim?": ({str: {str: STAT}}, None)}},
    "samples?": [SAMPLE], "failed?": [dict], "design?": DESIGN, "host?": {str: (str, float, None)}, "hosts?": (dict, list),
    "measurement?": {"accelerator?": (str, None), "clock?": (str, None), "sim?": ({str: (float, bool, None)}, None)},
    "geomean?": {str: {"speedup?": NUM, "ci_low?": NUM, "ci_high?": NUM, "workloads?": [str]}},
}
PROOF = {"ok?": bool, "ratio?": NUM, "threshold?": NUM}
RUN_SHAPE = {
    "request?": dict, "host?": dict, "kernel?": {str: (str, None)}, "phases_seconds?": {str: float}, "studies?": [str],
    "builds?": {str: {"release?": (str, None), "seconds?": NUM, "sizes?": {str: (int, None)}}},
    "workloads?": {str: {"params?": dict, "unit?": str, "proof?": PROOF, "profile?": dict}},
    "universal?": {str: {"proof?": PROOF}},
}


def read_json(path: Path, what: str, shape: Any = dict) -> dict[str, Any] | None:
    """A JSON object of `shape` from `path`, None when nothing is there; anything else is a UserError naming it."""
    return inputs.read_json(path, f"re-run the step that writes {what}", shape, missing_ok=True)


def check_results(res: dict[str, Any], path: Path) -> dict[str, Any]:
    """Bench results of the shape the report understands (schema 3, or 2 restated: kpgo.bench.restate)."""
    if res.get("schema") not in RESULTS_SCHEMAS:
        raise UserError(f"{path} has schema {res.get('schema', 1)}; the report reads schema {' or '.join(map(str, RESULTS_SCHEMAS))}",
                        "re-run `kpgo run` (or `kpgo bench`) with this kpgo; finished boots are reused")
    inputs.check(res, RESULTS_SHAPE, path, "re-run the bench that wrote it (`kpgo run` or `kpgo bench`; finished boots are reused)")
    from kpgo import bench  # numpy and scipy: only once there are results to read

    return bench.restate(res)


def load(run_dir: Path) -> RunData:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        what = "is not a directory" if run_dir.exists() else "does not exist"
        raise UserError(f"run directory {run_dir} {what}", "give the directory of a `kpgo run` (its --dir)")
    run = read_json(run_dir / "run.json", "run.json (`kpgo run`)", RUN_SHAPE)
    rpath = run_dir / "bench" / "results.json"
    results = read_json(rpath, "bench/results.json (`kpgo run` or `kpgo bench`)")
    if results is not None:
        results = check_results(results, rpath)
    spath = run_dir / "studies" / "sensitivity" / "results.json"
    sens = read_json(spath, "the sensitivity study")
    if sens is not None:
        sens = check_results(sens, spath)
    cpath = run_dir / "studies" / "compiler" / "results.json"
    comp = read_json(cpath, "the compiler study (`kpgo study compiler`)")
    if comp is not None:
        comp = check_results(comp, cpath)
    table = read_json(run_dir / "studies" / "compiler" / "compiler.json", "the compiler study (`kpgo study compiler`)")
    if table is not None and comp is not None:
        from kpgo import study

        table = study.restate_table(table, comp)
    if run is None and results is None:
        raise UserError(f"{run_dir} has neither run.json nor bench/results.json",
                        "give the directory of a `kpgo run` (its --dir) after it finished")
    return RunData(run_dir=run_dir, run=run, results=results, sensitivity=sens, compiler=comp, compiler_table=table if comp is not None else None)
