#!/usr/bin/env python3
"""Splits a profile of the relay's call loop by layer (BENCHMARKS.md, issue 44).

    bench/layers.py perf.txt                                   # CPU samples, by layer
    bench/layers.py --parts perf.txt                           # … by part of a call's work
    bench/layers.py --per CALLS [--minus SMALL.folded] LARGE.folded

The input is `perf script -F comm,pid,tid,ip,sym` output (CPU samples) or folded stacks,
`root;…;leaf COUNT` per line (heaptrack_print -F with --flamegraph-cost-type allocations:
allocations). A sample or an allocation belongs to the layer of the frame nearest its leaf that
names one (LAYERS, in that order within a frame); none: "other". --minus subtracts another
profile's counts layer by layer (a shorter run of the same kind: start-up cancels out) and
--per divides by the calls that make the difference. --parts splits by PARTS instead: the
product's work per call part by part, beside the kinds of work the floor does too.
"""

import argparse
import collections
import importlib.util
import pathlib
import re

# A frame of the kernel's, or of the C library's system-call wrappers.
KERNEL = (r"\[k\]|^entry_SYSCALL|^__x64_sys|^do_syscall|_raw_spin|finish_task_switch|^tcp_|"
          r"^__tcp|^ip_|^__dev_queue|^sock_|^__libc_(send|recv)|^(send|recv)(to|from|msg)?$|"
          r"^epoll|^__GI___libc_(write|read)")

# (layer, regular expression on a frame). The first layer whose expression a frame matches,
# walking from the leaf, takes the sample.
LAYERS = [
    ("metrics and logging", r"tracing_core::|tracing::|tracing_subscriber|tracing_appender|"
     r"::process::metrics|prometheus_client|::telemetry"),
    ("the store", r"toolrelay_relay::store::"),
    ("the tab's socket (frames in and out)", r"tungstenite|toolrelay_relay::transport::ws|"
     r"toolrelay_gateway::websocket|provider_socket"),
    ("the hand-over to the tab (the tab's connection core, its channels)",
     r"toolrelay_relay::domain::provider|toolrelay_relay::domain::downlink|"
     r"toolrelay_relay::domain::channel|tokio::sync::mpsc|tokio::sync::oneshot|tokio::sync::notify"),
    ("the answer path (the caller's wait, the answer's checks)",
     r"toolrelay_relay::domain::relay::(answers|waiting|content)|toolrelay_relay::store::events"),
    ("the relay's admission and budgets (calls, access, limits)",
     r"toolrelay_relay::domain::|toolrelay_relay::ops|toolrelay_relay::front"),
    ("the gateway's checks (middleware, caller keys, limits)",
     r"toolrelay_gateway::middleware|toolrelay_gateway::limits"),
    ("the gateway's handler (REST / MCP types)", r"toolrelay_gateway::|rmcp::"),
    ("HTTP parsing and middleware (hyper, poem)", r"hyper::|poem::|h2::|http::"),
    ("JSON (serde) outside the layers above", r"serde_json|serde::"),
    ("the runtime (scheduling, wake-ups, timers)", r"tokio::runtime|tokio::time|tokio::task"),
    ("the kernel (syscalls, loopback TCP)", KERNEL),
]

# A finer cut (--parts): what each part of the product's work per call costs, beside the kinds of
# work the floor does too (BENCHMARKS.md, issue 44, the eighth session). The same rule: the
# first part whose expression a frame matches, walking from the leaf.
PARTS = [
    ("logging: the call's line", r"tracing_core::event::Event::dispatch|telemetry::batched|"
     r"telemetry::lines|span_fields|WriteAdaptor|format_event"),
    # A request's context for its lines: a task-local since the tenth session of issue 44 (a
    # tracing span before it: the span's bookkeeping, still matched here, was most of this).
    ("logging: the request's context", r"tracing::span::|new_span|try_close|Registry as "
     r"tracing_core::subscriber::Subscriber>::(enter|exit)|EnvFilter::on_|sharded_slab|"
     r"tracing_subscriber|Correlated::of|RequestContext|task_local::TaskLocalFuture"),
    ("metrics: HTTP", r"middleware::observe|Metrics::http_request|prometheus_client"),
    ("the store: queueing a call", r"MemoryStore>::enqueue_checked|Entry::enqueue|"
     r"RequestRecord::queued|callers_call_hash"),
    ("the store: finishing a call (its waiter woken)", r"MemoryStore>::finish|Entry::finish|"
     r"finished::|SessionChannel::announce|Mailbox::put"),
    ("the store: listening for the answer", r"MemoryStore>::listen_for_answer|"
     r"SessionChannel::wait_for|events::Waiting"),
    ("metrics: the store's operations timed", r"store::observed"),
    ("the store: the caller's budget, the rest", r"toolrelay_relay::store::memory"),
    ("the argument check (the function's schema)", r"manifest::check|jsonschema"),
    ("the relay's admission (caller keys, budgets, approvals)", r"ops::calls::admitted|limits::|"
     r"approvals::|named_session"),
    ("the hand-over to the tab (its connection core, channels)", r"domain::provider|"
     r"domain::downlink|domain::channel|tokio::sync"),
    ("the tab's socket (frames in and out)", r"tungstenite|transport::ws|provider_socket"),
    ("the answer's way back (the wait, the answer's checks)", r"relay::answers|relay::waiting|"
     r"relay::content"),
    ("the relay's queueing and views", r"toolrelay_relay::domain|toolrelay_relay::ops"),
    ("the gateway's checks", r"toolrelay_gateway::middleware|toolrelay_gateway::limits"),
    ("the gateway's handler", r"toolrelay_gateway::|rmcp::"),
    ("HTTP (hyper, poem)", r"hyper::|poem::|h2::|http::|transport::listen"),
    ("JSON elsewhere", r"serde_json|serde::"),
    ("the runtime", r"tokio::runtime|tokio::time|tokio::task|rewoken"),
    ("the kernel", KERNEL),
]

# Rust's legacy symbol escapes, as heaptrack prints some frames (`_$LT$a..b$GT$`).
ESCAPES = [("$LT$", "<"), ("$GT$", ">"), ("$u20$", " "), ("$C$", ","), ("$RF$", "&"),
           ("$BP$", "*"), ("$u7b$", "{"), ("$u7d$", "}"), ("$u5b$", "["), ("$u5d$", "]"),
           ("..", "::")]


def demangle(frame):
    if "$" not in frame and ".." not in frame:
        return frame
    for escape, text in ESCAPES:
        frame = frame.replace(escape, text)
    return frame[1:] if frame.startswith("_<") else frame


def layer_of(frames_leaf_first, table):
    for frame in map(demangle, frames_leaf_first):
        for name, expr in table:
            if expr.search(frame):
                return name
    return "other"


def perf_samples(path):
    """(frames leaf first, 1) of each sample of `perf script` output (bench/perf-tasks.py)."""
    spec = importlib.util.spec_from_file_location(
        "perf_tasks", pathlib.Path(__file__).with_name("perf-tasks.py"))
    perf_tasks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(perf_tasks)
    for _thread, _pid, frames in perf_tasks.samples(path):
        yield frames, 1


def folded_samples(path):
    with open(path, errors="replace") as text:
        for line in text:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if stack and count.isdigit():
                yield list(reversed(stack.split(";"))), int(count)


def profile(path, table):
    with open(path, errors="replace") as text:
        first = text.readline()
    folded = bool(re.search(r";.* \d+$", first.rstrip("\n"))) or path.endswith(".folded")
    counts = collections.Counter()
    for frames, count in (folded_samples if folded else perf_samples)(path):
        counts[layer_of(frames, table)] += count
    return counts


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("profile")
    parser.add_argument("--minus")
    parser.add_argument("--per", type=int)
    parser.add_argument("--parts", action="store_true")
    args = parser.parse_args()
    table, names = (PARTS, "part") if args.parts else (LAYERS, "layer")
    compiled = [(name, re.compile(expr)) for name, expr in table]
    counts = profile(args.profile, compiled)
    if args.minus:
        counts.subtract(profile(args.minus, compiled))
    total = sum(counts.values())
    order = [name for name, _ in table] + ["other"]
    print(f"| {names} | share | " + ("per call |" if args.per else "count |"))
    print("|---|---|---|")
    for name in order:
        count = counts.get(name, 0)
        if not count:
            continue
        value = f"{count / args.per:.1f}" if args.per else f"{count}"
        print(f"| {name} | {100 * count / max(total, 1):.1f} % | {value} |")
    value = f"{total / args.per:.1f}" if args.per else f"{total}"
    print(f"| **all** | 100 % | **{value}** |")


if __name__ == "__main__":
    main()
