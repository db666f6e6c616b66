"""Boot a kernel under virtme-ng over the host's root and run one command in it.

Every guest has a hard timeout (the whole QEMU process group is killed), boots with panic=-1
so a panic ends it at once, and reports back through files in a shared run directory (the
exit status of the command is in result.json written by the guest agent). KVM is used only
if a short boot test passes on this machine; otherwise TCG, and we say so once. With simulated
counters (kpgo.sim) the guest runs under TCG with kpgo's QEMU plugin loaded."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from kpgo import atomic, client, proc
from kpgo import branches as elf
from kpgo import sim as simulator
from kpgo.errors import InfraError, UserError
from kpgo.guest import contract
from kpgo.paths import cache_dir
from kpgo.progress import say
from kpgo.workloads.install import tools_dir

AGENT = Path(__file__).parent / "guest" / "agent.py"
AGENT_STARTED = "kpgo-agent: started"  # the agent's first line on the console
# What a TCG guest prints when one vCPU runs a stale translation of kernel text another vCPU has just live-patched
# (static keys): it executes a breakpoint the patching code already removed. An emulator flake, not the kernel's.
# micro avoids it by holding on the keys its stressors flipped (docs/SIM.md, "Live text patching under TCG").
TEXT_PATCH_RACE = "Oops: int3"
SHAREABLE = re.compile(r"[A-Za-z0-9_+ /.-]+")  # what vng's --rwdir accepts
BRANCH_RECORDS = "branches.rec"  # in run_agent's rundir, with branch records (kpgo.branches)
DATA_PLACES = ("tmpfs", "disk")
DATA_DISK_BYTES = 4 << 30  # the data disk's size (sparse: the host stores what the guest writes); tmpfs has 1 GiB
DATA_DISK = "data.img"  # beside the boot's console log, removed after the boot


@dataclass(frozen=True)
class Guest:
    cpus: int | None = None  # None: 2, or with a host client one per core the client leaves (client.plan)
    memory: str = "2G"
    timeout: float = 900.0
    # Boot to the agent's first line: ~10 s under TCG, ~60 s with the simulator on from power-on, more on a busy
    # host. Past this the boot has hung (seen under TCG: a vCPU whose timer never fires, RCU stall reports, then
    # silence), so it is killed and booted once more instead of waiting out `timeout`.
    start_timeout: float = 300.0
    # Where the workload's run directory (its data) lives: "tmpfs" (memory), or "disk": ext4 on a virtio disk,
    # a sparse image on the host made for the boot, so the kernel's block layer and file system work as on a server
    # whose data is on a disk.
    data: str = "tmpfs"

    def __post_init__(self) -> None:
        if self.data not in DATA_PLACES:
            raise UserError(f"--data {self.data}: the run directory is on tmpfs or disk", "use --data tmpfs or --data disk")
        if self.data == "disk":
            mkfs_ext4()  # before any boot: every boot makes its disk with it


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def accelerator(probe_kernel: Path) -> str:
    """'kvm' or 'tcg'. KVM_CREATE_VM succeeding is not enough (guests die here with an
    emulation failure), so KVM must boot a kernel and run `true`. Cached per host boot."""
    forced = os.environ.get("KPGO_ACCEL")
    if forced in ("kvm", "tcg"):
        return forced
    cache = cache_dir() / "accel.json"
    try:
        known = json.loads(cache.read_text())
        if known.get("boot_id") == _boot_id():
            return str(known["accel"])
    except (OSError, ValueError, KeyError):
        pass
    accel = "tcg"
    reason = "/dev/kvm is missing or not accessible"
    if os.path.exists("/dev/kvm") and os.access("/dev/kvm", os.R_OK | os.W_OK):
        log = cache_dir() / "kvm-probe.log"
        log.unlink(missing_ok=True)
        res = proc.run(
            ["vng", "-r", probe_kernel, "--cpus", "1", "--memory", "512M", "--append", "panic=-1", "--exec", "true"],
            log=log, timeout=60, check=False, what="KVM boot probe",
        )
        if res.returncode == 0:
            accel, reason = "kvm", "a KVM boot test passed"
        else:
            reason = f"/dev/kvm exists but a KVM boot test failed (log: {log})"
    atomic.write_json(cache, {"boot_id": _boot_id(), "accel": accel, "reason": reason})
    if accel == "tcg":
        say(f"guests run under QEMU TCG (software emulation): {reason}; timings are not what a real CPU shows")
    return accel


def vng_argv(kernel: Path, cmd: str, *, guest: Guest, accel: str, rwdir: Path | None = None,
             sim: simulator.SimConfig | None = None, report: Path | None = None, net: client.HostClient | None = None,
             branches: simulator.BranchConfig | None = None, records: Path | None = None, disk: Path | None = None) -> list[str | Path]:
    """The vng command line booting `kernel` to run the shell command `cmd` (an argument list and
    nothing else: prepare_sim readies a simulated boot). With `sim`, the plugin writes its report
    to `report` and the guest runs under TCG; with `branches` too, its branch records to `records`.
    With `net` (a host client), the guest gets its NIC and QEMU is pinned to the cores the client leaves."""
    if not kernel.is_file():
        raise UserError(f"kernel image {kernel} not found", "build it first with `kpgo build`")
    argv: list[str | Path] = ["vng", "-r", kernel]
    if rwdir is not None:
        argv += ["--rwdir", rwdir]
    cpus = net.placement.vcpus if net is not None else guest.cpus or 2
    argv += ["--cpus", str(cpus), "--memory", guest.memory, "--append", "panic=-1", "--verbose", "--exec", cmd]
    if disk is not None:
        argv += ["--disk", disk]  # the guest's only disk (virtme-ng 1.x attaches it as virtio-blk: /dev/vda)
    if net is not None:
        argv.append(f"--qemu-opts={net.qemu_opts()}")
    if sim is not None:
        if report is None:
            raise ValueError("a simulated boot needs a report path")
        # nokaslr/norandmaps: the same code at the same virtual addresses every boot, so the
        # virtually indexed cache and TLB sets repeat (vng splits one --append on spaces).
        # "--qemu-opts=VALUE" in one word: argparse takes a separate "-plugin ..." for an option.
        # nokaslr also keeps the kernel's code at vmlinux's addresses, which branch records rely on.
        argv += ["--append", "nokaslr norandmaps", f"--qemu-opts={simulator.qemu_opts(sim.for_guest(cpus), report, branches, records)}"]
        accel = "tcg"  # a plugin sees only TCG-translated code
    if accel != "kvm":
        argv.insert(1, "--disable-kvm")
    return proc.pinned(argv, net.placement.qemu_cpus) if net is not None else argv


def mkfs_ext4() -> str:
    mkfs = shutil.which("mkfs.ext4") or next((p for p in ("/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4") if os.access(p, os.X_OK)), None)
    if mkfs is None:
        raise UserError("--data disk needs mkfs.ext4 on the host", "install e2fsprogs (apt install e2fsprogs)")
    return mkfs


def make_data_disk(path: Path) -> None:
    """A sparse image holding an empty ext4 file system, its inode tables and journal written now: left to the
    guest, ext4lazyinit would zero them in the background during the measured window."""
    mkfs = mkfs_ext4()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    with open(path, "wb") as f:
        f.truncate(DATA_DISK_BYTES)
    proc.run([mkfs, "-q", "-F", "-L", "kpgo-data", "-E", "lazy_itable_init=0,lazy_journal_init=0", str(path)], timeout=300)


def prepare_sim(report: Path, accel: str, records: Path | None = None) -> None:
    """The host side of a simulated boot, before vng starts: kpgo's QEMU plugin and the guest's
    kpgo-window built (the plugin header fetched once), no report (or branch records) left by an earlier boot."""
    if accel == "kvm":
        say("simulated counters need QEMU TCG: this guest runs without KVM")
    simulator.setup()
    simulator.clean_report(report)
    if records is not None:
        simulator.clean_report(records)


def run_command(kernel: Path, cmd: str, *, guest: Guest, log: Path, accel: str,
                sim: simulator.SimConfig | None = None, report: Path | None = None) -> proc.Result:
    """Boot `kernel` and run the shell command `cmd` (no agent, no retry): for tests and
    measurements of the simulator. The guest's output is in the console log and the Result."""
    argv = vng_argv(kernel, cmd, guest=guest, accel=accel, sim=sim, report=report)
    if sim is not None:
        assert report is not None  # vng_argv refuses a simulated boot without one
        prepare_sim(report, accel)
    log.unlink(missing_ok=True)
    res = proc.run(argv, log=log, timeout=guest.timeout, check=False, keep_output=True)
    if res.timed_out:
        raise InfraError(f"the guest did not finish within {guest.timeout:.0f} s and was killed", f"console log: {log}")
    return res


def vmlinux_beside(kernel: Path) -> Path | None:
    """The vmlinux of the build directory a kernel image lies in (BUILD/arch/x86/boot/bzImage, kbuild.image), whose
    build id the booted guest must report; None for an image outside a build directory."""
    kernel = kernel.resolve()
    if kernel.parts[-4:-1] != ("arch", "x86", "boot"):
        return None
    vmlinux = kernel.parents[3] / "vmlinux"
    return vmlinux if vmlinux.is_file() else None


def run_agent(kernel: Path, rundir: Path, job: contract.Job, *, guest: Guest, log: Path, accel: str,
              sim: simulator.SimConfig | None = None, branches: simulator.BranchConfig | None = None) -> contract.Result:
    """Boot `kernel`, run the guest agent on `job` with `rundir` shared read-write, return its result
    (result.json) with the host's side of the boot: the placement, and the simulator's windows. The guest must have run
    the kernel of `kernel`'s build directory (the build id of its vmlinux), or the boot fails.

    With `sim`, kpgo's QEMU plugin counts each measured run in its own window (the agent opens and
    closes it around the load steps; with the workload's `windows = "step"`, around each load step)
    and result.sim is the list of windows as kpgo.sim.read_windows returns them: one per entry of
    result.runs, or per step of each run in the order of its `step_ops`."""
    # With `branches` too, the plugin records the windows' branches into rundir/BRANCH_RECORDS (kpgo.branches).
    if branches is not None and sim is None:
        raise ValueError("branch records come from the simulator: give sim too")
    if not SHAREABLE.fullmatch(str(rundir.resolve())):
        raise UserError(f"virtme-ng cannot share {rundir.resolve()} with the guest (it takes only letters, digits, space and _ + / . -)",
                        "choose an output or run directory whose path has no other characters")
    report = rundir / "sim.json"
    cmd = shlex.join([sys.executable, str(AGENT), str(rundir / "job.json")])
    placement = client.plan(job.workload, guest.cpus)
    if sim is not None:
        sim = sim.for_guest(placement.vcpus)  # what QEMU gets is what each window records
    net = None
    if placement.client == "host":
        client.check_ports_free(job.workload)
        net = client.HostClient(job.workload, placement, rundir / "client", log.with_name("client.log"))
    try:
        res = _run_agent(kernel, rundir, job, cmd, guest, log, accel, sim, report, net, branches)
    finally:
        if net is not None:
            net.close()
    result_file = rundir / "result.json"
    # Why the host client failed (it never reached the agent, say), beside what the guest saw.
    host_side = f"; the host client: {net.error}" if net is not None and net.error else ""
    if res.stalled:
        raise InfraError(f"the guest did not start kpgo's agent within {guest.start_timeout:.0f} s, twice, and was killed{host_side}",
                         f"console log: {log}")
    if res.timed_out:
        raise InfraError(f"the guest did not finish within {guest.timeout:.0f} s and was killed{host_side}", f"console log: {log}")
    if not result_file.exists():
        tail = " | ".join(ln.strip() for ln in res.output.strip().splitlines()[-3:])
        raise InfraError(f"the guest ended (status {res.returncode}) without a result: {tail[-300:]}{host_side}", f"console log: {log}")
    result = contract.Result.from_json(json.loads(result_file.read_text()))
    result.placement = placement.as_json()
    if result.ok and guest.data == "disk" and not (result.rundir_fs or "").startswith("ext4 "):
        raise InfraError(f"--data disk: the guest's run directory was on {result.rundir_fs or 'an unknown file system'}, not the data disk's ext4",
                         f"console log: {log}")
    beside = vmlinux_beside(kernel)
    if beside is not None and result.build_id and result.build_id != (want_id := elf.build_id_of(beside)):
        # every figure belongs to the build it is filed under: the guest names the kernel it ran (/sys/kernel/notes)
        raise InfraError(f"the guest ran the kernel with build id {result.build_id}, not {beside}'s {want_id}",
                         f"rebuild {beside.parent}: its bzImage does not hold its vmlinux")
    if not result.ok:
        # The tails of the failing step's output and of the server's log say why, in place.
        for text, tag in ((result.output_tail, "output"), (result.server_log_tail, "server")):
            for ln in (text or "").strip().splitlines()[-6:]:
                print(f"  {tag}| {ln}", file=sys.stderr)
        raise InfraError(f"workload {job.workload.name} failed in the guest ({result.phase}): {result.error}{host_side}", f"console log: {log}")
    if sim is not None:
        windows = simulator.read_windows(report)
        if sim.boot and windows:
            result.sim_boot = windows.pop(0)  # power-on to the agent's start
        want = result.window_count(job.workload.windows)
        if len(windows) != want:
            per = f" of {want // max(len(result.runs), 1)} load step(s) each" if job.workload.windows == "step" else ""
            raise InfraError(f"the simulator recorded {len(windows)} window(s) for {len(result.runs)} measured run(s){per}",
                             f"report: {report}; console log: {log}")
        for w in windows + ([result.sim_boot] if result.sim_boot else []):
            w["icount"] = sim.icount  # the guest clock each window was counted under
        result.sim = windows
    return result


def text_patch_race(log: Path, accel: str) -> bool:
    """Did this guest die of QEMU TCG's race with the kernel's live text patching (TEXT_PATCH_RACE in its console log
    `log`)? Never under KVM, where the CPU runs the patched text itself."""
    try:
        return accel == "tcg" and TEXT_PATCH_RACE in log.read_text(errors="replace")
    except OSError:
        return False


def _run_agent(kernel: Path, rundir: Path, job: contract.Job, cmd: str, guest: Guest, log: Path, accel: str,
               sim: simulator.SimConfig | None, report: Path, net: client.HostClient | None,
               branches: simulator.BranchConfig | None = None) -> proc.Result:
    """run_agent's boot: the job written, the guest booted (twice if its kernel panicked or hung early)."""
    records = rundir / BRANCH_RECORDS if branches is not None else None
    disk = log.parent / DATA_DISK if guest.data == "disk" else None
    argv = vng_argv(kernel, cmd, guest=guest, accel=accel, rwdir=rundir, sim=sim, report=report, net=net,
                    branches=branches, records=records, disk=disk)  # checks the kernel first
    if sim is not None:
        prepare_sim(report, accel, records)
    rundir.mkdir(parents=True, exist_ok=True)
    for stale in ("result.json", "gcda.tar"):
        (rundir / stale).unlink(missing_ok=True)
    if sim is not None:
        job = replace(job, sim=True, sim_boot=sim.boot)
    if net is not None:
        shutil.rmtree(net.workdir, ignore_errors=True)
        net.prepare()
        job = replace(job, client=net.job())
    atomic.write_json(rundir / "job.json", replace(job, tools_dir=str(tools_dir()), data=guest.data).to_json())
    result_file = rundir / "result.json"
    for attempt in (1, 2):
        if net is not None:
            net.start()
        try:
            if disk is not None:
                make_data_disk(disk)  # a fresh one for each boot
            res = proc.run(argv, log=log, timeout=guest.timeout, check=False, keep_output=True, on_line=net.on_console if net else None,
                           expect=(AGENT_STARTED, guest.start_timeout))
        finally:
            if net is not None:
                net.stop()
            if disk is not None:
                disk.unlink(missing_ok=True)
        # Under TCG with 2 vCPUs the kernel's int3-based live text patching (static keys flipped
        # during boot) now and then races the other vCPU: "Oops: int3" and a panic before the
        # agent starts. That is an emulator flake, not the workload: boot once more, and say so.
        # A boot that hangs before the agent starts (res.stalled) is the same kind of flake.
        early_panic = "Kernel panic" in res.output and AGENT_STARTED not in res.output
        if (res.timed_out and not res.stalled) or result_file.exists() or not (early_panic or res.stalled) or attempt == 2:
            break
        what = f"hung while booting (no agent after {guest.start_timeout:.0f} s)" if res.stalled else "panicked while booting"
        say(f"the guest kernel {what} (console log: {log}); booting once more")
        log.rename(log.with_name(log.name + (".stalled" if res.stalled else ".panic")))
        if sim is not None:
            simulator.clean_report(report)
            if records is not None:
                simulator.clean_report(records)
    return res
