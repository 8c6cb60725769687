//! The Python sandbox: each run is a fresh CPython process under bubblewrap, as a non-root
//! uid, with no network, only `/usr` (without `/usr/local`) and the PuLP virtualenv mounted
//! read-only (no home directories, no `/etc/shadow`, no project files), a private `/tmp`, a
//! `/proc` with the host-revealing files hidden, a clean environment, a system-call filter
//! (see [`super::seccomp`]), and limits on CPU time, address space, processes, file size and
//! wall-clock time (`prlimit` sets them, so no `unsafe` is needed). Output is captured and
//! capped.
//!
//! If bubblewrap, user namespaces, the filter or the virtualenv are missing, runs fail with a
//! message saying so: code is never run unsandboxed or unfiltered.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Seek, Write};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{SocketAddr, UnixListener};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use command_fds::{CommandFdExt, FdMapping};
use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

use super::seccomp;
use toolrelay_relay::builtin::{FailureKind, ToolCode, ToolFailure};

/// Room on stdout for the result's marker and envelope besides the model itself.
const RESULT_SLACK: usize = 64 * 1024;
/// The end of stderr kept, for the message of a run that died.
const STDERR_BYTES: usize = 16 * 1024;

/// The script each run executes (`python -I -c`).
const RUNNER: &str = include_str!("runner.py");
/// The line the runner's result follows.
const MARKER: &str = "\u{1e}TOOLRELAY-RESULT ";
/// The descriptor bubblewrap reads the system-call filter from (`--seccomp`).
const FILTER_FD: i32 = 3;
/// What the start-up probe runs under the filter: it fails unless the filter is in force.
const PROBE: &str = r#"
import socket
try:
    socket.socket(socket.AF_INET)
except PermissionError:
    pass
else:
    raise SystemExit("an AF_INET socket was allowed: the system-call filter is not in force")
if "\nSeccomp:\t2" not in open("/proc/self/status").read():
    raise SystemExit("no system-call filter is in force")
"#;
/// Files of `/proc` that tell about the host (its kernel, boot command line, symbols,
/// modules, keys, memory layout); each is covered by `/dev/null`, which cannot be opened there.
const HIDDEN_PROC_FILES: &[&str] = &[
    "cmdline",
    "config.gz",
    "kallsyms",
    "modules",
    "keys",
    "key-users",
    "kmsg",
    "kcore",
    "version",
    "bootconfig",
    "timer_list",
    "sched_debug",
    "latency_stats",
    "iomem",
    "ioports",
    "vmallocinfo",
    "slabinfo",
    "kpagecount",
    "kpageflags",
    "kpagecgroup",
    "sysrq-trigger",
];
/// Directories of `/proc` about the host's kernel settings and hardware; each is covered by
/// an empty read-only tmpfs.
const HIDDEN_PROC_DIRS: &[&str] = &[
    "sys",
    "acpi",
    "scsi",
    "bus",
    "driver",
    "fs",
    "irq",
    "pressure",
    "dynamic_debug",
];

/// Limits and locations of the sandbox.
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    /// The virtualenv's Python (PuLP installed), outside any home directory.
    pub python: PathBuf,
    /// CPU seconds a run may use.
    pub cpu_seconds: u64,
    /// Address space of each process of a run, in bytes.
    pub memory_bytes: u64,
    /// Processes and threads the run's uid may have, bubblewrap's two included: a run's
    /// memory is at most about (processes - 2) × `memory_bytes`, plus its `/tmp`.
    pub processes: u64,
    /// Largest file a run may write, in bytes.
    pub file_bytes: u64,
    /// Wall-clock time before a run is killed.
    pub wall_clock: Duration,
    /// Largest result of a run (the model as PuLP's JSON), in bytes.
    pub result_bytes: usize,
    /// Size of the run's private `/tmp`, in bytes.
    pub tmp_bytes: u64,
    /// First of the sandbox uids (each run has its own) when the relay runs as root.
    pub base_uid: u32,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        Self {
            python: PathBuf::from("/opt/toolrelay/mip-venv/bin/python"),
            cpu_seconds: 20,
            memory_bytes: 1024 * 1024 * 1024,
            processes: 4,
            file_bytes: 16 * 1024 * 1024,
            wall_clock: Duration::from_secs(30),
            result_bytes: 8 * 1024 * 1024,
            tmp_bytes: 64 * 1024 * 1024,
            base_uid: 61000,
        }
    }
}

/// Runs the LLM's Python, one fresh sandboxed process per run.
pub struct Sandbox {
    config: SandboxConfig,
    /// The virtualenv's root (the directory above `bin/python`).
    venv: PathBuf,
    /// Why runs cannot happen, when they cannot.
    unavailable: Option<String>,
    as_root: bool,
    /// The system-call filter, compiled once (empty when it cannot be built: then
    /// `unavailable` says why).
    filter: Vec<u8>,
    /// bubblewrap's arguments hiding what this host's `/proc` reveals.
    hidden_proc: Vec<String>,
}

/// How many uids from `base_uid` on the sandbox may use.
const UID_RANGE: u32 = 4096;

/// Sandbox uids in use in this process: by a run, or by processes of a run not yet gone; each
/// with its claim among the relays on this host ([`claim`]). Process-wide, as uids and
/// processes are. Std mutexes: each is held for one map or set operation.
static UIDS_IN_USE: Mutex<BTreeMap<u32, Option<UnixListener>>> = Mutex::new(BTreeMap::new());
/// Pids of the runs' own processes (the `bwrap` each run started and waits for), which
/// [`reap_orphans`] must leave to tokio.
static RUNNING: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

fn locked<T>(set: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    set.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("python", &self.config.python)
            .field("unavailable", &self.unavailable)
            .finish()
    }
}

impl Sandbox {
    /// A sandbox. Checks once that it can work (a run of `true`
    /// under bubblewrap); when it cannot, every run reports why.
    pub fn new(config: SandboxConfig) -> Self {
        let as_root = std::fs::metadata("/proc/self")
            .map(|meta| meta.uid() == 0)
            .unwrap_or(false);
        let venv = config
            .python
            .parent()
            .and_then(Path::parent)
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let (filter, unfiltered) = match seccomp::program() {
            Ok(filter) => (filter, None),
            Err(reason) => (Vec::new(), Some(reason)),
        };
        let mut sandbox = Self {
            config,
            venv,
            unavailable: None,
            as_root,
            filter,
            hidden_proc: hidden_proc(),
        };
        // bubblewrap's outer process exits without waiting for its inner one, which is then
        // re-parented: to this process, not to a PID 1 that may never reap it (a container's
        // init, or none), so that the relay reaps it and the sandbox uid's process count falls.
        if let Err(error) = nix::sys::prctl::set_child_subreaper(true) {
            tracing::warn!(%error, "cannot adopt the sandbox's orphaned processes");
        }
        sandbox.unavailable = unfiltered.or_else(|| sandbox.probe());
        if let Some(reason) = &sandbox.unavailable {
            tracing::warn!(%reason, "the MIP sandbox is unavailable; generate and validate will say so");
        }
        sandbox
    }

    /// Why the sandbox cannot run code, if it cannot.
    pub fn unavailable(&self) -> Option<&str> {
        self.unavailable.as_deref()
    }

    /// Whether a run can start: Python, under bubblewrap, with the filter in force (a run of
    /// the same filter that checks it is there), as a run would be.
    fn probe(&self) -> Option<String> {
        if !self.config.python.exists() {
            return Some(format!(
                "the sandbox's Python {} is missing: run scripts/setup.sh (it creates the PuLP virtualenv) or set MIP_PYTHON",
                self.config.python.display()
            ));
        }
        let mut command = std::process::Command::new("bwrap");
        command
            .args(self.bwrap_args())
            .arg(&self.config.python)
            .args(["-I", "-S", "-c", PROBE]);
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Err(error) = self.pass_filter(&mut command) {
            return Some(format!(
                "the system-call filter cannot be handed to bubblewrap: {error}"
            ));
        }
        // Its own uid like any run, so it cannot crowd a run's process limit.
        let _lease = if self.as_root {
            let Some(lease) = UidLease::take(self.config.base_uid) else {
                return Some("no sandbox uid is free".into());
            };
            command.uid(lease.0).gid(lease.0);
            Some(lease)
        } else {
            None
        };
        let probed = command.spawn().and_then(|child| {
            let _running = Running::insert(child.id());
            child.wait_with_output()
        });
        match probed {
            Ok(output) if output.status.success() => None,
            Ok(output) => {
                let said = String::from_utf8_lossy(&output.stderr);
                let last = said.lines().rev().find(|line| !line.trim().is_empty());
                let last = last.unwrap_or_default().trim();
                Some(if !said.contains("bwrap:") {
                    format!(
                        "the sandbox's Python does not run under its system-call filter ({last})"
                    )
                } else if said.contains("seccomp") {
                    format!(
                        "bubblewrap cannot apply the sandbox's system-call filter ({last}); the kernel must allow seccomp filters"
                    )
                } else {
                    format!(
                        "bubblewrap cannot start a sandbox here ({last}); unprivileged user namespaces may be disabled"
                    )
                })
            }
            Err(error) => Some(format!(
                "bubblewrap (bwrap) is not installed: {error}; install the bubblewrap package"
            )),
        }
    }

    /// Hands the filter to the child as [`FILTER_FD`], where `--seccomp` reads it. A fresh
    /// memfd each time (bubblewrap reads it to the end), mapped into the child only, so runs
    /// spawned at once never see each other's descriptors.
    fn pass_filter<C: CommandFdExt>(&self, command: &mut C) -> std::io::Result<()> {
        let mut file =
            std::fs::File::from(memfd_create(c"toolrelay-seccomp", MFdFlags::MFD_CLOEXEC)?);
        file.write_all(&self.filter)?;
        file.rewind()?;
        command
            .fd_mappings(vec![FdMapping {
                parent_fd: file.into(),
                child_fd: FILTER_FD,
            }])
            .map_err(std::io::Error::other)?;
        Ok(())
    }

    /// bubblewrap's arguments: a read-only world with only what a run needs.
    fn bwrap_args(&self) -> Vec<String> {
        let mut args: Vec<String> = [
            "--unshare-all",
            // Always a user namespace, and no further ones inside it (they would allow mounts).
            "--unshare-user",
            "--disable-userns",
            "--die-with-parent",
            "--new-session",
            "--clearenv",
            "--cap-drop",
            "ALL",
            "--ro-bind",
            "/usr",
            "/usr",
        ]
        .map(str::to_owned)
        .to_vec();
        // Whatever was installed by hand (/usr/local) stays out of reach: an empty,
        // read-only tmpfs over it.
        if Path::new("/usr/local").is_dir() {
            args.extend(["--tmpfs", "/usr/local", "--remount-ro", "/usr/local"].map(str::to_owned));
        }
        args.extend(["--seccomp".into(), FILTER_FD.to_string()]);
        // Debian's merged /usr: /bin, /lib, /lib64 and /sbin are links into it.
        for dir in ["bin", "lib", "lib64", "sbin"] {
            if Path::new(&format!("/{dir}")).is_symlink() {
                args.extend(["--symlink".into(), format!("usr/{dir}"), format!("/{dir}")]);
            } else if Path::new(&format!("/{dir}")).is_dir() {
                args.extend(["--ro-bind".into(), format!("/{dir}"), format!("/{dir}")]);
            }
        }
        if Path::new("/etc/ld.so.cache").exists() {
            args.extend(["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"].map(str::to_owned));
        }
        let venv = self.venv.display().to_string();
        args.extend(["--ro-bind".into(), venv.clone(), venv]);
        args.extend(["--size".into(), self.config.tmp_bytes.to_string()]);
        args.extend(["--tmpfs", "/tmp", "--proc", "/proc"].map(str::to_owned));
        args.extend(self.hidden_proc.iter().cloned());
        args.extend(
            [
                "--dev",
                "/dev",
                "--chdir",
                "/tmp",
                "--setenv",
                "PATH",
                "/usr/bin",
                "--setenv",
                "HOME",
                "/tmp",
                "--setenv",
                "LANG",
                "C.UTF-8",
                "--setenv",
                "PYTHONDONTWRITEBYTECODE",
                "1",
                "--remount-ro",
                "/dev",
                "--remount-ro",
                "/",
            ]
            .map(str::to_owned),
        );
        args
    }

    /// Runs the runner with `job` on stdin; returns its JSON result.
    pub async fn run(&self, job: &Value) -> Result<Value, ToolFailure> {
        if let Some(reason) = &self.unavailable {
            return Err(ToolFailure::new(
                FailureKind::Internal,
                ToolCode::SandboxUnavailable,
                format!("Python cannot run here: {reason}. The code was not run."),
            ));
        }
        let lease = if self.as_root {
            Some(UidLease::take(self.config.base_uid).ok_or_else(busy)?)
        } else {
            None
        };
        let outcome = self.run_as(job, lease.as_ref().map(|lease| lease.0)).await;
        reap_orphans();
        outcome
    }

    async fn run_as(&self, job: &Value, uid: Option<u32>) -> Result<Value, ToolFailure> {
        let limits = &self.config;
        // As root each run has its own uid; otherwise the uid is the relay's, whose own
        // processes and threads count against the limit too.
        let processes = match uid {
            Some(_) => limits.processes,
            None => {
                tasks_of(std::fs::metadata("/proc/self").map_or(0, |meta| meta.uid()))
                    + limits.processes
            }
        };
        let mut job = job.clone();
        job["limit"] = limits.result_bytes.into();
        let mut command = Command::new("prlimit");
        command
            // SIGXCPU at the soft limit (a clear cause), SIGKILL a second later.
            .arg(format!(
                "--cpu={}:{}",
                limits.cpu_seconds,
                limits.cpu_seconds + 1
            ))
            .arg(format!("--as={}", limits.memory_bytes))
            .arg(format!("--nproc={processes}"))
            .arg(format!("--fsize={}", limits.file_bytes))
            .arg("--core=0")
            .arg("--")
            // Killed with the relay, even if the relay dies without cleaning up.
            .args(["setpriv", "--pdeathsig", "KILL", "--", "bwrap"])
            .args(self.bwrap_args())
            .arg(&self.config.python)
            .args(["-I", "-c", RUNNER])
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(uid) = uid {
            command.uid(uid).gid(uid);
        }
        let could_not_start = |error: std::io::Error| {
            ToolFailure::new(
                FailureKind::Internal,
                ToolCode::SandboxUnavailable,
                format!("The sandbox could not start: {error}. The code was not run."),
            )
        };
        self.pass_filter(&mut command).map_err(could_not_start)?;
        let mut child = command.spawn().map_err(could_not_start)?;
        let pid = child.id();
        let _running = pid.map(Running::insert);
        let input = serde_json::to_vec(&job).unwrap_or_default();
        if let Some(mut stdin) = child.stdin.take() {
            // A run that exits before reading its input fails below with its own message.
            let _ = stdin.write_all(&input).await;
        }
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        // The result is the last line: keep the end of stdout, with room for the result.
        let reading = async {
            let (out, err) = tokio::join!(
                tail(stdout, limits.result_bytes + RESULT_SLACK),
                tail(stderr, STDERR_BYTES)
            );
            let status = child.wait().await;
            (out, err, status)
        };
        let finished = tokio::time::timeout(limits.wall_clock, reading).await;
        let Ok((stdout, stderr, status)) = finished else {
            // Killing bwrap ends its PID namespace, and with it every process of the run.
            let _ = child.kill().await;
            return Err(stopped(format!(
                "The code ran longer than {} s and was stopped. Look for endless loops or make the model smaller.",
                limits.wall_clock.as_secs()
            )));
        };
        let (stdout, stdout_cut) = stdout;
        let (stderr, _) = stderr;
        // The runner's result follows the last marker (on the same line as output the code
        // wrote without a newline, if it did).
        if let Some(line) = stdout.rfind(MARKER).map(|at| {
            stdout[at + MARKER.len()..]
                .lines()
                .next()
                .unwrap_or_default()
        }) {
            return serde_json::from_str(line).map_err(|error| {
                ToolFailure::new(
                    FailureKind::Internal,
                    ToolCode::SandboxFailed,
                    format!("The run's result was unreadable: {error}."),
                )
            });
        }
        if stdout_cut {
            return Err(ToolFailure::new(
                FailureKind::TooLarge,
                ToolCode::ModelTooLarge,
                format!(
                    "The run wrote more than {} KB to its output, so its result was lost. Print less, or make the model smaller.",
                    limits.result_bytes / 1024
                ),
            ));
        }
        let status = status.ok();
        // bubblewrap reports a signal that ended the run as the exit status 128 + signal.
        let signal = status.and_then(|status| {
            status.signal().or_else(|| {
                status
                    .code()
                    .filter(|code| (129..160).contains(code))
                    .map(|code| code - 128)
            })
        });
        let why = match signal {
            Some(24) => format!("it used more than {} s of CPU time", limits.cpu_seconds),
            Some(9) => "it was killed (out of memory or CPU time)".to_owned(),
            Some(signal) => format!("it was stopped by signal {signal}"),
            None => format!(
                "it exited with status {}",
                status.and_then(|status| status.code()).unwrap_or(-1)
            ),
        };
        let detail = stderr
            .lines()
            .rev()
            .find(|line| !line.trim().is_empty())
            .unwrap_or_default()
            .to_owned();
        Err(stopped(format!(
            "The code did not finish: {why}.{} Limits: {} s CPU, {} MB memory, {} processes.",
            if detail.is_empty() {
                String::new()
            } else {
                format!(" Last message: {detail}.")
            },
            limits.cpu_seconds,
            limits.memory_bytes / (1024 * 1024),
            limits.processes
        )))
    }
}

/// bubblewrap's arguments covering the host-revealing parts of `/proc` that exist here (a
/// mount needs an existing target, and the sandbox's `/proc` has the host kernel's entries).
fn hidden_proc() -> Vec<String> {
    let mut args = Vec::new();
    for file in HIDDEN_PROC_FILES {
        let path = format!("/proc/{file}");
        if Path::new(&path).exists() {
            args.extend(["--ro-bind".into(), "/dev/null".into(), path]);
        }
    }
    for dir in HIDDEN_PROC_DIRS {
        let path = format!("/proc/{dir}");
        if Path::new(&path).is_dir() {
            args.extend(["--tmpfs".into(), path.clone(), "--remount-ro".into(), path]);
        }
    }
    args
}

/// Marks a pid as a run's own (in [`RUNNING`]) while alive.
struct Running(u32);

impl Running {
    fn insert(pid: u32) -> Self {
        locked(&RUNNING).insert(pid);
        Self(pid)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        locked(&RUNNING).remove(&self.0);
    }
}

/// A sandbox uid held by one run; freed (once its processes are gone) when dropped, also
/// when the run is cancelled.
struct UidLease(u32);

impl UidLease {
    /// A uid from `base` on that no other run of this process or of another relay on this
    /// host uses, and no process has.
    fn take(base: u32) -> Option<Self> {
        let mut used = locked(&UIDS_IN_USE);
        let (uid, claimed) = (base..base.saturating_add(UID_RANGE)).find_map(|uid| {
            if used.contains_key(&uid) {
                return None;
            }
            // Claimed first, so that no other relay starts a run as `uid` between the check
            // for its processes and this run's start.
            let claimed = claim(uid)?;
            if has_processes(uid) {
                // Runs left by a relay that died are ended: the uid is free for a later run.
                end_orphaned_runs(uid);
                return None;
            }
            Some((uid, claimed))
        })?;
        used.insert(uid, claimed);
        Some(Self(uid))
    }
}

/// Claims `uid` for this process among the relays on this host, whose runs would otherwise
/// share its process limit (and fail to fork): an abstract Unix socket named after it, which
/// one process at a time can bind and which the kernel frees when that process closes it or
/// dies. `None` when another process holds it; `Some(None)` when no such socket can be made
/// here (then only this process's own runs are kept apart, as before).
fn claim(uid: u32) -> Option<Option<UnixListener>> {
    let name = format!("toolrelay-sandbox-uid-{uid}");
    let bound = SocketAddr::from_abstract_name(name.as_bytes())
        .and_then(|address| UnixListener::bind_addr(&address));
    match bound {
        Ok(listener) => Some(Some(listener)),
        Err(error) if error.kind() == std::io::ErrorKind::AddrInUse => None,
        Err(_) => Some(None),
    }
}

impl Drop for UidLease {
    fn drop(&mut self) {
        end_orphaned_runs(self.0);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(release(self.0))),
            // No runtime to wait on: free it now; has_processes guards the next take.
            Err(_) => drop(locked(&UIDS_IN_USE).remove(&self.0)),
        }
    }
}

/// Reaps the exited processes of past runs that were re-parented to this process: zombie
/// children called `bwrap` or `python…` that are not a run's own (tokio waits for those).
fn reap_orphans() {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid …"; comm may hold spaces and parentheses.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = &stat[open + 1..close];
        let mut rest = stat[close + 1..].split_whitespace();
        let (state, ppid) = (
            rest.next(),
            rest.next().and_then(|ppid| ppid.parse::<u32>().ok()),
        );
        let ours = comm == "bwrap" || comm.starts_with("python");
        if state == Some("Z") && ppid == Some(me) && ours {
            let own = locked(&RUNNING).contains(&pid);
            if !own && let Ok(pid) = i32::try_from(pid) {
                let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
            }
        }
    }
}

/// Frees `uid` once none of its processes is left. They die with the run's PID namespace
/// (the kernel kills them all when bubblewrap goes), which takes a moment after a fork bomb;
/// until they are gone and reaped they would count against the next run's process limit.
async fn release(uid: u32) {
    for _ in 0..500 {
        reap_orphans();
        if !has_processes(uid) {
            locked(&UIDS_IN_USE).remove(&uid);
            return;
        }
        // An outer bubblewrap killed a moment ago may have left its inner process only now.
        end_orphaned_runs(uid);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tracing::error!(
        uid,
        "processes of a sandbox run outlived it by 10 s; that sandbox uid stays out of use"
    );
}

/// Whether any process runs as `uid`.
fn has_processes(uid: u32) -> bool {
    processes_of(uid).next().is_some()
}

/// The processes (zombies too) running as `uid` that this process can see.
fn processes_of(uid: u32) -> impl Iterator<Item = i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(move |entry| {
            let pid = entry.file_name().to_str()?.parse::<i32>().ok()?;
            entry
                .metadata()
                .is_ok_and(|meta| meta.uid() == uid)
                .then_some(pid)
        })
}

/// Ends the runs as `uid` that bubblewrap left behind. bubblewrap's inner process (pid 1 of
/// the run's PID namespace) is bound to its outer one (`--die-with-parent`) only once it has
/// set up, so an outer process killed before then (a run cancelled at once, a relay killed)
/// leaves it running with the run's code, adopted by whatever reaps orphans. Such a process,
/// pid 1 of a PID namespace below this one whose parent does not run as `uid`, is killed, and
/// its namespace with it. A run under way never is one (its inner process's parent is its
/// outer one, as `uid`), whichever relay on this host started it; nor is any process that is
/// not bubblewrap's inner one.
fn end_orphaned_runs(uid: u32) {
    for pid in processes_of(uid) {
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .map(str::trim)
        };
        // "NSpid: <pid here> … <pid in its own namespace>"
        let ids: Vec<&str> = field("NSpid:")
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        let namespace_init = ids.len() > 1 && ids.last() == Some(&"1");
        let real_uid = field("Uid:").and_then(|ids| ids.split_whitespace().next());
        let parent_uid = field("PPid:")
            .and_then(|ppid| std::fs::metadata(format!("/proc/{ppid}")).ok())
            .map(|meta| meta.uid());
        let adopted = parent_uid != Some(uid);
        if namespace_init && adopted && real_uid == Some(uid.to_string().as_str()) {
            // Gone already: nothing to do.
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// The last `cap` bytes a stream gives, and whether anything before them was dropped (the
/// rest is read and dropped so the process does not block on a full pipe).
async fn tail(stream: Option<impl AsyncRead + Unpin>, cap: usize) -> (String, bool) {
    let Some(mut stream) = stream else {
        return (String::new(), false);
    };
    let mut kept: std::collections::VecDeque<u8> = std::collections::VecDeque::new();
    let mut cut = false;
    let mut buffer = [0u8; 8192];
    while let Ok(read) = stream.read(&mut buffer).await {
        if read == 0 {
            break;
        }
        kept.extend(&buffer[..read]);
        if kept.len() > cap {
            kept.drain(..kept.len() - cap);
            cut = true;
        }
    }
    (
        String::from_utf8_lossy(kept.make_contiguous()).into_owned(),
        cut,
    )
}

/// Processes and threads running as `uid` (what `RLIMIT_NPROC` counts).
fn tasks_of(uid: u32) -> u64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .filter(|entry| entry.metadata().is_ok_and(|meta| meta.uid() == uid))
        .filter_map(|entry| std::fs::read_to_string(entry.path().join("status")).ok())
        .filter_map(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("Threads:"))
                .and_then(|threads| threads.trim().parse::<u64>().ok())
        })
        .sum()
}

fn stopped(message: String) -> ToolFailure {
    ToolFailure::new(FailureKind::BadInput, ToolCode::RunStopped, message)
}

/// Every sandbox is in use.
pub fn busy() -> ToolFailure {
    ToolFailure {
        kind: FailureKind::Busy,
        code: ToolCode::Busy.into(),
        message:
            "The relay is running as many models as it can at once. Try again in a few seconds."
                .into(),
        retry_after: Some(Duration::from_secs(5)),
    }
}
