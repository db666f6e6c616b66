"""What a run directory holds, read once as kpgo.records, checked just enough that the sections can trust it.

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
from kpgo.records import PROOF_SHAPE as PROOF  # noqa: F401 -- the shapes' names before they moved to kpgo.records
from kpgo.records import RESULTS_SCHEMAS, RESULTS_SHAPE, RUN_SHAPE, Results, Run  # noqa: F401


@dataclass
class RunData:
    run_dir: Path
    run: Run | None  # run.json
    results: Results | None  # bench/results.json
    sensitivity: Results | None  # studies/sensitivity/results.json
    compiler: Results | None = None  # studies/compiler/results.json
    compiler_table: dict[str, Any] | None = None  # studies/compiler/compiler.json (kpgo.study.compiler_table)

    @property
    def baseline(self) -> str:
        return self.results.baseline if self.results and self.results.baseline else "vanilla"

    def build_dir(self, label: str) -> Path:
        """Where a kernel's build lives: RUN_DIR/builds/LABEL (the run directory may have moved since the bench),
        else where the bench recorded it."""
        own = self.run_dir / "builds" / label
        if own.is_dir():
            return own
        for res in (self.results, self.sensitivity, self.compiler):
            k = res.kernels.get(label) if res else None
            if k and k.build_dir and Path(k.build_dir).is_dir():
                return Path(k.build_dir)
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
        names = list(self.results.workloads) if self.results else []
        return names + [n for n in (self.run.workloads if self.run else {}) if n not in names]


def read_json(path: Path, what: str, shape: Any = dict) -> dict[str, Any] | None:
    """A JSON object of `shape` from `path`, None when nothing is there; anything else is a UserError naming it."""
    return inputs.read_json(path, f"re-run the step that writes {what}", shape, missing_ok=True)


def read_results(path: Path, what: str) -> Results | None:
    """Bench results of the shape the report understands (schema 3, or 2 restated: kpgo.bench.restate), None when
    there are none."""
    return Results.read(path, what)


def load(run_dir: Path) -> RunData:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        what = "is not a directory" if run_dir.exists() else "does not exist"
        raise UserError(f"run directory {run_dir} {what}", "give the directory of a `kpgo run` (its --dir)")
    run = Run.read(run_dir / "run.json", "re-run the step that writes run.json (`kpgo run`)")
    results = read_results(run_dir / "bench" / "results.json", "bench/results.json (`kpgo run` or `kpgo bench`)")
    sens = read_results(run_dir / "studies" / "sensitivity" / "results.json", "the sensitivity study")
    comp = read_results(run_dir / "studies" / "compiler" / "results.json", "the compiler study (`kpgo study compiler`)")
    table = read_json(run_dir / "studies" / "compiler" / "compiler.json", "the compiler study (`kpgo study compiler`)")
    if table is not None and comp is not None:
        from kpgo import study

        table = study.restate_table(table, comp)
    if run is None and results is None:
        raise UserError(f"{run_dir} has neither run.json nor bench/results.json",
                        "give the directory of a `kpgo run` (its --dir) after it finished")
    return RunData(run_dir=run_dir, run=run, results=results, sensitivity=sens, compiler=comp, compiler_table=table if comp is not None else None)
