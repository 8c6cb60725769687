#!/usr/bin/env python3
"""Folds a perf profile of the relay by the task each sample ran in (BENCHMARKS.md).

    perf record -e cpu-clock -F 999 --call-graph dwarf,16384 -p <pid> -o perf.data -- sleep 8
    perf script -i perf.data -F comm,pid,tid,ip,sym > perf.txt
    bench/perf-tasks.py perf.txt                       # share of samples per task
    bench/perf-tasks.py perf.txt 'redis=redis::' ...   # and of samples with a frame matching

A sample belongs to the first task whose frame it holds, in the order of TASKS; the rest are
"other" with their thread's name. With patterns (NAME=TEXT|TEXT…), it also prints the share of
samples (of each process) that hold a frame containing one of the texts.
"""

import collections
import sys

TASKS = [
    ("the tab's WebSocket task", "provider_socket"),
    ("the provider's driver task", "Driver::run"),
    ("the log thread", "tracing_appender"),
    ("a caller's HTTP connection (hyper, poem)", "hyper::proto::h1::dispatch"),
]


def samples(path):
    """(thread name, pid, frames leaf first) of each sample of `perf script` output."""
    head, frames = None, []
    with open(path, errors="replace") as text:
        for line in text:
            line = line.rstrip("\n")
            if not line.strip():
                if head:
                    yield head[0], head[1].split("/")[0], frames
                head, frames = None, []
            elif not line[0].isspace():
                head = line.split()
            else:
                parts = line.strip().split(None, 1)
                frames.append(parts[1] if len(parts) > 1 else "?")
    if head:
        yield head[0], head[1].split("/")[0], frames


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    patterns = [arg.partition("=") for arg in sys.argv[2:]]
    total = 0
    tasks = collections.Counter()
    processes = collections.Counter()
    matched = collections.Counter()
    for thread, pid, frames in samples(sys.argv[1]):
        total += 1
        processes[pid] += 1
        stack = " | ".join(frames)
        task = next((name for name, frame in TASKS if frame in stack), None)
        if task is None:
            # The log thread by its name: its stacks do not always unwind to its start.
            task = TASKS[2][0] if thread == "toolrelay-log" else f"other: {thread}"
        tasks[task] += 1
        for name, _, texts in patterns:
            if any(text in stack for text in texts.split("|")):
                matched[(pid, name)] += 1
    print(f"{total} samples")
    for task, count in tasks.most_common():
        print(f"{100 * count / total:6.1f} %  {task}")
    if patterns:
        for pid, count in processes.most_common():
            print(f"process {pid}: {100 * count / total:.1f} % of the samples")
        for (pid, name), count in sorted(matched.items()):
            print(f"  process {pid}, {name}: {100 * count / processes[pid]:.1f} % of its samples")


if __name__ == "__main__":
    main()
