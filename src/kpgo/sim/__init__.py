"""Simulated CPU counters for guests under QEMU TCG (docs/SIM.md).

kpgosim.c is a QEMU TCG plugin: inside windows the guest opens and closes with marker NOPs
(window.c, the guest tool `kpgo-window open|close`), it counts guest instructions, taken branches
and simulated L1 instruction-cache and iTLB accesses and misses, each split kernel/user, and writes
every closed window to a JSON report on the host. This module builds both programs, reads the
report and turns one side's counters into an estimate of front-end stall cycles.

Debian ships QEMU without the plugin header, so it is taken from Debian's source package of
exactly the installed QEMU (downloaded once, cached under the kpgo cache directory)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shlex
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kpgo import atomic, proc
from kpgo.errors import InfraError, UserError
from kpgo.paths import cache_dir
from kpgo.progress import say

HERE = Path(__file__).parent
PLUGIN_SOURCE = HERE / "kpgosim.c"
WINDOW_SOURCE = HERE / "window.c"
WINDOW_TOOL = "kpgo-window"
QEMU_PACKAGE = "qemu-system-x86"
HEADER = "qemu-plugin.h"
REPORT_FORMAT = 3  # 3: taken_branches per side; itlb_kpage defaults to 2 MiB
COUNTERS = ("insns", "l1i_accesses", "l1i_misses", "itlb_accesses", "itlb_misses", "taken_branches")
# Assumed front-end stall per simulated miss, in core cycles, for a current x86 core (docs/SIM.md,
# "Front-end cost"): an L1i miss served from L2, an iTLB miss served from the second-level TLB.
STALL_L1I_CYCLES = 14.0
STALL_ITLB_CYCLES = 14.0
APT_RETRIES = 3  # per download; the tests set 0 to fail fast
SETUP_HINT = "run `make setup` (or `.venv/bin/python -m kpgo.sim`)"


# ---- configuration ----------------------------------------------------------------------------

_SUFFIX = {"": 1, "k": 1 << 10, "m": 1 << 20}


BOOLS = ("warm", "boot")


@dataclass(frozen=True)
class SimConfig:
    """The simulated L1 instruction cache and iTLB. The defaults are of the order of current x86
    cores (32 KiB 8-way 64-byte lines; 64-entry 4-way iTLB) but model no particular CPU.
    itlb_page is the page size for user code, itlb_kpage for kernel code: 2 MiB by default,
    because x86-64 kernels map their text with 2 MiB pages (docs/SIM.md); itlb_kpage=4k models
    kernel code on 4 KiB pages. warm=True keeps simulating outside the windows (slower there) so
    a window starts warm. boot=True adds a window from power-on to the guest agent's start (firmware,
    decompressor, kernel init, virtme's init: the cost of booting, on paths no workload profile sees)."""

    l1i_size: int = 32768
    l1i_assoc: int = 8
    l1i_line: int = 64
    itlb_entries: int = 64
    itlb_assoc: int = 4
    itlb_page: int = 4096
    itlb_kpage: int = 2 << 20
    warm: bool = False
    boot: bool = False

    def __post_init__(self) -> None:
        for name in BOOLS:
            v = getattr(self, name)
            if v in (0, 1) and not isinstance(v, bool):
                object.__setattr__(self, name, bool(v))  # --sim-opt warm=1 arrives as an int
        problem = self.problem()
        if problem:
            raise UserError(f"simulated cache: {problem}",
                            "sets (size / (line × ways), entries / ways), lines and pages must be powers of two, e.g. the defaults "
                            "l1i_size=32768 l1i_assoc=8 l1i_line=64 itlb_entries=64 itlb_assoc=4")

    def problem(self) -> str | None:
        """The first thing the plugin would refuse (it checks the same), or None."""
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name in BOOLS:
                if not isinstance(v, bool):
                    return f"{f.name} must be true or false, not {v!r}"
            elif isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                return f"{f.name} must be a positive integer, not {v!r}"
        for name in ("l1i_line", "itlb_page", "itlb_kpage"):
            if not _pow2(getattr(self, name)):
                return f"{name}={getattr(self, name)} is not a power of two"
        for name in ("l1i_assoc", "itlb_assoc"):
            if getattr(self, name) > 64:
                return f"{name}={getattr(self, name)} is above 64 ways"
        way = self.l1i_line * self.l1i_assoc
        if self.l1i_size % way or not _pow2(self.l1i_size // way):
            return f"l1i_size={self.l1i_size} over {self.l1i_assoc} ways of {self.l1i_line}-byte lines is not a power-of-two number of sets"
        if self.itlb_entries % self.itlb_assoc or not _pow2(self.itlb_entries // self.itlb_assoc):
            return f"itlb_entries={self.itlb_entries} over {self.itlb_assoc} ways is not a power-of-two number of sets"
        return None

    @classmethod
    def parse(cls, text: str) -> SimConfig:
        """'l1i_size=16k,itlb_kpage=2M' (comma-separated KEY=VALUE, k/M suffixes) over the defaults."""
        known = {f.name for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for item in filter(None, (t.strip() for t in text.split(","))):
            key, sep, value = item.partition("=")
            if not sep or key not in known:
                raise UserError(f"simulator setting '{item}' is not KEY=VALUE with a known KEY", f"keys: {', '.join(sorted(known))}")
            if key in BOOLS:
                values[key] = value.lower() in ("1", "true", "yes", "on")
                continue
            m = re.fullmatch(r"([0-9]+)([kKmM]?)", value.strip())
            if not m:
                raise UserError(f"simulator setting '{item}': not a number", "use an integer, optionally with a k or M suffix")
            values[key] = int(m[1]) * _SUFFIX[m[2].lower()]
        return cls(**values)

    def plugin_arg(self, out: Path) -> str:
        """The plugin's arguments, as they follow the library in `-plugin LIB,ARGS`."""
        out = Path(out).resolve()
        if "," in str(out):
            raise UserError(f"the simulator report path {out} contains a comma, which QEMU's option syntax splits on",
                            "use a run directory without commas")
        args = [f"out={out}"] + [f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self) if f.name not in BOOLS]
        args.append(f"warm={'on' if self.warm else 'off'}")
        args.append(f"always={'on' if self.boot else 'off'}")  # the plugin opens its first window at start-up
        return ",".join(args)


def _pow2(v: int) -> bool:
    return v > 0 and not v & (v - 1)


def qemu_opts(config: SimConfig, out: Path) -> str:
    """The value of vng's --qemu-opts that loads the plugin (built if needed). vng pastes it into a
    shell command line, so it is shell-quoted here."""
    return "-plugin " + shlex.quote(f"{build_plugin()},{config.plugin_arg(out)}")


# ---- the plugin header ------------------------------------------------------------------------


@dataclass(frozen=True)
class QemuVersion:
    source_package: str  # "qemu"
    source_version: str  # "1:7.2+dfsg-7+deb12u18" (the binary's version without the +b3 binNMU suffix)
    upstream: str  # "7.2.22", as qemu-system-x86_64 --version says

    @property
    def stamp(self) -> str:
        return f"{self.source_package} {self.source_version}"


def qemu_version() -> QemuVersion:
    res = proc.run(["dpkg-query", "-W", "-f=${db:Status-Abbrev}|${source:Package}|${source:Version}", QEMU_PACKAGE], check=False)
    fields = res.output.strip().split("|")
    if res.returncode != 0 or len(fields) != 3 or not fields[0].startswith("ii"):
        raise UserError(f"{QEMU_PACKAGE} is not installed, so there is no QEMU to build the simulator plugin for", SETUP_HINT)
    m = re.search(r"QEMU emulator version ([0-9][0-9.]*)", proc.capture(["qemu-system-x86_64", "--version"]))
    if not m:
        raise InfraError("cannot read the QEMU version from `qemu-system-x86_64 --version`", f"reinstall {QEMU_PACKAGE}")
    return QemuVersion(fields[1], fields[2], m[1])


def header_dir(version: QemuVersion | None = None) -> Path:
    return cache_dir() / "qemu-plugin" / (version or qemu_version()).upstream


def fetch_header() -> Path:
    """The directory holding qemu-plugin.h of the installed QEMU: from the cache when its VERSION
    names the installed source package version, else taken from Debian's source package (the
    upstream tarball plus the Debian patches that touch the header). Nothing in /etc/apt or
    /var/lib/apt changes: apt-get runs on a private deb-src list and list directory."""
    version = qemu_version()
    dest = header_dir(version)
    hdr, stamp = dest / HEADER, dest / "VERSION"
    if hdr.is_file() and hdr.stat().st_size > 0 and stamp.is_file() and stamp.read_text().strip() == version.stamp:
        return dest
    proc.need("apt-get")
    say(f"sim: fetching {HEADER} from Debian source package {version.source_package}={version.source_version} (once)")
    log = cache_dir() / "qemu-plugin" / "fetch.log"
    log.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="kpgo-qemu-src.") as tmp:
        work = Path(tmp)
        sources = _deb_src_lines()
        if not sources:
            raise UserError(f"no Debian archive in /etc/apt to download the {version.source_package} source package from",
                            "add a Debian mirror (deb http://deb.debian.org/debian bookworm main) to /etc/apt/sources.list")
        (work / "sources.list").write_text("\n".join(sources) + "\n")
        (work / "lists" / "partial").mkdir(parents=True)
        (work / "src").mkdir()
        apt = ["apt-get", "-q",
               "-o", f"Dir::Etc::SourceList={work / 'sources.list'}", "-o", "Dir::Etc::SourceParts=/nonexistent",
               "-o", f"Dir::State::Lists={work / 'lists'}", "-o", "Dir::Cache::pkgcache=", "-o", "Dir::Cache::srcpkgcache=",
               "-o", "APT::Get::List-Cleanup=0", "-o", "Debug::NoLocking=1", "-o", "APT::Sandbox::User=root",
               "-o", f"Acquire::Retries={APT_RETRIES}"]
        env = {"DEBIAN_FRONTEND": "noninteractive"}
        hint = f"check the network and the Debian mirrors in /etc/apt, then {SETUP_HINT}; log: {log}"
        # apt-get update only warns about an unreachable mirror: no Sources index means failure.
        updated = proc.run([*apt, "update"], log=log, env=env, timeout=600, check=False).returncode == 0
        if not updated or not any((work / "lists").glob("*Sources*")):
            raise InfraError("could not read the Debian source package lists (apt-get update failed)", hint)
        want = f"{version.source_package}={version.source_version}"
        if proc.run([*apt, "source", "--download-only", want], cwd=work / "src", log=log, env=env, timeout=1800, check=False).returncode != 0:
            raise InfraError(f"could not download the Debian source package {want} for {HEADER}", hint)
        text, patches = _header_from_source(work / "src", work / "x", log)
    dest.mkdir(parents=True, exist_ok=True)
    atomic.write_text(hdr, text)
    atomic.write_text(dest / "PATCHES", f"debian patches applied to the header: {' '.join(patches) or 'none'}\n")
    atomic.write_text(stamp, version.stamp + "\n")  # last: the cache is valid only once all is there
    return dest


def _deb_src_lines() -> list[str]:
    """deb-src twins of the system's Debian `deb` entries (one-line .list and deb822 .sources)."""
    etc = Path("/etc/apt")
    lines: list[str] = []
    for f in [etc / "sources.list", *sorted((etc / "sources.list.d").glob("*.list"))]:
        if f.is_file():
            for ln in f.read_text(errors="replace").splitlines():
                m = re.match(r"\s*deb\s+(.*)", ln)
                if m:
                    lines.append(f"deb-src {m[1]}")
    for f in sorted((etc / "sources.list.d").glob("*.sources")):
        for para in re.split(r"\n\s*\n", f.read_text(errors="replace")):
            fields: dict[str, str] = {}
            for ln in para.splitlines():
                m = re.match(r"([A-Za-z-]+):\s*(.*)", ln)
                if m:
                    fields[m[1].lower()] = m[2].strip()
            if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes").lower() == "no":
                continue
            key = fields.get("signed-by", "")
            opt = f"[signed-by={key}] " if key.startswith("/") else ""  # an inline key block: apt's default keyring
            for uri in fields.get("uris", "").split():
                for suite in fields.get("suites", "").split():
                    lines.append(f"deb-src {opt}{uri} {suite} {fields.get('components', '')}".rstrip())
    # Only Debian's archives carry the qemu source package.
    return [ln for ln in lines if re.search(r"debian(-security)?[ /]", ln)]


def _header_from_source(src: Path, work: Path, log: Path) -> tuple[str, list[str]]:
    """qemu-plugin.h from the .orig tarball with the header hunks of the Debian patches applied."""
    orig = sorted(src.glob("*.orig.tar.*"))
    debian = sorted(src.glob("*.debian.tar.*"))
    if not orig:
        raise InfraError(f"the downloaded source package has no .orig tarball in {src}", f"log: {log}")
    tree = work / "tree"
    (tree / "include" / "qemu").mkdir(parents=True)
    hdr = tree / "include" / "qemu" / HEADER
    with tarfile.open(orig[0], "r|*") as tf:  # streamed: stop at the one member wanted
        for member in tf:
            if member.isfile() and member.name.endswith("/include/qemu/" + HEADER):
                f = tf.extractfile(member)
                assert f is not None
                hdr.write_bytes(f.read())
                break
    if not hdr.is_file():
        raise InfraError(f"{orig[0].name} holds no include/qemu/{HEADER}", "this QEMU may predate TCG plugins (QEMU ≥ 4.2 has them)")
    patches: dict[str, bytes] = {}
    if debian:
        with tarfile.open(debian[0], "r|*") as tf:
            for member in tf:
                name = member.name.removeprefix("./")
                if member.isfile() and name.startswith("debian/patches/"):
                    f = tf.extractfile(member)
                    assert f is not None
                    patches[name.removeprefix("debian/patches/")] = f.read()
    applied = []
    for line in patches.get("series", b"").decode(errors="replace").splitlines():
        words = line.split("#", 1)[0].split()  # "name [-pN]"; comments and blank lines skipped
        body = patches.get(words[0], b"").decode(errors="replace") if words else ""
        if f"include/qemu/{HEADER}" not in body:
            continue
        name = words[0]
        hunk = work / "hdr.patch"
        hunk.write_text(_header_hunks(body))
        proc.run(["patch", "-s", "-p1", "-i", hunk], cwd=tree, log=log, what=f"applying Debian patch {name} to {HEADER}")
        applied.append(name)
    return hdr.read_text(), applied


def _header_hunks(patch: str) -> str:
    """Only the parts of a patch that change qemu-plugin.h (the patch may touch other files)."""
    keep, out = False, []
    for ln in patch.splitlines(keepends=True):
        if ln.startswith(("diff ", "--- ")):
            keep = f"include/qemu/{HEADER}" in ln
        if keep:
            out.append(ln)
    return "".join(out)


# ---- building ---------------------------------------------------------------------------------


def plugin_path() -> Path:
    return cache_dir() / "sim" / "libkpgosim.so"


def build_plugin() -> Path:
    """libkpgosim.so for the installed QEMU, rebuilt when kpgosim.c, the header or the QEMU version changes."""
    inc = fetch_header()
    try:
        glib = proc.capture(["pkg-config", "--cflags", "--libs", "glib-2.0"]).split()
    except (InfraError, UserError):
        raise UserError("the GLib development files are missing (pkg-config glib-2.0)", f"apt-get install libglib2.0-dev pkg-config, or {SETUP_HINT}") from None
    out = plugin_path()
    argv = ["gcc", "-shared", "-fPIC", "-fvisibility=hidden", "-O2", "-g", "-Wall", "-Wextra", "-Wno-unused-parameter",
            f"-I{inc}", "-o", "{output}", str(PLUGIN_SOURCE), *glib]
    h = hashlib.sha256(PLUGIN_SOURCE.read_bytes())
    h.update((inc / HEADER).read_bytes())
    h.update((inc / "VERSION").read_bytes())
    h.update(repr(argv).encode())
    want = h.hexdigest()[:16]
    stamp = out.with_name(out.name + ".stamp")
    if out.is_file() and stamp.is_file() and stamp.read_text() == want:
        return out
    say(f"sim: building the QEMU plugin {out.name}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    log = out.with_name(out.name + ".log")
    log.unlink(missing_ok=True)
    try:
        proc.run([a.replace("{output}", str(tmp)) for a in argv], log=log, timeout=300, what=f"building {out.name}")
        os.replace(tmp, out)  # a QEMU running the old one keeps its mapping
    finally:
        tmp.unlink(missing_ok=True)
    stamp.write_text(want)
    return out


def build_window_tool() -> Path:
    """The guest's `kpgo-window` among kpgo's helper programs (tools_dir, stamped by source hash)."""
    from kpgo.workloads import install

    spec = {
        "name": "sim",
        "build": [{
            "output": WINDOW_TOOL,
            "source": str(WINDOW_SOURCE),  # absolute: the helper builder joins it onto workloads/tools/ unchanged
            # static, no libc: exec is cheap under TCG and little besides the marker runs in the window
            "argv": ["gcc", "-O2", "-static", "-nostdlib", "-ffreestanding", "-fno-stack-protector", "-fno-pie", "-no-pie",
                     "-Wall", "-Wextra", "-o", "{output}", "{source}"],
        }],
    }
    install.build_tools([spec])
    return install.tools_dir() / WINDOW_TOOL


def setup() -> tuple[Path, Path]:
    """Everything a simulated boot needs on the host: the plugin and the guest's window tool."""
    return build_plugin(), build_window_tool()


# ---- the report -------------------------------------------------------------------------------


def read_windows(path: Path) -> list[dict[str, Any]]:
    """Every closed window of the report, in order. Each has "user", "kernel" and "total" (each
    with insns, blocks, l1i_accesses, l1i_misses, itlb_accesses, itlb_misses, taken_branches),
    "seconds" (host time the window was open), "index", "kernel_insn_share", "duplicate_opens"
    and "per_vcpu" (a "user" and a "kernel" of the same counters per vCPU)."""
    hint = "see the guest's console log; if the plugin was changed, rebuild it with `.venv/bin/python -m kpgo.sim`"
    try:
        report = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InfraError(f"the simulator wrote no report {path} (the QEMU plugin did not load or QEMU did not exit cleanly)", hint) from None
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise InfraError(f"the simulator report {path} is unreadable or corrupt ({str(e).splitlines()[0][:120]})", hint) from None
    problem = _report_problem(report)
    if problem:
        raise InfraError(f"the simulator report {path} is corrupt: {problem}", hint)
    return list(report["windows"])


def _report_problem(report: Any) -> str | None:
    if not isinstance(report, dict) or report.get("tool") != "kpgosim":
        return "not a kpgosim report"
    fmt = report.get("format")
    if fmt != REPORT_FORMAT:
        age = "an older" if isinstance(fmt, int) and fmt < REPORT_FORMAT else "another"
        return (f"report format {fmt} from {age} kpgosim, this kpgo reads format {REPORT_FORMAT} "
                f"(rebuild the plugin with `.venv/bin/python -m kpgo.sim` and measure again)")
    windows = report.get("windows")
    if not isinstance(windows, list):
        return "no windows list"
    for i, w in enumerate(windows):
        if not isinstance(w, dict) or not isinstance(w.get("seconds"), (int, float)):
            return f"window {i + 1} has no seconds"
        for side in ("user", "kernel", "total"):
            missing = _missing_counters(w.get(side))
            if missing:
                return f"window {i + 1} lacks {side} counters ({missing})"
        per_vcpu = w.get("per_vcpu", [])
        if not isinstance(per_vcpu, list):
            return f"window {i + 1} has a per_vcpu that is not a list"
        for v in per_vcpu:
            for side in ("user", "kernel"):
                missing = _missing_counters(v.get(side) if isinstance(v, dict) else None)
                if missing:
                    return f"window {i + 1} lacks {side} counters of a vCPU ({missing})"
    return None


def _missing_counters(c: Any) -> str | None:
    """The first of COUNTERS that `c` lacks (or holds as other than a count), or None."""
    if not isinstance(c, dict):
        return "none at all"
    for k in COUNTERS:
        v = c.get(k)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            return k
    return None


def frontend_stall_cycles(side_counters: dict) -> float:
    """Estimated front-end stall cycles of one side's counters (a window's "user", "kernel" or
    "total"): L1i misses × STALL_L1I_CYCLES + iTLB misses × STALL_ITLB_CYCLES. A model with fixed
    penalties (docs/SIM.md), for comparing kernels, not a prediction of any CPU's cycles."""
    return side_counters["l1i_misses"] * STALL_L1I_CYCLES + side_counters["itlb_misses"] * STALL_ITLB_CYCLES


def clean_report(path: Path) -> None:
    """Remove a report (and a stale temporary) before a boot writes a new one."""
    for p in (Path(path), Path(f"{path}.tmp")):
        p.unlink(missing_ok=True)
