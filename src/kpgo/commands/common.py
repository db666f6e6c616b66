"""Options shared by several subcommands."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

from kpgo.guest.contract import Workload  # stdlib only: cheap to import before a command starts
from kpgo.remote import Remote


def add_kernel_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("kernel")
    g.add_argument("--source", type=Path, metavar="PATH",
                   help="kernel tree or linux-*.tar.* (default: Debian's /usr/src/linux-source-6.12.tar.xz, extracted once into the cache)")
    g.add_argument("--base", metavar="NAME", default=None,
                   help="built-in base config: server (default), tiny, or Debian's own with modules: debian, debian-cloud (docs/PACKAGING.md)")
    g.add_argument("--config", type=Path, metavar="FILE", help="start from this .config instead of a built-in base")
    g.add_argument("--fragment", type=Path, action="append", default=[], metavar="FILE", help="config fragment merged on top (repeatable)")
    g.add_argument("-j", "--jobs", type=int, default=(os.cpu_count() or 2) + 1, help="parallel compile jobs (default: cores + 1)")


def add_guest_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("guest")
    g.add_argument("--cpus", type=int, default=None,
                   help="guest vCPUs (default: with a host client, one per host core but the client's, QEMU pinned to them; otherwise 2)")
    g.add_argument("--memory", default="2G", help="guest memory (default 2G)")
    g.add_argument("--guest-timeout", type=float, default=900, metavar="SECONDS", help="hard limit per guest boot (default 900)")
    g.add_argument("--data", choices=("tmpfs", "disk"), default="tmpfs",
                   help="where each workload's data lives in the guest: tmpfs (default), or disk: ext4 on a virtio disk (a sparse "
                   "image made on the host for each boot; needs mkfs.ext4 and a kernel with VIRTIO_BLK and EXT4_FS)")


def add_cluster_option(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--cluster", metavar="ADDRESS",
                   help=f"{what} on a Ray cluster: a Ray address (host:port), auto, or local (needs kpgo[cluster]); each step a task "
                   "on a node that has what it needs, a guest only on nodes with the kpgo_guest resource, one per node at a time (docs/SCALE.md)")


def cluster_from(args: argparse.Namespace) -> Remote | None:
    """--cluster as what the steps are handed (a kpgo.cluster.Cluster, a kpgo.remote.Remote; making it imports no
    Ray), or None."""
    if not getattr(args, "cluster", None):
        return None
    from kpgo.cluster import Cluster

    return Cluster(args.cluster)


def add_workload_options(p: argparse.ArgumentParser) -> None:
    from kpgo import workloads

    p.add_argument("--workload", default="redis", metavar="NAME[,NAME...]",
                   help=f"workload(s): {', '.join(workloads.names())}, or all (default redis; see `kpgo workloads list`)")
    p.add_argument("--set", action="append", default=[], metavar="[NAME.]KEY=VALUE",
                   help="override a workload parameter, for every chosen workload that has it or for NAME only (repeatable)")
    p.add_argument("--client", choices=workloads.CLIENTS, default=workloads.DEFAULT_CLIENT,
                   help="where the load generators of the network servers run: on the host (default) against 127.0.0.1 ports "
                   "QEMU forwards to the guest's virtio NIC, pinned to a core of its own, or in the guest over loopback "
                   "(docs/WORKLOADS.md); micro and the embedded databases have no client")


def chosen_workloads(args: argparse.Namespace) -> list[Workload]:
    """The --workload list with --set applied; fails before any boot if a package is missing."""
    from kpgo import workloads

    specs = workloads.load_many(args.workload, args.set, getattr(args, "client", workloads.DEFAULT_CLIENT))
    prepare_workloads(specs)
    return specs


def prepare_workloads(specs: list[Workload]) -> None:
    """Last of the checks, as it may compile a helper: Debian packages present, helpers built, the host
    client's ports free — before any build or boot."""
    from kpgo import client
    from kpgo.workloads import install

    install.require(specs)
    client.check_host(specs)


def guest_from(args: argparse.Namespace):  # -> vm.Guest
    from kpgo import vm

    # --cpus and --guest-timeout are checked with the other shared options before any command starts (cli.CHECKED_OPTIONS).
    return vm.Guest(cpus=args.cpus, memory=args.memory, timeout=args.guest_timeout, data=args.data)


def add_design_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("benchmark design")
    g.add_argument("--boots", type=int, default=3,
                   help="boots per kernel and workload (default 3; a 95%% interval needs ≥ 2, below that a ratio gets its range); "
                   "with --precision, the rounds booted before any is added")
    g.add_argument("--precision", type=float, default=None, metavar="P",
                   help="add randomized rounds (every cell of the workloads not there yet) until every kernel's interval on the "
                   "headline metric (simulated kernel instructions/op, else the speedup) is within ±P of its ratio on every workload, e.g. 0.015 for ±1.5%%, "
                   "or until --max-boots or --max-time; the tables say which cells stopped wider (docs/EVALUATION.md)")
    g.add_argument("--max-boots", type=int, default=10, metavar="N", help="with --precision: rounds at most (default 10)")
    g.add_argument("--max-time", type=duration, default=None, metavar="DURATION",
                   help="with --precision: begin a round only if it should end within this time of booting, e.g. 90m, 6h, 1h30m")
    g.add_argument("--runs", type=int, default=1, help="measured runs per boot after the warm-up (default 1)")
    g.add_argument("--order", choices=("random", "abba"), default="random",
                   help="boot order per round: random (randomized blocks, default) or abba (alternating A B / B A)")
    g.add_argument("--seed", type=int, help="seed of the random order (default: the earlier bench's in the same directory, else drawn and recorded)")
    g.add_argument("--sim", action=argparse.BooleanOptionalAction, default=None,
                   help="count guest instructions, taken and indirect branches and simulated L1i/iTLB misses per operation with kpgo's QEMU "
                   "plugin (docs/SIM.md); default: on when guests run under TCG (no working KVM), where they are the headline, "
                   "off under KVM; --no-sim turns them off")
    g.add_argument("--sim-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="simulator settings, e.g. l1i_size=64k, l1i_assoc=8, l1i_line=64, itlb_entries=64, itlb_assoc=4, "
                   "itlb_kpage=4k (default 2M: kernel text on huge pages), boot=on (one more window from power-on to the guest agent: "
                   "the cost of booting), icount=off (default 5: a 1-vCPU guest's clock advances 2^5 ns per instruction, so "
                   "per-operation counts do not follow the host's speed); repeatable")


def design_from(args: argparse.Namespace):  # -> bench.Design
    from kpgo import bench

    return bench.Design(boots=args.boots, runs=args.runs, order=args.order, seed=args.seed, precision=args.precision,
                        max_boots=args.max_boots, max_time=args.max_time)


_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?")


def duration(text: str) -> float:
    """'90m', '6h', '1h30m', '45s' or plain seconds, in seconds (argparse type)."""
    m = _DURATION.fullmatch(text.strip())
    if not text.strip() or m is None or not any(m.groups()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (e.g. 90m, 6h, 1h30m or seconds)")
    h, mi, sec = (float(x) if x else 0.0 for x in m.groups())
    return h * 3600 + mi * 60 + sec


def sim_from(args: argparse.Namespace):  # -> bench.SimChoice
    """--sim / --no-sim / neither (auto: simulated exactly when guests run under TCG) with --sim-opt."""
    from kpgo import bench, sim

    return bench.SimChoice(sim_mode(args), sim.SimConfig.parse(",".join(args.sim_opt)))


def sim_mode(args: argparse.Namespace) -> str:
    """bench.SIM_MODES from --sim / --no-sim / neither."""
    from kpgo.errors import UserError

    if args.sim_opt and args.sim is False:
        raise UserError("--sim-opt given with --no-sim", "drop one of them")
    return {None: "auto", True: "on", False: "off"}[args.sim]
