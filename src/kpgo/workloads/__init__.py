"""Workloads as data: one TOML file per workload in this package. A workload is files written
into a guest tmpfs run dir, setup steps, an optional server with a TCP readiness probe, prepare
and warm-up steps, and measured load steps whose output a regex turns into numbers. Templates
use {param}; the guest adds {rundir}, {tools} (kpgo's built helper programs) and {cpus}.
`--set KEY=VALUE` (or NAME.KEY=VALUE) overrides a parameter. See docs/WORKLOADS.md.

A file is read as a dict and checked here (validate); only then is it built into the typed
kpgo.guest.contract.Workload that the rest of kpgo, and the guest agent, read."""

from __future__ import annotations

import re
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

from kpgo import inputs
from kpgo.errors import UserError
from kpgo.guest.contract import STEP_KINDS, WINDOWS, Workload
from kpgo.kernel import kconfig

GUEST_VARS = ("rundir", "tools", "cpus", "listen")  # listen: the servers' bind address (0.0.0.0 with a host client)
CLIENTS = ("guest", "host")
# Where the network servers' load generators run unless --client says otherwise: on the host, through the guest's NIC,
# as in production (docs/WORKLOADS.md "Which placement (measured)": a loopback profile optimizes the wrong paths).
DEFAULT_CLIENT = "host"
AGGREGATES = ("hmean", "geomean", "mean", "sum")
_FIELD = re.compile(r"\{([a-z_][a-z0-9_]*)\}")


def _dir() -> Path:
    return Path(str(resources.files("kpgo.workloads")))


def names() -> list[str]:
    return sorted(p.stem for p in _dir().glob("*.toml"))


def _raw(name: str) -> dict[str, Any]:
    """The workload file as a dict, validated (a Workload is built only from such a dict)."""
    path = _dir() / f"{name}.toml"
    if not path.exists():
        raise UserError(f"unknown workload '{name}'", f"choose from: {', '.join(names())} (or all)")
    spec = inputs.read_toml(path, "fix the file (docs/WORKLOADS.md)")
    for f in spec.get("files", []) if isinstance(spec.get("files"), list) else []:
        # Shared page content lives once, in workloads/data/.
        if isinstance(f, dict) and isinstance(f.get("source"), str):
            f["text"] = inputs.read_text(_dir() / "data" / f.pop("source"), "fix the file (docs/WORKLOADS.md)")
    problems = validate(spec)
    if problems:  # checked on every load, so a mistake in a file stops before any build or boot
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise UserError(f"workload file {path}: {problems[0]}{more}", "fix the file (docs/WORKLOADS.md)")
    return spec


# Every key a workload file may hold, by section (a typo such as `warmpu` is an error, not a silently skipped step),
# with the type of its value.
TOP_KEYS: dict[str, type | tuple[type, ...]] = {
    "name": str, "description": str, "unit": str, "higher_is_better": bool, "aggregate": str, "params": dict, "packages": list,
    "paper": dict, "files": list, "server": dict, "build": list, "kernel_config": list, "client": str, "windows": str,
    **dict.fromkeys(STEP_KINDS, list)}
REQUIRED = ("name", "description", "unit", "higher_is_better", "aggregate", "params", "load")
SECTION_KEYS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "step": {"name": str, "argv": list, "each": str, "client": bool, "timeout": (int, float), "metric": str, "ops": str,
             "ops_per_part": (str, int), "secondary": dict},
    "server": {"argv": list, "ready_tcp": str, "ready_timeout": (int, float), "speaks_first": bool},
    "files": {"path": str, "text": str},
    "build": {"output": str, "source": str, "argv": list},
    "paper": {"params": str, "source": str},
}


def _shape(where: str, table: Any, keys: dict[str, type | tuple[type, ...]]) -> list[str]:
    if not isinstance(table, dict):
        return [f"{where} is not a table"]
    out = [f"{where}: unknown key '{k}' (known: {', '.join(keys)})" for k in table if k not in keys]
    out += [f"{where}: {k} should be of type {getattr(keys[k], '__name__', 'number')}" for k, v in table.items()
            if k in keys and not isinstance(v, keys[k])]
    return out


def validate(spec: dict[str, Any]) -> list[str]:
    """Problems in a workload spec (empty if none): known keys of the right types, regexes, and every {template}
    names a parameter."""
    problems = [f"missing '{key}'" for key in REQUIRED if key not in spec]
    problems += _shape("the file", spec, TOP_KEYS)
    if any("unknown key" not in p for p in problems):
        return problems  # a section missing or of another type: the checks below would read it
    for kind in STEP_KINDS:
        problems += [p for i, step in enumerate(spec.get(kind, [])) for p in _shape(f"{kind} step {i + 1}", step, SECTION_KEYS["step"])]
    for section in ("server", "paper"):
        if section in spec:
            problems += _shape(section, spec[section], SECTION_KEYS[section])
    for section in ("files", "build"):
        problems += [p for i, t in enumerate(spec.get(section, [])) for p in _shape(f"{section} {i + 1}", t, SECTION_KEYS[section])]
    if problems:
        return problems
    if spec["aggregate"] not in AGGREGATES:
        problems.append(f"aggregate must be one of {AGGREGATES}")
    if spec.get("windows", "run") not in WINDOWS:
        problems.append(f"windows must be one of {WINDOWS} (a simulator window per measured run or per load step), not {spec['windows']!r}")
    known = set(spec["params"]) | set(GUEST_VARS)

    def check_template(text: str, where: str, extra: tuple[str, ...] = ()) -> None:
        for m in _FIELD.finditer(text):
            if m[1] not in known and m[1] not in extra:
                problems.append(f"{where}: {{{m[1]}}} is not a parameter")

    for i, f in enumerate(spec.get("files", [])):
        if not {"path", "text"} <= set(f):
            problems.append(f"files {i + 1}: needs path and text (or source)")
        check_template(f.get("path", ""), "files.path")
        check_template(f.get("text", ""), f"files {f.get('path')}")
    if "paper" in spec and "params" not in spec["paper"]:
        problems.append("paper needs params")
    if "server" in spec:
        srv = spec["server"]
        if not srv.get("argv") or "ready_tcp" not in srv:
            problems.append("server needs argv and ready_tcp")
        for a in srv.get("argv", []) + [srv.get("ready_tcp", "")]:
            check_template(a, "server")
    for b in spec.get("build", []):
        if not {"output", "source", "argv"} <= set(b) or not (_dir() / "tools" / b.get("source", "")).is_file():
            problems.append(f"build {b.get('output')}: needs output, argv and a source in workloads/tools/")
    if not spec["load"]:
        problems.append("no load step")
    for kind in STEP_KINDS:
        for step in spec.get(kind, []):
            where = f"{kind} step {step.get('name', '?')}"
            if not step.get("name") or not isinstance(step.get("argv"), list) or not step["argv"]:
                problems.append(f"{where}: needs name and argv")
                continue
            if step.get("client") and (kind not in ("warmup", "load") or "server" not in spec):
                problems.append(f"{where}: client = true marks a warm-up or load step that drives the server (it may run on the host)")
            each = step.get("each")
            if each is not None and each not in spec["params"]:
                problems.append(f"{where}: each = {each} is not a parameter")
            for a in step["argv"]:
                check_template(a, where, ("each",) if each else ())
            if kind == "load":
                rxs = {"metric": step.get("metric", "")} | {f"secondary {k}": v for k, v in step.get("secondary", {}).items()}
                if "ops" in step and "ops_per_part" in step:
                    problems.append(f"{where}: ops (a regex for the reported count) and ops_per_part (a fixed count) exclude each other")
                if "ops" in step:
                    rxs["ops"] = step["ops"]
                check_template(str(step.get("ops_per_part", "")), where)
                for label, rx in rxs.items():
                    try:
                        if "value" not in re.compile(rx).groupindex:
                            problems.append(f"{where}: {label} regex has no (?P<value>...) group")
                    except re.error as e:
                        problems.append(f"{where}: {label} regex does not compile: {e}")
    return problems


# What kpgo's guest needs built in: virtme-ng shares the host's root with it over 9p (virtiofs needs the Rust virtiofsd;
# Debian 12's is QEMU's C one, which virtme-ng cannot start), and a module it needs first would need an initramfs.
GUEST_BUILTIN = ("NET_9P", "NET_9P_VIRTIO", "9P_FS", "VIRTIO_PCI")


DISK_BUILTIN = ("VIRTIO_BLK", "EXT4_FS")  # the guest's data disk (--data disk: vng --disk attaches it as virtio-blk), built in


def check_kernel(specs: list[Workload], build_dir: Path, disk: bool = False) -> None:
    """The guest's own needs (GUEST_BUILTIN; with the data on a disk, DISK_BUILTIN), and the kernel options workloads
    name they cannot run without (kernel_config = ["SYSVIPC"]): a build lacking one fails here, before a boot, instead
    of deep inside the guest."""
    try:
        config = (build_dir / ".config").read_text()
    except OSError:
        return  # not a kpgo build; the caller's own check reports that
    options = kconfig.parse(config)
    lacking = [o for o in DISK_BUILTIN if disk and options.get(f"CONFIG_{o}") != "y"]
    if lacking:
        opts = " ".join(f"CONFIG_{o}=y" for o in lacking)
        raise UserError(f"--data disk: the kernel in {build_dir} needs {opts} to mount its data disk",
                        f"build it with --fragment FILE holding {opts} (one per line), or measure with --data tmpfs")
    lacking = [o for o in GUEST_BUILTIN if options.get(f"CONFIG_{o}") != "y"]
    if lacking:
        opts = " ".join(f"CONFIG_{o}=y" for o in lacking)
        raise UserError(f"the kernel in {build_dir} cannot boot as kpgo's guest: it needs {opts} (virtme-ng's root filesystem is "
                        "the host's, over virtio 9p, before any module loads)", f"build it with --fragment FILE holding {opts} (one per line)")
    have = {k.removeprefix("CONFIG_") for k, v in options.items() if v in ("y", "m")}
    for s in specs:
        lacking = [o for o in s.kernel_config if o not in have]
        if lacking:
            opts = " ".join(f"CONFIG_{o}=y" for o in lacking)
            raise UserError(f"workload {s.name} needs {opts}, which the kernel in {build_dir} lacks",
                            f"build it with --fragment FILE holding {opts} (one per line)")


def _coerce(name: str, key: str, old: Any, value: str, item: str) -> Any:
    if isinstance(old, bool):
        return value.lower() in ("1", "true", "yes", "on")
    try:
        new = type(old)(value)
    except ValueError:
        raise UserError(f"--set {item}: {key} of workload {name} takes a value of type {type(old).__name__}", f"its default is {old}") from None
    if isinstance(new, (int, float)) and not new >= 0:  # counts, sizes, seconds and ports are never negative
        raise UserError(f"--set {item}: {key} of workload {name} cannot be negative", f"its default is {old}")
    return new


def load(name: str, overrides: list[str] | None = None) -> Workload:
    """One workload with overrides applied (KEY=VALUE, or NAME.KEY=VALUE for this workload only)."""
    return load_many(name, overrides)[0]


def parse_names(text: str, what: str = "--workload") -> list[str]:
    """The names in 'a,b' (each once, in order) or every workload for 'all'; `what` names the argument in errors."""
    wanted = names() if text.strip() == "all" else [w.strip() for w in text.split(",") if w.strip()]
    if not wanted:
        raise UserError(f"{what} {text!r} names no workload", f"choose from: {', '.join(names())} (or all)")
    for w in wanted:
        _raw(w)  # unknown names fail here, before anything runs
    return list(dict.fromkeys(wanted))


def load_many(text: str, overrides: list[str] | None = None, client: str = "guest", what: str = "--workload") -> list[Workload]:
    """Workloads named by 'a,b' or 'all', each with the overrides that apply to it. A plain
    KEY=VALUE goes to every chosen workload that has KEY; it must fit at least one. `client`:
    where the load generators run, for the workloads that have one (the others ignore it); a
    host client is recorded in the workload (its `client`), so it is part of every key derived from it."""
    if client not in CLIENTS:
        raise UserError(f"--client {client}: unknown placement", f"choose from: {', '.join(CLIENTS)}")
    specs = [Workload.from_json(_raw(n)) for n in parse_names(text, what)]  # parsed afresh: overrides never leak between calls
    if client == "host":
        from kpgo.client import has_client

        specs = [replace(s, client="host") if has_client(s) else s for s in specs]
    for item in overrides or []:
        key, sep, value = item.partition("=")
        scope, dot, pkey = key.rpartition(".")
        if not sep or not key:
            raise UserError(f"--set {item}: expected KEY=VALUE or WORKLOAD.KEY=VALUE", "for example --set redis.clients=8")
        if dot and scope not in {s.name for s in specs}:
            chosen = ", ".join(s.name for s in specs)
            raise UserError(f"--set {item}: workload {scope} is not chosen (--workload {chosen})", f"add {scope} to --workload or drop this --set")
        targets = [s for s in specs if (not dot or s.name == scope) and pkey in s.params]
        if not targets:
            where = scope if dot else "/".join(s.name for s in specs)
            known = sorted({k for s in specs if not dot or s.name == scope for k in s.params})
            raise UserError(f"--set {item}: {pkey} is not a parameter of {where}", f"parameters: {', '.join(known)}")
        for s in targets:
            s.params[pkey] = _coerce(s.name, pkey, s.params[pkey], value, item)
    return specs

