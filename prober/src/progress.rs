//! Progress of long runs (`certify`: RDMA per rail, the NCCL sweeps; `campaign`: rounds of
//! pair tests). The runs report to a [`Progress`] sink and know nothing of terminals; the
//! shell picks the sink (a terminal bar, or [`NoProgress`], which prints nothing).

/// Where a run reports its steps. Called from worker threads too.
pub trait Progress: Send + Sync {
    /// `steps` more steps are planned (once up front, or per round as a plan grows).
    fn plan(&self, steps: u64);
    /// What runs now: which rail, which step (`RDMA rail 2/8 mlx5_3:1: GPU 1 memory`).
    fn step(&self, label: &str);
    /// One planned step is done.
    fn step_done(&self);
    /// The run is over: clear what was drawn.
    fn finish(&self);
    /// Whether this sink draws anything at all.
    fn draws(&self) -> bool {
        false
    }
}

/// Reports nothing: not a terminal, `--json`, the daemon.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoProgress;

impl Progress for NoProgress {
    fn plan(&self, _steps: u64) {}
    fn step(&self, _label: &str) {}
    fn step_done(&self) {}
    fn finish(&self) {}
}

/// Records every call, for tests of what a run reports.
#[derive(Debug, Default)]
pub struct RecordingProgress {
    pub events: std::sync::Mutex<Vec<String>>,
}

impl RecordingProgress {
    pub fn events(&self) -> Vec<String> {
        self.events.lock().map(|e| e.clone()).unwrap_or_default()
    }
    fn push(&self, e: String) {
        if let Ok(mut v) = self.events.lock() {
            v.push(e);
        }
    }
}

impl Progress for RecordingProgress {
    fn plan(&self, steps: u64) {
        self.push(format!("plan {steps}"));
    }
    fn step(&self, label: &str) {
        self.push(format!("step {label}"));
    }
    fn step_done(&self) {
        self.push("done".into());
    }
    fn finish(&self) {
        self.push("finish".into());
    }
}
