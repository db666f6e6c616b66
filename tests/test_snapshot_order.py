"""The gcov snapshot's read order (guest agent, snapshot_order): reading a .gcda runs kernel code whose counters sit in
other .gcda files (the copy made at open: a kvmalloc per function and counter kind; seq_file, slab, VFS), so a file
read late holds the reads before it. Here a simulated gcov tree: each read of any file counts once in the read
path's files; the idle system ticks a timer file now and then. Files a read of themselves changes go first, then
those a read of the tree changes, then the rest; the read path's files then hold a few reads, not a tree's worth."""

from __future__ import annotations

from pathlib import Path

import pytest

from test_workloads import agent

READ_PATH = ("mm/util.gcda", "mm/slub.gcda", "fs/seq_file.gcda")
TIMER = "kernel/time/timer.gcda"


class Kernel:
    """gcov counters as the agent sees them: a file's bytes are its counter; a read increments the read path's."""

    def __init__(self, root: Path, names: list[str]) -> None:
        self.root = root
        self.count = dict.fromkeys(names, 0)
        self.reads = 0
        for n in names:
            (root / n).parent.mkdir(parents=True, exist_ok=True)
            (root / n).write_bytes(b"")

    def read_all(self, path: str) -> bytes:
        name = str(Path(path).relative_to(self.root))
        data = str(self.count[name]).encode()  # the copy at open: before this read's own work
        self.reads += 1
        for n in READ_PATH:
            self.count[n] += 1
        if self.reads % 50 == 0:  # the idle system
            self.count[TIMER] += 1
        return data


@pytest.fixture
def kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[object, Kernel]:
    a = agent()
    names = [f"drivers/d{i}.gcda" for i in range(200)] + [f"net/n{i}.gcda" for i in range(200)] + [*READ_PATH, TIMER]
    root = tmp_path / "sys" / "gcov"
    k = Kernel(root / "build", names)
    monkeypatch.setattr(a, "GCOV_ROOT", str(root))
    monkeypatch.setattr(a, "read_all", k.read_all)
    return a, k


def held(a: object, k: Kernel, order: list[str]) -> dict[str, int]:
    """What each read-path file holds in a snapshot read in `order` after a reset (the window did nothing)."""
    for n in k.count:
        k.count[n] = 0
    return {str(Path(p).relative_to(k.root)): int(a.read_all(p)) for p in order}  # type: ignore[attr-defined]


def test_the_read_path_is_read_first(kernel: tuple[object, Kernel]) -> None:
    a, k = kernel
    timings: dict[str, float] = {}
    order, counts = a.snapshot_order("/build", timings)  # type: ignore[attr-defined]
    names = [str(Path(p).relative_to(k.root)) for p in order]
    assert sorted(names) == sorted(k.count) and "snapshot_order" in timings
    assert set(names[:3]) == set(READ_PATH) and counts[0] == 3 and counts[1] >= 3
    walk = held(a, k, a.gcda_paths(str(k.root)))  # type: ignore[attr-defined]
    ours = held(a, k, order)
    assert max(ours[n] for n in READ_PATH) <= 2  # the reads of the read path's files before it
    assert max(walk[n] for n in READ_PATH) > 100  # the walk's order: most of the tree's reads land in them
    assert all(v == 0 for n, v in ours.items() if n not in (*READ_PATH, TIMER))


def test_a_profile_read_in_the_walks_order_is_collected_again(tmp_path: Path) -> None:
    """A run's cached collection is kept only if its snapshot was read in this order: one made before holds the
    reads' own kernel work, so `kpgo run` collects it again."""
    import json

    from kpgo import pipeline, records, workloads

    def instrumented(key: str) -> records.Build:  # the run's instrumented build, as the collect step is handed it
        return records.Build(True, key, "instrumented", "6.12.0", None, {}, {}, None)

    wl = workloads.load("redis")
    raw = tmp_path / "redis.raw"
    raw.mkdir()
    old = {"kind": "kernel-gcov-profile", "build_key": "k1", "workload": {"name": "redis", "params": wl.params}}
    (raw / "profile.json").write_text(json.dumps(old))
    assert pipeline._collected(tmp_path, instrumented("k1"), wl) is None
    (raw / "profile.json").write_text(json.dumps(old | {"gcda_read_first": [40, 110]}))
    assert pipeline._collected(tmp_path, instrumented("k1"), wl) is not None
    assert pipeline._collected(tmp_path, instrumented("k2"), wl) is None
