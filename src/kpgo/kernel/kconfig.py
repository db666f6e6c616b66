"""Kernel configs as data: a base (shipped `tiny`/`server`, or a user's --config FILE) plus
fragments merged the Kbuild way (scripts/kconfig/merge_config.sh, then olddefconfig).

A shipped config file names its starting target in a `# kpgo-base: TARGET` line
(allnoconfig, x86_64_defconfig) and lists the options on top of it; `debian:FLAVOUR` starts from the whole config
Debian ships for that flavour of its kernel (package linux-config-6.12; docs/DEBIAN.md)."""

from __future__ import annotations

import functools
import hashlib
import lzma
import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from kpgo import atomic, inputs, proc
from kpgo.errors import UserError
from kpgo.paths import cache_dir


def _configs_dir() -> Path:
    return Path(str(resources.files("kpgo.kernel") / "configs"))


def base_names() -> list[str]:
    return sorted(p.stem for p in _configs_dir().glob("*.config") if "kpgo-base:" in p.read_text())


@dataclass(frozen=True)
class ConfigSpec:
    name: str  # "tiny", "server", or the user's file stem
    base_target: str | None  # make target that starts the config, None when a full .config is given
    files: tuple[Path, ...]  # the full config (if any) then fragments, in merge order

    def digest(self) -> str:
        h = hashlib.sha256(f"{self.name}:{self.base_target}".encode())
        for f in self.files:
            h.update(inputs.read_bytes(f, "pass the config again", inputs.TEXT_LIMIT))
        return h.hexdigest()[:16]


def resolve(base: str | None, config_file: Path | None, fragments: list[Path]) -> ConfigSpec:
    for frag in fragments:
        if not os.path.lexists(frag):  # anything else at the path (a directory, a FIFO) is named by read_options
            raise UserError(f"config fragment {frag} not found", "pass an existing file to --fragment")
        read_options(frag, "config fragment")
    if config_file is not None:
        if base is not None:
            raise UserError(f"--base {base} and --config {config_file} both name the starting config", "give one of them")
        if not os.path.lexists(config_file):
            raise UserError(f"config file {config_file} not found", "pass an existing .config to --config")
        read_options(config_file, "config file")
        return ConfigSpec(config_file.stem, None, (config_file.resolve(), *[f.resolve() for f in fragments]))
    name = "server" if base is None else base  # an empty --base is refused below, not taken for the default
    path = _configs_dir() / f"{name}.config"
    if name not in base_names():
        raise UserError(f"unknown base config '{name}'", f"choose one of: {', '.join(base_names())}, or pass --config FILE")
    m = re.search(r"^# kpgo-base:\s*(\S+)", path.read_text(), re.M)
    assert m  # base_names() only lists files that have it
    if m.group(1).startswith("debian:"):  # Debian's whole config, then this file's options as the first fragment
        return ConfigSpec(name, None, (debian_config(m.group(1).removeprefix("debian:")), path, *[f.resolve() for f in fragments]))
    return ConfigSpec(name, m.group(1), (path, *[f.resolve() for f in fragments]))


DEBIAN_CONFIGS = Path("/usr/src/linux-config-6.12")  # the package linux-config-6.12 (scripts/setup.sh installs it)


def debian_config(flavour: str) -> Path:
    """Debian's config of one flavour of its kernel, uncompressed once into the cache (its digest is the config's:
    ConfigSpec.digest reads the bytes), so Kbuild and the build key read a plain file."""
    packed = DEBIAN_CONFIGS / f"config.{flavour}.xz"
    if not packed.is_file():
        raise UserError(f"Debian's kernel config {packed} not found",
                        "install the Debian package linux-config-6.12 (`make setup`), or pass the config with --config FILE")
    try:
        data = lzma.decompress(packed.read_bytes()).decode()
    except (OSError, lzma.LZMAError, UnicodeDecodeError) as e:
        raise UserError(f"Debian's kernel config {packed} cannot be read ({e})", "reinstall the package linux-config-6.12") from None
    out = cache_dir() / "debian" / f"config.{flavour}"
    if not (out.is_file() and out.read_text() == data):
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_text(out, data)
    return out


# A config line: an option, an option switched off, a comment, or nothing. merge_config.sh silently skips anything
# else ("CONFIG_X = y" with spaces), so such a line would be lost without a word.
_LINE = re.compile(r"CONFIG_\w+=.*|# CONFIG_\w+ is not set|#.*|")
# Symbols that only another architecture's config sets: kpgo builds x86-64 kernels.
OTHER_ARCHES = ("ARM64", "ARM", "RISCV", "PPC", "PPC64", "S390", "MIPS", "LOONGARCH", "SPARC", "PARISC", "ALPHA", "M68K")


def read_options(path: Path, what: str) -> dict[str, str]:
    """The options a user's config file or fragment sets, refusing a file that is not one (a line that is no config
    syntax, no option at all, another architecture's config)."""
    text = inputs.read_text(path, f"pass a kernel config (lines CONFIG_NAME=VALUE) to {'--config' if what == 'config file' else '--fragment'}")
    for n, line in enumerate(text.splitlines(), 1):
        if not _LINE.fullmatch(line.strip()):
            raise UserError(f"{what} {path} line {n} is not a config line: {line.strip()[:60]!r}",
                            "write each option as CONFIG_NAME=VALUE or '# CONFIG_NAME is not set'")
    opts = parse(text)
    if not opts:
        raise UserError(f"{what} {path} sets no CONFIG_ option", "pass a kernel config (lines CONFIG_NAME=VALUE)")
    arch = [a for a in OTHER_ARCHES if opts.get(f"CONFIG_{a}") == "y"]
    if arch:
        raise UserError(f"{what} {path} is for another architecture (CONFIG_{arch[0]}=y)", "kpgo builds x86-64 kernels: pass an x86-64 config")
    return opts


@functools.cache
def kconfig_symbols(src: Path) -> frozenset[str]:
    """Every symbol a Kconfig file of the source tree defines (`config X`, `menuconfig X`), any architecture."""
    rx = re.compile(rb"^[ \t]*(?:menu)?config[ \t]+([A-Za-z0-9_]+)", re.M)
    syms: set[str] = set()
    for root, dirs, files in os.walk(src):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("Documentation", "tools")]
        for f in files:
            if f.startswith("Kconfig"):
                with open(os.path.join(root, f), "rb") as fh:
                    syms.update(m.decode() for m in rx.findall(fh.read()))
    return frozenset(syms)


def check_applies(spec: ConfigSpec, src: Path) -> None:
    """Every option a user's fragment switches on exists in this kernel (a typo or an option of another kernel
    version would otherwise surface after configure as 'dependencies not met', with a half-made build directory)."""
    frags = spec.files[1:]
    if not frags:
        return
    known = kconfig_symbols(Path(src))
    for frag in frags:
        for key, value in read_options(frag, "config fragment").items():
            if value != "n" and key.removeprefix("CONFIG_") not in known:
                raise UserError(f"config fragment {frag} sets {key}, which this kernel ({src}) does not have",
                                "fix the option's name, or drop it from the fragment")


def variant_fragments(names: tuple[str, ...]) -> tuple[Path, ...]:
    """The shipped fragments a variant adds (variants.Variant.fragments: gcov for the instrumented kernel, os for -Os)."""
    return tuple(_configs_dir() / f"{n}.config" for n in names)


_OPT = re.compile(r"^(CONFIG_\w+)=(.*)$|^# (CONFIG_\w+) is not set$")


def parse(text: str) -> dict[str, str]:
    """CONFIG_X -> value ('n' for 'is not set')."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = _OPT.match(line.strip())
        if m:
            if m.group(1):
                out[m.group(1)] = m.group(2)
            else:
                out[m.group(3)] = "n"
    return out


def merged_files(spec: ConfigSpec, fragments: tuple[str, ...]) -> list[Path]:
    """The files merge_config.sh merges, in order: the base's options (unless copied whole), the user's fragments,
    the variant's."""
    return [*(spec.files if spec.base_target else spec.files[1:]), *variant_fragments(fragments)]


def sets_modules(spec: ConfigSpec, fragments: tuple[str, ...]) -> bool:
    """Whether the config will build modules, as far as its files say (a dry run has no .config to read): the last
    file to set CONFIG_MODULES decides."""
    files = [*(spec.files[:1] if not spec.base_target else []), *merged_files(spec, fragments)]
    said = [v for f in files if (v := parse(f.read_text()).get("CONFIG_MODULES")) is not None]
    return bool(said) and said[-1] == "y"


def configure_commands(src: Path, out: Path, spec: ConfigSpec, fragments: tuple[str, ...], make_args: tuple[str, ...] = ()) -> list[list[str]]:
    """The commands that write out/.config (after copying spec.files[0] there when no base target starts it).
    make_args select the variant's compiler: Kconfig asks the compiler what it supports, so configure and build
    must see the same one."""
    make = ["make", "-C", str(src), f"O={out}", *make_args]
    cmds = [[*make, spec.base_target]] if spec.base_target else []
    merge = merged_files(spec, fragments)
    if merge:
        cmds.append([str(src / "scripts/kconfig/merge_config.sh"), "-m", "-O", str(out), str(out / ".config"), *map(str, merge)])
    cmds.append([*make, "olddefconfig"])
    return cmds


def configure(src: Path, out: Path, spec: ConfigSpec, fragments: tuple[str, ...], log: Path, make_args: tuple[str, ...] = ()) -> dict[str, str]:
    """Write out/.config; every option a fragment asks for must survive, or the build stops."""
    dotconfig = out / ".config"
    if not spec.base_target:
        dotconfig.write_bytes(spec.files[0].read_bytes())
    for argv in configure_commands(src, out, spec, fragments, make_args):
        merging = argv[0].endswith("merge_config.sh")
        proc.run(argv, log=log, cwd=src if merging else None, what="merge_config.sh" if merging else f"make {argv[-1]}")
    final = parse(dotconfig.read_text())
    problems: list[str] = []
    wanted: dict[str, tuple[str, str]] = {}  # option -> (value, file): a later file's value wins, as in merge_config.sh
    for f in merged_files(spec, fragments):
        wanted |= {key: (want, f.name) for key, want in parse(f.read_text()).items()}
    for key, (want, name) in wanted.items():
        have = final.get(key, "n")
        if have != want and not (want == "n" and key not in final):
            problems.append(f"{key}={want} (from {name}) became {key}={have}")
    if problems:
        more = f" and {len(problems) - 1} more" if len(problems) > 1 else ""
        raise UserError(
            f"config option {problems[0]}{more}: its dependencies are not met",
            f"fix the fragment (see {log} and {dotconfig})",
        )
    return final
