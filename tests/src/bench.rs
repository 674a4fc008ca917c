//! What the scheduler benchmarks (`railguard-scheduler-bench`, `railguard-dra-scheduler-bench`)
//! share.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use futures::{StreamExt, TryStreamExt};

/// API writes in flight while setting up and cleaning up.
pub const IN_FLIGHT: usize = 32;

/// Runs `f(0..n)` with at most [`IN_FLIGHT`] futures at a time; the first error stops it.
pub async fn fan_out<F, Fut>(n: usize, f: F) -> Result<()>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    futures::stream::iter((0..n).map(f))
        .buffer_unordered(IN_FLIGHT)
        .try_collect::<()>()
        .await
}

/// Counts with `left` every 500 ms until nothing is left; past `timeout` the error `stuck`
/// says for the last count.
pub async fn until_none_left<F, Fut>(
    timeout: Duration,
    mut left: F,
    stuck: impl Fn(usize) -> String,
) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<usize>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let left = left().await?;
        if left == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{}", stuck(left));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
