"""A profile directory read into one buffer: the relative paths of its .gcda files, and their bytes as an Image
for kpgo.gcov.gcda.index_image, the parser, which checks and indexes all of them at once.

API
    gcda_rels(src) -> list[str]                    relative paths of the .gcda files, sorted (as iter_gcda)
    read_file(path) -> bytes                       one file; an unreadable one is a one-line UserError
    read_image(src, rels) -> Image                 read the files (one buffer); no checks yet
"""

from __future__ import annotations

import os

from kpgo import inputs
from kpgo.errors import UserError
from kpgo.gcov.gcda import DAMAGED_GCNO_HINT, DAMAGED_HINT, Image, make_image


def gcda_rels(src: str | os.PathLike[str]) -> list[str]:
    """Relative paths ('/'-separated) of the .gcda files under src, sorted; hidden files and directories (our own
    temporary outputs) skipped, symbolic links to directories not followed (as os.walk)."""
    root = os.fspath(src)
    if not os.path.isdir(root):
        what = "is not a directory" if os.path.exists(root) else "does not exist"
        raise UserError(f"profile directory {root} {what}", "give a directory of .gcda files")
    out: list[str] = []
    nested: list[str] = []  # subdirectories that are profiles of their own (they hold a profile.json)
    stack = [("", root)]
    while stack:
        rel, path = stack.pop()
        with os.scandir(path) as it:
            for e in it:
                name = e.name
                if name.startswith("."):
                    continue
                if e.is_dir():
                    if not e.is_symlink():
                        stack.append((rel + name + "/", e.path))
                elif name.endswith(".gcda"):
                    out.append(rel + name)
                elif rel and name == "profile.json":
                    nested.append(rel.rstrip("/"))
    if nested:
        # `kpgo collect --workload a,b -o DIR` writes DIR/a and DIR/b: read as one, their files would land on the
        # wrong paths (a/kernel/sched.gcda) and mix two workloads.
        nested.sort()
        raise UserError(f"{root} holds {len(nested)} profiles ({', '.join(nested[:4])}{', ...' if len(nested) > 4 else ''}), "
                        "not one", f"pass one of them, e.g. {os.path.join(root, nested[0])}")
    out.sort()
    return out


def read_file(path: str) -> bytes:
    """The bytes of one file; an unreadable one, or a FIFO, device or directory named .gcda, is a one-line UserError
    naming it (kpgo.inputs: never a blocking open or an unbounded read)."""
    return inputs.read_bytes(path, DAMAGED_GCNO_HINT if path.endswith(".gcno") else DAMAGED_HINT)


def read_image(src: str | os.PathLike[str], rels: list[str]) -> Image:
    root = os.fspath(src)
    prefix = os.path.join(root, "")  # root + "/": the same strings as os.path.join(root, rel), cheaper
    return make_image(root, rels, [read_file(prefix + rel) for rel in rels])
