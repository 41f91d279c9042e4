#!/usr/bin/env python3
"""One line per profiled row from scripts/gpu-profile.sh's folder of
`ncu --csv --page raw` reports: time, DRAM traffic against the time, issue
and occupancy figures, and the three largest stall reasons per issued
instruction -- enough to say whether a kernel is bound by memory, by issue
or by latency (too little in flight)."""
import csv
import sys
from pathlib import Path


def report(path):
    lines = path.read_text(errors="replace").splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        return None
    rows = list(csv.reader(l for l in lines[start:] if l.startswith('"')))
    if len(rows) < 3:
        return None
    header, units, values = rows[0], rows[1], rows[2]
    return {h: (v, u) for h, u, v in zip(header, units, values)}


def number(rec, name):
    value, unit = rec.get(name, ("", ""))
    try:
        x = float(value.replace(",", ""))
    except ValueError:
        return None
    scale = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "msecond": 1e3, "ms": 1e3, "nsecond": 1e-3,
             "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}
    return x * scale.get(unit, 1.0)


def main():
    folder = Path(sys.argv[1])
    print("row | kernel | us | DRAM GB/s | DRAM % | SM % | issue % | occupancy % | regs | inst/KB | thr/inst | top stalls (warps per issue)")
    for csv_path in sorted(folder.glob("*.csv"), key=lambda p: int(p.stem)):
        row = (folder / f"{csv_path.stem}.row").read_text().strip() if (folder / f"{csv_path.stem}.row").exists() else "?"
        rec = report(csv_path)
        if rec is None:
            err = (folder / f"{csv_path.stem}.err")
            print(f"{row} | no report | {err.read_text()[-200:].strip() if err.exists() else ''}")
            continue
        name = rec.get("Kernel Name", ("?", ""))[0]
        us = number(rec, "gpu__time_duration.sum")
        nbytes = (number(rec, "dram__bytes_read.sum") or 0) + (number(rec, "dram__bytes_write.sum") or 0)
        inst = number(rec, "smsp__inst_executed.sum") or 0
        stalls = []
        for key in rec:
            if key.startswith("smsp__average_warps_issue_stalled_") and key.endswith("_per_issue_active.ratio"):
                v = number(rec, key)
                if v is not None:
                    stalls.append((v, key[len("smsp__average_warps_issue_stalled_"):-len("_per_issue_active.ratio")]))
        stalls.sort(reverse=True)
        top = ", ".join(f"{n} {v:.2f}" for v, n in stalls[:3])
        gbs = nbytes / (us * 1e3) if us else 0
        fmt = lambda k: f"{number(rec, k):.1f}" if number(rec, k) is not None else "?"
        print(f"{row} | {name[:60]} | {us:.1f} | {gbs:.0f} | {fmt('dram__throughput.avg.pct_of_peak_sustained_elapsed')} | "
              f"{fmt('sm__throughput.avg.pct_of_peak_sustained_elapsed')} | {fmt('smsp__issue_active.avg.pct_of_peak_sustained_active')} | "
              f"{fmt('sm__warps_active.avg.pct_of_peak_sustained_active')} | {fmt('launch__registers_per_thread')} | "
              f"{inst / (nbytes / 1e3) if nbytes else 0:.1f} | {fmt('smsp__thread_inst_executed_per_inst_executed.ratio')} | {top}")


if __name__ == "__main__":
    main()
