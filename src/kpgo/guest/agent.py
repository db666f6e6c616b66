"""kpgo's agent inside the guest (stdlib only; runs under the guest kernel over the host's root).

It reads one JSON job from the shared run directory, starts the workload's server on loopback
with its data on tmpfs, warms it up, (collect mode) resets the kernel's gcov counters, runs the
measured load, (collect mode) snapshots every .gcda into one tar, and writes result.json.
One process reads all the .gcda files: under TCG each process spawn costs ~0.3 s and each file
written over 9p costs more, so a per-file loop would take minutes.

Usage: python3 agent.py JOB.json      (exit 0 on success; result.json holds the details)"""

import io
import json
import os
import re
import socket
import subprocess
import sys
import tarfile
import tempfile
import time

GCOV_ROOT = "/sys/kernel/debug/gcov"


class Failure(Exception):
    pass


def fill(argv, params):
    return [str(a).format(**params) for a in argv]


def mount_tmpfs():
    base = tempfile.mkdtemp(prefix="kpgo-")
    # Own tmpfs, so the workload's data never touches 9p.
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1g", "kpgo", base], check=False)
    return base


def ensure_debugfs():
    if not os.path.isdir(GCOV_ROOT):
        subprocess.run(["mount", "-t", "debugfs", "debugfs", "/sys/kernel/debug"], check=False)


def wait_tcp(addr, timeout, server):
    host, port = addr.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise Failure(f"server exited with status {server.returncode} before it was ready")
        try:
            with socket.create_connection((host, int(port)), timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise Failure(f"server not ready on {addr} within {timeout} s")


def run(argv, timeout, what):
    try:
        cp = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    except FileNotFoundError:
        raise Failure(f"{what}: program {argv[0]} not found in the guest") from None
    except subprocess.TimeoutExpired:
        raise Failure(f"{what} did not finish within {timeout} s") from None
    if cp.returncode != 0:
        tail = " | ".join(cp.stdout.strip().splitlines()[-3:])
        raise Failure(f"{what} failed with status {cp.returncode}: {tail}")
    return cp.stdout


def parse_metric(text, spec):
    rx = re.compile(spec["regex"], re.M)
    parts = {}
    for m in rx.finditer(text):
        parts[m.groupdict().get("name") or str(len(parts))] = float(m.group("value"))
    if not parts:
        raise Failure("the load generator's output has no line matching the metric regex")
    vals = list(parts.values())
    if spec.get("aggregate") == "hmean":
        value = len(vals) / sum(1.0 / v for v in vals) if all(v > 0 for v in vals) else 0.0
    elif spec.get("aggregate") == "sum":
        value = sum(vals)
    else:
        value = sum(vals) / len(vals)
    return value, parts


def gcov_reset():
    with open(os.path.join(GCOV_ROOT, "reset"), "w") as f:
        f.write("1")


def gcda_paths(root):
    """Every .gcda under root. Never follow or stat symlinks: the gcov tree links each .gcno
    to the build directory on the host, and a stat over 9p per link took 17-33 s in all."""
    found = []
    stack = [root]
    while stack:
        d = stack.pop()
        with os.scandir(d) as it:
            for e in it:
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                elif e.name.endswith(".gcda") and not e.is_symlink():
                    found.append(e.path)
    return found


def read_all(path):
    # debugfs seq_files report size 0, so read until EOF
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while True:
            b = os.read(fd, 1 << 20)
            if not b:
                return b"".join(chunks)
            chunks.append(b)
    finally:
        os.close(fd)


def snapshot(prefix, tar_path, timings):
    """All .gcda under the gcov tree, into one tar, named relative to the kernel build directory."""
    root = os.path.join(GCOV_ROOT, prefix.lstrip("/"))
    if not os.path.isdir(root):
        raise Failure(f"no gcov data for build directory {prefix} under {GCOV_ROOT} (is this the instrumented kernel?)")
    t = time.monotonic()
    paths = gcda_paths(root)
    timings["snapshot_list"] = round(time.monotonic() - t, 2)
    t = time.monotonic()
    data = [read_all(p) for p in paths]
    timings["snapshot_read"] = round(time.monotonic() - t, 2)
    now = int(time.time())
    with tarfile.open(tar_path, "w") as tf:
        for path, blob in zip(paths, data):
            info = tarfile.TarInfo(os.path.relpath(path, root))
            info.size = len(blob)
            info.mtime = now
            tf.addfile(info, io.BytesIO(blob))
    return len(paths), sum(len(b) for b in data)


def main(job_path):
    job = json.load(open(job_path))
    outdir = os.path.dirname(os.path.abspath(job_path))
    result = {"ok": False, "mode": job["mode"], "kernel": os.uname().release, "timings": {}, "runs": []}
    t0 = time.monotonic()
    server = None
    try:
        wl = job["workload"]
        rundir = mount_tmpfs()
        params = dict(wl["params"], rundir=rundir)
        log = open(os.path.join(rundir, "server.log"), "w")
        server = subprocess.Popen(fill(wl["server"]["argv"], params), stdout=log, stderr=subprocess.STDOUT, cwd=rundir)
        wait_tcp(fill([wl["server"]["ready_tcp"]], params)[0], float(wl["server"].get("ready_timeout", 60)), server)
        result["timings"]["ready"] = round(time.monotonic() - t0, 2)
        t = time.monotonic()
        run(fill(wl["warmup"]["argv"], params), float(wl["load"].get("timeout", 600)), "warm-up")
        result["timings"]["warmup"] = round(time.monotonic() - t, 2)
        if job["mode"] == "collect":
            ensure_debugfs()
            gcov_reset()
        for i in range(int(job.get("runs", 1))):
            t = time.monotonic()
            out = run(fill(wl["load"]["argv"], params), float(wl["load"].get("timeout", 600)), "load generator")
            secs = time.monotonic() - t
            with open(os.path.join(outdir, f"load-{i}.txt"), "w") as f:
                f.write(out)
            value, parts = parse_metric(out, wl["metric"])
            if value <= 0:
                raise Failure("the load generator reported zero throughput")
            result["runs"].append({"value": value, "parts": parts, "seconds": round(secs, 2)})
        if job["mode"] == "collect":
            t = time.monotonic()
            tar_tmp = os.path.join(rundir, "gcda.tar")
            n, nbytes = snapshot(job["build_dir"], tar_tmp, result["timings"])
            with open(tar_tmp, "rb") as src, open(os.path.join(outdir, "gcda.tar.partial"), "wb") as dst:
                while True:
                    chunk = src.read(1 << 20)
                    if not chunk:
                        break
                    dst.write(chunk)
            os.rename(os.path.join(outdir, "gcda.tar.partial"), os.path.join(outdir, "gcda.tar"))
            result["gcda_files"] = n
            result["gcda_bytes"] = nbytes
            result["timings"]["snapshot"] = round(time.monotonic() - t, 2)
        result["ok"] = True
    except Failure as e:
        result["error"] = str(e)
        try:
            result["server_log_tail"] = open(os.path.join(rundir, "server.log")).read()[-2000:]
        except Exception:
            pass
    finally:
        if server is not None and server.poll() is None:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
        result["timings"]["total"] = round(time.monotonic() - t0, 2)
        with open(os.path.join(outdir, "result.json.partial"), "w") as f:
            json.dump(result, f, indent=2)
        os.rename(os.path.join(outdir, "result.json.partial"), os.path.join(outdir, "result.json"))
    print("kpgo-agent: " + ("ok" if result["ok"] else "error: " + result.get("error", "")), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
