"""Value profiling in the kernel (`kpgo build --variant instrumented --values`, `kpgo run --values`; docs/VALUES.md).

GCC's -fprofile-values records which functions indirect calls reach, common divisors and string-operation sizes;
-fprofile-use then promotes hot indirect calls to guarded direct calls and specializes divisions and string
operations. Upstream Linux's gcov cannot hold such profiles, so a value-profiled build is made from a copy of the
source with kpgo's patch (kernel/values/gcov-values.patch: the profilers, a preallocated node pool for the top-N
counters, their serialization and reset, CONFIG_GCOV_PROFILE_VALUES), compiled with kpgo's GCC plugin
(kernel/values/gcov_percpu_plugin.cc: GCC's thread-local indirect-call tuple moved to a per-CPU variable).
Neither touches the user's tree: the patched copy lives in the cache, keyed by the source and the patch.

API
    check(compiler)                  refuse a compiler that cannot make a value-profiled kernel, before any work
    patched(source) -> KernelSource  the cached patched copy of a source tree (made once; one-line error naming
                                     the hunk that does not apply)
    plugin(compiler) -> Path         the plugin built for that GCC (once, in the cache)
    FRAGMENT                         the config fragment that turns the recording on
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from kpgo import proc
from kpgo.errors import UserError
from kpgo.kernel import source
from kpgo.kernel.source import KernelSource
from kpgo.paths import cache_dir
from kpgo.progress import say
from kpgo.variants import Compiler

HERE = Path(__file__).parent
PATCH = HERE / "values" / "gcov-values.patch"
PLUGIN_SOURCE = HERE / "values" / "gcov_percpu_plugin.cc"
FRAGMENT = HERE / "configs" / "values.config"
PLUGIN_VAR = "KPGO_GCOV_PLUGIN"  # the make variable the patched Makefile passes to GCC as -fplugin=
MIN_GCC = 11  # the top-N layout the patch writes (total, n, n pairs per site) is GCC 11's; GCC 10 wrote fixed-size sites


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p)
    return h.hexdigest()[:12]


def check(compiler: Compiler) -> None:
    if compiler.family != "gcc" or compiler.major < MIN_GCC:
        raise UserError(f"--values needs GCC {MIN_GCC} or later (kpgo's kernel patch writes GCC {MIN_GCC}'s top-N counter layout); "
                        f"this build compiles with {compiler.name}", "build the instrumented variant (gcc-12) with --values")


def patched_files() -> list[str]:
    """The files the patch changes or adds, relative to the tree."""
    return source.patch_files(PATCH)


def patched(src: KernelSource) -> KernelSource:
    """The cached copy of `src` with the value-profiling patch (kpgo.kernel.source.patched_copy)."""
    return source.patched_copy(src, PATCH, "values", "kpgo's value-profiling patch",
                               "value profiles need a tree whose kernel/gcov is Linux 6.12's (the default source); build without --values on this one")


def _plugin_compiler(compiler: Compiler) -> str:
    """The C++ compiler of the same GCC: a plugin must be built by the GCC it loads into."""
    versioned = f"g++-{compiler.major}"
    if proc.which(versioned):
        return versioned
    if compiler.command == "gcc" and proc.which("g++"):
        return "g++"
    raise UserError(f"no C++ compiler of {compiler.name} to build kpgo's GCC plugin", f"install g++-{compiler.major}")


def plugin(compiler: Compiler) -> Path:
    check(compiler)
    src = PLUGIN_SOURCE.read_bytes()
    out = cache_dir() / "plugins" / f"gcov_percpu-{compiler.name}-{_digest(src, compiler.version_text().encode())}.so"
    if out.exists():  # built for this very compiler: its headers are not needed any more
        return out
    include = Path(proc.capture([compiler.command, "-print-file-name=plugin"]).strip()) / "include"
    if not (include / "plugin-version.h").exists():
        raise UserError(f"{compiler.name} has no plugin headers ({include})", f"install gcc-{compiler.major}-plugin-dev (`make setup` installs it)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}")
    say(f"values: building the GCC plugin {out.name}")
    proc.run([_plugin_compiler(compiler), "-shared", "-fPIC", "-fno-rtti", "-O2", "-Wall", f"-I{include}", "-o", str(tmp), str(PLUGIN_SOURCE)],
             what="the GCC plugin build")
    os.replace(tmp, out)
    return out


def plugin_digest() -> str:
    """What a value-profiled build's key holds of the plugin (its source; the compiler is in the key already)."""
    return _digest(PLUGIN_SOURCE.read_bytes())
