//! One probe worker: probes its container instance every period, counts
//! consecutive identical results against the thresholds and records the
//! decided result (upstream `worker.go`).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Probe;
use tokio::sync::Notify;
use tokio::time::{interval, sleep, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use super::handlers::{self, Outcome};
use super::{Inner, ProbeType, ResultLabel, Standing, WorkerCtx};

/// Probe timing and thresholds with upstream's defaults for unset (or
/// zero) fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Params {
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

fn positive(v: Option<i32>, default: i32) -> i32 {
    v.filter(|v| *v > 0).unwrap_or(default)
}

impl Params {
    pub fn from_spec(p: &Probe) -> Self {
        Params {
            initial_delay: Duration::from_secs(p.initial_delay_seconds.unwrap_or(0).max(0) as u64),
            period: Duration::from_secs(positive(p.period_seconds, 10) as u64),
            timeout: Duration::from_secs(positive(p.timeout_seconds, 1) as u64),
            success_threshold: positive(p.success_threshold, 1) as u32,
            failure_threshold: positive(p.failure_threshold, 3) as u32,
        }
    }
}

/// How much of the initial delay, counted from the container's start
/// (nanoseconds since the epoch), is still to wait.
pub(crate) fn initial_delay_left(started_at: i64, delay: Duration) -> Duration {
    if delay.is_zero() {
        return Duration::ZERO;
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as i64;
    let elapsed = Duration::from_nanos(now.saturating_sub(started_at).max(0) as u64);
    delay.saturating_sub(elapsed)
}

/// Consecutive identical results and the thresholds that decide them.
#[derive(Debug, Default)]
pub(crate) struct Run {
    last: Option<bool>,
    count: u32,
}

impl Run {
    /// Adds a result; returns it once it has been seen `threshold` times
    /// in a row (and on every further repetition, as upstream does).
    pub fn observe(&mut self, success: bool, p: &Params) -> Option<bool> {
        if self.last == Some(success) {
            self.count = self.count.saturating_add(1);
        } else {
            self.last = Some(success);
            self.count = 1;
        }
        let threshold = if success {
            p.success_threshold
        } else {
            p.failure_threshold
        };
        (self.count >= threshold).then_some(success)
    }
}

pub(crate) async fn run(
    inner: Arc<Inner>,
    ctx: WorkerCtx,
    token: CancellationToken,
    trigger: Arc<Notify>,
) {
    let params = Params::from_spec(&ctx.spec);
    let delay = initial_delay_left(ctx.started_at, params.initial_delay);
    if !delay.is_zero() {
        tokio::select! {
            _ = token.cancelled() => return,
            _ = sleep(delay) => {}
        }
    }
    let mut ticker = interval(params.period);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut run = Run::default();
    let name = ctx.container.name.as_str();
    let kind = ctx.probe_type.as_str();
    loop {
        tokio::select! {
            biased;
            _ = token.cancelled() => return,
            _ = ticker.tick() => {}
            _ = trigger.notified() => {}
        }
        match (inner.standing(&ctx), ctx.probe_type) {
            (Standing::Stale, _) => return,
            // Started: the startup probe's work is done.
            (Standing::Current { started: true }, ProbeType::Startup) => return,
            // Liveness and readiness wait for the startup probe.
            (Standing::Current { started: false }, t) if t != ProbeType::Startup => continue,
            _ => {}
        }
        let probe_start = tokio::time::Instant::now();
        let outcome = tokio::select! {
            _ = token.cancelled() => return,
            o = handlers::run_probe(inner.runtime.as_ref(), &ctx.spec, &ctx.container,
                &ctx.container_id, &ctx.pod_ip, params.timeout) => o,
        };
        let success = match outcome {
            Ok(Outcome::Success(_)) => true,
            Ok(Outcome::Warning(output)) => {
                info!(pod = %ctx.pod_ref, container = name, probe = kind, %output,
                    "ProbeWarning: {kind} probe warning");
                crate::events::record(
                    ctx.event_ref.clone(),
                    crate::events::WARNING,
                    "ProbeWarning",
                    format!("{} probe warning: {output}", ctx.probe_type),
                );
                true
            }
            Ok(Outcome::Failure(output)) => {
                info!(pod = %ctx.pod_ref, container = name, probe = kind, %output,
                    "Unhealthy: {kind} probe failed");
                crate::events::record(
                    ctx.event_ref.clone(),
                    crate::events::WARNING,
                    "Unhealthy",
                    format!("{} probe failed: {output}", ctx.probe_type),
                );
                false
            }
            Err(error) => {
                // Upstream throws prober errors away (after retries),
                // without counting them.
                info!(pod = %ctx.pod_ref, container = name, probe = kind, %error,
                    "Unhealthy: {kind} probe errored");
                continue;
            }
        };
        inner.count(
            &ctx,
            if success {
                ResultLabel::Successful
            } else {
                ResultLabel::Failed
            },
            probe_start.elapsed(),
        );
        let Some(decided) = run.observe(success, &params) else {
            continue;
        };
        if let Some(update) = inner.set_result(&ctx, decided) {
            debug!(pod = %ctx.pod_ref, container = name, probe = kind, success = decided,
                "probe result changed");
            tokio::select! {
                _ = token.cancelled() => return,
                _ = inner.updates.send(update) => {}
            }
        }
        match (ctx.probe_type, decided) {
            // The container will be restarted; its next instance gets new
            // workers. Upstream holds the worker until then.
            (ProbeType::Liveness | ProbeType::Startup, false) => return,
            (ProbeType::Startup, true) => return,
            _ => {}
        }
    }
}
