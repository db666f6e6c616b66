"""Studies that extend a finished `kpgo run` directory (the universal and cross-application studies
are part of the run itself: see kpgo.pipeline).

  sensitivity   one workload under several settings of one parameter: a profile and an optimized
                kernel per setting (RUN/builds/optimized-WL+KEY-VALUE), each measured under every
                setting beside vanilla -> RUN/studies/sensitivity/results.json
  share         the kernel's share of guest CPU time, instructions and simulated L1i/iTLB misses
                per workload on the vanilla kernel (simulated counters) -> RUN/studies/share/results.json

Both reuse the run's instrumented and vanilla builds, its kernel source and configuration."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from kpgo import atomic, bench, pipeline, vm, workloads
from kpgo.errors import UserError
from kpgo.guest.contract import Workload


def run_options(run_dir: Path) -> pipeline.RunOptions:
    """The request of the finished run in run_dir, to extend it exactly as it was started."""
    try:
        run = json.loads((run_dir / "run.json").read_text())
    except OSError:
        raise UserError(f"{run_dir} holds no finished kpgo run (no run.json)", "run `kpgo run --dir RUN_DIR` first") from None
    except ValueError:
        raise UserError(f"{run_dir / 'run.json'} is not valid JSON", "re-run `kpgo run --dir RUN_DIR` to rewrite it") from None
    if not isinstance(run, dict) or not isinstance(run.get("request"), dict):
        raise UserError(f"{run_dir / 'run.json'} was written by an older kpgo (no request)", "re-run `kpgo run --dir RUN_DIR` (cached steps are kept)")
    return pipeline.RunOptions.from_json(run["request"], run_dir)


def _builder(run_dir: Path):
    opts = run_options(run_dir)
    return opts.builder(*opts.kernel())


def variants(name: str, key: str, values: list[str], overrides: list[str]) -> list[Workload]:
    """The workload once per value of KEY, renamed NAME+KEY-VALUE (a name that is also a directory name virtme-ng
    can share: letters, digits and _ + . - only, so other characters of the value become _)."""
    if len(values) < 2:
        raise UserError("--vary needs two or more values", "e.g. --vary clients=1,50")
    out = []
    for v in values:
        spec = workloads.load(name, overrides + [f"{key}={v}"])
        out.append(replace(spec, name=re.sub(r"[^A-Za-z0-9_.+-]", "_", f"{name}+{key}-{v}")))
    return out


def sensitivity(run_dir: Path, specs: list[Workload], design: bench.Design, guest: vm.Guest, sim: Any = None) -> dict:
    build = _builder(run_dir)
    out = run_dir / "studies" / "sensitivity"
    instr = build("instrumented", "instrumented")
    for wl in specs:
        prof = pipeline.collect_cached(out / "profiles", run_dir / "builds" / "instrumented", instr, wl, guest)
        pipeline.fix_cached(out / "profiles", instr, wl, prof)
        build("optimized", f"optimized-{wl.name}", out / "profiles" / wl.name)
    build("vanilla", "vanilla")
    kernels = [bench.Kernel("vanilla", run_dir / "builds" / "vanilla")] + [
        bench.Kernel(f"optimized-{w.name}", run_dir / "builds" / f"optimized-{w.name}") for w in specs]
    return bench.bench(kernels, specs, out, design=design, guest=guest, sim=sim)


def share(run_dir: Path, specs: list[Workload], design: bench.Design, guest: vm.Guest, sim: Any) -> dict:
    _builder(run_dir)("vanilla", "vanilla")
    res = bench.bench([bench.Kernel("vanilla", run_dir / "builds" / "vanilla")], specs, run_dir / "studies" / "share", design=design, guest=guest, sim=sim)
    atomic.write_json(run_dir / "studies" / "share" / "share.json", bench.kernel_share(res))
    return res


def format_share(table: dict) -> str:
    def pct(x: float | None) -> str:
        return "–" if x is None else f"{x:.1%}"

    lines = [f"{'workload':<14} {'CPU time':>9} {'insns':>9} {'L1i miss':>9} {'iTLB miss':>9}   (kernel's share)"]
    lines += [f"{n:<14} {pct(r['cpu_time']):>9} " + " ".join(f"{pct(r[k]):>9}" for k in bench.SHARES) for n, r in table.items()]
    return "\n".join(lines)
