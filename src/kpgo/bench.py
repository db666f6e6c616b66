"""Benchmark kernels against each other: interleaved boots (A B A B ...), a warm-up per boot,
the same workload on each; per kernel mean, sd and the ratio to the first kernel with a
bootstrap 95% CI over boots. Each boot's result is kept, so an interrupted bench resumes."""

from __future__ import annotations

import json
import platform
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from kpgo import atomic, host, proc, stats, vm, workloads
from kpgo.errors import UserError
from kpgo.kernel import kbuild
from kpgo.progress import fmt_secs, say

TCG_NOTE = (
    "Measured under QEMU TCG (software emulation): wall-clock timings there do not show what code layout "
    "does on a real CPU; treat ratios as indicative only."
)


@dataclass(frozen=True)
class Kernel:
    label: str
    build_dir: Path


def parse_kernel_arg(text: str) -> Kernel:
    label, sep, path = text.partition("=")
    if not sep:
        path, label = text, Path(text).name
    return Kernel(label, Path(path).resolve())


def host_facts(accel: str) -> dict:
    qemu = proc.capture(["qemu-system-x86_64", "--version"]).splitlines()[0]
    return {"cpu": host.cpu_model(), "accelerator": accel, "qemu": qemu, "host_kernel": platform.release(), "gcc": kbuild.gcc_version()}


def bench(kernels: list[Kernel], workload: dict, out: Path, *, boots: int, runs: int, guest: vm.Guest) -> dict:
    if not kernels:
        raise UserError("bench needs a kernel", "pass --kernel LABEL=BUILD_DIR (two or more to compare them)")
    if len({k.label for k in kernels}) != len(kernels):
        raise UserError("kernel labels must be distinct", "name them with LABEL=BUILD_DIR")
    if boots < 1 or runs < 1:
        raise UserError("--boots and --runs must be at least 1", "fix the option")
    images: dict[str, tuple[Path, dict]] = {}
    for k in kernels:
        m = kbuild.load_manifest(k.build_dir)
        if m is None or not m.get("ok"):
            raise UserError(f"{k.build_dir} holds no complete kpgo build", "build it with `kpgo build`")
        images[k.label] = (Path(m["bzImage"]), m)
        workloads.check_kernel([workload], k.build_dir)
    accel = vm.accelerator(images[kernels[0].label][0])
    out.mkdir(parents=True, exist_ok=True)
    # Boots kept from an earlier bench are reused only if kernels, workload and design are the same.
    key = json.dumps({"kernels": [(k.label, images[k.label][1]["key"]) for k in kernels], "workload": workload, "runs": runs}, sort_keys=True)
    keyfile = out / "bench-key.json"
    if keyfile.exists() and keyfile.read_text() != key:
        shutil.rmtree(out / "boots", ignore_errors=True)
    atomic.write_text(keyfile, key)
    design = [(i, k.label) for i in range(boots) for k in (kernels if i % 2 == 0 else kernels[::-1])]
    # A B, B A, A B ...: each kernel is as often first as second, so drift over time cancels.
    samples: dict[str, list[float]] = {k.label: [] for k in kernels}
    raw: list[dict] = []
    t0 = time.monotonic()
    for n, (i, label) in enumerate(design, 1):
        bootdir = out / "boots" / f"{i:02d}-{label}"
        done = bootdir / "sample.json"
        if done.exists():
            rec = json.loads(done.read_text())
        else:
            say(f"bench: boot {n}/{len(design)}: {label} ({workload['name']}, {runs} run(s) after warm-up) {fmt_secs(time.monotonic() - t0)}")
            job = {"mode": "bench", "workload": workload, "runs": runs}
            result = vm.run_agent(images[label][0], bootdir / "guest", job, guest=guest, log=bootdir / "console.log", accel=accel)
            values = [r["value"] for r in result["runs"]]
            rec = {
                "boot": i, "kernel": label, "values": values, "mean": sum(values) / len(values),
                "parts": [r["parts"] for r in result["runs"]], "secondary": [r["secondary"] for r in result["runs"]],
                "kernel_share": [r["kernel_share"] for r in result["runs"]], "timings": result["timings"],
            }
            atomic.write_json(done, rec)
        samples[label].append(rec["mean"])
        raw.append(rec)
    base = kernels[0].label
    summary = []
    for k in kernels:
        d = stats.describe(samples[k.label])
        r, lo, hi = stats.ratio_ci(samples[base], samples[k.label])
        summary.append({"kernel": k.label, **d, "ratio": r, "ci_low": lo, "ci_high": hi, "ci_includes_1": not (lo > 1 or hi < 1)})
    results = {
        "workload": {"name": workload["name"], "params": workload["params"], "unit": workload["unit"], "higher_is_better": workload["higher_is_better"]},
        "design": {"order": "alternating A B / B A per round", "boots_per_kernel": boots, "runs_per_boot": runs, "warmup_per_boot": True, "unit_of_replication": "boot"},
        "kernels": {k.label: {"build_dir": str(k.build_dir), "variant": images[k.label][1]["variant"], "kernel_release": images[k.label][1]["kernel_release"]} for k in kernels},
        "host": host_facts(accel),
        "samples": raw,
        "summary": summary,
        "baseline": base,
        "note": TCG_NOTE if accel == "tcg" else "Measured under KVM.",
    }
    atomic.write_json(out / "results.json", results)
    return results


def format_table(results: dict) -> str:
    unit = results["workload"]["unit"]
    lines = [
        f"{results['workload']['name']}: {results['design']['boots_per_kernel']} boots per kernel × {results['design']['runs_per_boot']} run(s), interleaved; baseline {results['baseline']}",
        f"{'kernel':<14} {'mean ' + unit:>20} {'sd':>10} {'cv':>6}  {'ratio [95% CI]':>24}",
    ]
    for s in results["summary"]:
        ci = "" if s["kernel"] == results["baseline"] else (f"[{s['ci_low']:.3f}, {s['ci_high']:.3f}]" if s["ci_low"] == s["ci_low"] else "[n<2]")
        star = "*" if s["kernel"] != results["baseline"] and s["ci_includes_1"] else " "
        lines.append(f"{s['kernel']:<14} {s['mean']:>20.1f} {s['sd']:>10.1f} {s['cv']:>6.1%}  {s['ratio']:>7.3f} {ci:>16}{star}")
    lines.append("* the 95% CI includes 1.0: no difference shown at this sample size")
    lines.append(results["note"])
    return "\n".join(lines)
