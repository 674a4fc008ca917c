//! The terminal side of progress: [`TerminalProgress`] (indicatif, on stderr) only when
//! stderr is a terminal and the output is not `--json`, else the library's [`NoProgress`];
//! and [`LogWriter`], which writes log lines around the bar.

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use railguard_prober::progress::{NoProgress, Progress};

/// The bar on screen, if any: log lines are written around it ([`LogWriter`]).
static ACTIVE: Mutex<Option<indicatif::ProgressBar>> = Mutex::new(None);

/// Log writer for stderr that hides the active progress bar while a line is written, so log
/// lines and the bar do not run into each other. Without a bar it is plain stderr.
#[derive(Debug, Default, Clone, Copy)]
pub struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let bar = ACTIVE.lock().ok().and_then(|b| b.clone());
        match bar {
            Some(bar) => bar.suspend(|| std::io::stderr().write(buf)),
            None => std::io::stderr().write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = LogWriter;
    fn make_writer(&'a self) -> Self::Writer {
        LogWriter
    }
}

/// Whether progress is drawn: only on a terminal, and never with `--json`.
pub fn wants_progress(stderr_is_terminal: bool, json: bool) -> bool {
    stderr_is_terminal && !json
}

/// The sink for a command printing `json` or not: a terminal bar on stderr, or nothing.
pub fn for_stderr(json: bool) -> Arc<dyn Progress> {
    sink(wants_progress(std::io::stderr().is_terminal(), json))
}

/// [`TerminalProgress`] when `draw`, else [`NoProgress`].
pub fn sink(draw: bool) -> Arc<dyn Progress> {
    if draw {
        Arc::new(TerminalProgress::new())
    } else {
        Arc::new(NoProgress)
    }
}

/// A progress bar on stderr: position, the current step, elapsed and remaining time.
pub struct TerminalProgress {
    bar: indicatif::ProgressBar,
}

impl TerminalProgress {
    pub fn new() -> Self {
        let bar = indicatif::ProgressBar::with_draw_target(
            Some(0),
            indicatif::ProgressDrawTarget::stderr(),
        );
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{spinner} {elapsed_precise} {bar:12} {pos}/{len} {wide_msg} ~{eta} left",
        ) {
            bar.set_style(style);
        }
        bar.enable_steady_tick(Duration::from_millis(200));
        if let Ok(mut active) = ACTIVE.lock() {
            *active = Some(bar.clone());
        }
        TerminalProgress { bar }
    }
}

impl Default for TerminalProgress {
    fn default() -> Self {
        Self::new()
    }
}

impl Progress for TerminalProgress {
    fn plan(&self, steps: u64) {
        self.bar.inc_length(steps);
    }
    fn step(&self, label: &str) {
        self.bar.set_message(label.to_string());
    }
    fn step_done(&self) {
        self.bar.inc(1);
    }
    fn finish(&self) {
        self.bar.finish_and_clear();
        if let Ok(mut active) = ACTIVE.lock() {
            *active = None;
        }
    }
    fn draws(&self) -> bool {
        true
    }
}

impl Drop for TerminalProgress {
    fn drop(&mut self) {
        // An error path never reaches finish(): do not leave a bar behind the message.
        if !self.bar.is_finished() {
            self.finish();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_only_on_a_terminal_without_json() {
        assert!(wants_progress(true, false));
        assert!(!wants_progress(true, true));
        assert!(!wants_progress(false, false));
        assert!(!wants_progress(false, true));
    }

    #[test]
    fn the_sink_off_a_terminal_draws_nothing() {
        // The test's stderr is captured (not a terminal): for_stderr gives the silent sink,
        // whatever --json says.
        for json in [false, true] {
            let p = sink(wants_progress(false, json));
            assert!(!p.draws());
            p.plan(3);
            p.step("RDMA rail 1/3 mlx5_0:1: host memory");
            p.step_done();
            p.finish();
        }
        assert!(sink(wants_progress(true, false)).draws());
        // The terminal bar itself keeps count (indicatif hides it on a non-terminal).
        let bar = TerminalProgress::new();
        bar.plan(2);
        bar.step("x");
        bar.step_done();
        assert_eq!(bar.bar.position(), 1);
        assert_eq!(bar.bar.length(), Some(2));
        bar.finish();
        assert!(bar.bar.is_finished());
    }
}
