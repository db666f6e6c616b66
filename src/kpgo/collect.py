"""Collect a kernel profile: boot the instrumented kernel, run the workload with counters reset
after warm-up, snapshot every .gcda, and write a profile directory:

  PROFILE/<path relative to the kernel build dir>.gcda   (kernel/sched/fair.gcda, ...)
  PROFILE/profile.json                                   (what, where, how much)
  PROFILE/log/                                           (guest console, raw load output)"""

from __future__ import annotations

import shutil
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

from kpgo import atomic, client, inputs, vm, workloads
from kpgo.errors import InfraError, KpgoError, UserError
from kpgo.guest import contract
from kpgo.kernel import kbuild
from kpgo.progress import fmt_secs, say
from kpgo.remote import Remote


def check_build(build_dir: Path, wls: list[contract.Workload], guest: vm.Guest) -> dict:
    """build.json of an instrumented build whose config has what the workloads need; a UserError otherwise."""
    hint = "build one with `kpgo build --variant instrumented`"
    build = kbuild.load_build(build_dir, hint)
    # what a profile.json records of its build (every build.json kbuild writes has them)
    inputs.check(build, {"build_dir": str, "config_name": (str, None), "config_hash": str, "gcc": str}, build_dir / "build.json", hint)
    if not build.get("gcov"):
        raise UserError(f"the kernel in {build_dir} is not instrumented (CONFIG_GCOV_KERNEL is off)", "build it with `kpgo build --variant instrumented`")
    workloads.check_kernel(wls, build_dir, disk=guest.data == "disk")
    return build


def collect(build_dir: Path, workload: contract.Workload, out: Path, *, guest: vm.Guest, replace: bool = False) -> dict:
    build_dir = build_dir.resolve()
    build = check_build(build_dir, [workload], guest)
    atomic.check_output(out, inputs=[build_dir], what="profile directory", replace=replace)  # never inside the build
    kernel = kbuild.image(build_dir)
    accel = vm.accelerator(kernel)
    t0 = time.monotonic()
    with atomic.output_dir(out, replace=replace) as tmp:
        logdir = tmp / "log"
        share = tmp / "guest"
        job = contract.Job(mode="collect", workload=workload, runs=1, build_dir=build["build_dir"])
        where = " (client on the host)" if client.placement_of(workload) == "host" else ""
        say(f"collect {workload.name}: booting {build['kernel_release']} ({accel}){where}, warm-up, reset counters, measured load, snapshot")
        try:
            result = vm.run_agent(kernel, share, job, guest=guest, log=logdir / "console.log", accel=accel)
        except KpgoError as e:
            # The profile is not written, but the guest's logs are kept for the post-mortem.
            kept = out.parent / f"{out.name}.failed-logs"
            shutil.rmtree(kept, ignore_errors=True)
            shutil.copytree(tmp, kept, ignore=shutil.ignore_patterns("*.gcda", "gcda.tar"))
            raise type(e)(e.message, f"guest logs kept in {kept}") from None
        with tarfile.open(share / "gcda.tar") as tf:
            tf.extractall(tmp, filter="data")
        left_out = _leave_out_apparatus(tmp)
        for raw in share.glob("load-*.txt"):
            shutil.move(raw, logdir / raw.name)
        atomic.write_json(logdir / "guest-result.json", result.to_json())
        shutil.rmtree(share)
        info = _profile_info(tmp)
        run = result.runs[0]
        profile = {
            "kind": "kernel-gcov-profile",
            "kernel_release": build["kernel_release"],
            "config_name": build["config_name"],
            "config_hash": build["config_hash"],
            "build_dir": build["build_dir"],
            "build_key": build["key"],
            "gcc": build["gcc"],
            "gcov_version": info["gcov_version"],
            "workload": {"name": workload.name, "params": workload.params, "unit": workload.unit, "client": client.placement_of(workload)},
            "placement": result.placement,
            "throughput": run.value,
            "throughput_parts": run.parts,
            "secondary": run.secondary,
            "kernel_share": run.kernel_share,
            "window_seconds": run.seconds,
            "accelerator": accel,
            "files": info["files"],
            "arcs_sum": info["arcs_sum"],
            "left_out": left_out,
            "guest_timings": result.timings,
            "gcda_read_first": result.gcda_read_first,
            "mitigations": result.mitigations,
            **({"value_profiles": result.gcov_values} if result.gcov_values is not None else {}),
            "collected_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        atomic.write_json(tmp / "profile.json", profile)
    dropped = (profile.get("value_profiles") or {}).get("dropped_values", 0)
    if dropped:
        say(f"collect {workload.name}: the kernel's value-profile pool ran out: {dropped} new values were not recorded "
            "(the profile is valid; a larger CONFIG_GCOV_VALUES_POOL keeps them)")
    say(
        f"collect {workload.name}: {info['files']} .gcda files, counter sum {info['arcs_sum']}, "
        f"{profile['throughput']:.0f} {workload.unit} (snapshot {result.timings.get('snapshot', 0):.1f} s, all {fmt_secs(time.monotonic() - t0)}) — {out}"
    )
    return profile


def on_cluster(cluster: Remote, build_dir: Path, outs: dict[str, Path], wls: list[contract.Workload], *,
               guest: vm.Guest) -> Iterator[tuple[contract.Workload, dict | KpgoError]]:
    """Each workload collected on a node of the cluster (kpgo.cluster.Cluster, handed in), its profile written here at
    outs[name] (with the node that collected it in profile.json's "host"), or its error with the guest's logs kept
    beside it, as with collect(). Every check that needs no guest runs here first, before any task: a workload whose
    output cannot be written fails there, as collect() would fail it, and the others go on."""
    build_dir = build_dir.resolve()
    build = check_build(build_dir, wls, guest)
    todo = []
    for wl in wls:
        try:
            atomic.check_output(outs[wl.name], inputs=[build_dir], what="profile directory")
            todo.append(wl)
        except UserError as e:
            yield wl, e
    if not todo:
        return
    for wl, outcome, files in cluster.collect(build_dir, build["key"], todo, guest):
        out = outs[wl.name]
        if "error" in outcome:
            hint = outcome.get("hint") or "run the same command again to retry it"
            if files:
                kept = out.parent / f"{out.name}.failed-logs"
                shutil.rmtree(kept, ignore_errors=True)
                atomic.untar(files, kept)
                hint = f"guest logs kept in {kept}"
            where = outcome["host"].get("hostname", outcome["host"]["node_id"][:8])
            yield wl, (UserError if outcome["exit_code"] == UserError.exit_code else InfraError)(f"{outcome['error']} (on {where})", hint)
            continue
        assert files is not None
        t0 = time.monotonic()
        with atomic.output_dir(out) as tmp:
            atomic.untar(files, tmp)
            outcome["host"]["task"] |= {"unpack": round(time.monotonic() - t0, 3), "bytes": len(files)}
            profile = dict(outcome["profile"], host=outcome["host"])
            atomic.write_json(tmp / "profile.json", profile)
        say(f"collect {wl.name}: {profile['files']} .gcda files, {profile['throughput']:.0f} {wl.unit}, collected on "
            f"{outcome['host'].get('hostname', '?')} [{outcome['host']['node_id'][:8]}] — {out}")
        yield wl, profile


def _leave_out_apparatus(root: Path) -> dict:
    """Remove the .gcda files of the measurement apparatus (kpgo.gcov.profile.APPARATUS: the kernel's gcov code, whose
    counters are the reset and the snapshot themselves) from the snapshot in root; what they held, for profile.json."""
    from kpgo.gcov.gcda import ARCS, read_gcda
    from kpgo.gcov.profile import APPARATUS_WHY, is_apparatus

    files = sorted(p for p in root.rglob("*.gcda") if is_apparatus(str(p.relative_to(root))))
    arcs = sum(int(read_gcda(p).counters(ARCS).sum()) for p in files)
    for p in files:
        p.unlink()
    for d in sorted({p.parent for p in files}, key=lambda d: -len(d.parts)):  # and the directories they leave empty
        while d != root and not any(d.iterdir()):
            d.rmdir()
            d = d.parent
    return {"files": [str(p.relative_to(root)) for p in files], "arcs_sum": arcs, "why": APPARATUS_WHY}


def _profile_info(root: Path) -> dict:
    from kpgo.gcov.gcda import ARCS, read_gcda

    files = 0
    total = 0
    versions: set[str] = set()
    for p in root.rglob("*.gcda"):
        g = read_gcda(p)
        files += 1
        total += int(g.counters(ARCS).sum())
        versions.add(g.version_text)
    if files == 0:
        raise UserError("the guest returned no .gcda files", "is the kernel built with CONFIG_GCOV_PROFILE_ALL?")
    return {"files": files, "arcs_sum": total, "gcov_version": ",".join(sorted(versions))}


def collect_branches(build_dir: Path, workload: contract.Workload, out: Path, *, guest: vm.Guest, period: int | None = None,
                     replace: bool = False) -> dict:
    """Branch records of any kernel (no instrumented build needed): boot it under kpgo's QEMU plugin with branch
    recording on (TCG, nokaslr), run the workload with the simulator's window around the measured load, and write
    a branch profile directory (kpgo.branches: the plugin's records, BOLT's pre-aggregated profile, perf-script
    branch stacks for llvm-profgen --kernel, the call graph, and profile.json)."""
    from kpgo import branches, sim

    build_dir = build_dir.resolve()
    build = kbuild.load_build(build_dir, "build one with `kpgo build`")
    vmlinux = build_dir / "vmlinux"
    if not inputs.is_regular(vmlinux):
        raise UserError(f"{build_dir} has no vmlinux", "branch records are symbolized with it: build the kernel again")
    build_id = branches.build_id_of(vmlinux)
    workloads.check_kernel([workload], build_dir, disk=guest.data == "disk")
    config = sim.BranchConfig(build_id=build_id, period=sim.BRANCH_PERIOD if period is None else period,
                              thunks=tuple(branches.thunk_ranges(vmlinux)))
    atomic.check_output(out, inputs=[build_dir], what="branch profile directory", replace=replace)
    kernel = kbuild.image(build_dir)
    t0 = time.monotonic()
    with atomic.output_dir(out, replace=replace) as tmp:
        logdir = tmp / "log"
        share = tmp / "guest"
        # mode "bench": the agent runs the workload and its window and touches no gcov counters
        job = contract.Job(mode="bench", workload=workload, runs=1)
        where = " (client on the host)" if client.placement_of(workload) == "host" else ""
        say(f"collect {workload.name} --branches: booting {build['kernel_release']} (TCG, kpgo's QEMU plugin recording kernel branches){where}")
        try:
            result = vm.run_agent(kernel, share, job, guest=guest, log=logdir / "console.log", accel="tcg", sim=sim.SimConfig(),
                                  branches=config)
        except KpgoError as e:
            kept = out.parent / f"{out.name}.failed-logs"
            shutil.rmtree(kept, ignore_errors=True)
            shutil.copytree(tmp, kept, ignore=shutil.ignore_patterns(vm.BRANCH_RECORDS))
            raise type(e)(e.message, f"guest logs kept in {kept}") from None
        try:
            records = branches.read_records(share / vm.BRANCH_RECORDS, build_id)
        except UserError as e:  # the plugin wrote it for this kernel: a missing or cut file is the boot's failure
            raise InfraError(e.message, f"console log: {logdir / 'console.log'}") from None
        shutil.move(share / vm.BRANCH_RECORDS, tmp / branches.RECORDS_FILE)
        outputs = branches.make_outputs(records, vmlinux, tmp)
        for raw in share.glob("load-*.txt"):
            shutil.move(raw, logdir / raw.name)
        atomic.write_json(logdir / "guest-result.json", result.to_json())
        shutil.rmtree(share)
        run = result.runs[0]
        windows = result.sim or []
        profile = {
            "kind": branches.PROFILE_KIND,
            "build_id": build_id,
            "guest_build_id": result.build_id,  # what the booted kernel said of itself (the agent, /sys/kernel/notes)
            "thunks": [{"kind": k, "start": f"{lo:#x}", "end": f"{hi:#x}"} for k, lo, hi in config.thunks],
            "vmlinux": str(vmlinux),
            "kernel_release": build["kernel_release"],
            "config_name": build.get("config_name"),
            "build_dir": build.get("build_dir", str(build_dir)),
            "build_key": build.get("key"),
            "variant": build.get("variant"),
            "workload": {"name": workload.name, "params": workload.params, "unit": workload.unit, "client": client.placement_of(workload)},
            "placement": result.placement,
            "throughput": run.value,
            "throughput_parts": run.parts,
            "ops": run.ops,
            "window_seconds": run.seconds,
            "sim_windows": [{"seconds": w["seconds"], "kernel": w["kernel"], "user": w["user"]} for w in windows],
            **outputs,
            "files": {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()},
            "mitigations": result.mitigations,
            "collected_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "seconds": round(time.monotonic() - t0, 1),
        }
        atomic.write_json(tmp / "profile.json", profile)
    rec = profile["records"]
    lost = rec["lost_edges"] + rec["lost_ranges"] + rec["lost_samples"]
    if lost:
        say(f"collect {workload.name} --branches: the plugin's tables were full: {lost} executions of new keys were not recorded "
            "(counts of what is recorded stay exact)")
    say(f"collect {workload.name} --branches: {rec['branches']:,} kernel branches, {rec['edges']:,} edges, {rec['ranges']:,} ranges, "
        f"{rec['samples']:,} sampled stacks ({rec['stacks']:,} distinct), {profile['throughput']:.0f} {workload.unit} "
        f"(all {fmt_secs(time.monotonic() - t0)}) — {out}")
    return profile
