"""Kernel configs as data: a base (shipped `tiny`/`server`, or a user's --config FILE) plus
fragments merged the Kbuild way (scripts/kconfig/merge_config.sh, then olddefconfig).

A shipped config file names its starting target in a `# kpgo-base: TARGET` line
(allnoconfig, x86_64_defconfig) and lists the options on top of it."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from kpgo import proc
from kpgo.errors import UserError

VARIANT_FRAGMENTS = {"vanilla": (), "instrumented": ("gcov",), "optimized": ()}


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
            h.update(f.read_bytes())
        return h.hexdigest()[:16]


def resolve(base: str | None, config_file: Path | None, fragments: list[Path]) -> ConfigSpec:
    for frag in fragments:
        if not frag.is_file():
            raise UserError(f"config fragment {frag} not found", "pass an existing file to --fragment")
    if config_file is not None:
        if not config_file.is_file():
            raise UserError(f"config file {config_file} not found", "pass an existing .config to --config")
        return ConfigSpec(config_file.stem, None, (config_file.resolve(), *[f.resolve() for f in fragments]))
    name = base or "server"
    path = _configs_dir() / f"{name}.config"
    if name not in base_names():
        raise UserError(f"unknown base config '{name}'", f"choose one of: {', '.join(base_names())}, or pass --config FILE")
    m = re.search(r"^# kpgo-base:\s*(\S+)", path.read_text(), re.M)
    assert m  # base_names() only lists files that have it
    return ConfigSpec(name, m.group(1), (path, *[f.resolve() for f in fragments]))


def variant_fragments(variant: str) -> tuple[Path, ...]:
    return tuple(_configs_dir() / f"{n}.config" for n in VARIANT_FRAGMENTS[variant])


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


def configure(src: Path, out: Path, spec: ConfigSpec, variant: str, log: Path) -> dict[str, str]:
    """Write out/.config; every option a fragment asks for must survive, or the build stops."""
    dotconfig = out / ".config"
    if spec.base_target:
        proc.run(["make", "-C", src, f"O={out}", spec.base_target], log=log, what=f"make {spec.base_target}")
        frags = list(spec.files[1:]) + list(variant_fragments(variant))
        first = [spec.files[0]]
    else:
        dotconfig.write_bytes(spec.files[0].read_bytes())
        frags = list(spec.files[1:]) + list(variant_fragments(variant))
        first = []
    merge = [*first, *frags]
    if merge:
        proc.run(
            [src / "scripts/kconfig/merge_config.sh", "-m", "-O", out, dotconfig, *merge],
            log=log,
            cwd=src,
            what="merge_config.sh",
        )
    proc.run(["make", "-C", src, f"O={out}", "olddefconfig"], log=log, what="make olddefconfig")
    final = parse(dotconfig.read_text())
    problems: list[str] = []
    for f in merge:
        for key, want in parse(f.read_text()).items():
            have = final.get(key, "n")
            if have != want and not (want == "n" and key not in final):
                problems.append(f"{key}={want} (from {f.name}) became {key}={have}")
    if problems:
        more = f" and {len(problems) - 1} more" if len(problems) > 1 else ""
        raise UserError(
            f"config option {problems[0]}{more}: its dependencies are not met",
            f"fix the fragment (see {log} and {dotconfig})",
        )
    return final
