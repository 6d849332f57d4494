#!/usr/bin/env python3
"""Derives an emulator calibration file from the results of device/bench/calibrate.cu.

Usage: derive.py RESULTS.json INPUT.toml OUTPUT.toml

Every constant that a measurement determines gets the measured value, `measured = true` and a
source naming the device, the driver, the measurement and its date; every other constant is
copied unchanged. Measurements that only fix a sum of several constants do not set any of them:
the sum is written as a comment at the top of OUTPUT.toml (and printed), next to what the model
currently assumes, so nobody has to invent a split.

How emu/src/sim/ (fault_path.rs, wicd.rs) uses the fault-path constants (this decides what a measurement determines):

  A GPU access to an unmapped page raises one fault-buffer entry. When the bottom half is idle it
  starts after `fault.interrupt_to_bh_ns` (I) and takes up to `fault.batch_max` entries. A batch
  of n entries costs `fault.batch_fixed_ns + n * fault.per_fault_ns` (B + n P), plus, per
  managed page it migrates, `link.pcie_ns(4 KiB)` = `pcie_latency_ns + 4096 / pcie_gbps` (M).
  After a batch that serviced anything, a replay follows after `fault.replay_ns` (R); the replay
  flushes the buffer, every still-unmapped stalled access faults again and the bottom half goes
  on at once with the next batch (no new interrupt latency).

So, for W warps touching W distinct pages at the same moment:
  one batch (W <= batch_max, all served by one replay):
      stall of every warp  = I + B + W (P + M) + R          (host-resident pages)
                           = I + B + W P + R                (pages that need no migration)
  many batches (W >> batch_max):
      d(max stall) / dW    = (B + R) / batch_max + P + M

The unpopulated variant (never-touched pages: the fault populates them on the GPU, no copy)
therefore determines P as the slope of the single-batch window over W; the W = 1 windows only
determine I + B + R (no-migration) and I + B + R + M (host-resident); the large-W slope only
determines (B + R) / batch_max + P + M. I, B and R stay estimates; their measured sums are
recorded.
"""

import datetime
import json
import math
import re
import sys
import textwrap

try:
    import tomllib
except ImportError:  # python < 3.11: the output is checked by the hand parser only
    tomllib = None

PROGRAM = "device/bench/run.sh"


def fail(message):
    sys.exit(f"derive.py: error: {message}")


# ---- the calibration file (simple TOML: [section.name] tables of value / source / measured) ----

SECTION = re.compile(r"^\[([A-Za-z0-9_]+\.[A-Za-z0-9_]+)\]\s*(#.*)?$")
KEY = re.compile(r"^(value|source|measured)\s*=\s*(.*?)\s*$")
INT = re.compile(r"^[+-]?[0-9][0-9_]*$")


def parse_basic_string(raw, where):
    if len(raw) < 2 or raw[0] != '"' or raw[-1] != '"':
        fail(f"{where}: expected a double-quoted string, got {raw}")
    out, i, body = [], 0, raw[1:-1]
    while i < len(body):
        ch = body[i]
        if ch == "\\":
            nxt = body[i + 1] if i + 1 < len(body) else ""
            mapping = {'"': '"', "\\": "\\", "n": "\n", "t": "\t", "r": "\r"}
            if nxt not in mapping:
                fail(f"{where}: unsupported escape \\{nxt}")
            out.append(mapping[nxt])
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def quote(text):
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    escaped = "".join(ch if ord(ch) >= 0x20 else f"\\u{ord(ch):04x}" for ch in escaped)
    return f'"{escaped}"'


def parse_calibration(text, path):
    """Returns (lines, constants) where constants[name] = {value, raw, is_int, source, measured,
    and the line numbers of each key and of the section header}."""
    lines = text.splitlines()
    constants, current = {}, None
    for number, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        m = SECTION.match(stripped)
        if m:
            current = m.group(1)
            if current in constants:
                fail(f"{path}:{number + 1}: [{current}] appears twice")
            constants[current] = {"header": number}
            continue
        m = KEY.match(stripped)
        if not m or current is None:
            fail(f"{path}:{number + 1}: unexpected line: {line}")
        key, raw = m.group(1), m.group(2)
        if "#" in raw and not raw.startswith('"'):
            raw = raw.split("#", 1)[0].strip()
        entry = constants[current]
        entry[key + "_line"] = number
        where = f"{path}:{number + 1}"
        if key == "value":
            entry["raw"] = raw
            entry["is_int"] = bool(INT.match(raw))
            try:
                entry["value"] = int(raw.replace("_", "")) if entry["is_int"] else float(raw)
            except ValueError:
                fail(f"{where}: value is not a number: {raw}")
        elif key == "source":
            entry["source"] = parse_basic_string(raw, where)
        else:
            if raw not in ("true", "false"):
                fail(f"{where}: measured must be true or false")
            entry["measured"] = raw == "true"
    for name, entry in constants.items():
        if "value" not in entry or "source" not in entry:
            fail(f"{path}: [{name}] needs a value and a source")
        entry.setdefault("measured", False)
    return lines, constants


def format_value(entry, value, decimals):
    if entry["is_int"]:
        return str(max(1, int(round(value))) if value > 0 else int(round(value)))
    text = f"{value:.{decimals}f}"
    return text if "." in text else text + ".0"


def write_calibration(lines, constants, updates, header_notes):
    """updates[name] = (formatted value, source). Returns the new file's text."""
    out = list(lines)
    inserts = {}
    for name, (value_text, source) in updates.items():
        entry = constants[name]
        out[entry["value_line"]] = f"value = {value_text}"
        out[entry["source_line"]] = f"source = {quote(source)}"
        if "measured_line" in entry:
            out[entry["measured_line"]] = "measured = true"
        else:
            inserts[entry["source_line"]] = "measured = true"
    result = []
    for number, line in enumerate(out):
        result.append(line)
        if number in inserts:
            result.append(inserts[number])
    # The notes go after the leading comment block.
    first_section = next(i for i, line in enumerate(result) if SECTION.match(line.strip()))
    block = ["# " + "-" * 95]
    for note in header_notes:
        indent = len(note) - len(note.lstrip())
        block += textwrap.wrap(note, width=98, initial_indent="# ", subsequent_indent="# " + " " * (indent + 4),
                               break_on_hyphens=False) or ["#"]
    block += ["# " + "-" * 95, ""]
    head = result[:first_section]
    # A block written by an earlier run of this script (when its output is the input) is replaced.
    rule = "# " + "-" * 95
    marks = [i for i, line in enumerate(head) if line.strip() == rule]
    if len(marks) >= 2 and head[marks[0] + 1].startswith("# Derived by device/bench/derive.py"):
        head = head[: marks[0]] + head[marks[1] + 1:]
    while head and not head[-1].strip():
        head.pop()
    return "\n".join(head + [""] + block + result[first_section:]) + "\n"


# ---- reading the results -------------------------------------------------------------------------


def get(tree, *path):
    for key in path:
        if not isinstance(tree, dict) or key not in tree:
            return None
        tree = tree[key]
    return tree


def finite(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def median(values):
    v = sorted(x for x in values if finite(x))
    if not v:
        return None
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


def slope(points):
    """Least-squares slope of (x, y) points."""
    pts = [(x, y) for x, y in points if finite(x) and finite(y)]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sxx if sxx else None


def by_warps(results, name):
    """The entries of a fault run by warp count, those with the numbers derive needs only."""
    needed = ("window_ns", "resident_load_median_ns", "stall_max_ns")
    return {int(e["warps"]): e for e in get(results, name, "by_warps") or []
            if finite(e.get("warps")) and all(finite(e.get(k)) for k in needed)}


def single_replay(entry):
    """Whether most reps resumed all W warps together (one replay, hence one batch)."""
    groups = entry.get("reps_resume_groups") or []
    return bool(groups) and sum(1 for g in groups if g == 1) * 2 > len(groups)


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__.split("\n\n")[1])
    results_path, input_path, output_path = sys.argv[1:]
    with open(results_path, encoding="utf-8") as f:
        data = json.load(f)
    with open(input_path, encoding="utf-8") as f:
        lines, constants = parse_calibration(f.read(), input_path)

    dev = data.get("device") or {}
    results = data.get("results") or {}
    device_name = dev.get("name", "unknown device")
    driver = dev.get("driver_version", "unknown")
    date = (data.get("date_utc") or datetime.date.today().isoformat())[:10]

    def source(what):
        return f"measured on {device_name}, driver {driver}: {PROGRAM} ({what}), {date}"

    values = {name: entry["value"] for name, entry in constants.items()}
    updates, notes, skipped = {}, [], []

    def set_constant(name, value, decimals, what):
        if name not in constants:
            fail(f"{input_path} has no [{name}]")
        text = format_value(constants[name], value, decimals)
        updates[name] = (text, source(what))
        values[name] = float(text) if "." in text else int(text)

    def skip(name, why):
        skipped.append((name, why))

    # ---- direct mappings ----------------------------------------------------------------------

    # link.pcie_latency_ns: one way = half the host -> GPU -> host round trip through pinned
    # mapped memory (the file's previous source used the same definition, from gdrcopy).
    rtt = get(results, "mapped_poll_round_trip", "round_trip_ns", "median")
    if finite(rtt) and rtt > 0:
        set_constant("link.pcie_latency_ns", rtt / 2, 0,
                     f"mapped_poll_round_trip: median round trip {rtt:.0f} ns over pinned mapped memory / 2")
        gpu_read = get(results, "mapped_poll_round_trip", "gpu_read_pinned_word_ns", "median")
        if finite(gpu_read):
            notes.append(f"GPU read of a pinned host word (one PCIe read round trip): median {gpu_read:.0f} ns")
    else:
        skip("link.pcie_latency_ns", "no round-trip result")

    # link.pcie_gbps: the model moves migrated pages and copies at this rate (H2D is the
    # direction of host producers and of host-resident pages).
    h2d = get(results, "pcie_copy", "h2d_gbps")
    if finite(h2d) and h2d > 0:
        set_constant("link.pcie_gbps", h2d, 2, "pcie_copy: cudaMemcpy 256 MiB pinned host to device, median")
        d2h = get(results, "pcie_copy", "d2h_gbps")
        if finite(d2h):
            notes.append(f"pcie_copy D2H: {d2h:.2f} GB/s (the model has one PCIe rate; H2D is used)")
    else:
        skip("link.pcie_gbps", "no pcie_copy result")

    # fault.cpu_fault_ns: the model charges it when a host producer writes a flag page that sits
    # on the GPU. Median over pages written one after the other; if most of those writes did not
    # fault (the driver brought neighbours back with an earlier fault), the isolated-page median.
    cpu = get(results, "cpu_fault_on_gpu_page")
    if cpu and finite(get(cpu, "per_page_ns", "median")):
        fast = cpu.get("share_under_1us") or 0.0
        if fast > 0.5 and finite(get(cpu, "isolated_ns", "median")):
            v = cpu["isolated_ns"]["median"]
            set_constant("fault.cpu_fault_ns", v, 0,
                         "cpu_fault_on_gpu_page: CPU write to one GPU-resident managed page, isolated, median")
            notes.append(f"cpu_fault_on_gpu_page: {fast:.0%} of the page-by-page writes took < 1 us "
                         "(no fault of their own); the isolated-page median is used")
        else:
            v = cpu["per_page_ns"]["median"]
            set_constant("fault.cpu_fault_ns", v, 0,
                         "cpu_fault_on_gpu_page: CPU write of one byte per GPU-resident managed page, median")
    else:
        skip("fault.cpu_fault_ns", "no cpu_fault_on_gpu_page result")

    # host.memcpy_gbps: wicd copies message bytes into pinned pages; streaming source.
    mc = get(results, "host_memcpy", "streaming_gbps")
    if finite(mc) and mc > 0:
        set_constant("host.memcpy_gbps", mc, 2,
                     "host_memcpy: one thread, 64 KiB chunks into pinned memory, streaming source, median")
        hot = get(results, "host_memcpy", "hot_source_gbps")
        if finite(hot):
            notes.append(f"host_memcpy with a cache-hot source: {hot:.2f} GB/s (streaming {mc:.2f} GB/s is used)")
    else:
        skip("host.memcpy_gbps", "no host_memcpy result")

    # poll.issue_weight: in the model each computing warp runs at
    # min(warp_ipc, schedulers / (computing + w * polling)); with issue-bound compute, c compute and
    # p polling warps per SM, slowdown = (c + w p) / c, so w = (slowdown - 1) c / p. calibrate.cu
    # computes w that way; it is used only when the compute was issue-bound and the same formula
    # gives ~1 for co-runners that run the compute loop themselves.
    poll = get(results, "poll_issue_weight")
    if poll and finite(poll.get("value")):
        w = poll["value"]
        bound = get(poll, "issue_bound_check", "issue_bound")
        check = poll.get("validation_weight_fma_corunner")
        c, p = poll.get("compute_warps_per_sm"), poll.get("polling_warps_per_sm")
        aa = get(poll, "modes", "none_again", "slowdown_cycles")
        resolution = abs(aa - 1.0) * c / p if finite(aa) and c and p else None
        if bound is not True:
            skip("poll.issue_weight", "the compute loop was not issue-bound, the formula does not apply")
        elif not (finite(check) and 0.7 <= check <= 1.3):
            skip("poll.issue_weight", f"the method's check failed: co-running compute warps gave w = {check}, not ~1")
        else:
            clamped = min(1.0, max(0.0, w))
            set_constant("poll.issue_weight", clamped, 4,
                         "poll_issue_weight: managed-flag tight poll loop, (slowdown - 1) * c / p with "
                         f"c = {c} issue-bound compute and p = {p} polling warps per SM, median")
            if clamped != w:
                notes.append(f"poll.issue_weight: measured {w:.4f}, clamped to {clamped} (model range 0..1)")
            if resolution is not None:
                notes.append(f"poll.issue_weight resolution (same run twice, no pollers): +-{resolution:.4f}")
        for key in ("pinned_tight", "device_nanosleep_backoff", "managed_atomic_tight", "fma_corunner"):
            wk = get(poll, "modes", key, "issue_weight")
            if finite(wk):
                notes.append(f"poll weight of {key}: {wk:.4f}")
    else:
        skip("poll.issue_weight", "no poll_issue_weight result")

    # ---- the fault path ---------------------------------------------------------------------------
    unpop = by_warps(results, "fault_first_touch_unpopulated")
    host = by_warps(results, "fault_first_touch")
    batch_max = values["fault.batch_max"]

    # P: slope of the single-batch window (last load end - first load start) over W for pages
    # that need no migration: window(W) - window(1) = (W - 1) P. The largest W that one replay
    # served is used (more entries, less noise).
    per_fault = None
    if 1 in unpop:
        for w in (256, 16):
            if w in unpop and w <= batch_max and single_replay(unpop[w]):
                d = unpop[w]["window_ns"] - unpop[1]["window_ns"]
                per_fault = d / (w - 1)
                notes.append(f"unpopulated pages, one replay for W={w}: (window({w}) - window(1)) / {w - 1} = "
                             f"{per_fault:.0f} ns per entry")
                if per_fault > 0:
                    set_constant("fault.per_fault_ns", per_fault, 0,
                                 f"fault_first_touch_unpopulated: (window(W={w}) - window(1)) / {w - 1}, "
                                 "faults on never-touched managed pages served by one batch and one replay")
                else:
                    skip("fault.per_fault_ns", f"the single-batch slope came out {per_fault:.0f} ns (noise)")
                break
        else:
            skip("fault.per_fault_ns", "no W > 1 of the unpopulated run was served by a single replay")
    else:
        skip("fault.per_fault_ns", "no fault_first_touch_unpopulated result")
    p_used = values["fault.per_fault_ns"]

    b_r = values["fault.batch_fixed_ns"] + values["fault.replay_ns"]
    i_b_r = values["fault.interrupt_to_bh_ns"] + b_r
    m_model = values["link.pcie_latency_ns"] + 4096 / values["link.pcie_gbps"]
    sums = []
    if 1 in unpop:
        s0 = unpop[1]["window_ns"] - unpop[1]["resident_load_median_ns"]
        sums.append(f"interrupt_to_bh_ns + batch_fixed_ns + replay_ns = {s0 - p_used:.0f} ns measured "
                    f"(this file: {i_b_r}): one fault on a never-touched page, stall {s0:.0f} ns minus "
                    f"per_fault_ns {p_used} (includes populating the page on the GPU)")
    if 1 in host:
        s1 = host[1]["window_ns"] - host[1]["resident_load_median_ns"]
        sums.append(f"interrupt_to_bh_ns + batch_fixed_ns + per_fault_ns + replay_ns + migration of 4 KiB = "
                    f"{s1:.0f} ns measured (this file: {i_b_r + p_used + m_model:.0f}): one fault on a "
                    "host-resident page, stall minus the resident load")
        if 1 in unpop:
            sums.append(f"migration of one 4 KiB host-resident page inside the fault path = {s1 - s0:.0f} ns "
                        f"measured (model: link.pcie_ns(4 KiB) = {m_model:.0f} ns)")
    many = [(w, host[w]["stall_max_ns"]) for w in (256, 1024, 4096) if w in host]
    k = slope(many)
    if k is not None:
        sums.append(f"(batch_fixed_ns + replay_ns) / {batch_max} + per_fault_ns + migration per page = {k:.0f} ns "
                    f"measured (this file: {b_r / batch_max + p_used + m_model:.0f}): "
                    "slope of the max stall over W = 256, 1024, 4096 host-resident pages; the driver's prefetcher "
                    "may migrate neighbours of faulted pages, which the model does not do")
    for w in (1024, 4096):
        if w in host and finite(host[w].get("resume_groups")) and \
                finite(median(host[w].get("reps_resume_gap_median_ns") or [])):
            sums.append(f"W={w} host-resident: {host[w]['resume_groups']:.0f} resume groups, median gap "
                        f"{median(host[w]['reps_resume_gap_median_ns']):.0f} ns between them (one batch + replay each)")
    for name in ("fault.interrupt_to_bh_ns", "fault.batch_fixed_ns", "fault.replay_ns"):
        skip(name, "measurements fix only sums that include it (see the notes)")

    stall = get(results, "stalled_warps_do_not_block_issue")
    if stall and finite(stall.get("ratio_cycles")):
        notes.append(f"stalled warps do not block issue: compute beside fault-stalled warps / alone = "
                     f"{stall['ratio_cycles']:.4f} (model assumes 1), same-scheduler stall coverage "
                     f"{stall.get('coverage_same_scheduler_median', float('nan')):.2f}")

    # Facts of the device that the file states as datasheet values (not changed here).
    for name, fact, label in (("gpu.sms", dev.get("sms"), "SMs"),
                              ("gpu.warp_slots_per_sm", dev.get("warp_slots_per_sm"), "warp slots per SM"),
                              ("gpu.clock_ghz", dev.get("sm_clock_ghz_measured"), "SM clock (GHz) under load")):
        if finite(fact):
            shown = f"{fact:.3f}".rstrip("0").rstrip(".")
            notes.append(f"{label} on this device: {shown} ({name} in the file: {constants[name]['raw']}, unchanged)")
    ipc = get(results, "timer", "single_warp_ipc_dependent_chain")
    if finite(ipc):
        notes.append(f"one warp on one dependent FMA chain: {ipc:.3f} instructions/cycle "
                     f"(gpu.warp_ipc in the file: {constants['gpu.warp_ipc']['raw']}, unchanged)")
    batch_param = get(dev, "uvm_parameters", "uvm_perf_fault_batch_count")
    if batch_param is not None:
        notes.append(f"nvidia_uvm uvm_perf_fault_batch_count in force: {batch_param} "
                     f"(fault.batch_max in the file: {constants['fault.batch_max']['raw']}, unchanged)")

    # ---- write and check ----------------------------------------------------------------------------
    for name, (text, _) in updates.items():
        v = float(text)
        if name == "poll.issue_weight":
            if not 0.0 <= v <= 1.0:
                fail(f"{name} = {text} is outside 0..1")
        elif not v > 0:
            fail(f"{name} = {text} is not positive")
    header = [f"Derived by device/bench/derive.py from {results_path.rsplit('/', 1)[-1]}: {device_name}, "
              f"driver {driver}, measured {date}.",
              f"{len(updates)} constants below are `measured = true` from that run; the others are as before.",
              "Measured sums that do not determine single constants (those stay estimates):"]
    header += ["  " + s for s in sums] or ["  (none)"]
    header.append("Other observations of the run:")
    header += ["  " + n for n in notes] or ["  (none)"]
    text = write_calibration(lines, constants, updates, header)
    _, check_constants = parse_calibration(text, output_path)
    if set(check_constants) != set(constants):
        fail("internal: the rewritten file lost or gained constants")
    if tomllib is not None:
        parsed = tomllib.loads(text)
        for name in constants:
            section, key = name.split(".")
            entry = parsed[section][key]
            if type(entry["value"]) is not type(constants[name]["value"]):
                fail(f"internal: {name} changed type")
    with open(output_path, "w", encoding="utf-8") as f:
        f.write(text)

    # ---- report --------------------------------------------------------------------------------------
    print(f"derive: {device_name}, driver {driver}, measured {date}")
    print(f"{'constant':28} {'old':>12} {'new':>12}  measured")
    for name, entry in constants.items():
        new = updates[name][0] if name in updates else entry["raw"]
        measured = name in updates or entry["measured"]
        mark = "*" if name in updates else " "
        print(f"{name:28} {entry['raw']:>12} {new:>12}  {'yes' if measured else 'no'} {mark}")
    print("(* = set from this run)")
    if skipped:
        print("not set:")
        for name, why in skipped:
            print(f"  {name}: {why}")
    print("measured sums:")
    for s in sums or ["(none)"]:
        print("  " + s)
    print("observations:")
    for n in notes or ["(none)"]:
        print("  " + n)
    print(f"derive: wrote {output_path} ({len(updates)} constants set)")


if __name__ == "__main__":
    main()
