"""Execution counts of every arc and block from the arc counters, by flow conservation on the CFG of the .gcno.

GCC instruments only the arcs off a spanning tree; every other count follows from "what enters a block leaves it"
(gcov's solve_flow_graph). The solution is linear in the counters and depends only on the graph, so it is solved
once per build *symbolically*: each arc's count is a sparse combination {counter index: coefficient} of the
function's counters. Any number of profiles are then evaluated with one sparse product each.

`kpgo profile compare` uses it only for functions whose tree arcs do not form a spanning tree (with EXIT merged
into ENTRY); the others are solved for all functions at once by kpgo.analysis.characterize (subtree sums), which
gives the same counts (tests/test_profile_fast.py checks both on real GCC output).

API
    solve_function(fn) -> list[dict[int, int]] | None     expression of each arc (None if the graph is unsolvable)
    block_counts(fn, arc_expr) -> list[dict[int, int]]    expression of each block's count
    evaluate(expr, counters) -> int                       numeric value of one expression
"""

from __future__ import annotations

from collections import deque

import numpy as np

from kpgo.gcov.gcno import ARC_ON_TREE, GcnoFunction

Expr = dict[int, int]


def _add(acc: Expr, e: Expr, sign: int = 1) -> None:
    for k, v in e.items():
        nv = acc.get(k, 0) + sign * v
        if nv:
            acc[k] = nv
        else:
            acc.pop(k, None)


def solve_function(fn: GcnoFunction) -> list[Expr] | None:
    n = max(fn.n_blocks, 2)
    src = fn.arc_src.tolist()
    dst = fn.arc_dst.tolist()
    flags = fn.arc_flags.tolist()
    m = len(src)
    expr: list[Expr | None] = [None] * m
    k = 0
    for a in range(m):
        if not flags[a] & ARC_ON_TREE:
            expr[a] = {k: 1}
            k += 1
    outs: list[list[int]] = [[] for _ in range(n)]
    ins: list[list[int]] = [[] for _ in range(n)]
    for a in range(m):
        outs[src[a]].append(a)
        ins[dst[a]].append(a)
    unk_out = [sum(expr[a] is None for a in outs[b]) for b in range(n)]
    unk_in = [sum(expr[a] is None for a in ins[b]) for b in range(n)]
    count: list[Expr | None] = [None] * n
    work = deque(range(n))
    queued = [True] * n
    remaining = m - k

    def known_sum(arcs: list[int]) -> Expr:
        acc: Expr = {}
        for a in arcs:
            e = expr[a]
            if e is not None:
                _add(acc, e)
        return acc

    def settle(a: int, e: Expr) -> None:
        nonlocal remaining
        expr[a] = e
        remaining -= 1
        unk_out[src[a]] -= 1
        unk_in[dst[a]] -= 1
        for b in (src[a], dst[a]):
            if not queued[b]:
                queued[b] = True
                work.append(b)

    while work and remaining:
        b = work.popleft()
        queued[b] = False
        if count[b] is None:
            if ins[b] and unk_in[b] == 0:
                count[b] = known_sum(ins[b])
            elif outs[b] and unk_out[b] == 0:
                count[b] = known_sum(outs[b])
            elif not ins[b] and not outs[b]:
                count[b] = {}
            else:
                continue
        c = count[b]
        assert c is not None  # set above, or the loop continued
        if unk_out[b] == 1:
            a = next(x for x in outs[b] if expr[x] is None)
            e = dict(c)
            _add(e, known_sum(outs[b]), -1)
            settle(a, e)
        if unk_in[b] == 1:
            a = next(x for x in ins[b] if expr[x] is None)
            e = dict(c)
            _add(e, known_sum(ins[b]), -1)
            settle(a, e)
    if remaining:
        return None
    return [e if e is not None else {} for e in expr]


def block_counts(fn: GcnoFunction, arc_expr: list[Expr]) -> list[Expr]:
    """Block count = sum of its incoming arcs (sum of outgoing for the entry block)."""
    n = max(fn.n_blocks, 2)
    out: list[Expr] = [{} for _ in range(n)]
    src = fn.arc_src.tolist()
    dst = fn.arc_dst.tolist()
    has_in = [False] * n
    for a, e in enumerate(arc_expr):
        _add(out[dst[a]], e)
        has_in[dst[a]] = True
    for a, e in enumerate(arc_expr):
        if not has_in[src[a]]:
            _add(out[src[a]], e)
    return out


def evaluate(e: Expr, counters: np.ndarray) -> int:
    return int(sum(v * int(counters[k]) for k, v in e.items()))
