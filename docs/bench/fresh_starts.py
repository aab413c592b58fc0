"""Fresh starts of a node (issue 17: "start each two-card node from a fresh process at least three times: every
start healthy"): for every node given, `forge provision NODE --port 0 --metrics-port 0 --ready-file F` as a new
process, --starts times; per start the time until the ready file names the control URL, the control endpoint's
/health (every card of the node among healthy_cards?), then SIGTERM and the exit code (and whether the node
logged "stopped (clean)"). Writes starts.json and starts.md into --out after every start, so a stage cut short
keeps the starts it made; exits 0 only if every start was healthy and stopped cleanly.

    python docs/bench/fresh_starts.py NODE.yaml [NODE.yaml ...] [--starts 3] [--out DIR]
        [--ready-timeout 240] [--stop-timeout 120]

Every wait is bounded: a node not ready in --ready-timeout is recorded as such and stopped; one that does not
exit within --stop-timeout of SIGTERM is killed (SIGKILL) and recorded as killed. A SIGTERM to this script
(the stage's `timeout`) stops the node it is waiting on before it exits."""
from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import httpx

from forge.bench.env import describe
from forge.config.load import load_node
from forge.errors import ForgeError
from forge.hardware.probe import probe_nvml

POLL_S = 0.1
HEALTH_TIMEOUT_S = 10.0


class Stopped(Exception):
    """SIGTERM to this script: stop the node being started, write what was measured, exit."""


def one_start(node: Path, cards: list[str], work: Path, n: int, ready_timeout: float, stop_timeout: float) -> dict:
    ready, log = work / f"{node.stem}-{n}.ready", work / f"{node.stem}-{n}.log"
    ready.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "forge", "provision", str(node), "--port", "0", "--metrics-port", "0",
            "--ready-file", str(ready)]
    rec: dict = {"node": str(node), "start": n, "cards": cards, "log": str(log)}
    t0 = time.monotonic()
    with log.open("w") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
    try:
        while time.monotonic() - t0 < ready_timeout and proc.poll() is None:
            if ready.exists() and ready.read_text().strip():
                break
            time.sleep(POLL_S)
        url = ready.read_text().strip() if ready.exists() else ""
        if url and proc.poll() is None:
            rec["ready_s"] = round(time.monotonic() - t0, 2)
            rec["url"] = url
            try:
                rec["health"] = httpx.get(url + "/health", timeout=HEALTH_TIMEOUT_S).json()
            except (httpx.HTTPError, ValueError) as e:
                rec["problem"] = f"/health: {type(e).__name__}: {e}"
        elif proc.poll() is not None:
            rec["problem"] = f"exited with {proc.returncode} before it was ready"
        else:
            rec["problem"] = f"not ready within {ready_timeout:g} s"
    finally:
        rec.update(stop(proc, stop_timeout))
    health = rec.get("health") or {}
    rec["every_card_healthy"] = (health.get("status") == "ok" and sorted(health.get("healthy_cards", [])) == sorted(cards))
    text = log.read_text(errors="replace")
    rec["clean_stop"] = rec["exit_code"] == 0 and "stopped (clean)" in text and not rec["killed"]
    if not (rec["every_card_healthy"] and rec["clean_stop"]):
        rec["log_tail"] = text.strip().splitlines()[-8:]
    return rec


def stop(proc: subprocess.Popen, timeout: float) -> dict:
    if proc.poll() is not None:
        return {"exit_code": proc.returncode, "stop_s": 0.0, "killed": False}
    t = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=timeout)
        killed = False
    except subprocess.TimeoutExpired:
        proc.kill()
        rc, killed = proc.wait(timeout=30), True
    return {"exit_code": rc, "stop_s": round(time.monotonic() - t, 2), "killed": killed}


def summary(starts: list[dict]) -> dict:
    out = {}
    for node in dict.fromkeys(s["node"] for s in starts):
        mine = [s for s in starts if s["node"] == node]
        ready = [s["ready_s"] for s in mine if "ready_s" in s]
        out[node] = {"starts": len(mine), "healthy": sum(s["every_card_healthy"] for s in mine),
                     "clean_stops": sum(s["clean_stop"] for s in mine),
                     "ready_s": {"min": min(ready), "median": round(statistics.median(ready), 2),
                                 "max": max(ready)} if ready else None}
    return out


def markdown(data: dict) -> str:
    env = data["env"]
    gpus = data["gpus"]
    hw = (f"{len(gpus)}x {gpus[0]['model']} ({gpus[0]['memory_gib']:.1f} GiB); " if gpus else "no GPU (NVML); ")
    lines = ["# Fresh starts of a node", "", f"- date: {env['date']}",
             f"- hardware: {hw}{env['hardware']['cpu']}, {env['hardware']['cpu_cores_usable']} core(s) usable",
             "- software: " + ", ".join(f"{k} {v}" for k, v in env["software"].items()),
             f"- command: `{env['command']}`", "",
             "| node | start | ready s | healthy cards / cards | every card healthy | exit code | stop s | clean stop |",
             "| --- | ---: | ---: | --- | --- | ---: | ---: | --- |"]
    for s in data["starts"]:
        h = s.get("health") or {}
        got = ", ".join(h.get("healthy_cards", [])) or "none"
        lines.append(f"| {Path(s['node']).name} | {s['start']} | {s.get('ready_s', '—')} | {got} / "
                     f"{', '.join(s['cards'])} | {'yes' if s['every_card_healthy'] else 'NO'} | {s['exit_code']}"
                     f"{' (killed)' if s['killed'] else ''} | {s['stop_s']} | {'yes' if s['clean_stop'] else 'NO'} |")
    lines.append("")
    for node, m in data["summary"].items():
        r = m["ready_s"]
        lines.append(f"- {Path(node).name}: {m['healthy']} of {m['starts']} start(s) healthy on every card, "
                     f"{m['clean_stops']} stopped cleanly on SIGTERM" + (
                         f"; ready in {r['min']}–{r['max']} s (median {r['median']})" if r else ""))
    problems = [s for s in data["starts"] if "problem" in s or "log_tail" in s]
    if problems:
        lines += ["", "## Starts that were not healthy or clean", ""]
        for s in problems:
            lines += [f"**{Path(s['node']).name} start {s['start']}**: {s.get('problem', '')} (log: {s['log']})", "",
                      "```", *s.get("log_tail", []), "```", ""]
    lines += ["", "Ready s: from spawning `forge provision` to its ready file naming the control URL (every card's "
              "engine loaded in its worker). Healthy cards: /health's healthy_cards right after. Clean stop: exit "
              "code 0 after SIGTERM and the node's own \"stopped (clean)\" line.", ""]
    return "\n".join(lines)


def write(out: Path, data: dict) -> None:
    data["summary"] = summary(data["starts"])
    (out / "starts.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    (out / "starts.md").write_text(markdown(data), encoding="utf-8")


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("nodes", nargs="+", type=Path)
    ap.add_argument("--starts", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("fresh-starts"))
    ap.add_argument("--ready-timeout", type=float, default=240.0)
    ap.add_argument("--stop-timeout", type=float, default=120.0)
    a = ap.parse_args(argv)
    if a.starts < 1:
        ap.error("--starts: at least 1")
    try:                                         # a bad file: refused in one line, before any start
        cards = {n: [p.card_id for p in load_node(n).plans] for n in a.nodes}
    except ForgeError as e:
        print(f"fresh_starts: {e}", file=sys.stderr)
        return 2
    work = a.out / "work"
    work.mkdir(parents=True, exist_ok=True)

    def on_term(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)     # once: the node being stopped is not interrupted again
        raise Stopped()

    signal.signal(signal.SIGTERM, on_term)
    data = {"kind": "forge-fresh-starts", "env": describe(["python", *sys.argv], load_torch=False),
            "gpus": [{"index": g.index, "model": g.model, "memory_gib": g.memory_gib} for g in probe_nvml()],
            "starts": []}
    try:
        for node in a.nodes:
            for n in range(1, a.starts + 1):
                s = one_start(node, cards[node], work, n, a.ready_timeout, a.stop_timeout)
                data["starts"].append(s)
                write(a.out, data)
                print(f"{node.name} start {n}: ready {s.get('ready_s', '—')} s, healthy "
                      f"{s.get('health', {}).get('healthy_cards')}, exit {s['exit_code']}", flush=True)
    except Stopped:
        print("stopped by SIGTERM; the starts made so far are written", flush=True)
        data["cut_short"] = True
        write(a.out, data)
        return 1
    write(a.out, data)
    ok = all(s["every_card_healthy"] and s["clean_stop"] for s in data["starts"])
    print(f"wrote {a.out / 'starts.json'}, {a.out / 'starts.md'}: {'every start healthy' if ok else 'NOT every start healthy'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
