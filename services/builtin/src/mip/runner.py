# Runs one piece of an LLM's Python inside the sandbox (bubblewrap, a fresh process each
# time) and reports on stdout, after a marker, one JSON object:
#   generate: {"ok": true, "problem": <LpProblem.toDict()>, "constant": <objective constant>,
#              "stdout": "..."}  — the code must define exactly one pulp.LpProblem
#   validate: {"ok": true, "stdout": "..."}  — with `solution` bound to the solved values
#   failure:  {"ok": false, "error": "<the exception's last line>", "traceback": "<tail>",
#              "stdout": "..."}
# The job comes as JSON on stdin: {"mode": "generate" | "validate", "code": "...",
# "solution": {...}}.

import contextlib
import errno
import io
import json
import os
import sys
import traceback

MARKER = "\x1eTOOLRELAY-RESULT "
MAX_OUTPUT = 20000
# Frames of the LLM's code, by the file names compile() gave it.
OWN_FILES = ("<problem>", "<validation>")
BLOCKED = "the sandbox does not allow this: no network, no system administration; plain Python, PuLP and files in /tmp work"


class Tail(io.TextIOBase):
    """Keeps the last MAX_OUTPUT characters printed, so printing without end costs no memory."""

    def __init__(self):
        self.kept = ""

    def writable(self):
        return True

    def write(self, text):
        self.kept = (self.kept + text)[-MAX_OUTPUT:]
        return len(text)

    def getvalue(self):
        return self.kept


def report(result, limit=None):
    try:
        text = json.dumps(result, allow_nan=False)
    except ValueError:
        result = {
            "ok": False,
            "code": "INVALID_MODEL",
            "error": "The model holds an infinite or NaN number (a coefficient, bound or constant overflowed); use finite numbers.",
        }
        text = json.dumps(result)
    except TypeError as error:
        result = {
            "ok": False,
            "code": "INVALID_MODEL",
            "error": f"The model cannot be written as PuLP's dict: {error}.",
        }
        text = json.dumps(result)
    if limit is not None and len(text) > limit:
        text = json.dumps(
            {
                "ok": False,
                "code": "MODEL_TOO_LARGE",
                "error": f"The model is {len(text) // 1000} KB as PuLP's JSON, over the limit of {limit // 1000} KB; make it smaller.",
            }
        )
    sys.__stdout__.write(MARKER + text + "\n")
    sys.__stdout__.flush()


def last_line(error):
    """The exception as its traceback's last line says it: `Type: message`."""
    name = type(error).__name__
    if isinstance(error, SyntaxError):
        return f"{name}: {error.msg} (line {error.lineno})"
    message = str(error)
    line = f"{name}: {message}" if message else name
    if isinstance(error, OSError) and error.errno in (errno.EPERM, errno.ENOSYS):
        # Most likely the sandbox's system-call filter: say so, and what is left.
        line += f" ({BLOCKED})"
    return line


def failure(error, captured):
    last = last_line(error)
    frames = [
        line
        for line in traceback.format_tb(error.__traceback__)
        if any(name in line for name in OWN_FILES)
    ]
    report(
        {
            "ok": False,
            "error": last,
            "traceback": "".join(frames[-3:]).rstrip(),
            "stdout": captured.getvalue(),
        }
    )


def main():
    job = json.load(sys.stdin)
    # Descriptors beyond stdio that the relay itself inherited from whatever started it (and
    # so could not mark close-on-exec) are not for the LLM's code.
    os.closerange(3, 1 << 16)
    captured = Tail()
    try:
        import pulp
    except Exception as error:  # noqa: BLE001 - any import failure means a broken sandbox
        report({"ok": False, "error": f"PuLP cannot be imported in the sandbox: {error}"})
        return
    mode = job["mode"]
    namespace = {"__name__": "__main__", "pulp": pulp}
    if mode == "validate":
        namespace["solution"] = job["solution"]
    try:
        code = compile(job["code"], "<problem>" if mode == "generate" else "<validation>", "exec")
        with contextlib.redirect_stdout(captured):
            exec(code, namespace)  # noqa: S102 - running the LLM's code is the point, sandboxed
    except BaseException as error:  # noqa: BLE001 - SystemExit and asserts are failures too
        failure(error, captured)
        return
    output = captured.getvalue()
    if mode == "validate":
        report({"ok": True, "stdout": output})
        return

    problems = {}
    for name, value in namespace.items():
        if isinstance(value, pulp.LpProblem):
            problems.setdefault(id(value), (name, value))
    if not problems:
        report(
            {
                "ok": False,
                "error": 'The code defines no pulp.LpProblem. Assign the problem to a variable, e.g. prob = pulp.LpProblem("plan", pulp.LpMaximize).',
                "stdout": output,
            }
        )
        return
    if len(problems) > 1:
        names = ", ".join(sorted(name for name, _ in problems.values()))
        report(
            {
                "ok": False,
                "error": f"The code defines several pulp.LpProblem objects ({names}); define exactly one.",
                "stdout": output,
            }
        )
        return
    (_, problem), = problems.values()
    objective = problem.objective
    constant = float(objective.constant) if objective is not None else 0.0
    report(
        {"ok": True, "problem": problem.toDict(), "constant": constant, "stdout": output},
        job.get("limit"),
    )


main()
