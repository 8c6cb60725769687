//! The MIP tools' Python sandbox under attack: code that reaches for the network, secrets,
//! the file system or the machine's resources is stopped, and the relay stays healthy.
//!
//! One test in its own binary, so that no other test's sandbox runs while it counts what is
//! left running afterwards.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;
use tokio::net::TcpListener;
use toolrelay_relay::RelayConfig;
use toolrelay_relay::builtin::mip::MipConfig;
use toolrelay_relay::builtin::mip::sandbox::SandboxConfig;
use toolrelay_tests::repo_file;
use toolrelay_tests::system::{Answer, System};

/// Processes still running the sandbox's runner (its marker is on their command line).
fn sandbox_processes() -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| std::fs::read(entry.ok()?.path().join("cmdline")).ok())
        .filter(|cmdline| String::from_utf8_lossy(cmdline).contains("TOOLRELAY-RESULT"))
        .count()
}

async fn generate(system: &System, code: &str) -> Answer {
    system
        .post(
            "/api/tools/generate_mip_problem?scope=attacker",
            json!({"problemDefinitionCode": code}),
        )
        .await
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
    let mut config = RelayConfig::default();
    config.builtin.mip = MipConfig {
        sandbox: SandboxConfig {
            cpu_seconds: 2,
            wall_clock: Duration::from_secs(4),
            memory_bytes: 512 * 1024 * 1024,
            ..SandboxConfig::default()
        },
        ..MipConfig::default()
    };
    let system = System::with(config, |_| {}).await;
    // Something listening on loopback that the code will try to reach.
    let bait = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = bait.local_addr().unwrap().port();

    let network = generate(
        &system,
        &format!("import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)"),
    )
    .await;
    // The sandbox has its own loopback: nothing listens there, and the bait hears nothing.
    refused(&network, "PYTHON_ERROR", &["ConnectionRefusedError"]);
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
    refused(&outside, "PYTHON_ERROR", &["Network is unreachable"]);
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
    let memory = generate(
        &system,
        "blocks = []\nwhile True:\n    blocks.append(bytearray(10**7))",
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

    // Nothing of those runs is left, and the relay still works.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        sandbox_processes(),
        0,
        "sandbox processes outlived their runs"
    );
    let health = system.get("/healthz").await;
    assert_eq!(health.status, StatusCode::OK, "{health:?}");
    let fine = generate(&system, "import pulp\nprob = pulp.LpProblem('p', pulp.LpMaximize)\nx = pulp.LpVariable('x', 0, 3)\nprob += x").await;
    assert_eq!(fine.status, StatusCode::OK, "{fine:?}");
    drop(bait);
    system.stop().await;
}
