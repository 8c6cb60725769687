//! The log writer: loggers add their lines to one buffer, and a thread of its own writes the
//! buffer to stdout in one go, at most [`GATHER`] after its first line (sooner once
//! [`WRITE_AT`] bytes are waiting). A busy relay makes one write for many lines, and no
//! logger wakes a thread per line: `tracing-appender`'s channel woke its thread for each line,
//! a tenth of a relay's CPU when calls came one after another (BENCHMARKS.md, issue 44).
//!
//! Nothing is dropped: when stdout falls behind and [`FULL_AT`] bytes wait, loggers wait for
//! the writer. Dropping the [`LogGuard`] writes what is left and stops the thread.

use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use tracing_subscriber::fmt::MakeWriter;

/// How long the writer gathers lines after the first one before it writes them.
pub const GATHER: Duration = Duration::from_millis(50);
/// Waiting bytes that make the writer write at once.
pub const WRITE_AT: usize = 64 * 1024;
/// Waiting bytes that make loggers wait for the writer.
pub const FULL_AT: usize = 8 * 1024 * 1024;

#[derive(Default)]
struct Lines {
    bytes: Vec<u8>,
    closing: bool,
}

#[derive(Default)]
struct Shared {
    lines: Mutex<Lines>,
    /// The writer waits on it: for a first line, for [`WRITE_AT`] bytes, for the end.
    wake: Condvar,
    /// Loggers wait on it while [`FULL_AT`] bytes wait.
    written: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Lines> {
        self.lines
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Where the subscriber writes: the shared buffer ([`MakeWriter`]).
#[derive(Clone)]
pub struct Batched {
    shared: Arc<Shared>,
}

/// Keep until the end of `main`: dropping it writes out the lines still waiting.
#[must_use = "dropping the guard at once stops the log writer"]
pub struct LogGuard {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// A writer to `out` on the thread `name`, and its guard.
pub fn batched<W: Write + Send + 'static>(name: &str, out: W) -> (Batched, LogGuard) {
    let shared = Arc::new(Shared::default());
    let writer = Arc::clone(&shared);
    let thread = std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || write_lines(&writer, out))
        .ok();
    if thread.is_none() {
        eprintln!("cannot start the log writer's thread: logs go straight to their output");
    }
    let guard = LogGuard {
        shared: Arc::clone(&shared),
        thread,
    };
    // Without a thread nothing would ever write the buffer: loggers write it themselves.
    if guard.thread.is_none() {
        shared.lock().closing = true;
    }
    (Batched { shared }, guard)
}

/// The writer's loop: wait for a first line, gather for [`GATHER`], write them all.
fn write_lines(shared: &Shared, mut out: impl Write) {
    let mut batch = Vec::with_capacity(WRITE_AT);
    loop {
        let mut lines = shared.lock();
        while lines.bytes.is_empty() && !lines.closing {
            lines = shared
                .wake
                .wait(lines)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        if !lines.closing && lines.bytes.len() < WRITE_AT {
            lines = shared
                .wake
                .wait_timeout_while(lines, GATHER, |lines| {
                    !lines.closing && lines.bytes.len() < WRITE_AT
                })
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .0;
        }
        std::mem::swap(&mut lines.bytes, &mut batch);
        let closing = lines.closing;
        drop(lines);
        shared.written.notify_all();
        if batch.is_empty() && closing {
            return;
        }
        // A failed write (stdout closed) drops the batch: there is nowhere else to put it.
        let _ = out.write_all(&batch).and_then(|()| out.flush());
        batch.clear();
        if batch.capacity() > 4 * WRITE_AT {
            batch.shrink_to(WRITE_AT);
        }
    }
}

impl Drop for LogGuard {
    fn drop(&mut self) {
        self.shared.lock().closing = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One line's writer: the subscriber writes a formatted line with one `write_all`.
pub struct Line<'a> {
    shared: &'a Shared,
}

impl Write for Line<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut lines = self.shared.lock();
        if lines.closing {
            // The writer is gone (or never started): write at once.
            drop(lines);
            return std::io::stdout().lock().write(buf);
        }
        while lines.bytes.len() >= FULL_AT && !lines.closing {
            lines = self
                .shared
                .written
                .wait(lines)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        let was_empty = lines.bytes.is_empty();
        lines.bytes.extend_from_slice(buf);
        let wake = was_empty || lines.bytes.len() >= WRITE_AT;
        drop(lines);
        if wake {
            self.shared.wake.notify_one();
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Batched {
    type Writer = Line<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        Line {
            shared: &self.shared,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Instant;

    use super::*;

    /// A `Write` that sends each write to a channel (the test's stdout).
    struct Sent(mpsc::Sender<Vec<u8>>);

    impl Write for Sent {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let _ = self.0.send(buf.to_vec());
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn log(writer: &Batched, line: &str) {
        writer.make_writer().write_all(line.as_bytes()).unwrap();
    }

    #[test]
    fn lines_come_out_in_order_gathered_in_few_writes_and_none_is_lost_at_the_end() {
        let (sent, out) = mpsc::channel();
        let (writer, guard) = batched("test-log", Sent(sent));
        let started = Instant::now();
        log(&writer, "first\n");
        // A first line is written within the gathering time (and a deadline for a loaded machine).
        let first = out.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(first, b"first\n");
        assert!(started.elapsed() >= GATHER / 2, "written before gathering");
        // Many lines from several threads: gathered into few writes, each line whole.
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let writer = writer.clone();
                std::thread::spawn(move || {
                    for n in 0..2_000 {
                        log(&writer, &format!("thread {t} line {n:04}\n"));
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        log(&writer, "last\n");
        drop(guard);
        let written: Vec<Vec<u8>> = out.try_iter().collect();
        assert!(
            written.len() < 1_000,
            "{} writes for 8,001 lines",
            written.len()
        );
        let text = String::from_utf8(written.concat()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 8_001);
        assert_eq!(lines.last(), Some(&"last"));
        for t in 0..4 {
            let mine: Vec<&str> = lines
                .iter()
                .copied()
                .filter(|line| line.starts_with(&format!("thread {t} ")))
                .collect();
            let expected: Vec<String> = (0..2_000)
                .map(|n| format!("thread {t} line {n:04}"))
                .collect();
            assert_eq!(mine, expected, "thread {t}'s lines, whole and in order");
        }
    }

    #[test]
    fn loggers_wait_for_a_writer_that_falls_behind_rather_than_drop_lines() {
        /// Stdout that takes each write only when the test says so.
        struct Slow(mpsc::Receiver<()>, mpsc::Sender<usize>);
        impl Write for Slow {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.recv().unwrap();
                let _ = self.1.send(buf.len());
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let (go, gate) = mpsc::channel();
        let (took, taken) = mpsc::channel();
        let (writer, guard) = batched("test-log-slow", Slow(gate, took));
        let line = "x".repeat(1023) + "\n";
        let logger = {
            let writer = writer.clone();
            let line = line.clone();
            std::thread::spawn(move || {
                for _ in 0..(3 * FULL_AT / 1024) {
                    log(&writer, &line);
                }
            })
        };
        // The logger fills the buffer and waits: it cannot finish while stdout takes nothing.
        let deadline = Instant::now() + Duration::from_secs(10);
        while writer.shared.lock().bytes.len() < FULL_AT && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(writer.shared.lock().bytes.len() >= FULL_AT);
        assert!(!logger.is_finished());
        // Stdout takes writes again: every byte arrives.
        let mut total = 0;
        while total < 3 * FULL_AT {
            go.send(()).unwrap();
            total += taken.recv_timeout(Duration::from_secs(10)).unwrap();
        }
        logger.join().unwrap();
        assert_eq!(total, 3 * FULL_AT);
        go.send(()).ok();
        drop(guard);
    }
}
