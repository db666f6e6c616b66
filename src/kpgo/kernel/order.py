"""Function order for GCC kernels without BOLT (issue 35 part 3; docs/LAYOUT.md "Function order").

From the call graph kpgo records from the emulator's branch records (`kpgo collect BUILD --branches`, kpgo.branches),
C3 (call-chain clustering: Ottoni & Maher, "Optimizing Function Placement for Large-Scale Data-Center Applications",
CGO 2017) gives an order of the functions that ran. A kernel compiled with -ffunction-sections (each C function in
its own section .text.NAME) is then linked with those sections first in its main text, in that order.

GNU ld 2.40 (Debian 12) has no --section-ordering-file, and Linux 6.12's x86 linker script puts only .text (and
.text.hot, .text.unlikely, ...) into its main text: the function sections of a -ffunction-sections build are orphans
that ld places after _etext, outside the kernel's text (20,000 orphan warnings on the tiny config, a failed link
under CONFIG_WERROR). kpgo's patch (kernel/order/text-sections.patch, applied to a cached copy of the source, never
the user's tree; Clang's AutoFDO builds use it too, kpgo.afdo) makes the main text take them, and with make's KPGO_FUNCTION_ORDER=FILE starts the main text with
the linker-script fragment FILE: one input-section line per ordered function, written here.

Static functions of the same name in several objects share a section name, and the kernel's `ld -r` into vmlinux.o
merges same-named sections into one. The call graph cannot tell them apart either (it names functions: the
recording's symbols, kpgo.branches.Functions), so an ordered name places all of its functions together; build.json
counts those names.

After the link, kpgo checks the binary: the ordered functions that have a section of their own must appear in
vmlinux at increasing addresses, right after the head text, with no other function among them; else the build
fails (build.json keeps ok: false), as a PGO build fails its proof.

API
    recording(path) -> Recording      the call graph, its kernel and branch records (one-line errors)
    plan(recording) -> Plan           C3 over it: the order
    write(plan, out) -> Path          the fragment and the order list in the build directory
    check(out, plan) -> dict          build.json's "order": the order found in the binary, the hot text's span
    hot_text(elf, weights)            the span and pages of the functions holding most of the weight
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kpgo import inputs
from kpgo.errors import InfraError, UserError
from kpgo.kernel import codesize, source
from kpgo.kernel.source import KernelSource

if TYPE_CHECKING:  # kpgo.branches pulls in numpy: imported where it is used
    from kpgo.branches import CallEdge

HERE = Path(__file__).parent
PATCH = HERE / "order" / "text-sections.patch"
MAKE_VAR = "KPGO_FUNCTION_ORDER"  # the make variable the patched arch/x86/kernel/Makefile passes to the linker script
FRAGMENT = "function-order.lds"  # in the build directory: what ld includes
LIST = "function-order.txt"  # the same order for people: name, weight, size, cluster
VERSION = 2  # of the algorithm, its settings and the fragment it writes: part of the build key
PAGE = 4096  # C3's cluster size limit: a cluster never grows past one page
# C3 does not append a cluster to its caller's when the merged cluster would be less than 1/8 as dense as the callee's
# own: a hot function glued behind a large, cold caller would spread its page over code that does not run.
DENSITY_DROP = 8.0
HOT_SHARES = (0.9, 0.99)  # the hot text measured: the functions holding these shares of the recorded weight
PAGE_4K, PAGE_2M = 4096, 2 << 20
HEAD_SLACK = 128  # function alignment and the __pfx_ padding between the head text and the first ordered function
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.$]*")  # what a function section name can hold (no ld wildcard characters)
PFX = "__pfx_"  # objtool's call padding in front of a function, in the function's own section
_COLD = re.compile(r"(.+)\.cold(\.[0-9]+)?")  # GCC's split-off cold part of NAME, in .text.unlikely.NAME


def sections_of(name: str) -> tuple[str, ...]:
    """The sections a -ffunction-sections build puts the function `name` in: .text.NAME, or .text.hot.NAME when a
    profile made it hot; a cold part NAME.cold lives in .text.unlikely.NAME (with NAME itself only when GCC found
    all of NAME unlikely). .text.unlikely.NAME is placed only for a cold part that ran: for NAME, it would drag the
    cold parts of every hot function into the hot text."""
    m = _COLD.fullmatch(name)
    return (f".text.unlikely.{m[1]}",) if m else (f".text.{name}", f".text.hot.{name}")


# ---- C3 ----

@dataclass(frozen=True)
class Node:
    name: str
    size: int  # bytes the function's section holds (every function of that name, their __pfx_ padding)
    weight: float  # taken branches leaving it in the recording (or, without records, calls in and out)


def c3(nodes: Mapping[str, Node], edges: Iterable[tuple[str, str, int]], page: int = PAGE,
       density_drop: float = DENSITY_DROP) -> list[list[str]]:
    """C3's clusters, in their final order. Every node starts as a cluster of its own. Nodes are taken in decreasing
    weight; each one's cluster is appended to the cluster of its most likely caller (the heaviest caller -> callee
    edge into it), unless they are the same cluster, the two together would pass `page` bytes, or the merged
    cluster would be more than `density_drop` times less dense than the callee's. The clusters are then sorted by
    density (weight per byte), densest first. Edges are (caller, callee, count); self calls and names that are not
    nodes are ignored; ties go by name, so the order is the same for the same input."""
    into: dict[tuple[str, str], int] = {}
    for caller, callee, count in edges:
        if caller != callee and caller in nodes and callee in nodes and count > 0:
            into[(caller, callee)] = into.get((caller, callee), 0) + count
    best: dict[str, tuple[int, str]] = {}  # callee -> (count, caller) of its heaviest caller
    for (caller, callee), count in into.items():
        have = best.get(callee)
        if have is None or count > have[0] or (count == have[0] and caller < have[1]):
            best[callee] = (count, caller)
    head = {n: n for n in nodes}  # node -> the first node of its cluster (the cluster's id)
    members = {n: [n] for n in nodes}
    size = {n: max(nodes[n].size, 1) for n in nodes}
    weight = {n: nodes[n].weight for n in nodes}
    for f in sorted(nodes, key=lambda n: (-nodes[n].weight, n)):
        if f not in best:
            continue
        cf, cp = head[f], head[best[f][1]]
        if cf == cp or size[cf] + size[cp] > page:
            continue
        merged = (weight[cf] + weight[cp]) / (size[cf] + size[cp])
        if merged * density_drop < weight[cf] / size[cf]:
            continue
        for m in members[cf]:  # the callee's cluster goes after the caller's
            head[m] = cp
        members[cp] += members.pop(cf)
        size[cp] += size.pop(cf)
        weight[cp] += weight.pop(cf)
    return [members[c] for c in sorted(members, key=lambda c: (-weight[c] / size[c], -weight[c], c))]


def hot_names(weights: Mapping[str, float], share: float) -> list[str]:
    """The fewest names, heaviest first, that together hold `share` of the total weight."""
    total = sum(w for w in weights.values() if w > 0)
    out: list[str] = []
    acc = 0.0
    for n in sorted((n for n, w in weights.items() if w > 0), key=lambda n: (-weights[n], n)):
        if acc >= share * total:
            break
        out.append(n)
        acc += weights[n]
    return out


# ---- the input: a branch profile's call graph, its kernel, its records ----

@dataclass(frozen=True)
class Recording:
    given: Path  # what the user passed (the profile directory or its call graph file)
    graph: Path  # the call graph (kpgo.branches.CALL_GRAPH_FILE)
    vmlinux: Path  # the kernel it was recorded on: the functions' names and sizes
    records: Path | None  # its branch records (the node weights), when kept beside it
    build_id: str


def recording(path: Path) -> Recording:
    """The call graph at `path` (a branch profile directory from `kpgo collect --branches`, or the call graph file in
    one) with the kernel it was recorded on, which its profile.json names. One-line errors for what does not fit."""
    from kpgo import branches

    path = Path(path).resolve()  # build.json names it, and the build runs elsewhere
    hint = "pass the directory `kpgo collect BUILD_DIR --branches` wrote (or its callgraph.tsv)"
    if path.is_dir():
        graph, home = path / branches.CALL_GRAPH_FILE, path
    elif inputs.is_regular(path):
        graph, home = path, path.parent
    else:
        raise UserError(f"call graph {path} is {inputs.kind(path)}" if path.exists() else f"call graph {path} not found", hint)
    if not os.path.lexists(graph):
        raise UserError(f"{path} holds no call graph ({branches.CALL_GRAPH_FILE})", hint)
    if not os.path.lexists(home / "profile.json"):
        raise UserError(f"the call graph {graph} has no profile.json beside it, so kpgo cannot tell which kernel it was "
                        "recorded on (the functions' sizes come from that vmlinux)", hint)
    manifest = inputs.read_json(home / "profile.json", hint, branches.MANIFEST_SHAPE)
    if manifest.get("kind") != branches.PROFILE_KIND:
        raise UserError(f"{home} is not a branch profile (profile.json kind {manifest.get('kind')!r})", hint)
    vmlinux, have = branches.recorded_kernel(manifest, f"the call graph {graph}")
    rec = home / branches.RECORDS_FILE
    return Recording(path, graph, vmlinux, rec if rec.is_file() else None, have)


def input_digest(r: Recording) -> str:
    """What a build key holds of an order: the call graph's and the records' bytes, the kernel they name, the
    algorithm and its settings."""
    h = hashlib.sha256()
    h.update(json.dumps({"version": VERSION, "page": PAGE, "density_drop": DENSITY_DROP, "build_id": r.build_id}).encode())
    again = "record the call graph again (`kpgo collect BUILD_DIR --branches`)"
    h.update(inputs.read_bytes(r.graph, again))
    if r.records is not None:
        h.update(inputs.read_bytes(r.records, again))
    return h.hexdigest()[:16]


def _read_graph(path: Path) -> list[CallEdge]:
    from kpgo import branches

    edges = branches.read_call_graph(path)  # a file that is no call graph (binary, a FIFO) is a UserError there
    if not edges:
        raise UserError(f"the call graph {path} holds no calls", "record the workload again with `kpgo collect --branches`")
    return edges


# ---- the plan: the order of one recording ----

@dataclass(frozen=True)
class Plan:
    recording: Recording
    order: tuple[str, ...]
    cluster_of: dict[str, int]  # name -> its cluster's rank in the order
    weights: dict[str, float]  # every recorded function's weight, by name (the hot text is measured with it)
    sizes: dict[str, int]
    stats: dict[str, Any]


def _weights(r: Recording, edges: list[CallEdge]) -> tuple[dict[str, float], str]:
    """Per function name, the taken branches leaving it (kpgo.branches.function_branches), or, without the records,
    the calls into and out of it."""
    out: dict[str, float] = {}
    if r.records is not None:
        from kpgo import branches

        records = branches.read_records(r.records, r.build_id)
        fns = branches.Functions(r.vmlinux)
        per = branches.function_branches(records, fns)
        for i in per.nonzero()[0].tolist():
            out[fns.names[i]] = out.get(fns.names[i], 0.0) + float(per[i])
        return out, "taken branches"
    for e in edges:
        for n in (e.caller, e.callee):
            out[n] = out.get(n, 0.0) + e.calls + e.tail_calls
    return out, "calls"


def _sizes(vmlinux: Path) -> tuple[dict[str, int], dict[str, int]]:
    """Per function name, the bytes of its section(s): the functions of that name (one name per address, as the call
    graph names them) and their __pfx_ padding; and how many functions share each name."""
    from kpgo import branches

    fns = branches.Functions(vmlinux)
    sizes: dict[str, int] = {}
    count: dict[str, int] = {}
    for name, start, end in zip(fns.names, fns.starts.tolist(), fns.ends.tolist()):
        key = name[len(PFX):] if name.startswith(PFX) else name
        sizes[key] = sizes.get(key, 0) + int(end - start)
        if key == name:
            count[name] = count.get(name, 0) + 1
    return {n: s for n, s in sizes.items() if n in count}, count


def plan(r: Recording, page: int = PAGE) -> Plan:
    edges = _read_graph(r.graph)
    sizes, count = _sizes(r.vmlinux)
    named = {n for e in edges for n in (e.caller, e.callee)}
    known = named & sizes.keys()
    if not known:
        raise UserError(f"the call graph {r.graph} names no function of {r.vmlinux} (e.g. {sorted(named)[0]})",
                        "pass the call graph recorded on that kernel (`kpgo collect BUILD_DIR --branches`)")
    weights, source_of_weight = _weights(r, edges)
    nodes = {n: Node(n, sizes[n], w) for n, w in weights.items() if w > 0 and n in sizes and _NAME.fullmatch(n)}
    clusters = c3(nodes, ((e.caller, e.callee, e.calls + e.tail_calls) for e in edges), page)
    order = tuple(n for c in clusters for n in c)
    total_calls = sum(e.calls + e.tail_calls for e in edges) or 1
    unknown_calls = sum(e.calls + e.tail_calls for e in edges if e.caller not in sizes or e.callee not in sizes)
    total_weight = sum(w for w in weights.values() if w > 0) or 1.0
    stats = {
        "algorithm": "C3", "version": VERSION, "page": page, "density_drop": DENSITY_DROP, "weights": source_of_weight,
        "functions": len(order), "clusters": len(clusters), "bytes": sum(sizes[n] for n in order),
        "graph_edges": len(edges), "graph_names_unknown": len(named - known), "graph_calls_unknown_share": round(unknown_calls / total_calls, 6),
        "weight_ordered_share": round(sum(nodes[n].weight for n in order) / total_weight, 6),
        # names that several functions share (static functions of several objects): all of them are placed together
        "shared_names": sum(1 for n in order if count.get(n, 0) > 1),
        "shared_functions": sum(count[n] for n in order if count.get(n, 0) > 1),
    }
    return Plan(r, order, {n: i for i, c in enumerate(clusters) for n in c}, weights, {n: sizes[n] for n in order}, stats)


def fragment_text(order: Sequence[str], comment: str = "") -> str:
    """The linker-script lines that place `order`: one input section description per function (its sections_of),
    so that ld keeps their order (one description with several patterns places its sections in input order)."""
    head = f"/* kpgo function order{': ' + comment if comment else ''} */\n"
    return head + "".join(f"*({' '.join(sections_of(n))})\n" for n in order)


_UNSAFE = re.compile(r"[\s\"'$\\]")


def check_out(out: Path) -> None:
    """The build directory can hold the fragment: its path goes through make, the shell and cpp into a quoted ld
    file name."""
    if _UNSAFE.search(str(out.resolve() / FRAGMENT)):
        raise UserError(f"the build directory {out.resolve()} has a blank, quote, $ or backslash in its path, which the function "
                        "order's linker-script fragment cannot be included from", "choose an -o without them")


def write(p: Plan, out: Path) -> Path:
    """The fragment (FRAGMENT) and the readable order (LIST) in the build directory `out`; returns the fragment."""
    check_out(out)
    frag = out.resolve() / FRAGMENT
    frag.write_text(fragment_text(p.order, f"C3 over {p.recording.graph}, {len(p.order)} functions"))
    lines = ["name\tweight\tsize\tcluster"] + [f"{n}\t{p.weights.get(n, 0):.0f}\t{p.sizes[n]}\t{p.cluster_of[n]}" for n in p.order]
    (out / LIST).write_text("\n".join(lines) + "\n")
    return frag


def patched(src: KernelSource) -> KernelSource:
    """The cached copy of `src` with the text-sections patch (kpgo.kernel.source.patched_copy)."""
    return source.patched_copy(src, PATCH, "order", "kpgo's text-sections patch",
                               "function order and Clang AutoFDO need Linux 6.12's linker script (the default source); build without them on this tree")


# ---- the binary: was the order applied, and what does the hot text span ----

def verify(relocatable: Path, linked: Path, order: Sequence[str]) -> dict[str, Any]:
    """The order as found in the linked binary. `relocatable` is what the final link placed (the kernel's vmlinux.o):
    it says which ordered names have a section of their own (sections_of: .text.NAME, .text.hot.NAME, a cold part's
    .text.unlikely.NAME; assembly, noinstr, sched and spinlock functions have none). Those must lie in `linked`'s
    .text at increasing addresses, from right after the head text (.head.text), with no other function among them."""
    secs = codesize.function_sections(relocatable)
    own = {n: secs.get(n, frozenset()) & set(sections_of(n)) for n in order}
    placeable = [n for n in order if own[n]]
    placed_sections = set().union(*own.values()) if own else set()
    syms = codesize.symbols(linked)
    text = syms.section(codesize.TEXT)
    if text is None:
        raise InfraError(f"{linked} has no .text section")
    first: dict[str, codesize.Function] = {}  # the lowest function of each name in .text: the ordered one
    for f in syms.functions:
        if text.holds(f.address) and not f.name.startswith(PFX) and (f.name not in first or f.address < first[f.name].address):
            first[f.name] = f
    first_at = {n: f.address for n, f in first.items()}
    missing = [n for n in placeable if n not in first_at]
    seq = [first_at[n] for n in placeable if n in first_at]
    inversions = sum(1 for a, b in zip(seq, seq[1:]) if b <= a)
    intruders: list[str] = []
    start = end = None
    if seq:
        names = set(placeable)
        start = min(seq)
        end = max(first[n].end for n in placeable if n in first)
        for f in syms.functions:
            if start <= f.address < end and not f.name.startswith(PFX) and f.name not in names and not (secs.get(f.name, frozenset()) & placed_sections):
                intruders.append(f.name)
    head = next((s.size for s in codesize.sections(relocatable) if s.name == ".head.text"), 0)
    base = syms.stext if syms.stext is not None else text.address
    offset = None if start is None else start - base
    ok = bool(seq) and not missing and inversions == 0 and not intruders and offset is not None and offset <= head + HEAD_SLACK
    return {"ok": ok, "placeable": len(placeable), "placed_in_order": len(seq) - inversions, "inversions": inversions,
            "missing": len(missing), "missing_examples": missing[:5], "intruders": len(intruders), "intruder_examples": intruders[:5],
            "start_offset": offset, "head_text": head, "region_bytes": None if start is None or end is None else end - start,
            "not_placeable": [n for n in order if not own[n]]}


def hot_text(elf: Path, weights: Mapping[str, float], share: float) -> dict[str, Any]:
    """Where the functions holding `share` of the weight lie in `elf`: their bytes, the bytes their addresses span
    (first start to last end), and the 4 KiB and 2 MiB pages they touch. A name with several functions counts all of
    them; names `elf` lacks (inlined there, or another kernel's) are counted with their share of the weight."""
    names = hot_names(weights, share)
    syms = codesize.symbols(elf)
    at: dict[str, list[codesize.Function]] = {}
    for f in syms.functions:
        at.setdefault(f.name, []).append(f)
    total = sum(w for w in weights.values() if w > 0) or 1.0
    ranges = {(f.address, f.end) for n in names for f in at.get(n, ())}
    pages4 = {p for a, e in ranges for p in range(a // PAGE_4K, (e - 1) // PAGE_4K + 1)}
    pages2 = {p for a, e in ranges for p in range(a // PAGE_2M, (e - 1) // PAGE_2M + 1)}
    lacking = [n for n in names if n not in at]
    # The entry text (syscall and interrupt entry) sits on the 2 MiB boundary after all the compiled code, where the
    # x86-64 linker script keeps it for page-table isolation: hot, but no order moves it, so the span of the rest is
    # given too.
    limit = syms.entry_text & -codesize.ENTRY_ALIGN if syms.entry_text is not None else None
    main = [r for r in ranges if limit is None or r[0] < limit]
    return {"share": share, "functions": len(names), "bytes": sum(e - a for a, e in ranges),
            "span": _span(ranges), "span_before_entry_text": _span(main),
            "pages_4k": len(pages4), "pages_2m": len(pages2), "missing": len(lacking),
            "missing_weight_share": round(sum(weights[n] for n in lacking) / total, 6)}


def _span(ranges: Iterable[tuple[int, int]]) -> int:
    r = list(ranges)
    return max(e for _, e in r) - min(a for a, _ in r) if r else 0


def recorded_hot_text(path: Path) -> dict[str, dict[str, Any]]:
    """hot_text of a branch profile's own kernel, per share of HOT_SHARES (e.g. a line of `kpgo profile stats`)."""
    r = recording(path)
    weights, _ = _weights(r, _read_graph(r.graph))
    return {f"{s:g}": hot_text(r.vmlinux, weights, s) for s in HOT_SHARES}


def hot_text_line(share: str, h: dict[str, Any]) -> str:
    return (f"hot text ({float(share):.0%} of the recorded weight): {h['functions']:,} functions, {_size(h['bytes'])}, spanning "
            f"{_size(h['span_before_entry_text'])} before the entry text, {h['pages_4k']:,} 4 KiB and {h['pages_2m']} 2 MiB pages")


def check(out: Path, p: Plan) -> dict[str, Any]:
    """build.json's "order" for the build in `out`: the plan, the order found in its vmlinux (verify), the weight
    share the placed functions hold, and the hot text before (the kernel the call graph was recorded on) and after."""
    found = verify(out / "vmlinux.o", out / "vmlinux", p.order)
    unplaced = found.pop("not_placeable")
    total = sum(w for w in p.weights.values() if w > 0) or 1.0
    heaviest = sorted(unplaced, key=lambda n: (-p.weights.get(n, 0.0), n))[:10]
    record = {
        "file": str(out.resolve() / FRAGMENT), "list": str(out.resolve() / LIST), "call_graph": str(p.recording.graph),
        "records": str(p.recording.records) if p.recording.records else None, "recorded_vmlinux": str(p.recording.vmlinux),
        "recorded_build_id": p.recording.build_id, **p.stats, **found,
        "weight_placed_share": round(sum(p.weights.get(n, 0.0) for n in p.order if n not in set(unplaced)) / total, 6),
        "not_placeable_heaviest": [{"function": n, "weight_share": round(p.weights.get(n, 0.0) / total, 6)} for n in heaviest],
        "hot_text": {f"{s:g}": {"recorded": hot_text(p.recording.vmlinux, p.weights, s), "built": hot_text(out / "vmlinux", p.weights, s)}
                     for s in HOT_SHARES},
    }
    return record


def enforce(record: dict[str, Any], out: Path) -> None:
    """Fail the build (after build.json is written with ok: false) when the binary does not show the order."""
    if record.get("ok"):
        return
    why = (f"{record['inversions']} out of order" if record["inversions"] else f"{record['intruders']} other functions among them (e.g. "
           f"{', '.join(record['intruder_examples'])})" if record["intruders"] else f"{record['missing']} missing from vmlinux" if record["missing"]
           else "none placed" if not record["placeable"] else f"they start {record['start_offset']} bytes into the text, not after the head text")
    raise InfraError(f"the function order was not applied: of {record['placeable']} ordered functions with a section of their own, {why}",
                     f"see {out / 'build.json'} (order) and {out / LIST}")


def _size(n: float) -> str:
    for unit, scale in (("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def summary_lines(record: dict[str, Any]) -> list[str]:
    """What `kpgo build` prints of an order."""
    lines = [f"order: C3 over {record['call_graph']} ({record['weights']}): {record['functions']:,} functions in {record['clusters']:,} clusters; "
             f"{record['placed_in_order']:,} placed first in the main text, in order ({'checked in vmlinux' if record['ok'] else 'NOT in order'}), "
             f"{record['functions'] - record['placeable']:,} without a section of their own (assembly, noinstr, sched, spinlock: "
             f"{1 - record['weight_placed_share'] / max(record['weight_ordered_share'], 1e-12):.1%} of the ordered weight)"]
    for share, sides in record.get("hot_text", {}).items():
        a, b = sides["recorded"], sides["built"]
        lines.append(f"hot text ({float(share):.0%} of the recorded weight, {a['functions']:,} functions, {_size(b['bytes'])}): spans "
                     f"{_size(a['span_before_entry_text'])} -> {_size(b['span_before_entry_text'])} before the entry text "
                     f"({_size(a['span'])} -> {_size(b['span'])} with it), 4 KiB pages {a['pages_4k']:,} -> {b['pages_4k']:,}, "
                     f"2 MiB pages {a['pages_2m']} -> {b['pages_2m']} (recorded kernel -> this one)")
    return lines

