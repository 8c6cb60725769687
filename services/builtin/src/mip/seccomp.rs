//! The sandbox's system-call filter: an allow-list of what CPython and PuLP use to build a
//! model (found by tracing real runs with `strace -f`), plus what ordinary Python does with
//! files in its private `/tmp`, threads, child processes and `AF_UNIX` sockets. Every other
//! system call fails with `EPERM` ("Operation not permitted"), so Python raises a readable
//! error instead of being killed. Left out on purpose, among others: sockets of any family
//! but `AF_UNIX` (an argument check on `socket`/`socketpair`, so no vsock, IP, netlink or
//! packet sockets), `io_uring_*`, `userfaultfd`, `ptrace`, `process_vm_*`, `bpf`,
//! `perf_event_open`, `kexec_*`, `mount` and the new mount API, `unshare`/`setns`,
//! `keyctl`/`add_key`, `personality`, `prctl`, `seccomp`, module loading, and every ioctl but
//! a handful that Python's file objects issue (no `TIOCSTI`).
//!
//! bubblewrap installs the filter (`--seccomp FD`, the compiled classic BPF) just before it
//! executes Python, so `execve` must be allowed; the filter then binds every process of the
//! run. seccompiler writes the BPF, including the check that a call uses this architecture's
//! system-call table (anything else, such as `int 0x80` on x86_64, kills the process).

use std::collections::BTreeMap;

/// The compiled filter, as the bytes `bwrap --seccomp` reads (native-endian `sock_filter`s),
/// or why it cannot be built here.
pub fn program() -> Result<Vec<u8>, String> {
    let bpf = build()?;
    let mut bytes = Vec::with_capacity(bpf.len() * 8);
    for instruction in bpf {
        bytes.extend(instruction.code.to_ne_bytes());
        bytes.push(instruction.jt);
        bytes.push(instruction.jf);
        bytes.extend(instruction.k.to_ne_bytes());
    }
    Ok(bytes)
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn build() -> Result<seccompiler::BpfProgram, String> {
    use seccompiler::{
        SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
        SeccompRule, TargetArch,
    };

    let failed = |error: seccompiler::BackendError| {
        format!("the sandbox's system-call filter cannot be built: {error}")
    };
    // `call(arg) == one of values`, as or-ed rules.
    let one_of = |arg: u8, values: &[u64]| -> Result<Vec<SeccompRule>, String> {
        values
            .iter()
            .map(|value| {
                SeccompCondition::new(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, *value)
                    .and_then(|condition| SeccompRule::new(vec![condition]))
                    .map_err(failed)
            })
            .collect()
    };
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = ALLOWED
        .iter()
        .chain(ALLOWED_HERE)
        .map(|call| (*call, Vec::new()))
        .collect();
    let unix = libc::AF_UNIX as u64;
    rules.insert(libc::SYS_socket, one_of(0, &[unix])?);
    rules.insert(libc::SYS_socketpair, one_of(0, &[unix])?);
    rules.insert(libc::SYS_ioctl, one_of(1, IOCTLS)?);
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(failed)?;
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Errno(libc::EPERM as u32),
        SeccompAction::Allow,
        arch,
    )
    .map_err(failed)?;
    filter.try_into().map_err(failed)
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn build() -> Result<seccompiler::BpfProgram, String> {
    Err(format!(
        "the sandbox's system-call filter exists for x86_64 and aarch64 only, not {}",
        std::env::consts::ARCH
    ))
}

/// ioctl requests allowed: what `isatty`, terminal size, `os.set_inheritable` and
/// `os.set_blocking` issue. Not `TIOCSTI` (typing into a terminal) or any device's own.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[allow(clippy::unnecessary_cast)] // `libc::Ioctl` is u64 with glibc but i32 with musl
const IOCTLS: &[u64] = &[
    libc::TCGETS as u64,
    libc::TIOCGWINSZ as u64,
    libc::TIOCGPGRP as u64,
    libc::FIONREAD as u64,
    libc::FIONBIO as u64,
    libc::FIOCLEX as u64,
    libc::FIONCLEX as u64,
];

/// System calls allowed with any arguments, on every architecture.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
const ALLOWED: &[i64] = &[
    // Files (only /tmp is writable; the rest of the tree is read-only).
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_preadv,
    libc::SYS_pwritev,
    libc::SYS_preadv2,
    libc::SYS_pwritev2,
    libc::SYS_openat,
    libc::SYS_openat2,
    libc::SYS_close,
    libc::SYS_close_range,
    libc::SYS_lseek,
    libc::SYS_fstat,
    libc::SYS_newfstatat,
    libc::SYS_statx,
    libc::SYS_statfs,
    libc::SYS_fstatfs,
    libc::SYS_faccessat,
    libc::SYS_faccessat2,
    libc::SYS_readlinkat,
    libc::SYS_getdents64,
    libc::SYS_getcwd,
    libc::SYS_chdir,
    libc::SYS_fchdir,
    libc::SYS_mkdirat,
    libc::SYS_unlinkat,
    libc::SYS_renameat2,
    libc::SYS_linkat,
    libc::SYS_symlinkat,
    libc::SYS_fchmod,
    libc::SYS_fchmodat,
    libc::SYS_umask,
    libc::SYS_truncate,
    libc::SYS_ftruncate,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_fallocate,
    libc::SYS_fadvise64,
    libc::SYS_flock,
    libc::SYS_fcntl,
    libc::SYS_dup,
    libc::SYS_dup3,
    libc::SYS_pipe2,
    libc::SYS_utimensat,
    libc::SYS_getxattr,
    libc::SYS_lgetxattr,
    libc::SYS_fgetxattr,
    libc::SYS_listxattr,
    libc::SYS_llistxattr,
    libc::SYS_flistxattr,
    libc::SYS_sendfile,
    libc::SYS_copy_file_range,
    libc::SYS_memfd_create,
    // Memory.
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mprotect,
    libc::SYS_mremap,
    libc::SYS_madvise,
    libc::SYS_brk,
    libc::SYS_mincore,
    libc::SYS_msync,
    libc::SYS_membarrier,
    // Threads and child processes (in the run's own PID namespace; new namespaces are
    // refused by bubblewrap's settings, so clone's flags need no check).
    libc::SYS_clone,
    libc::SYS_clone3,
    libc::SYS_execve,
    libc::SYS_wait4,
    libc::SYS_waitid,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_kill,
    libc::SYS_tgkill,
    libc::SYS_tkill,
    libc::SYS_pidfd_open,
    libc::SYS_pidfd_send_signal,
    libc::SYS_getpid,
    libc::SYS_getppid,
    libc::SYS_gettid,
    libc::SYS_getuid,
    libc::SYS_geteuid,
    libc::SYS_getgid,
    libc::SYS_getegid,
    libc::SYS_getresuid,
    libc::SYS_getresgid,
    libc::SYS_getgroups,
    libc::SYS_getpgid,
    libc::SYS_setpgid,
    libc::SYS_getsid,
    libc::SYS_setsid,
    libc::SYS_getpriority,
    libc::SYS_setpriority,
    libc::SYS_sched_yield,
    libc::SYS_sched_getaffinity,
    libc::SYS_sched_setaffinity,
    libc::SYS_sched_getparam,
    libc::SYS_sched_getscheduler,
    libc::SYS_sched_get_priority_max,
    libc::SYS_sched_get_priority_min,
    libc::SYS_prlimit64,
    libc::SYS_getrusage,
    libc::SYS_times,
    libc::SYS_sysinfo,
    libc::SYS_uname,
    libc::SYS_capget,
    libc::SYS_set_tid_address,
    libc::SYS_set_robust_list,
    libc::SYS_rseq,
    libc::SYS_futex,
    libc::SYS_futex_waitv,
    libc::SYS_getrandom,
    // Signals and time.
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_rt_sigsuspend,
    libc::SYS_rt_sigtimedwait,
    libc::SYS_rt_sigpending,
    libc::SYS_sigaltstack,
    libc::SYS_getitimer,
    libc::SYS_setitimer,
    libc::SYS_restart_syscall,
    libc::SYS_clock_gettime,
    libc::SYS_clock_getres,
    libc::SYS_gettimeofday,
    libc::SYS_nanosleep,
    libc::SYS_clock_nanosleep,
    libc::SYS_timer_create,
    libc::SYS_timer_settime,
    libc::SYS_timer_gettime,
    libc::SYS_timer_getoverrun,
    libc::SYS_timer_delete,
    libc::SYS_timerfd_create,
    libc::SYS_timerfd_settime,
    libc::SYS_timerfd_gettime,
    // Waiting on descriptors.
    libc::SYS_ppoll,
    libc::SYS_pselect6,
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_pwait2,
    libc::SYS_eventfd2,
    libc::SYS_signalfd4,
    // Sockets: only AF_UNIX ones can be made (see the rules on socket and socketpair).
    libc::SYS_connect,
    libc::SYS_bind,
    libc::SYS_listen,
    libc::SYS_accept,
    libc::SYS_accept4,
    libc::SYS_sendto,
    libc::SYS_recvfrom,
    libc::SYS_sendmsg,
    libc::SYS_recvmsg,
    libc::SYS_sendmmsg,
    libc::SYS_recvmmsg,
    libc::SYS_shutdown,
    libc::SYS_getsockname,
    libc::SYS_getpeername,
    libc::SYS_getsockopt,
    libc::SYS_setsockopt,
];

/// x86_64's older calls, which glibc and CPython still use there (aarch64 has only the
/// `*at` and generic forms above).
#[cfg(target_arch = "x86_64")]
const ALLOWED_HERE: &[i64] = &[
    libc::SYS_open,
    libc::SYS_creat,
    libc::SYS_stat,
    libc::SYS_lstat,
    libc::SYS_access,
    libc::SYS_readlink,
    libc::SYS_getdents,
    libc::SYS_mkdir,
    libc::SYS_rmdir,
    libc::SYS_unlink,
    libc::SYS_rename,
    libc::SYS_renameat,
    libc::SYS_link,
    libc::SYS_symlink,
    libc::SYS_chmod,
    // glibc 2.39+ tries it before fchmodat and falls back only on ENOSYS.
    libc::SYS_fchmodat2,
    libc::SYS_utime,
    libc::SYS_utimes,
    libc::SYS_futimesat,
    libc::SYS_pipe,
    libc::SYS_dup2,
    libc::SYS_fork,
    libc::SYS_vfork,
    libc::SYS_getpgrp,
    libc::SYS_poll,
    libc::SYS_select,
    libc::SYS_epoll_create,
    libc::SYS_epoll_wait,
    libc::SYS_eventfd,
    libc::SYS_signalfd,
    libc::SYS_alarm,
    libc::SYS_pause,
    libc::SYS_time,
    libc::SYS_getrlimit,
    libc::SYS_setrlimit,
    libc::SYS_arch_prctl,
];

#[cfg(target_arch = "aarch64")]
const ALLOWED_HERE: &[i64] = &[];
