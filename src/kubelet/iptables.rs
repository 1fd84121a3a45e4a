//! The kubelet's iptables chains (`makeIPTablesUtilChains`, upstream
//! kubelet_network_linux.go): `KUBE-IPTABLES-HINT` in mangle, which
//! kube-proxy's image reads to choose between iptables-legacy and
//! iptables-nft, and on IPv4 `KUBE-FIREWALL`, which drops packets to
//! 127.0.0.0/8 from elsewhere (route_localnet would let them in). A
//! `KUBE-KUBELET-CANARY` chain in mangle, nat and filter is checked every
//! minute; when a firewall reload has flushed it, the chains are made
//! again (upstream's iptables Monitor).
//!
//! The `iptables`/`ip6tables` commands are run as upstream's
//! pkg/util/iptables runs them (no maintained crate speaks to both the
//! legacy and the nft back ends the way the binaries do).

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub const HINT_CHAIN: &str = "KUBE-IPTABLES-HINT";
pub const FIREWALL_CHAIN: &str = "KUBE-FIREWALL";
pub const CANARY_CHAIN: &str = "KUBE-KUBELET-CANARY";
const CANARY_TABLES: [&str; 3] = ["mangle", "nat", "filter"];
/// How often the canary is looked for (upstream's 1 minute).
pub const MONITOR_INTERVAL: Duration = Duration::from_secs(60);

/// How one command ended: its exit code, or why it could not run.
pub type Outcome = Result<i32, String>;

/// Runs one `iptables`-style command (a seam for tests).
#[async_trait::async_trait]
pub trait Runner: Send + Sync {
    /// `args` after the binary's name.
    async fn run(&self, args: &[&str]) -> Outcome;
    /// "IPv4" or "IPv6", for logs.
    fn protocol(&self) -> &'static str;
    fn ipv6(&self) -> bool;
}

/// The real binaries, with upstream's lock wait (`-w 5 -W 100000`) so a
/// concurrent kube-proxy is waited for rather than failed on.
pub struct Binary {
    pub ipv6: bool,
}

#[async_trait::async_trait]
impl Runner for Binary {
    async fn run(&self, args: &[&str]) -> Outcome {
        let bin = if self.ipv6 { "ip6tables" } else { "iptables" };
        let mut cmd = tokio::process::Command::new(bin);
        cmd.args(["-w", "5", "-W", "100000"])
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
            .await
            .map_err(|_| format!("{bin} {} did not finish within 30s", args.join(" ")))?
            .map_err(|e| format!("{bin}: {e}"))?;
        let code = out.status.code().unwrap_or(-1);
        if code != 0 {
            debug!(
                command = %format!("{bin} {}", args.join(" ")),
                code,
                stderr = %String::from_utf8_lossy(&out.stderr).trim(),
                "iptables command exited non-zero"
            );
        }
        Ok(code)
    }

    fn protocol(&self) -> &'static str {
        if self.ipv6 {
            "IPv6"
        } else {
            "IPv4"
        }
    }

    fn ipv6(&self) -> bool {
        self.ipv6
    }
}

/// Makes `chain` in `table` unless it exists (iptables exits 1 for that).
async fn ensure_chain(r: &dyn Runner, table: &str, chain: &str) -> Result<(), String> {
    match r.run(&["-N", chain, "-t", table]).await? {
        0 | 1 => Ok(()),
        code => Err(format!(
            "error creating chain {chain:?} in table {table}: exit status {code}"
        )),
    }
}

async fn chain_exists(r: &dyn Runner, table: &str, chain: &str) -> Result<bool, String> {
    Ok(r.run(&["-S", chain, "-t", table]).await? == 0)
}

/// Adds the rule at the start (`prepend`) or end of `chain` unless `-C`
/// finds it there already.
async fn ensure_rule(
    r: &dyn Runner,
    prepend: bool,
    table: &str,
    chain: &str,
    rule: &[&str],
) -> Result<(), String> {
    let with = |op: &'static str| {
        let mut a = vec![op, chain, "-t", table];
        a.extend_from_slice(rule);
        a
    };
    if r.run(&with("-C")).await? == 0 {
        return Ok(());
    }
    match r.run(&with(if prepend { "-I" } else { "-A" })).await? {
        0 => Ok(()),
        code => Err(format!(
            "error appending rule to chain {chain:?} in table {table}: exit status {code}"
        )),
    }
}

/// Upstream's syncIPTablesRules: the hint chain, and on IPv4 the firewall
/// chain, its jumps from INPUT and OUTPUT and its rule.
pub async fn sync_rules(r: &dyn Runner) -> Result<(), String> {
    ensure_chain(r, "mangle", HINT_CHAIN)
        .await
        .map_err(|e| format!("Failed to ensure that iptables hint chain exists: {e}"))?;
    if r.ipv6() {
        // IPv6 has no route_localnet to guard against.
        return Ok(());
    }
    ensure_chain(r, "filter", FIREWALL_CHAIN).await?;
    for from in ["OUTPUT", "INPUT"] {
        ensure_rule(r, true, "filter", from, &["-j", FIREWALL_CHAIN]).await?;
    }
    ensure_rule(
        r,
        false,
        "filter",
        FIREWALL_CHAIN,
        &[
            "-m",
            "comment",
            "--comment",
            "block incoming localnet connections",
            "--dst",
            "127.0.0.0/8",
            "!",
            "--src",
            "127.0.0.0/8",
            "-m",
            "conntrack",
            "!",
            "--ctstate",
            "RELATED,ESTABLISHED,DNAT",
            "-j",
            "DROP",
        ],
    )
    .await
}

/// Whether this family has iptables at all (upstream's Present: the nat
/// table's POSTROUTING chain can be listed).
async fn present(r: &dyn Runner) -> bool {
    matches!(chain_exists(r, "nat", "POSTROUTING").await, Ok(true))
}

/// Upstream's initNetworkUtil for each family present, then its Monitor
/// until `token` is cancelled.
pub async fn run(runners: Vec<Box<dyn Runner>>, interval: Duration, token: CancellationToken) {
    let mut families = Vec::new();
    for r in runners {
        if present(r.as_ref()).await {
            families.push(r);
        }
    }
    if families.is_empty() {
        info!("No iptables support on this system; not creating the KUBE-IPTABLES-HINT chain");
        return;
    }
    let mut monitors = Vec::new();
    for r in families {
        match sync_rules(r.as_ref()).await {
            Ok(()) => {
                info!(protocol = r.protocol(), "Initialized iptables rules.");
                monitors.push(r);
            }
            Err(e) => {
                warn!(protocol = r.protocol(), error = %e, "Failed to initialize iptables rules; some functionality may be missing.");
            }
        }
    }
    let watched = monitors
        .iter()
        .map(|r| monitor(r.as_ref(), interval, &token));
    futures::future::join_all(watched).await;
}

/// Upstream's Monitor: keeps a canary chain in each table and, once a
/// flush has removed it from the first, waits (up to 5 s) for the others
/// to go too, then makes the kubelet's chains again. Ends with `token`.
pub async fn monitor(r: &dyn Runner, interval: Duration, token: &CancellationToken) {
    loop {
        // Make the canaries, again every interval while that fails.
        loop {
            let mut made = true;
            for table in CANARY_TABLES {
                if let Err(e) = ensure_chain(r, table, CANARY_CHAIN).await {
                    warn!(protocol = r.protocol(), table, error = %e, "Could not set up iptables canary");
                    made = false;
                    break;
                }
            }
            if made {
                break;
            }
            if sleep_or_cancel(interval, token).await {
                return;
            }
        }
        // Until the first table's canary is gone.
        loop {
            if sleep_or_cancel(interval, token).await {
                return;
            }
            match chain_exists(r, CANARY_TABLES[0], CANARY_CHAIN).await {
                Ok(true) => continue,
                Ok(false) => break,
                // Could not ask (e.g. the lock held past its wait): not a flush.
                Err(e) => {
                    warn!(protocol = r.protocol(), error = %e, "Could not check for iptables canary")
                }
            }
        }
        // A flush of several tables is not atomic: wait for the others.
        for table in &CANARY_TABLES[1..] {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            while matches!(chain_exists(r, table, CANARY_CHAIN).await, Ok(true))
                && tokio::time::Instant::now() < deadline
            {
                if sleep_or_cancel(Duration::from_millis(100), token).await {
                    return;
                }
            }
        }
        info!(protocol = r.protocol(), "Reloading after iptables flush");
        if let Err(e) = sync_rules(r).await {
            warn!(protocol = r.protocol(), error = %e, "Failed to initialize iptables rules; some functionality may be missing.");
        }
    }
}

/// Waits `d`; true when `token` was cancelled first.
async fn sleep_or_cancel(d: Duration, token: &CancellationToken) -> bool {
    tokio::select! {
        _ = token.cancelled() => true,
        _ = tokio::time::sleep(d) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;
    use std::collections::BTreeSet;
    use std::sync::Arc;

    /// An iptables of chains and rules in memory, answering as the binary.
    #[derive(Default)]
    struct Fake {
        ipv6: bool,
        chains: Mutex<BTreeSet<(String, String)>>,
        rules: Mutex<Vec<(String, String, Vec<String>)>>,
        calls: Mutex<Vec<String>>,
    }

    impl Fake {
        fn with_builtins(ipv6: bool) -> Arc<Self> {
            let f = Fake {
                ipv6,
                ..Default::default()
            };
            for (t, c) in [
                ("nat", "POSTROUTING"),
                ("filter", "INPUT"),
                ("filter", "OUTPUT"),
            ] {
                f.chains.lock().insert((t.into(), c.into()));
            }
            Arc::new(f)
        }
        fn has(&self, table: &str, chain: &str) -> bool {
            self.chains.lock().contains(&(table.into(), chain.into()))
        }
        fn flush(&self) {
            self.chains.lock().retain(|(_, c)| {
                c.starts_with("INPUT") || c.starts_with("OUTPUT") || c == "POSTROUTING"
            });
            self.rules.lock().clear();
        }
    }

    #[async_trait::async_trait]
    impl Runner for Arc<Fake> {
        async fn run(&self, args: &[&str]) -> Outcome {
            self.calls.lock().push(args.join(" "));
            let (op, chain, table) = (args[0], args[1].to_string(), args[3].to_string());
            let rule: Vec<String> = args[4..].iter().map(|s| s.to_string()).collect();
            let key = (table.clone(), chain.clone());
            Ok(match op {
                "-N" => i32::from(!self.chains.lock().insert(key)),
                "-S" => i32::from(!self.has(&table, &chain)),
                "-C" => i32::from(!self.rules.lock().contains(&(table, chain, rule))),
                "-I" => {
                    self.rules.lock().insert(0, (table, chain, rule));
                    0
                }
                "-A" => {
                    self.rules.lock().push((table, chain, rule));
                    0
                }
                _ => 2,
            })
        }
        fn protocol(&self) -> &'static str {
            "IPv4"
        }
        fn ipv6(&self) -> bool {
            self.ipv6
        }
    }

    /// Old code: none of the kubelet's chains were made.
    #[tokio::test]
    async fn the_hint_and_firewall_chains_are_made_once() {
        let f = Fake::with_builtins(false);
        sync_rules(&f).await.unwrap();
        sync_rules(&f).await.unwrap();
        assert!(f.has("mangle", HINT_CHAIN) && f.has("filter", FIREWALL_CHAIN));
        let rules = f.rules.lock().clone();
        assert_eq!(rules.len(), 3, "no rule twice: {rules:?}");
        assert_eq!(rules[0].1, "INPUT");
        assert_eq!(rules[1].1, "OUTPUT");
        assert_eq!(rules[2].1, FIREWALL_CHAIN);
        assert!(rules[2]
            .2
            .join(" ")
            .contains("--dst 127.0.0.0/8 ! --src 127.0.0.0/8"));
        // IPv6: the hint chain only.
        let six = Fake::with_builtins(true);
        sync_rules(&six).await.unwrap();
        assert!(six.has("mangle", HINT_CHAIN) && !six.has("filter", FIREWALL_CHAIN));
        assert!(six.rules.lock().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_flush_is_noticed_by_the_canary_and_the_chains_come_back() {
        let f = Fake::with_builtins(false);
        let token = CancellationToken::new();
        let task = tokio::spawn(run(
            vec![Box::new(f.clone())],
            MONITOR_INTERVAL,
            token.clone(),
        ));
        // Past start: chains and canaries made.
        tokio::time::sleep(Duration::from_secs(1)).await;
        for t in CANARY_TABLES {
            assert!(f.has(t, CANARY_CHAIN), "canary in {t}");
        }
        f.flush();
        assert!(!f.has("mangle", HINT_CHAIN));
        // Within one interval (and the 5 s wait for the other tables).
        tokio::time::sleep(MONITOR_INTERVAL + Duration::from_secs(6)).await;
        assert!(f.has("mangle", HINT_CHAIN) && f.has("filter", FIREWALL_CHAIN));
        assert!(CANARY_TABLES.iter().all(|t| f.has(t, CANARY_CHAIN)));
        assert_eq!(f.rules.lock().len(), 3);
        token.cancel();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn no_iptables_means_nothing_is_attempted() {
        let f = Arc::new(Fake::default());
        run(
            vec![Box::new(f.clone())],
            MONITOR_INTERVAL,
            CancellationToken::new(),
        )
        .await;
        assert_eq!(
            f.calls.lock().clone(),
            vec!["-S POSTROUTING -t nat".to_string()]
        );
    }
}
