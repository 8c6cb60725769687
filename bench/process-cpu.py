#!/usr/bin/env python3
"""The CPU each of the bench's processes spends (issue 44): the relay or the floor, the tabs
process and the callers process, sampled from /proc/<pid>/stat (user + system) until the
bench process PID ends. Divide by the calls the run made (the measured ones and the warm-up)
for µs a call.

    $B --scenario throughput --callers 50 & bench/process-cpu.py $!
"""
import os
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def sample(seen):
    """Records the CPU seconds of every live process whose program is one of toolrelay's."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if not argv[0].rsplit(b"/", 1)[-1].startswith(b"toolrelay"):
                continue  # another program (a Python under ~/.cache/toolrelay, say)
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended between the listing and the read
        role = " ".join(arg.decode().rsplit("/", 1)[-1] for arg in argv[:2])
        seen[int(pid)] = (role, (int(fields[11]) + int(fields[12])) / TICK)


def main():
    if len(sys.argv) != 2 or not sys.argv[1].isdigit():
        sys.exit("usage: bench/process-cpu.py BENCH_PID")
    bench = int(sys.argv[1])
    seen = {}
    while os.path.exists(f"/proc/{bench}"):
        sample(seen)
        time.sleep(0.05)
    for pid, (role, seconds) in sorted(seen.items()):
        print(f"{pid} {role}: {seconds:.2f} s")


main()
