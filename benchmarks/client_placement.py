"""Guest-client vs host-client profiles of the network workloads, side by side (the evidence for where the load
generator runs: docs/MEASUREMENTS.md, "Client placement").

    python benchmarks/client_placement.py --build BUILD/instrumented --guest PROFILES_G --host PROFILES_H \
        [--workload apache,nginx,...] [--top 20] -o OUT

PROFILES_G/NAME.raw and PROFILES_H/NAME.raw are `kpgo collect` outputs of the same instrumented build (the
guest client's, e.g. a `kpgo run` directory's profiles/, and `kpgo collect --client host`'s). Per workload it
prints and writes (OUT/results.json, OUT/summary.md): the similarity of the two profiles (`kpgo profile
compare`'s function and branch cosine, taken-probability L1), the kernel share of the window and the
throughput of each collection, the arc counts of the virtio-net and loopback drivers, and each profile's
`--top` functions by execution count, marked when they are not among the other profile's top, and the
functions whose share of all function executions moved most between the two. The outputs name the directories
BUILD, GUEST, HOST and OUT, never by this machine's absolute paths."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kpgo import atomic
from kpgo.analysis.characterize import compare_profiles
from kpgo.gcov.gcda import ARCS, read_gcda
from kpgo.report.profiles import top_functions

NETWORK = "apache,nginx,redis,memcached,mysql,postgresql"
DRIVERS = {"virtio_net": "drivers/net/virtio_net.gcda", "loopback": "drivers/net/loopback.gcda"}


def arcs(profile: Path, rel: str) -> int:
    path = profile / rel
    return int(read_gcda(path).counters(ARCS).sum()) if path.is_file() else 0


def side(profile: Path, shown: str) -> dict:
    meta = json.loads((profile / "profile.json").read_text())
    return {"profile": shown, "throughput": meta["throughput"], "kernel_share": meta.get("kernel_share"),
            "placement": meta.get("placement"), "drivers": {k: arcs(profile, rel) for k, rel in DRIVERS.items()}}


def shifts(guest: list[dict], host: list[dict], n: int) -> list[dict]:
    """The n functions that gained most share with the host client, then the n that lost most."""
    share: dict[tuple[str, str], dict] = {}
    for where, rows in (("guest", guest), ("host", host)):
        for r in rows:
            share.setdefault((r["object"], r["function"]), {"object": r["object"], "function": r["function"], "guest": 0.0, "host": 0.0})[where] = r["share"]
    ranked = sorted(share.values(), key=lambda r: r["host"] - r["guest"])
    return ranked[::-1][:n] + ranked[:n][::-1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", type=Path, required=True)
    ap.add_argument("--guest", type=Path, required=True)
    ap.add_argument("--host", type=Path, required=True)
    ap.add_argument("--workload", default=NETWORK)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("-o", "--out", type=Path, required=True)
    a = ap.parse_args()
    names = a.workload.split(",")
    dirs = {f"{w}/{where}": root / f"{w}.raw" for w in names for where, root in (("guest", a.guest), ("host", a.host))}
    missing = [str(d) for d in dirs.values() if not (d / "profile.json").is_file()]
    if missing:
        print(f"client_placement: no profile in {', '.join(missing)} — collect it first", file=sys.stderr)
        return 1
    cmp = compare_profiles(list(dirs.values()), a.build, names=list(dirs))
    every = top_functions(dirs, a.build, 10**9)  # every executed function, most executed first
    idx = {n: i for i, n in enumerate(cmp["names"])}
    out: dict = {"build": "BUILD", "top": a.top, "workloads": {}}
    where_out = a.out if not a.out.is_absolute() else "OUT"
    lines = ["# Guest client vs host client: the network workloads' kernel profiles", "",
             f"Command: `python benchmarks/client_placement.py --build BUILD --guest GUEST --host HOST --workload {a.workload} "
             f"--top {a.top} -o {where_out}` (BUILD: the instrumented build; GUEST and HOST: the directories of the guest-client "
             "and host-client profiles).", "",
             "| workload | function cosine | branch cosine | taken L1 | kernel share guest / host | throughput guest / host "
             "| virtio_net arcs guest / host | loopback arcs guest / host |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for w in names:
        g, h = idx[f"{w}/guest"], idx[f"{w}/host"]
        m = cmp["matrices"]
        row = {"function_cosine": m["function_cosine"][g][h], "branch_cosine": m["branch_cosine"][g][h],
               "taken_l1": m["taken_l1"][g][h], "guest": side(dirs[f"{w}/guest"], f"GUEST/{w}.raw"), "host": side(dirs[f"{w}/host"], f"HOST/{w}.raw"),
               "top": {"guest": every[f"{w}/guest"][:a.top], "host": every[f"{w}/host"][:a.top]},
               "shifts": shifts(every[f"{w}/guest"], every[f"{w}/host"], a.top)}
        out["workloads"][w] = row
        gs, hs = row["guest"], row["host"]
        lines.append(f"| {w} | {row['function_cosine']:.3f} | {row['branch_cosine']:.3f} | {row['taken_l1']:.3f} "
                     f"| {gs['kernel_share']:.1%} / {hs['kernel_share']:.1%} | {gs['throughput']:,.0f} / {hs['throughput']:,.0f} "
                     f"| {gs['drivers']['virtio_net']:,} / {hs['drivers']['virtio_net']:,} "
                     f"| {gs['drivers']['loopback']:,} / {hs['drivers']['loopback']:,} |")
    lines += ["", f"Top {a.top} kernel functions by execution count (share of all function executions); "
              f"**bold**: not among the other placement's top {a.top}.", ""]
    for w in names:
        top = out["workloads"][w]["top"]
        fns = {k: {r["function"] for r in v} for k, v in top.items()}
        lines += [f"## {w}", "", "| # | guest client | share | host client | share |", "|---:|---|---:|---|---:|"]
        for i in range(max(len(top["guest"]), len(top["host"]))):
            cells = []
            for where, other in (("guest", "host"), ("host", "guest")):
                if i < len(top[where]):
                    r = top[where][i]
                    name = f"`{r['function']}`"
                    cells += [f"**{name}**" if r["function"] not in fns[other] else name, f"{r['share']:.2%}"]
                else:
                    cells += ["", ""]
            lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
        lines += ["", f"Largest shifts in share (host − guest client), {a.top} each way:", "",
                  "| function | object | guest | host | shift |", "|---|---|---:|---:|---:|"]
        for r in out["workloads"][w]["shifts"]:
            lines.append(f"| `{r['function']}` | {r['object']} | {r['guest']:.3%} | {r['host']:.3%} | {r['host'] - r['guest']:+.3%} |")
        lines.append("")
    a.out.mkdir(parents=True, exist_ok=True)
    atomic.write_json(a.out / "results.json", out)
    atomic.write_text(a.out / "summary.md", "\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
