//! The rkubelet binary: flags, config file, logging, then the kubelet until
//! SIGTERM/SIGINT. Errors stop here as anyhow; pods keep running on exit.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use rkubelet::config::flags::{self, FlagError, VersionMode};
use rkubelet::config::{self, features, KubeletConfiguration};
use rkubelet::kubelet::{self, KubeletOptions, KUBERNETES_VERSION};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Raises the soft open-file limit to the hard one, as the Go runtime does
/// at start for upstream's kubelet (Go 1.19 and later): the stats reader
/// keeps cgroup files open, and a node's kubelet holds many connections.
fn raise_open_file_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct given.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

fn main() -> ExitCode {
    rkubelet::memtrim::tune_allocator();
    raise_open_file_limit();
    let parsed = flags::parse_args(std::env::args().skip(1));
    let flags = match parsed {
        Ok(f) => f,
        Err(FlagError::Help) => {
            println!("{}", flags::usage());
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("Error: {e}");
            eprintln!("Run 'rkubelet --help' for usage.");
            return ExitCode::from(1);
        }
    };
    match flags.version {
        Some(VersionMode::Plain) => {
            println!("Kubernetes {KUBERNETES_VERSION}");
            return ExitCode::SUCCESS;
        }
        Some(VersionMode::Raw) => {
            println!("version.Info{{GitVersion:\"{KUBERNETES_VERSION}\", Compiler:\"rustc\", Platform:\"linux/{}\"}}", std::env::consts::ARCH);
            return ExitCode::SUCCESS;
        }
        None => {}
    }
    // The flag now; the config file's `logging.verbosity` once it is read.
    rkubelet::logging::init(u32::from(flags.verbosity));
    match run(flags) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::from(1)
        }
    }
}

/// Upstream's `SetFromMap` at startup (`cmd/kubelet/app/server.go`): an
/// unknown or locked gate ends it; setting a GA or deprecated gate warns.
fn set_feature_gates(gates: &BTreeMap<String, bool>) -> anyhow::Result<Vec<String>> {
    features::check(gates).context("failed to set feature gates from initial flags-based config")
}

fn run(flags: flags::KubeletFlags) -> anyhow::Result<()> {
    for w in &flags.deprecation_warnings {
        warn!("{w}");
    }
    // Upstream sets the command line's gates before it reads the config
    // file, and the merged ones after.
    let mut from_flags = KubeletConfiguration::default();
    flags.apply(&mut from_flags);
    set_feature_gates(&from_flags.feature_gates)?;
    let mut cfg = match &flags.config {
        Some(path) => {
            let (cfg, warnings) = config::load_file(path).with_context(|| {
                format!("failed to load kubelet config file {}", path.display())
            })?;
            for w in warnings {
                warn!(file = %path.display(), "{w}");
            }
            cfg
        }
        // Upstream's base is the flag-parsed configuration.
        None => from_flags.clone(),
    };
    if let Some(dir) = &flags.config_dir {
        for w in config::dropin::merge_drop_ins(&mut cfg, dir)
            .context("failed to merge kubelet configs")?
        {
            warn!(dir = %dir.display(), "{w}");
        }
    }
    // Flags win over the file and the drop-ins (kubeletConfigFlagPrecedence).
    flags.apply(&mut cfg);
    // As upstream applies `logging` once flags and file are merged (the
    // flag, when given, has set the field).
    if cfg.logging.verbosity != rkubelet::logging::verbosity() {
        rkubelet::logging::set_verbosity(cfg.logging.verbosity);
    }
    rkubelet::logging::set_json(cfg.logging.format == "json");
    for w in set_feature_gates(&cfg.feature_gates)? {
        warn!("{w}");
    }
    cfg.validate().context("invalid kubelet configuration")?;
    // Upstream's ParseThresholdConfig stops the kubelet on a bad threshold;
    // checked here, before anything starts (run parses them again).
    rkubelet::eviction::parse_config(
        false,
        &cfg.eviction_hard,
        &cfg.eviction_soft,
        &cfg.eviction_soft_grace_period,
        &cfg.eviction_minimum_reclaim,
    )
    .context("failed to run Kubelet")?;
    // As upstream's NewMainKubelet: an allowed unsafe sysctl that is not
    // namespaced, or not a sysctl pattern, stops it.
    rkubelet::lifecycle::sysctl::Allowlist::new(&cfg.allowed_unsafe_sysctls)
        .context("failed to run Kubelet")?;
    let baseline = config::honesty::baseline(flags.config.is_some());
    for w in config::honesty::unimplemented_settings(&cfg, &baseline, &flags) {
        warn!("warning: {w}");
    }
    // As upstream's run(): taken before anything starts, held until exit.
    if flags.exit_on_lock_contention && flags.lock_file.is_none() {
        anyhow::bail!("cannot exit on lock file contention: no lock file specified");
    }
    // `_lock` keeps the flock until the process exits.
    let (_lock, contention) = match &flags.lock_file {
        None => (None, None),
        Some(path) => {
            info!(path = %path.display(), "Acquiring file lock");
            let lock = rkubelet::lockfile::acquire(path).with_context(|| {
                format!(
                    "unable to acquire file lock on {:?}",
                    path.display().to_string()
                )
            })?;
            let contention = if flags.exit_on_lock_contention {
                info!(path = %path.display(), "Watching for inotify events");
                Some(rkubelet::lockfile::watch_for_contention(path)?)
            } else {
                None
            };
            (Some(lock), contention)
        }
    };

    let opts = KubeletOptions {
        node_name: kubelet::node_name(flags.hostname_override.as_deref()),
        node_ip: flags.node_ip.clone(),
        root_dir: flags.root_dir.clone(),
        kubeconfig: flags.kubeconfig.clone(),
        node_labels: flags.node_labels.clone(),
        bootstrap_kubeconfig: flags.bootstrap_kubeconfig.clone(),
        cert_dir: flags.cert_dir.clone(),
        seccomp_default: flags.seccomp_default,
        allocatable_ignore_eviction: flags.experimental_allocatable_ignore_eviction,
        container_gc: rkubelet::kuberuntime::gc::Policy {
            min_age: flags.minimum_container_ttl_duration.0,
            max_per_pod_container: flags.maximum_dead_containers_per_container,
            max_containers: flags.maximum_dead_containers,
        },
        config: cfg,
    };
    // Probes and CRI calls are many small wake-ups: one worker thread saves
    // the cross-thread hand-offs (futex calls) that dominate the kubelet's
    // own CPU time. RKUBELET_WORKER_THREADS raises it, like GOMAXPROCS.
    let threads = std::env::var("RKUBELET_WORKER_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()?;
    let result = rt.block_on(async move {
        let token = CancellationToken::new();
        let mut task = tokio::spawn(kubelet::run(opts, token.clone()));
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let contended = async {
            match contention {
                Some(rx) => rx.await.unwrap_or_else(|_| "watch ended".to_string()),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = &mut task => return r?.map_err(anyhow::Error::from),
            _ = term.recv() => info!("received SIGTERM, shutting down"),
            _ = tokio::signal::ctrl_c() => info!("received SIGINT, shutting down"),
            // Upstream's run() returns (exit 0) on the first event or watch error.
            ev = contended => info!(event = %ev, "lock file contention, shutting down"),
        }
        token.cancel();
        match tokio::time::timeout(Duration::from_secs(10), task).await {
            Ok(r) => r?.map_err(anyhow::Error::from),
            Err(_) => {
                warn!("shutdown timed out");
                Ok(())
            }
        }
    });
    // Dropping the runtime would wait for every blocking task, and one
    // stuck on a dead NFS or FUSE mount never ends: give them a moment.
    rt.shutdown_timeout(Duration::from_secs(2));
    result
}
