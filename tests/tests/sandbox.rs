//! The MIP tools' Python sandbox under attack: code that reaches for the network (any socket
//! but AF_UNIX, vsock to a VM's host included), secrets, the host's kernel (`/proc`, system
//! calls such as io_uring, userfaultfd, ptrace), programs under `/usr/local`, or the machine's
//! resources is stopped, and the relay stays healthy.
//!
//! One test in its own binary, so that no other test's sandbox runs while it counts what is
//! left running afterwards.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;
use tokio::net::TcpListener;
use toolrelay_builtin::BuiltinConfig;
use toolrelay_builtin::mip::MipConfig;
use toolrelay_builtin::mip::sandbox::SandboxConfig;
use toolrelay_relay::RelayConfig;
use toolrelay_tests::system::{Answer, System};
use toolrelay_tests::{PATIENCE, repo_file, wait_until};

/// Processes running the sandbox's runner (its marker is on their command line), by pid.
fn sandbox_processes() -> BTreeSet<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            let cmdline = std::fs::read(path.join("cmdline")).ok()?;
            String::from_utf8_lossy(&cmdline)
                .contains("TOOLRELAY-RESULT")
                .then(|| path.file_name()?.to_str().map(str::to_owned))?
        })
        .collect()
}

/// Waits (with a deadline) until no sandbox process is left but the `others` there before this
/// test began (another suite's relay killed with `kill -9` under load can orphan one): a run's
/// answer can come before the last of its processes is reaped (bubblewrap's outer process may
/// exit before the inner).
async fn until_no_sandbox_processes(what: &str, others: &BTreeSet<String>) {
    wait_until(PATIENCE, async || {
        let left = sandbox_processes().difference(others).count();
        match left {
            0 => Ok(()),
            left => Err(format!("{left} {what}")),
        }
    })
    .await;
}

async fn generate(system: &System, code: &str) -> Answer {
    system
        .post(
            "/api/tools/generate_mip_problem?scope=attacker",
            json!({"problemDefinitionCode": code}),
        )
        .await
}

/// What a batch of attempts printed: one `name: outcome` line each, by name. Each attempt is
/// `attempt(name, action)`: the outcome is `refused: <exception>` when the action raises
/// `OSError`, else `ALLOWED: <what it returned>`.
async fn attempts(system: &System, code: &str) -> BTreeMap<String, String> {
    const HARNESS: &str = r#"
import ctypes, os, socket, pulp
def attempt(name, action):
    try:
        outcome = action()
    except OSError as error:
        print(f"{name}: refused: {type(error).__name__}: {error}")
    else:
        print(f"{name}: ALLOWED: {outcome!r}"[:300])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.ptrace.restype = ctypes.c_long
def checked(result):
    if result < 0:
        number = ctypes.get_errno()
        raise OSError(number, os.strerror(number))
    return f"returned {result}"
def syscall(*args):
    return checked(libc.syscall(*args))
ARCH = os.uname().machine
prob = pulp.LpProblem("still_a_model")
"#;
    let answer = generate(system, &format!("{HARNESS}{code}")).await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    answer.body["result"]["stdout"]
        .as_str()
        .unwrap()
        .lines()
        .filter_map(|line| line.split_once(": "))
        .map(|(name, outcome)| (name.to_owned(), outcome.to_owned()))
        .collect()
}

/// Each named attempt was refused with one of `messages`.
fn all_refused(outcomes: &BTreeMap<String, String>, names: &[&str], messages: &[&str]) {
    for name in names {
        let outcome = outcomes
            .get(*name)
            .unwrap_or_else(|| panic!("{name} reported nothing: {outcomes:#?}"));
        assert!(
            messages
                .iter()
                .any(|message| outcome == &format!("refused: {message}")),
            "{name}: {outcome} (expected one of {messages:?})"
        );
    }
}

/// The run failed with `code` and a message that mentions one of `words`.
fn refused(answer: &Answer, code: &str, words: &[&str]) {
    assert_eq!(answer.body["success"], false, "{answer:?}");
    assert_eq!(answer.body["error"]["code"], code, "{answer:?}");
    let message = answer.body["error"]["message"].as_str().unwrap();
    assert!(
        words.iter().any(|word| message.contains(word)),
        "{message:?} should mention one of {words:?}"
    );
}

#[tokio::test]
async fn hostile_code_is_stopped_and_the_relay_stays_healthy() {
    let others = sandbox_processes();
    let tools = BuiltinConfig {
        mip: MipConfig {
            sandbox: SandboxConfig {
                cpu_seconds: 2,
                wall_clock: Duration::from_secs(4),
                memory_bytes: 512 * 1024 * 1024,
                ..SandboxConfig::default()
            },
            ..MipConfig::default()
        },
        ..BuiltinConfig::default()
    };
    let system = System::with_tools(RelayConfig::default(), tools, |_| {}).await;
    // Something listening on loopback that the code will try to reach.
    let bait = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = bait.local_addr().unwrap().port();

    let network = generate(
        &system,
        &format!("import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)"),
    )
    .await;
    // No socket but AF_UNIX can be made at all (the system-call filter), so the bait hears
    // nothing; the message says why.
    refused(
        &network,
        "PYTHON_ERROR",
        &[
            "PermissionError: [Errno 1] Operation not permitted (the sandbox does not allow this: no network",
        ],
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(200), bait.accept())
            .await
            .is_err(),
        "the sandbox reached the host's loopback"
    );
    let outside = generate(
        &system,
        "import socket\nsocket.create_connection(('10.1.2.3', 80), timeout=2)",
    )
    .await;
    refused(&outside, "PYTHON_ERROR", &["Operation not permitted"]);
    let dns = generate(
        &system,
        "import urllib.request\nurllib.request.urlopen('http://pypi.org', timeout=2)",
    )
    .await;
    refused(
        &dns,
        "PYTHON_ERROR",
        &["URLError", "Temporary failure", "unreachable"],
    );

    let shadow = generate(&system, "print(open('/etc/shadow').read())").await;
    refused(
        &shadow,
        "PYTHON_ERROR",
        &["No such file or directory: '/etc/shadow'"],
    );
    let home = generate(&system, "import os\nprint(os.listdir('/root'))").await;
    refused(
        &home,
        "PYTHON_ERROR",
        &["No such file or directory: '/root'"],
    );
    let project = repo_file("Cargo.toml");
    let source = generate(
        &system,
        &format!("print(open({:?}).read())", project.display().to_string()),
    )
    .await;
    refused(&source, "PYTHON_ERROR", &["No such file or directory"]);
    let environment = generate(&system, "import os\nassert 'REDIS_URL' not in os.environ and 'HOME' in os.environ\nraise SystemExit(sorted(os.environ))").await;
    refused(
        &environment,
        "PYTHON_ERROR",
        &["SystemExit: ['HOME', 'LANG', 'PATH', 'PWD', 'PYTHONDONTWRITEBYTECODE']"],
    );

    for target in ["/usr/lib/evil.py", "/etc/evil", "/evil"] {
        let write = generate(&system, &format!("open({target:?}, 'w').write('x')")).await;
        refused(
            &write,
            "PYTHON_ERROR",
            &["Read-only file system", "Permission denied", "No such file"],
        );
    }
    let venv = SandboxConfig::default().python;
    let site = generate(
        &system,
        &format!(
            "import pathlib\npathlib.Path({:?}).with_name('evil').write_text('x')",
            venv.display().to_string()
        ),
    )
    .await;
    refused(
        &site,
        "PYTHON_ERROR",
        &["Read-only file system", "Permission denied"],
    );
    assert!(!venv.with_file_name("evil").exists());
    // Writing to the private /tmp is allowed, and it is gone after the run.
    let scratch = generate(
        &system,
        "import pulp\nopen('/tmp/scratch', 'w').write('x')\nprob = pulp.LpProblem('p')",
    )
    .await;
    assert_eq!(scratch.status, StatusCode::OK, "{scratch:?}");
    let gone = generate(&system, "import os, pulp\nassert not os.path.exists('/tmp/scratch'), 'a run saw the last run'\nprob = pulp.LpProblem('p')").await;
    assert_eq!(gone.status, StatusCode::OK, "{gone:?}");

    // /dev is read-only, /tmp is small, no new user namespaces, a handful of processes.
    let shm = generate(&system, "open('/dev/shm/x', 'w').write('x')").await;
    refused(
        &shm,
        "PYTHON_ERROR",
        &["Read-only file system", "No such file"],
    );
    let fill = generate(
        &system,
        "for n in range(100):\n    open(f'/tmp/f{n}', 'wb').write(b'x' * 8_000_000)",
    )
    .await;
    refused(&fill, "PYTHON_ERROR", &["No space left on device"]);
    let userns = generate(&system, "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nassert libc.unshare(0x10000000) == 0, f'errno {ctypes.get_errno()}'").await;
    refused(&userns, "PYTHON_ERROR", &["AssertionError: errno"]);
    let forks = generate(
        &system,
        "import os, time\nfor _ in range(8):\n    if os.fork() == 0:\n        time.sleep(60)",
    )
    .await;
    refused(
        &forks,
        "PYTHON_ERROR",
        &["BlockingIOError", "Resource temporarily unavailable"],
    );

    let started = Instant::now();
    let fork_bomb = generate(
        &system,
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
    )
    .await;
    refused(&fork_bomb, "RUN_STOPPED", &["did not finish", "ran longer"]);
    // bytes() comes zeroed from calloc, untouched: the address-space limit stops it without
    // the CPU time that touching 512 MB costs on a VM (over the 2 s limit, at times, right
    // after the fork bomb).
    let memory = generate(
        &system,
        "blocks = []\nwhile True:\n    blocks.append(bytes(10**7))",
    )
    .await;
    refused(&memory, "PYTHON_ERROR", &["MemoryError"]);
    let spin = generate(&system, "while True:\n    pass").await;
    refused(&spin, "RUN_STOPPED", &["CPU time"]);
    let sleeper = generate(&system, "import time\ntime.sleep(3600)").await;
    refused(&sleeper, "RUN_STOPPED", &["ran longer than 4 s"]);
    let noisy = generate(
        &system,
        "import pulp\nprob = pulp.LpProblem('p')\nwhile True:\n    print('x' * 10000)",
    )
    .await;
    refused(&noisy, "RUN_STOPPED", &["CPU time", "ran longer"]);
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "the limits took {:?}",
        started.elapsed()
    );

    // Sockets of every family but AF_UNIX are refused when made: vsock (which reached a VM's
    // host), IP, netlink (the host's network configuration), raw packets.
    let sockets = attempts(
        &system,
        r#"
def vsock():
    with socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM) as vsock:
        vsock.settimeout(2)
        vsock.connect((2, 1024))  # the VM's host
attempt("vsock", vsock)
attempt("inet", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
attempt("inet6", lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM))
attempt("netlink", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0))
attempt("packet", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW))
attempt("unix", lambda: socket.socketpair(socket.AF_UNIX)[0].family.name)
"#,
    )
    .await;
    all_refused(
        &sockets,
        &["vsock", "inet", "inet6", "netlink", "packet"],
        &["PermissionError: [Errno 1] Operation not permitted"],
    );
    assert_eq!(sockets["unix"], "ALLOWED: 'AF_UNIX'", "{sockets:#?}");

    // System calls a computation has no use for, each a way into the kernel or other
    // processes, are refused with EPERM (not a crash).
    let calls = attempts(
        &system,
        r#"
attempt("io_uring_setup", lambda: syscall(425, 8, ctypes.create_string_buffer(120)))
USERFAULTFD = {"x86_64": 323, "aarch64": 282}[ARCH]
attempt("userfaultfd", lambda: syscall(USERFAULTFD, 1 | os.O_CLOEXEC))  # UFFD_USER_MODE_ONLY
attempt("ptrace", lambda: checked(libc.ptrace(0, 0, None, None)))  # PTRACE_TRACEME
KEYCTL = {"x86_64": 250, "aarch64": 219}[ARCH]
attempt("keyctl", lambda: syscall(KEYCTL, 0, -3, 0))  # the session keyring's id
PERF = {"x86_64": 298, "aarch64": 241}[ARCH]
attempt("perf_event_open", lambda: syscall(PERF, ctypes.create_string_buffer(128), 0, -1, -1, 0))
attempt("unshare", lambda: checked(libc.unshare(0x20000)))  # CLONE_NEWNS
attempt("mount", lambda: checked(libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)))
"#,
    )
    .await;
    all_refused(
        &calls,
        &[
            "io_uring_setup",
            "userfaultfd",
            "ptrace",
            "keyctl",
            "perf_event_open",
            "unshare",
            "mount",
        ],
        &["PermissionError: [Errno 1] Operation not permitted"],
    );

    // Nothing installed under /usr/local is there to run, and /proc tells nothing about the
    // host's kernel (its configuration, boot command line, symbols, settings).
    let files = attempts(
        &system,
        r#"
attempt("usr-local", lambda: [os.path.join(top, name) for top, _, names in os.walk("/usr/local") for name in names])
attempt("usr-local-write", lambda: open("/usr/local/bin-evil", "w"))
for name in ["config.gz", "cmdline", "kallsyms", "version", "sys/kernel/osrelease"]:
    attempt(f"/proc/{name}", lambda: len(open(f"/proc/{name}", "rb").read()))
"#,
    )
    .await;
    assert_eq!(files["usr-local"], "ALLOWED: []", "{files:#?}");
    all_refused(
        &files,
        &["usr-local-write"],
        &["OSError: [Errno 30] Read-only file system: '/usr/local/bin-evil'"],
    );
    for name in [
        "config.gz",
        "cmdline",
        "kallsyms",
        "version",
        "sys/kernel/osrelease",
    ] {
        all_refused(
            &files,
            &[&format!("/proc/{name}")],
            &[
                &format!("PermissionError: [Errno 13] Permission denied: '/proc/{name}'"),
                &format!("FileNotFoundError: [Errno 2] No such file or directory: '/proc/{name}'"),
            ],
        );
    }

    // Nothing of those runs is left, and the relay still works: a model still generates,
    // solves and validates.
    until_no_sandbox_processes("sandbox processes outlived their runs", &others).await;
    let health = system.get("/healthz").await;
    assert_eq!(health.status, StatusCode::OK, "{health:?}");
    let fine = generate(&system, "import pulp\nprob = pulp.LpProblem('p', pulp.LpMaximize)\nx = pulp.LpVariable('x', 0, 3, cat='Integer')\nprob += x\nprob += x <= 2.5").await;
    assert_eq!(fine.status, StatusCode::OK, "{fine:?}");
    let problem_id = fine.body["result"]["problemId"].as_str().unwrap();
    let solved = system
        .post(
            "/api/tools/solve_mip_problem?scope=attacker",
            json!({"problemId": problem_id}),
        )
        .await;
    assert_eq!(solved.body["result"]["status"], "optimal", "{solved:?}");
    let checked = system
        .post(
            "/api/tools/validate_mip_solution?scope=attacker",
            json!({
                "solutionId": solved.body["result"]["solutionId"],
                "validationCode": "assert solution['variables']['x'] == 2\nprint('x is', solution['variables']['x'])",
            }),
        )
        .await;
    assert_eq!(
        checked.body["result"],
        json!({"status": "success", "message": "x is 2.0"}),
        "{checked:?}"
    );
    until_no_sandbox_processes("sandbox processes outlived the last runs", &others).await;
    drop(bait);
    system.stop().await;
}
