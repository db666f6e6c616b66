"""kpgo on a Ray cluster: the one module that uses Ray, imported only by commands given --cluster (docs/SCALE.md).

The commands hand the steps a Cluster (kpgo.remote.Remote); kpgo.bench, kpgo.collect, kpgo.pipeline and kpgo.study
never import this module, which imports them (its tasks run their code on the nodes).

API
    Cluster(address)                   what the commands hand in: .bench_runner(), .collect(), .builds(), .merge()
    session(address, num_cpus=None)    context: Ray connected (or started, for "local"), shut down after
    connect(address, num_cpus=None)    connect the driver; one-line UserError when Ray is missing or unreachable
    tree_merge(dirs, dst, ..., fan_in, address) -> dict
                                       `kpgo profile merge --cluster`: merge_profiles as a tree of Ray tasks
    bench_runner(address)              context: a kpgo.bench.Runner booting each bench boot as a Ray task
    collect(address, build_dir, key, workloads, guest)
                                       `kpgo collect --cluster`: each workload's collection a Ray task on a guest node
    builds(address, reqs, source_arg)  each kernel build a Ray task on a node with the driver's source and compilers,
                                       written here as it ends (kpgo.pipeline.Builder.many)
    Schedule(boots, nodes)             which node boots what: each round whole on one node (no Ray: testable alone)
    choose_nodes(checks, choice, address)
                                       the accelerator, the simulator and the nodes a bench boots on
    kpgo_identity()                    this kpgo's version and files' digest: every task checks its node's is the driver's
    failure(ray, e, what, node)        a task's failure as one line, Ray's whole report written to a file here
    trim_kernels(root, keep), tidy_node_dirs(cache, alive)
                                       a node's cache held to its bound, a lost node's leftovers removed

ADDRESS is a Ray address (host:port of the head's GCS, as `ray start --head` prints it, or ray://host:port for Ray
Client), `auto` (the cluster `ray start` left on this machine, or RAY_ADDRESS), or `local` (a Ray started here for
this command, with one worker per core this process may use, stopped when the command ends).

The merge is kpgo.gcov.merge's steps as tasks: each leaf folds at most fan_in inputs into a Partial (the exact
state of the accumulators, not rounded counters), each node above folds at most fan_in partials, level after level
until one remains; the driver then writes the output exactly as the serial merge does (same steps, same bytes).
Partials travel through Ray's object store as the next level's arguments (never waited for inside a task, so a lost
one is made again) and are freed once the level above has read them. Inputs are read by
the tasks at the paths the driver sees (absolute): every node must see them at the same path (a shared directory;
on a local cluster, this machine's).

A bench boots on the nodes that offer the custom resource GUEST (1 per node: `ray start --resources='{"kpgo_guest":
1}'`; `local` starts Ray with it), one guest per node at a time, each round of the plan whole on one node (the host is
a block of the randomized design), and only on nodes that have what a boot needs (a check task on each node first).
Kernel images travel once per kernel through the object store into a node-local cache; each boot's sample and
outputs come back as its task's value, and the driver writes them (docs/SCALE.md). Collections and builds run one per
node at a time, the next to the node that is free (_Nodes.spread); a build's outputs come back as a tar too."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import platform
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

from kpgo import atomic
from kpgo.errors import InfraError, KpgoError, UserError
from kpgo.paths import cache_dir
from kpgo.progress import fmt_secs, say

LOCAL = "local"
AUTO = "auto"
PROBE_SECONDS = 5.0  # a head that does not accept a TCP connection in this time is not there
INSTALL_HINT = "install it with pip install 'kpgo[cluster]' or make setup"
ADDRESS_HINT = "give the head's address as `ray start --head` prints it (host:port), auto, or local"
AUTH_HINT = ("a head with Ray's token authentication needs RAY_AUTH_MODE=token and its token here (~/.ray/auth_token or RAY_AUTH_TOKEN) — "
             "docs/SCALE.md")
GUEST = "kpgo_guest"  # custom resource, 1 on each node that may boot measuring guests: one guest per node at a time
RESOURCE_HINT = f"""start each node that may boot guests with ray start ... --resources='{{"{GUEST}": 1}}' (docs/SCALE.md), or use --cluster local"""
HEARTBEAT_SECONDS = 60.0  # a line this often while a build or a collection runs on a node
MERGE_HEARTBEAT_SECONDS = 10.0  # a line this often while a level of a fleet merge runs
KERNELS_MB = 4096  # a node keeps its copies of kernels up to this (the server kernel's are ~11 MB, a tiny one's 3-5 MB)
KERNELS_MB_ENV = "KPGO_NODE_KERNELS_MB"  # ... or this, set on the node
BOOT_RETRIES = 3  # Ray re-runs a boot whose worker process died while its node lives (the round stays there)
KERNEL_FILES = ("arch/x86/boot/bzImage", ".config", "build.json")  # what vng boots a build with and what kpgo reads of it
# (kpgo.collect checks the build from build.json); a build with modules adds them (kernel_files)
# What the driver keeps of a build made on a node: the kernel, vmlinux (the simulator's and the report's symbols and
# sizes), the log, the proof and the key (a later build there knows the directory); a gcov build's .gcno files too.
BUILD_FILES = (*KERNEL_FILES, "vmlinux", "System.map", "build.log", "proof.json", ".kpgo-key")


def kernel_files(d: Path) -> dict[str, Path]:
    """What a node needs of the build in d to boot it as vng boots the build: KERNEL_FILES, and for a config with
    modules (--base debian) each module modules.order names with what virtme-prep-kdir-mods reads beside them (the
    node's vng makes its module directory from them at the first boot)."""
    rels = list(KERNEL_FILES)
    if (d / "modules.order").is_file():
        rels += ["modules.order", "modules.builtin", "modules.builtin.modinfo", "System.map"]
        rels += [re.sub(r"\.o$", ".ko", m) for m in (d / "modules.order").read_text().split()]
    return {rel: d / rel for rel in rels}


def _import_ray() -> ModuleType:
    try:
        import ray
    except ImportError:
        raise UserError("--cluster needs Ray, which is not installed", INSTALL_HINT) from None
    return ray


def _ray_temp() -> str:
    """Where Ray keeps its sessions and logs on this machine (RAY_TMPDIR or TMPDIR, then /tmp: Ray's own rule)."""
    from ray._common.utils import get_default_ray_temp_dir

    return str(get_default_ray_temp_dir())


def _endpoint(address: str) -> tuple[str, int]:
    """The host and port Ray will dial for `address` (its own resolution: RAY_ADDRESS, the cluster `ray start` left
    for auto, localhost replaced by this node's address)."""
    if address.startswith("ray://"):
        host, _, port = address[len("ray://"):].rpartition(":")
        return host, int(port)
    from ray._private import services  # Ray's resolution, so the probe dials what ray.init will

    try:
        hostport = services.canonicalize_bootstrap_address(address)
    except (ConnectionError, ValueError):
        hostport = None
    if not hostport:
        if address == AUTO:
            raise UserError("--cluster auto: no Ray cluster is running on this machine (and RAY_ADDRESS is not set)",
                            "start one with `ray start --head`, give its address, or use --cluster local")
        raise UserError(f"--cluster {address}: not a Ray address", ADDRESS_HINT)
    host, _, port = hostport.rpartition(":")
    return host.strip("[]"), int(port)


def _probe(address: str) -> None:
    """A one-line error within PROBE_SECONDS when nothing listens at the address (ray.init would retry for minutes)."""
    try:
        host, port = _endpoint(address)
    except ValueError:
        raise UserError(f"--cluster {address}: not a Ray address", ADDRESS_HINT) from None
    try:
        with socket.create_connection((host, port), timeout=PROBE_SECONDS):
            pass
    except OSError as e:
        why = "no answer" if isinstance(e, TimeoutError) else (e.strerror or str(e))
        raise UserError(f"cannot reach a Ray cluster at {address} ({host}:{port}: {why})",
                        f"check that its head is running (`ray status` there), or {ADDRESS_HINT}") from None


@contextlib.contextmanager
def _env(**values: str) -> Iterator[None]:
    """Environment variables for the length of a ray.init that reads them (set only where not set already)."""
    added = [k for k in values if k not in os.environ]
    os.environ.update({k: values[k] for k in added})
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


def connect(address: str, num_cpus: int | None = None) -> ModuleType:
    """Connect this process to the cluster at `address` (or start a local one) and return the ray module."""
    ray = _import_ray()
    quiet: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": False}
    if address == LOCAL:
        cpus = num_cpus or len(os.sched_getaffinity(0))
        try:
            # address "local": a new Ray, not one `ray start` runs here or a dead one's address file names (ray.init's own
            # default would join those, and then refuse num_cpus)
            ray.init(address=LOCAL, num_cpus=cpus, resources={GUEST: 1}, include_dashboard=False, **quiet)
        except Exception as e:  # Ray raises many kinds; none is the user's to fix
            raise InfraError(f"could not start a local Ray cluster: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
                             f"see Ray's logs under {_ray_temp()}/session_latest/logs") from None
        return ray
    _probe(address)
    # Something answered: if it is not a Ray head, ray.init gives up after one round of retries (~40 s) rather than
    # its default of twenty.
    with _env(RAY_gcs_server_port_wait_time_s="1"):
        try:
            ray.init(address=address, **quiet)
        except (ConnectionError, RuntimeError, TimeoutError, ray.exceptions.RayError) as e:  # (AuthenticationError: no token here)
            raise UserError(f"cannot connect to a Ray cluster at {address}: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
                            f"check the address and the token: {AUTH_HINT}") from None
    return ray


@contextlib.contextmanager
def session(address: str, num_cpus: int | None = None) -> Iterator[ModuleType]:
    """Ray connected for the length of the block. A Ray this process initialized already (a test, a notebook) is
    used as it is and left running."""
    ray = _import_ray()
    if ray.is_initialized():
        yield ray
        return
    connect(address, num_cpus)
    try:
        yield ray
    finally:
        ray.shutdown()


# -- tasks --------------------------------------------------------------------------------------------------------
# Module-level functions, so that Ray's workers import them from kpgo (every node runs the same kpgo) rather than
# receive their code. Each returns (its value, [stats of itself and the tasks below it]).


@functools.cache
def kpgo_identity() -> dict[str, str]:
    """This process's kpgo: its version, where it is installed and a digest of every file of the package (its code and
    its data), which a node's must equal the driver's: a task runs the node's own kpgo, not code sent by the driver."""
    import kpgo

    root = Path(kpgo.__file__).resolve().parent
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(f"{f.relative_to(root)}\0{f.stat().st_size}\0".encode())
        h.update(f.read_bytes())
    return {"version": kpgo.__version__, "digest": h.hexdigest()[:16], "path": str(root)}


def _run_task(driver: dict[str, str], name: str, *args: Any) -> Any:
    """Every kpgo task on a node: refused in one line unless the node runs the driver's kpgo, then the task `name`."""
    mine = kpgo_identity()
    if (mine["version"], mine["digest"]) != (driver["version"], driver["digest"]):
        raise UserError(f"{socket.gethostname()} runs another kpgo than the driver: {mine['version']} (files {mine['digest']}) "
                        f"in {mine['path']}, the driver {driver['version']} (files {driver['digest']})",
                        "install the driver's kpgo on every node (the same release or tree) — docs/SCALE.md")
    return _TASKS[name](*args)


class _Task:
    """A kpgo task function as a Ray task run through _run_task (which checks the node's kpgo first); .options() as
    Ray's."""

    def __init__(self, ray: ModuleType, fn: Any, options: dict[str, Any] | None = None) -> None:
        self.ray, self.fn, self.opts = ray, fn, options or {}
        self.remote_fn = ray.remote(_run_task).options(name=fn.__name__.strip("_"), **self.opts)

    def options(self, **kw: Any) -> _Task:
        return _Task(self.ray, self.fn, {**self.opts, **kw})

    def remote(self, *args: Any) -> Any:
        return self.remote_fn.remote(kpgo_identity(), self.fn.__name__, *args)


def _reset_peak() -> None:
    """Start this process's peak RSS afresh (Linux): workers are reused, and a task's peak is what is asked for."""
    with contextlib.suppress(OSError):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")


def _rss_mb(field: str) -> float:
    """VmRSS (now) or VmHWM (peak) of this process; the peak since the process began where /proc lacks them."""
    with contextlib.suppress(OSError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _start() -> tuple[float, float]:
    """A task's start: its time, and the worker's RSS before it (Ray and numpy loaded: the part no task saves)."""
    _reset_peak()
    return time.monotonic(), _rss_mb("VmRSS")


def _stat(kind: str, inputs: int, start: tuple[float, float]) -> dict[str, Any]:
    return {"kind": kind, "inputs": inputs, "seconds": round(time.monotonic() - start[0], 4),
            "start_rss_mb": round(start[1], 1), "peak_rss_mb": round(_rss_mb("VmHWM"), 1), "pid": os.getpid(),
            "host": socket.gethostname()}


def _totals_task(dirs: list[str]) -> tuple[list[int], list[dict[str, Any]]]:
    from kpgo.gcov.merge import input_totals

    start = _start()
    out = input_totals(dirs)
    return out, [_stat("totals", len(dirs), start)]


def _fold_task(plan: Any, lo: int, hi: int) -> tuple[Any, list[dict[str, Any]]]:
    from kpgo.gcov.merge import fold_inputs

    start = _start()
    out = fold_inputs(plan, lo, hi)
    return out, [_stat("fold", hi - lo, start)]


def _files_task(plan: Any, rels: list[str], lo: int, hi: int, unmatched: list[list[str]]) -> tuple[Any, list[dict[str, Any]]]:
    from kpgo.gcov.merge import fold_files

    start = _start()
    out = fold_files(plan, rels, lo, hi, unmatched)
    return out, [_stat("fold-files", hi - lo, start)]


def _combine_task(plan: Any, files: bool, *children: tuple[Any, list[dict[str, Any]]]) -> tuple[Any, list[dict[str, Any]]]:
    """Fold the partials of children (each a task's (value, stats)) one at a time. They are the task's arguments, not
    refs it waits for: Ray fetches them (or makes a lost one again) before the task takes a CPU, and maps their arrays
    from the node's object store."""
    from kpgo.gcov.merge import combine, combine_files

    start = _start()
    parts = [value for value, _ in children]
    out = combine_files(plan, parts) if files else combine(plan, parts)
    return out, [*(s for _, below in children for s in below), _stat("combine-files" if files else "combine", len(children), start)]


def _get(ray: ModuleType, refs: Any, what: str = "merge") -> Any:
    """ray.get with a task's kpgo error re-raised as itself (one line), and any other failure as an InfraError naming
    what Ray reported (_failure)."""
    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as e:
        raise failure(ray, e, f"a {what} task") from None
    except ray.exceptions.RayError as e:
        raise failure(ray, e, f"the Ray cluster during the {what}") from None


def failure(ray: ModuleType, e: Exception, what: str, node: str | None = None) -> KpgoError:
    """A task's failure as one line. kpgo's own error (UserError, InfraError) is itself; anything else (an exception kpgo
    did not expect, a worker or a node that died) is an InfraError whose hint names a file here holding all Ray reported
    (the task's traceback, as the node printed it) and where that node keeps its Ray logs."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, KpgoError):
        return cause
    head = f"{type(cause).__name__}: {cause}" if cause is not None else f"{type(e).__name__}: {str(e).strip()}"
    log = cache_dir() / "cluster" / "logs" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{len(_REPORTED)}.log"
    atomic.write_text(log, f"{what} failed{f' on node {node}' if node else ''}\n\n" + re.sub(r"\x1b\[[0-9;]*m", "", str(e)) + "\n")
    _REPORTED.append(log)
    ip = re.search(r"\bip=([0-9A-Fa-f.:]+)", str(e))  # (Ray's report names the task's process and address: "(pid=..., ip=...)")
    logs = sorted({f"{n.get('NodeManagerHostname')}:{Path(n.get('ObjectStoreSocketName', '')).parent.parent / 'logs'}" for n in ray.nodes()
                   if (node and n["NodeID"] == node) or (not node and ip and n.get("NodeManagerAddress") == ip[1])})
    return InfraError(f"{what} failed{' on ' + node[:8] if node else ''}: {head.splitlines()[0] if head.strip() else type(e).__name__}",
                      f"Ray's report: {log}" + (f"; the node's Ray logs: {' or '.join(logs)}" if logs else ""))


_REPORTED: list[Path] = []  # the reports failure() wrote (their names stay distinct within a second)


def _chunks(n: int, k: int) -> list[tuple[int, int]]:
    return [(a, min(a + k, n)) for a in range(0, n, k)]


def _wait_level(ray: ModuleType, refs: list[Any], what: str, address: str) -> None:
    """Wait here, on the driver, until every task of a level of the merge has ended (nothing waits inside a task: a task
    waiting for a partial of a lost node would hold the CPU Ray needs to make that partial again). A line every
    MERGE_HEARTBEAT_SECONDS says how far it is; when no live node with a CPU is left, one line."""
    pending, t0 = list(refs), time.monotonic()
    while pending:
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=MERGE_HEARTBEAT_SECONDS, fetch_local=False)
        if not pending:
            break
        cpus = [n for n in ray.nodes() if n.get("Alive") and (n.get("Resources") or {}).get("CPU", 0) > 0]
        if not cpus:
            raise InfraError(f"merge: no node of the Ray cluster at {address} with a CPU is left ({what}: {len(refs) - len(pending)} of "
                             f"{len(refs)} tasks done)", "start nodes again (docs/SCALE.md) and run the same command again")
        say(f"merge: {what}: {len(refs) - len(pending)} of {len(refs)} tasks done, {fmt_secs(time.monotonic() - t0)}, "
            f"{len(cpus)} node(s) with CPUs alive")


def _tree(ray: ModuleType, leaves: list[Any], plan_ref: Any, fan_in: int, files: bool, address: str) -> tuple[Any, int]:
    """The leaves' refs folded by nodes of at most fan_in children, level after level, until one remains; the root's
    ref and the number of levels. Each level starts once the one below has ended; its partials are freed once read."""
    node = _Task(ray, _combine_task)
    kind = "per-file " if files else ""
    refs, levels = leaves, 1
    _wait_level(ray, refs, f"{kind}level 1 ({len(refs)} folds)", address)
    while len(refs) > 1:
        refs = [node.remote(plan_ref, files, *refs[a:b]) for a, b in _chunks(len(refs), fan_in)]
        levels += 1
        _wait_level(ray, refs, f"{kind}level {levels} ({len(refs)} combines)", address)
    return refs[0], levels


def tree_merge(dirs: Sequence[Path], dst: Path, *, weights: list[float] | None = None, normalize: bool = False,
               runs: int | None = None, strict: bool = False, fan_in: int = 16, address: str = LOCAL,
               num_cpus: int | None = None) -> dict[str, Any]:
    """kpgo.gcov.merge.merge_profiles as a tree of Ray tasks, each reading at most fan_in inputs or partials; the same
    output, byte for byte. The result is merge_profiles' with "cluster": address, fan_in, levels, seconds and each
    task's stats (kind, inputs, seconds, peak_rss_mb, pid, host)."""
    from kpgo.gcov.merge import Files, Template, check_request, finish, make_plan, slow_files

    if fan_in < 2:
        raise UserError(f"--fan-in {fan_in}: a node must merge at least 2 inputs", "give --fan-in 2 or more (default 16)")
    names = [Path(d) for d in dirs]
    dst = Path(dst)
    weights = check_request(names, dst, weights)
    paths = [str(d.absolute()) for d in names]
    started = time.monotonic()
    with session(address, num_cpus) as ray:
        connected = time.monotonic()
        template = Template.load(paths[0])
        stats: list[dict[str, Any]] = []
        totals = None
        if normalize:
            task = _Task(ray, _totals_task)
            got = _get(ray, [task.remote(paths[a:b]) for a, b in _chunks(len(paths), fan_in)])
            totals = [t for value, _ in got for t in value]
            stats += [s for _, below in got for s in below]
        plan = make_plan(paths, weights, normalize, runs, strict, totals, names=names)
        plan_ref = ray.put(plan)
        fold = _Task(ray, _fold_task)
        root, levels = _tree(ray, [fold.remote(plan_ref, a, b) for a, b in _chunks(len(paths), fan_in)], plan_ref, fan_in, False, address)
        part, below = _get(ray, root)
        del root
        stats += below
        rels = slow_files(template, part)
        files = Files({}, {})
        if rels:
            unmatched = [i.unmatched for i in part.inputs]
            task = _Task(ray, _files_task)
            froot, _ = _tree(ray, [task.remote(plan_ref, rels, a, b, unmatched[a:b]) for a, b in _chunks(len(paths), fan_in)],
                             plan_ref, fan_in, True, address)
            files, below = _get(ray, froot)
            del froot
            stats += below
        del plan_ref
        res = finish(plan, template, part, files, dst)
    res["cluster"] = {"address": address, "fan_in": fan_in, "levels": levels, "files_merged_per_file": len(rels),
                      "connect_seconds": round(connected - started, 3), "seconds": round(time.monotonic() - started, 3),
                      "tasks": stats}
    return res


# -- bench --------------------------------------------------------------------------------------------------------


def _node_of(sample: dict[str, Any]) -> str | None:
    """The Ray node that made a sample (None: made without --cluster, or before samples named their host)."""
    return (sample.get("host") or {}).get("node_id")


class Schedule:
    """Which node boots what next. Each round of the plan is a block on one node, and a node boots one guest at a
    time: its rounds in round order, each in the plan's order. Rounds go round-robin to the nodes (each to the node
    with the fewest, ties in node order); a round an earlier bench left half done on a node that is here stays
    there. A round would otherwise span two hosts, so it moves whole: its finished boots are booted again on its
    new node and replace the old samples (a rerun whose half-done round's node is gone; a node lost mid-round).

    boots: kpgo.bench.Boot of the whole plan (kept samples included); nodes: Ray node ids, in order."""

    def __init__(self, boots: Sequence[Any], nodes: Sequence[str]) -> None:
        self.nodes = list(nodes)
        self.rounds: dict[int, list[Any]] = {}
        for b in boots:
            self.rounds.setdefault(b.step["round"], []).append(b)
        self.owner: dict[int, str | None] = {}  # round -> the node its samples come from
        self.moves: list[dict[str, Any]] = []
        self.todo: dict[int, list[Any]] = {}
        self.queue: dict[str, list[int]] = {n: [] for n in self.nodes}
        self.started: set[int] = set()
        for r, bs in sorted(self.rounds.items()):
            made = {_node_of(b.kept) for b in bs if b.kept is not None}
            left = [b for b in bs if b.kept is None]
            if not left:  # finished: a block on the host that made it, here or not
                self.owner[r] = made.pop() if len(made) == 1 else None
                continue
            home = next(iter(made)) if len(made) == 1 else None
            if home is not None and home in self.queue:
                self.todo[r] = left
                self._give(r, home)
                continue
            self.todo[r] = list(bs) if made else left
            if made:
                self.moves.append({"round": r, "from": sorted(made, key=str), "booted_again": len(bs) - len(left),
                                   "why": "an earlier bench left it half done on a node that is not here"})
        for r in sorted(r for r in self.todo if r not in self.owner):
            self._give(r, self._least_loaded())
            for m in self.moves:
                if m["round"] == r:
                    m["to"] = self.owner[r]

    def _least_loaded(self) -> str:
        if not self.nodes:
            raise InfraError("every node of the Ray cluster that boots guests was lost",
                             "the finished boots are kept: run the same command again when nodes are back")
        return min(self.nodes, key=lambda n: (len(self.queue[n]), self.nodes.index(n)))

    def _give(self, r: int, node: str) -> None:
        """Round r to node's queue: after the round it is in the middle of, the others in round order."""
        q = self.queue[node]
        busy = q[:1] if q and q[0] in self.started else []
        self.queue[node] = busy + sorted(q[len(busy):] + [r])
        self.owner[r] = node

    def next(self, node: str) -> Any | None:
        """The boot this node does next (it stays to do until done()), or None when it has none."""
        q = self.queue.get(node, [])
        while q and not self.todo[q[0]]:
            q.pop(0)
        if not q:
            return None
        self.started.add(q[0])
        return self.todo[q[0]][0]

    def done(self, b: Any) -> None:
        """b has an outcome (a sample or a failure): it is not booted again."""
        left = self.todo[b.step["round"]]
        left[:] = [x for x in left if x is not b]

    def remaining(self) -> int:
        return sum(len(t) for t in self.todo.values())

    def lost(self, node: str) -> list[dict[str, Any]]:
        """node is gone: its unfinished rounds move whole to the others (the round it was in the middle of is booted
        again from its first cell). Returns the moves; an InfraError when no node is left."""
        self.nodes.remove(node)
        moved = []
        for r in self.queue.pop(node):
            if not self.todo[r]:
                continue
            again = len(self.rounds[r]) - len(self.todo[r])
            if r in self.started or again:
                self.todo[r] = list(self.rounds[r])
            self._give(r, self._least_loaded())
            moved.append({"round": r, "from": [node], "to": self.owner[r], "booted_again": again,
                          "why": "its node was lost" + (" during a boot" if r in self.started else "")})
        self.moves += moved
        return moved


def choose_nodes(checks: list[dict[str, Any]], choice: Any, address: str) -> tuple[str, Any, list[dict[str, Any]]]:
    """From each guest node's check (_check_task): the accelerator, the SimConfig (or None) and the nodes that boot.
    KVM is used when some node has it, and then only those nodes boot (as the accelerator probe decides on one
    machine); simulated boots run under TCG on nodes with kpgo's QEMU plugin. A UserError naming each node's
    problem when none can boot. choice: a kpgo.bench.SimChoice."""
    able = [c for c in checks if not c["problems"]]
    kvm = [c for c in able if c["kvm"]]
    accel = "kvm" if choice.mode != "on" and kvm else "tcg"
    sim = choice.resolve(accel)
    if sim is not None:
        accel = "tcg"  # a plugin sees only TCG-translated code
        chosen = [c for c in able if not c["sim_problem"]]
    else:
        chosen = kvm if accel == "kvm" else able
    if not chosen:
        why = "; ".join(f"{c['hostname']} [{c['node_id'][:8]}]: {', '.join(c['problems']) or c['sim_problem']}" for c in checks)
        raise UserError(f"no node of the Ray cluster at {address} can boot these guests ({why})".replace("\n", " "),
                        "set the nodes up as this machine (make setup; kpgo workloads install NAME) — docs/SCALE.md")
    return accel, sim, chosen


class _Laps:
    """A task's own timeline, in seconds: what it fetched (a kernel, a profile), its work, packing its outputs
    (docs/SCALE.md "Per-task overhead"); the driver adds the task's wall time from submit to result ("wall") and
    writing its outputs ("unpack")."""

    def __init__(self) -> None:
        self.t = time.monotonic()
        self.laps: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.laps[name] = round(self.laps.get(name, 0.0) + now - self.t, 3)
        self.t = now


def _build_here(key: str, box: list[Any]) -> Path:
    """This node's copy of a kernel build (KERNEL_FILES, in a build's layout, so vng boots it as it boots the build):
    fetched from the object store and written once per node, keyed by the build's key. box holds the object ref (in a
    list, so Ray passes the ref and does not fetch the kernel for a node that has it)."""
    from kpgo.kernel import kbuild

    d = cache_dir() / "cluster" / "kernels" / key
    # nodes on one machine share its cache: the second task to want this kernel waits for the first's copy
    with atomic.turn(d.parent / f".{key}.lock"):
        if not (kbuild.image(d).is_file() and (d / "build.json").is_file()):  # copies made for benches before collect ran here had none
            import ray

            files = ray.get(box[0])
            with atomic.output_dir(d, replace=True) as tmp:
                for rel, data in files.items():
                    (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                    (tmp / rel).write_bytes(data)
                if (tmp / "modules.order").is_file():  # vng's module directory (relative links), as the build made it
                    from kpgo import proc

                    proc.run(["virtme-prep-kdir-mods"], cwd=tmp, what="virtme-prep-kdir-mods")
            trim_kernels(d.parent, keep=d)
        os.utime(d)  # used now: the last to go (trim_kernels)
    return d


def trim_kernels(root: Path, keep: Path, limit_mb: float | None = None) -> list[str]:
    """A node's copies of kernels (root: KPGO_CACHE/cluster/kernels) held to limit_mb (KERNELS_MB_ENV, else
    KERNELS_MB): the least recently used go first, never `keep` (the one a task uses now). Returns those removed."""
    limit = float(os.environ.get(KERNELS_MB_ENV) or KERNELS_MB) if limit_mb is None else limit_mb
    sized = []
    for d in root.iterdir() if root.is_dir() else ():
        if d.is_dir() and not d.name.startswith("."):  # (atomic's temporary siblings are another task's, in progress)
            sized.append((d.stat().st_mtime, sum(f.stat().st_size for f in d.rglob("*") if f.is_file()), d))
    total = sum(size for _, size, _ in sized) / 1e6
    removed = []
    for _, size, d in sorted(sized, key=lambda x: x[0]):
        if total <= limit:
            break
        if d != keep:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d.name)
            total -= size / 1e6
    return removed


def tidy_node_dirs(cache: Path, alive: set[str]) -> list[str]:
    """Remove the task directories (KPGO_CACHE/cluster/{boots,collect,builds}/NODE) of nodes that are not alive in this
    cluster: a task removes its own when it ends, but not when its node is killed. Returns those removed."""
    removed = []
    for kind in ("boots", "collect", "builds"):
        for d in (cache / "cluster" / kind).glob("*"):
            if d.is_dir() and not any(n.startswith(d.name) for n in alive):
                shutil.rmtree(d, ignore_errors=True)
                removed.append(f"{kind}/{d.name}")
    return removed


def _tidy_here() -> None:
    """What a node's check does first: its cache's leftovers of lost nodes removed, its kernels held to their bound."""
    import ray

    tidy_node_dirs(cache_dir(), {n["NodeID"] for n in ray.nodes() if n.get("Alive")})
    trim_kernels(cache_dir() / "cluster" / "kernels", keep=Path())


def _kernel_here(key: str, box: list[Any]) -> Path:
    from kpgo.kernel import kbuild

    return kbuild.image(_build_here(key, box))


def _check_task(wls: list[Any], probe: tuple[str, list[Any]] | None, want_sim: bool) -> dict[str, Any]:
    """What this node can boot: QEMU and virtme-ng, the workloads' packages and helpers, KVM (probe: a kernel to boot
    the probe with, when the accelerator matters) and kpgo's QEMU plugin (want_sim); and its facts."""
    import ray

    from kpgo import client, host, proc, vm
    from kpgo import sim as simulator
    from kpgo.kernel import kbuild
    from kpgo.workloads import install

    facts: dict[str, Any] = {"node_id": ray.get_runtime_context().get_node_id(), **host.identity(), "host_kernel": platform.release()}
    _tidy_here()
    problems = [f"{tool} ({proc.PACKAGES[tool]}) is not installed" for tool in ("qemu-system-x86_64", "vng") if proc.which(tool) is None]
    try:
        install.require(wls)
        client.check_host(wls)  # a host client's ports free on this node (Ray's GCS takes 6379 on a head started by default)
    except KpgoError as e:
        problems.append(e.message)
    kvm = sim_problem = None
    if not problems:
        if probe is not None:
            kvm = vm.accelerator(_kernel_here(*probe)) == "kvm"
        if want_sim:
            try:
                simulator.setup()
            except KpgoError as e:
                sim_problem = f"kpgo's QEMU plugin: {e.message}"
    try:
        gcc = kbuild.gcc_version()
    except KpgoError:
        gcc = "unknown"
    return {**facts, "gcc": gcc, "kvm": kvm, "problems": problems, "sim_problem": sim_problem}


def _boot_task(kernel: tuple[str, list[Any]], step: dict[str, Any], key: str, name: str, how: Any) -> tuple[dict[str, Any], bytes]:
    """One bench boot on this node (kpgo.bench.measure) in a node-local directory; returns its outcome, naming this
    node, and its outputs as a tar for the driver to write. Writes nothing the driver reads: a retried task cannot
    count a boot twice."""
    import ray

    from kpgo import bench

    node = ray.get_runtime_context().get_node_id()
    laps = _Laps()
    image = _kernel_here(*kernel)
    laps.lap("fetch")
    with _node_work(node, "boots", name) as work:
        outcome = bench.measure(image, work, step, key, how)
        laps.lap("work")
        files = atomic.tar_of(work)
        laps.lap("pack")
        where = outcome["sample"]["host"] if "sample" in outcome else outcome["host"]
        where.update(node_id=node, task=laps.laps)
        return outcome, files


def _collect_task(build: tuple[str, list[Any]], workload: Any, guest: Any) -> tuple[dict[str, Any], bytes | None]:
    """One workload's collection on this node (kpgo.collect.collect) in a node-local directory; returns its outcome,
    naming this node, and the profile directory (or the failed collection's logs) as a tar for the driver to write.
    Writes nothing the driver reads: a retried task cannot leave half a profile."""
    import ray

    from kpgo import collect, host

    node = ray.get_runtime_context().get_node_id()
    laps = _Laps()
    where = {"node_id": node, **host.identity(), "task": laps.laps}
    with _node_work(node, "collect", workload.name) as work:
        try:
            kernel = _build_here(*build)
            laps.lap("fetch")
            profile = collect.collect(kernel, workload, work / "p", guest=guest)
            outcome: dict[str, Any] = {"profile": profile, "host": where}
            kept = work / "p"
        except KpgoError as e:
            outcome = {"error": e.message, "exit_code": e.exit_code, "host": where}
            kept = work / "p.failed-logs"
        laps.lap("work")
        files = atomic.tar_of(kept) if kept.is_dir() else None
        laps.lap("pack")
        return outcome, files


def _build_check_task(source_arg: str | None, ident: str, compilers: dict[str, tuple[Any, str]]) -> dict[str, Any]:
    """Whether this node can build the kernels: Kbuild's tools, the driver's kernel source (the same identity: the same
    tarball, or the same tree at the same path) and each compiler at the driver's version (a build's key has it, and a
    profile is read by the GCC that wrote it)."""
    import ray

    from kpgo import host, proc
    from kpgo.kernel import source

    facts: dict[str, Any] = {"node_id": ray.get_runtime_context().get_node_id(), **host.identity()}
    _tidy_here()
    problems = [f"{t} ({proc.PACKAGES.get(t, t)}) is not installed" for t in ("make", "flex", "bison", "bc", "gcc") if proc.which(t) is None]
    for name, (compiler, version) in compilers.items():
        try:
            have = compiler.version()
        except KpgoError:
            have = None
        if have != version:
            problems.append(f"{name} is {'missing' if have is None else have} here, {version} on the driver")
    try:
        src = source.resolve(Path(source_arg) if source_arg else None)
        if src.ident != ident:
            problems.append(f"its kernel source {src.path} is not the driver's")
    except KpgoError as e:
        problems.append(e.message)
    return {**facts, "problems": problems}


def _build_task(req: Any, key: str, source_arg: str | None, configs: list[tuple[str, bytes]], profile: list[Any] | None) -> tuple[dict[str, Any], bytes]:
    """One kernel build on this node (kpgo.kernel.kbuild.build) in a node-local directory, from the node's copy of the
    kernel source, the driver's config files and profile, with the node's cores; returns its build.json (or the
    error) and BUILD_FILES as a tar for the driver to write. The key must be the driver's: same inputs, same kernel."""
    import ray

    from kpgo import host
    from kpgo.kernel import kbuild, source

    node = ray.get_runtime_context().get_node_id()
    laps = _Laps()
    where = {"node_id": node, **host.identity(), "task": laps.laps}
    with _node_work(node, "builds", req.out.name) as work:
        (work / "config").mkdir()
        cfgs = []
        for i, (name, data) in enumerate(configs):
            cfgs.append(work / "config" / f"{i}-{name}")
            cfgs[-1].write_bytes(data)
        prof = None
        if profile is not None:
            prof = work / "profile"
            atomic.untar(ray.get(profile[0]), prof)
        mine = replace(req, source=source.resolve(Path(source_arg) if source_arg else None), config=replace(req.config, files=tuple(cfgs)),
                       out=work / "out", profile=prof, jobs=(os.cpu_count() or 2) + 1)
        laps.lap("fetch")
        try:
            if kbuild.key_of(mine) != key:
                raise UserError(f"the build's inputs on {where['hostname']} differ from the driver's (kernel source, config or compiler)",
                                "set the node up as the driver's machine (make setup) — docs/SCALE.md")
            record = kbuild.build(mine)
            outcome: dict[str, Any] = {"build": record, "host": where}
        except KpgoError as e:
            outcome = {"error": e.message, "hint": e.hint, "exit_code": e.exit_code, "host": where}
        laps.lap("work")
        out = work / "out"
        keep = [r for r in BUILD_FILES if (out / r).is_file()]
        if "build" in outcome and outcome["build"].get("gcov"):  # kpgo.analysis reads the functions' structure from them
            keep += [str(g.relative_to(out)) for g in out.rglob("*.gcno")]
        tar = atomic.tar_of(out, keep)
        laps.lap("pack")
        return outcome, tar


@contextlib.contextmanager
def _node_work(node: str, kind: str, name: str) -> Iterator[Path]:
    """A task's empty directory on this node, removed when the task ends: nothing a task writes is read by anyone
    else, so a retried task cannot count its work twice. The node id is in the path: nodes may share a cache (NFS,
    tests)."""
    work = cache_dir() / "cluster" / kind / node[:12] / name
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _safe_key(key: str) -> str:
    """A build key as a directory name (kpgo's keys are hex already)."""
    return key if re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", key) else hashlib.sha256(key.encode()).hexdigest()[:32]


class _Nodes:
    """The nodes of the cluster a command uses (those whose check passed), and how a task is pinned to one."""

    guest = True  # tasks hold the node's GUEST resource (boots, collections); builds do not need it

    def __init__(self, ray: ModuleType, address: str) -> None:
        self.ray, self.address = ray, address
        self.checks: dict[str, dict[str, Any]] = {}  # node id -> its check, for the nodes used
        self.cpus: dict[str, float] = {}

    def alive(self, resource: str) -> list[dict[str, Any]]:
        """The live nodes offering at least one of `resource`, in a stable order (hostname, node id); their CPUs noted
        for _on."""
        nodes = sorted((n for n in self.ray.nodes() if n.get("Alive") and (n.get("Resources") or {}).get(resource, 0) >= 1),
                       key=lambda n: (str(n.get("NodeManagerHostname")), n["NodeID"]))
        self.cpus = {n["NodeID"]: float((n.get("Resources") or {}).get("CPU", 0)) for n in nodes}
        return nodes

    def _on(self, node: str) -> dict[str, Any]:
        """A task on this node holding all its CPUs (and its GUEST), so nothing else Ray schedules shares the node."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return {"num_cpus": self.cpus[node], "resources": {GUEST: 1} if self.guest else {},
                "scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)}

    def _name(self, node: str) -> str:
        c = self.checks.get(node)
        return f"{c['hostname'] if c else '?'} [{node[:8]}]"

    def _lost(self, node: str, e: Exception) -> bool:
        exc = self.ray.exceptions
        if isinstance(e, tuple(getattr(exc, n) for n in ("TaskUnschedulableError", "NodeDiedError") if hasattr(exc, n))):
            return True
        return not any(n["NodeID"] == node and n.get("Alive") for n in self.ray.nodes())

    def spread(self, items: list[Any], start: Any, what: str, label: Any = str) -> Iterator[tuple[Any, str, Any, float]]:
        """Each item a task on a node of self.checks, one at a time per node, the next item to the node that is free;
        a node lost mid-task gives its item back to the queue, run again on another node. start(node, item) submits
        the task and returns its ref. Yields (item, node, the task's value or its RayError, its wall time from submit to
        result) as each ends. While none ends, a line a minute says what runs where (label(item) names it): the nodes'
        own output stays in their Ray logs."""
        ray = self.ray
        queue, live = list(items), list(self.checks)
        inflight: dict[Any, tuple[str, Any, float]] = {}

        def submit(node: str) -> None:
            if queue:
                item = queue.pop(0)
                inflight[start(node, item)] = (node, item, time.monotonic())

        for n in live:
            submit(n)
        while inflight:
            ready, _ = ray.wait(list(inflight), num_returns=1, timeout=HEARTBEAT_SECONDS)
            if not ready:
                now = time.monotonic()
                say(f"{what}: running " + ", ".join(f"{label(i)} on {self._name(n)} ({fmt_secs(now - t)})" for n, i, t in inflight.values()))
                continue
            node, item, t0 = inflight.pop(ready[0])
            try:
                value = ray.get(ready[0])
            except ray.exceptions.RayError as e:
                if self._lost(node, e):
                    live.remove(node)
                    if not live:
                        raise InfraError(f"{what}: every node of the Ray cluster at {self.address} it ran on was lost",
                                         "start nodes again (docs/SCALE.md) and run the same command again") from None
                    say(f"{what}: {self._name(node)} was lost; its task runs again on another node")
                    queue.insert(0, item)
                    busy = {n for n, _, _ in inflight.values()}
                    for n in live:
                        if n not in busy:
                            submit(n)
                    continue
                value = e
            yield item, node, value, round(time.monotonic() - t0, 3)
            submit(node)


class BenchOnCluster(_Nodes):
    """kpgo.bench.Runner on a Ray cluster: each boot a Ray task on the node its round was given (node affinity),
    holding the node's GUEST resource and all its CPUs, so nothing else Ray schedules shares the node with a
    measurement."""

    def __init__(self, ray: ModuleType, address: str) -> None:
        super().__init__(ray, address)
        self.kernels: dict[str, tuple[str, list[Any]]] = {}  # label -> (node cache key, [object ref])
        self.accel = ""
        self.schedule: Schedule | None = None
        self.moves: list[dict[str, Any]] = []  # earlier run()s' (a bench with --precision runs each added round apart)

    def prepare(self, builds: dict[str, tuple[Path, str]], wls: list[Any], choice: Any, what: str = "bench") -> tuple[str, Any]:
        ray = self.ray
        nodes = self.alive(GUEST)
        if not nodes:
            raise UserError(f"no node of the Ray cluster at {self.address} offers the {GUEST} resource a bench boot needs", RESOURCE_HINT)
        for label, (d, key) in builds.items():
            paths = kernel_files(d)
            if not paths[KERNEL_FILES[0]].is_file():
                raise UserError(f"kernel image {paths[KERNEL_FILES[0]]} not found", "build it first with `kpgo build`")
            self.kernels[label] = (_safe_key(key), [ray.put({rel: p.read_bytes() for rel, p in paths.items() if p.is_file()})])
        probe = None if choice.mode == "on" else next(iter(self.kernels.values()))
        check = _Task(ray, _check_task)
        checks = _get(ray, [check.options(**self._on(n["NodeID"])).remote(wls, probe, choice.mode != "off") for n in nodes], "node check")
        self.accel, sim, chosen = choose_nodes(checks, choice, self.address)
        self.checks = {c["node_id"]: c for c in chosen}
        say(f"{what}: {len(chosen)} of {len(nodes)} guest node(s) of the Ray cluster boot ({self.accel}): "
            + ", ".join(self._name(n) for n in self.checks))
        return self.accel, sim

    def run(self, boots: list[Any], how: Any, progress: Any) -> Iterator[tuple[Any, dict[str, Any]]]:
        ray = self.ray
        if self.schedule is not None:
            self.moves += self.schedule.moves
        sched = self.schedule = Schedule(boots, list(self.checks))
        for m in sched.moves:
            say(f"bench: round {m['round'] + 1} moves whole to {self._name(m['to'])}: {m['why']} "
                f"({m['booted_again']} finished boot(s) booted again there)")
        progress.total = sched.remaining()
        how_ref = ray.put(how)
        task = _Task(ray, _boot_task)
        inflight: dict[Any, tuple[str, Any, float]] = {}

        def submit(node: str) -> None:
            b = sched.next(node)
            if b is None:
                return
            progress.start(b, f" on {self._name(node)}")
            ref = task.options(max_retries=BOOT_RETRIES, **self._on(node)).remote(
                self.kernels[b.step["kernel"]], b.step, b.key, b.bootdir.name, how_ref)
            inflight[ref] = (node, b, time.monotonic())

        for n in list(sched.nodes):
            submit(n)
        while inflight:
            ready, _ = ray.wait(list(inflight), num_returns=1)
            node, b, t0 = inflight.pop(ready[0])
            try:
                outcome, files = ray.get(ready[0])
            except ray.exceptions.RayTaskError as e:  # not the boot's failure (measure returns those): the task's
                err = failure(ray, e, f"the boot's task on {self._name(node)}")
                outcome, files = {"error": err.message, "hint": err.hint, "exit_code": err.exit_code, "host": {"node_id": node}}, None
            except ray.exceptions.RayError as e:
                if self._lost(node, e):
                    for m in sched.lost(node):
                        say(f"bench: {self._name(node)} was lost: round {m['round'] + 1} moves whole to {self._name(m['to'])} "
                            f"({m['booted_again']} finished boot(s) booted again there)")
                    progress.total = progress.started + sched.remaining() - len(inflight)
                    busy = {n for n, _, _ in inflight.values()}
                    for n in sched.nodes:
                        if n not in busy:
                            submit(n)
                    continue
                outcome, files = {"error": f"Ray lost the boot's task on {self._name(node)}: {type(e).__name__}: {str(e).splitlines()[0]}",
                                  "hint": "run the same command again to retry it", "exit_code": InfraError.exit_code,
                                  "host": {"node_id": node}}, None
            wall = round(time.monotonic() - t0, 3)
            t1 = time.monotonic()
            if files:
                atomic.untar(files, b.bootdir)
            where = outcome["sample"]["host"] if "sample" in outcome else outcome["host"]
            if "task" in where:
                where["task"] |= {"wall": wall, "unpack": round(time.monotonic() - t1, 3), "bytes": len(files or b"")}
            sched.done(b)
            yield b, outcome
            submit(node)

    def facts(self, samples: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
        """results.json's "host" (its usual keys over every host), "hosts" (each node that made samples: its facts,
        rounds and boots) and the design's "hosts" (the block, each round's node, the moves)."""
        hosts: dict[str, dict[str, Any]] = {}
        for s in samples:
            h = dict(s.get("host") or {})
            node = str(h.pop("node_id", None) or h.get("hostname") or "unknown")
            e = hosts.setdefault(node, {**h, "rounds": [], "boots": 0})
            e["boots"] += 1
            if s["round"] not in e["rounds"]:
                e["rounds"].append(s["round"])
        for node, e in hosts.items():
            c = self.checks.get(node)
            if c:
                e.update(host_kernel=c["host_kernel"], gcc=c["gcc"], accelerator=self.accel)
            e["rounds"].sort()
        seen = list(hosts.values()) or list(self.checks.values())

        def each(k: str) -> str:
            return " | ".join(sorted({str(h.get(k)) for h in seen if h.get(k)})) or "unknown"

        sched = self.schedule
        host = {"cpu": each("cpu_model"), "accelerator": self.accel, "qemu": each("qemu"), "host_kernel": each("host_kernel"),
                "gcc": each("gcc"), "cluster": self.address, "hosts": len(hosts)}
        design = {"hosts": {"block": "round (each round whole on one host)", "assignment": "round-robin over the nodes",
                            "nodes": list(self.checks), "rounds": {str(r): n for r, n in sorted((sched.owner if sched else {}).items())},
                            "moved": self.moves + (sched.moves if sched else [])}}
        return {"host": host, "hosts": hosts}, design


def collect(address: str, build_dir: Path, key: str, workloads: list[Any], guest: Any) -> Iterator[tuple[Any, dict[str, Any], bytes | None]]:
    """`kpgo collect --cluster`: each workload's collection a Ray task on a guest node that passed the node check (one
    guest per node at a time, as for a bench boot), the next workload given to the node that is free; a node lost
    mid-collection gives its workload back to the queue, collected again on another node. Yields (workload, outcome,
    tar of its directory) as each ends; kpgo.collect writes them."""
    from kpgo.bench import SimChoice

    with session(address) as ray:
        nodes = BenchOnCluster(ray, address)
        nodes.prepare({"instrumented": (build_dir, key)}, workloads, SimChoice("off"), what="collect")
        task = _Task(ray, _collect_task)

        def start(node: str, wl: Any) -> Any:
            say(f"collect {wl.name}: on {nodes._name(node)}")
            return task.options(max_retries=BOOT_RETRIES, **nodes._on(node)).remote(nodes.kernels["instrumented"], wl, guest)

        for wl, node, value, wall in nodes.spread(workloads, start, "collect", lambda w: w.name):
            if isinstance(value, Exception):
                err = failure(ray, value, f"the collection's task on {nodes._name(node)}")
                value = ({"error": err.message, "hint": err.hint, "exit_code": err.exit_code, "host": {"node_id": node}}, None)
            outcome, files = value
            outcome["host"].setdefault("task", {})["wall"] = wall
            yield wl, outcome, files  # (kpgo.collect writes them, and adds "unpack")


def builds(address: str, reqs: list[Any], source_arg: Path | None) -> Iterator[tuple[Any, dict[str, Any] | KpgoError]]:
    """Kernel builds (kpgo.kernel.kbuild.BuildRequest, not up to date here) as Ray tasks, one per node at a time with
    all its cores, on the nodes whose check passed (the same kernel source and compilers as here); a node lost
    mid-build gives its build to another node. Each build is written into its req.out here as it ends (BUILD_FILES,
    build.json saying where it was built); yields (req, its build.json or the error)."""
    from kpgo.kernel import kbuild

    if not reqs:
        return
    keys = {r.out: kbuild.key_of(r) for r in reqs}
    compilers = {r.variant.compiler.name: (r.variant.compiler, r.variant.compiler.version()) for r in reqs}
    with session(address) as ray:
        nodes = _Nodes(ray, address)
        nodes.guest = False
        alive = nodes.alive("CPU")
        check = _Task(ray, _build_check_task)
        src = str(source_arg.resolve()) if source_arg else None
        checks = _get(ray, [check.options(**nodes._on(n["NodeID"])).remote(src, reqs[0].source.ident, compilers) for n in alive], "node check")
        able = [c for c in checks if not c["problems"]]
        if not able:
            why = "; ".join(f"{c['hostname']} [{c['node_id'][:8]}]: {', '.join(c['problems'])}" for c in checks) or "no node with a CPU"
            raise UserError(f"no node of the Ray cluster at {address} can build these kernels ({why})",
                            "set the nodes up as this machine (make setup) — docs/SCALE.md")
        nodes.checks = {c["node_id"]: c for c in able}
        say(f"build: {len(able)} of {len(checks)} node(s) of the Ray cluster build: " + ", ".join(nodes._name(n) for n in nodes.checks))
        task = _Task(ray, _build_task)

        def start(node: str, req: Any) -> Any:
            say(f"build {req.out.name}: on {nodes._name(node)}")
            prof = [ray.put(atomic.tar_of(req.profile))] if req.profile is not None else None
            configs = [(f.name, f.read_bytes()) for f in req.config.files]
            return task.options(max_retries=BOOT_RETRIES, **nodes._on(node)).remote(req, keys[req.out], src, configs, prof)

        for req, node, value, wall in nodes.spread(reqs, start, "build", lambda r: r.out.name):
            if isinstance(value, Exception):
                yield req, failure(ray, value, f"build {req.out.name}: its task on {nodes._name(node)}")
                continue
            outcome, files = value
            out = req.out.resolve()
            if "error" in outcome:
                log = out.parent / f"{out.name}.{node[:8]}-build.log"
                with tempfile.TemporaryDirectory() as logs:
                    atomic.untar(files, Path(logs))
                    if (Path(logs) / "build.log").is_file():
                        atomic.write_text(log, (Path(logs) / "build.log").read_text(errors="replace"))
                kind = UserError if outcome["exit_code"] == UserError.exit_code else InfraError
                yield req, kind(f"build {req.out.name} on {nodes._name(node)}: {outcome['error']}"
                                + (f" (its log: {log})" if log.is_file() else ""), outcome.get("hint") or "")
                continue
            record = outcome["build"]
            # here, its files are here (build_dir stays where it was compiled: the gcov kernel's debugfs tree is named by it)
            record |= {"bzImage": str(kbuild.image(out)), "vmlinux": str(out / "vmlinux"), "built_on": outcome["host"]}
            if req.profile is not None:
                record["profile"]["dir"] = str(req.profile.resolve())
            timing = record["built_on"]["task"]
            t0 = time.monotonic()
            with atomic.output_dir(out, replace=True) as tmp:
                atomic.untar(files, tmp)
                timing |= {"wall": wall, "unpack": round(time.monotonic() - t0, 3), "bytes": len(files)}
                atomic.write_json(tmp / "build.json", record)
            say(f"build {req.out.name}: done on {nodes._name(node)} in {fmt_secs(timing['work'])} "
                f"(the task {fmt_secs(wall)}, {len(files) / 1e6:.0f} MB back) — {out}")
            yield req, record


@contextlib.contextmanager
def bench_runner(address: str) -> Iterator[BenchOnCluster]:
    """`kpgo bench --cluster`: a kpgo.bench.Runner on the Ray cluster at address, connected for the block."""
    with session(address) as ray:
        yield BenchOnCluster(ray, address)


class Cluster:
    """The cluster as the commands hand it to the steps (kpgo.remote.Remote): its address and the runners for boots,
    collections, builds and merges there. Making one imports no Ray; each step connects for its own length."""

    def __init__(self, address: str) -> None:
        self.address = address

    def bench_runner(self) -> contextlib.AbstractContextManager[BenchOnCluster]:
        return bench_runner(self.address)

    def collect(self, build_dir: Path, key: str, workloads: list[Any], guest: Any) -> Iterator[tuple[Any, dict[str, Any], bytes | None]]:
        return collect(self.address, build_dir, key, workloads, guest)

    def builds(self, reqs: list[Any], source_arg: Path | None) -> Iterator[tuple[Any, dict[str, Any] | KpgoError]]:
        return builds(self.address, reqs, source_arg)

    def merge(self, dirs: list[Path], dst: Path, **kw: Any) -> dict[str, Any]:
        return tree_merge(dirs, dst, address=self.address, **kw)


_TASKS = {f.__name__: f for f in (_totals_task, _fold_task, _files_task, _combine_task, _check_task, _boot_task, _collect_task,
                                  _build_check_task, _build_task)}
