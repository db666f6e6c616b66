"""What the commands hand the steps when they run elsewhere (--cluster): kpgo.cluster.Cluster meets this protocol.

The steps (kpgo.bench, kpgo.collect, kpgo.pipeline, kpgo.study) use it and never import kpgo.cluster, which imports
them: the cluster's tasks run those steps' own code on the nodes. So data flows one way: the commands build a
Cluster from --cluster, the steps call it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

from kpgo.errors import KpgoError


class Remote(Protocol):
    address: str  # the Ray address (host:port, ray://host:port, auto or local)

    def bench_runner(self) -> AbstractContextManager[Any]:
        """A kpgo.bench.Runner booting each bench boot as a task there, connected for the block."""
        ...

    def collect(self, build_dir: Path, key: str, workloads: list[Any], guest: Any) -> Iterator[tuple[Any, dict[str, Any], bytes | None]]:
        """Each workload's collection a task there; yields (workload, outcome, the tar of its directory) as each ends."""
        ...

    def builds(self, reqs: list[Any], source_arg: Path | None) -> Iterator[tuple[Any, dict[str, Any] | KpgoError]]:
        """Each kernel build a task there, written here as it ends; yields (request, build.json or the error)."""
        ...

    def merge(self, dirs: list[Path], dst: Path, **kw: Any) -> dict[str, Any]:
        """kpgo.gcov.merge.merge_profiles as a tree of tasks there."""
        ...
