#!/usr/bin/env python3
"""Each application's honest bound and its transports' distance from it, from one run's output.

Usage: bounds.py APPS.txt [APPS-2GPU.txt] TRANSPORT.jsonl

APPS files hold the applications' lines ("NAME MODE key=value ... median_ms=... correct=yes"),
as device/run.sh writes them; TRANSPORT.jsonl is the transport benchmark's output of the same
run, from which the bulk copy bandwidth is taken.

A CPU-GPU application's bound is the largest of the times meant as what no implementation can
beat on that machine: its bytes at the bulk copy bandwidth (copy), its host side alone
(producer: the no-wait run's producer_ms, the time the streaming applications spent making
their messages, or the alternating applications' whole host side replayed against the kernel's
recorded results), its consumer alone (the no-wait run's time) and, for a streaming
application, its host pipeline (pipeline: its producer and the copies of what it makes, run
together with no consumer and no transport, so each on the host memory the other uses). A
replay is not the real
run: a mode faster than the bound (a ratio below 1) says the host-side term overestimates.
Where host and GPU strictly take turns, their sum is what the application cannot beat; the
table shows it (serial; meaningless for a streaming application), but the bound stays the
larger term. An inter-GPU application's bound is its no-wait run (tagged, and picked: the
transport wic::pick_peer_transport() picks, are modes of these only). Prints a Markdown table
with the ratio of each mode to the bound (launch: the CPU-GPU applications, whose consumer
kernels the channel launches per delivery), the term that binds, and alg1 / push per application
with their geometric mean. Standard library only.
"""

import json
import math
import os
import sys

MODES = ("nowait", "push", "launch", "tagged", "picked", "poll", "alg1")


def parse_apps(path):
    runs = {}
    with open(path) as f:
        for line in f:
            words = line.split()
            if len(words) < 3 or "=" in words[0] or words[1] not in MODES:
                continue
            fields = dict(w.split("=", 1) for w in words[2:] if "=" in w)
            if "median_ms" in fields:
                runs[(words[0], words[1])] = fields
    return runs


def bulk_gbps(path):
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("measurement") == "bulk_copy":
                return rec["gbps"]
    raise SystemExit(f"{path}: no bulk_copy measurement")


def main(argv):
    if len(argv) < 3:
        raise SystemExit(__doc__)
    *app_files, transport = argv[1:]
    gbps = bulk_gbps(transport)
    runs = {}
    for path in app_files:
        runs.update(parse_apps(path))
    apps = sorted({name for name, _ in runs}, key=lambda n: (not n.startswith("C_"), n))
    print(f"bulk copy: {gbps:.1f} GB/s (from {os.path.basename(transport)} of the same run)\n")
    print("| app | bound ms | binds | copy ms | producer ms | pipeline ms | nowait ms | serial ms | push / bound "
          "| launch / bound | tagged / bound | picked / bound | poll / bound | alg1 / bound | alg1 / push "
          "| all correct |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    ratios = []
    for app in apps:
        got = {m: runs.get((app, m)) for m in MODES}
        if not got["nowait"]:
            continue
        nowait = float(got["nowait"]["median_ms"])
        terms = {"consumer": nowait}
        copy = producer = None
        if "bytes" in got["nowait"]:
            copy = int(got["nowait"]["bytes"]) / (gbps * 1e6)
            producer = float(got["nowait"]["producer_ms"])
            terms["copy"] = copy
            terms["producer"] = producer
            if "pipeline_ms" in got["nowait"]:
                terms["pipeline"] = float(got["nowait"]["pipeline_ms"])
        binds = max(terms, key=terms.get)
        bound = terms[binds]

        def over(mode):
            r = got[mode]
            return f"{float(r['median_ms']) / bound:.2f}" if r else "-"

        alg1_push = "-"
        if got["push"] and got["alg1"]:
            r = float(got["alg1"]["median_ms"]) / float(got["push"]["median_ms"])
            ratios.append(r)
            alg1_push = f"{r:.2f}"
        correct = all(r["correct"] == "yes" for r in got.values() if r)
        serial = None if producer is None else producer + nowait + copy

        def ms(value):
            return "-" if value is None else f"{value:.2f}"

        print(f"| {app} | {bound:.2f} | {binds} | {ms(copy)} | {ms(producer)} | {ms(terms.get('pipeline'))} | "
              f"{nowait:.2f} | {ms(serial)} | {over('push')} | {over('launch')} | {over('tagged')} | {over('picked')} | "
              f"{over('poll')} | {over('alg1')} | {alg1_push} | {'yes' if correct else 'NO'} |")
    if ratios:
        geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        print(f"\nalg1 / push, geometric mean over {len(ratios)} applications: {geo:.2f}")


if __name__ == "__main__":
    main(sys.argv)
