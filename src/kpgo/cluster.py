"""kpgo on a Ray cluster: the one module that uses Ray, imported only by commands given --cluster (docs/SCALE.md).

API
    session(address, num_cpus=None)    context: Ray connected (or started, for "local"), shut down after
    connect(address, num_cpus=None)    connect the driver; one-line UserError when Ray is missing or unreachable
    tree_merge(dirs, dst, ..., fan_in, address) -> dict
                                       `kpgo profile merge --cluster`: merge_profiles as a tree of Ray tasks

ADDRESS is a Ray address (host:port of the head's GCS, as `ray start --head` prints it, or ray://host:port for Ray
Client), `auto` (the cluster `ray start` left on this machine, or RAY_ADDRESS), or `local` (a Ray started here for
this command, with one worker per core this process may use, stopped when the command ends).

The merge is kpgo.gcov.merge's steps as tasks: each leaf folds at most fan_in inputs into a Partial (the exact
state of the accumulators, not rounded counters), each node above folds at most fan_in partials, level after level
until one remains; the driver then writes the output exactly as the serial merge does (same steps, same bytes).
Partials travel through Ray's object store and are freed once the level above has read them. Inputs are read by
the tasks at the paths the driver sees (absolute): every node must see them at the same path (a shared directory;
on a local cluster, this machine's)."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from kpgo.errors import InfraError, KpgoError, UserError

LOCAL = "local"
AUTO = "auto"
PROBE_SECONDS = 5.0  # a head that does not accept a TCP connection in this time is not there
INSTALL_HINT = "install it with pip install 'kpgo[cluster]' or make setup"
ADDRESS_HINT = "give the head's address as `ray start --head` prints it (host:6379), auto, or local"


def _import_ray() -> ModuleType:
    try:
        import ray
    except ImportError:
        raise UserError("--cluster needs Ray, which is not installed", INSTALL_HINT) from None
    return ray


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
            ray.init(num_cpus=cpus, include_dashboard=False, **quiet)
        except Exception as e:  # Ray raises many kinds; none is the user's to fix
            raise InfraError(f"could not start a local Ray cluster: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
                             "see Ray's logs under /tmp/ray/session_latest/logs") from None
        return ray
    _probe(address)
    # Something answered: if it is not a Ray head, ray.init gives up after one round of retries (~40 s) rather than
    # its default of twenty.
    with _env(RAY_gcs_server_port_wait_time_s="1"):
        try:
            ray.init(address=address, **quiet)
        except (ConnectionError, RuntimeError, TimeoutError) as e:
            raise UserError(f"cannot connect to a Ray cluster at {address}: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
                            ADDRESS_HINT) from None
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


def _combine_task(plan: Any, refs: list[Any], files: bool) -> tuple[Any, list[dict[str, Any]]]:
    """Fold the partials behind refs one at a time: memory is the result and one partial, not fan_in of them."""
    import ray

    from kpgo.gcov.merge import combine, combine_files

    ray.wait(refs, num_returns=len(refs), fetch_local=False)  # (blocked, the task gives its CPU back)
    start = _start()
    stats: list[dict[str, Any]] = []

    def parts() -> Iterator[Any]:
        for r in refs:
            value, below = ray.get(r)
            stats.extend(below)
            yield value
            del value

    out = combine_files(plan, parts()) if files else combine(plan, parts())
    return out, [*stats, _stat("combine-files" if files else "combine", len(refs), start)]


def _get(ray: ModuleType, refs: Any) -> Any:
    """ray.get with a task's kpgo error re-raised as itself (one line), and any other failure as an InfraError."""
    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as e:
        cause = getattr(e, "cause", None)
        if isinstance(cause, KpgoError):
            raise cause from None
        raise InfraError(f"a merge task failed: {cause!r}" if cause else f"a merge task failed: {type(e).__name__}") from None
    except ray.exceptions.RayError as e:
        raise InfraError(f"the Ray cluster failed during the merge: {type(e).__name__}: {str(e).splitlines()[0]}") from None


def _chunks(n: int, k: int) -> list[tuple[int, int]]:
    return [(a, min(a + k, n)) for a in range(0, n, k)]


def _reduce(ray: ModuleType, plan_ref: Any, refs: list[Any], fan_in: int, files: bool) -> tuple[Any, int]:
    """Nodes of at most fan_in children, level after level, until one remains; the root's ref and the levels."""
    node = ray.remote(_combine_task)
    levels = 1
    while len(refs) > 1:
        refs = [node.remote(plan_ref, refs[a:b], files) for a, b in _chunks(len(refs), fan_in)]
        levels += 1
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
            task = ray.remote(_totals_task)
            got = _get(ray, [task.remote(paths[a:b]) for a, b in _chunks(len(paths), fan_in)])
            totals = [t for value, _ in got for t in value]
            stats += [s for _, below in got for s in below]
        plan = make_plan(paths, weights, normalize, runs, strict, totals, names=names)
        plan_ref = ray.put(plan)
        fold = ray.remote(_fold_task)
        root, levels = _reduce(ray, plan_ref, [fold.remote(plan_ref, a, b) for a, b in _chunks(len(paths), fan_in)],
                               fan_in, files=False)
        part, below = _get(ray, root)
        del root
        stats += below
        rels = slow_files(template, part)
        files = Files({}, {})
        if rels:
            unmatched = [i.unmatched for i in part.inputs]
            task = ray.remote(_files_task)
            froot, _ = _reduce(ray, plan_ref, [task.remote(plan_ref, rels, a, b, unmatched[a:b])
                                               for a, b in _chunks(len(paths), fan_in)], fan_in, files=True)
            files, below = _get(ray, froot)
            del froot
            stats += below
        del plan_ref
        res = finish(plan, template, part, files, dst)
    res["cluster"] = {"address": address, "fan_in": fan_in, "levels": levels, "files_merged_per_file": len(rels),
                      "connect_seconds": round(connected - started, 3), "seconds": round(time.monotonic() - started, 3),
                      "tasks": stats}
    return res
