//! Collections made just ahead of scrapes that come at a steady period.
//!
//! Prometheus and metrics-server scrape each target on a fixed period,
//! to within milliseconds. Upstream's kubelet answers from figures that
//! cAdvisor's housekeeping collected up to 15 s earlier. rkubelet collects
//! when asked, so a scrape waits for the cgroup reads, which are most of
//! its latency at 110 pods.
//!
//! Once an endpoint's last `ARRIVALS` scrapes came at one period, the
//! snapshot for the next one is collected just before it is due. The
//! scrape then finds it in the provider's cache. It is the same number of
//! collections, made earlier, and the figures are at most `CACHE_TTL` old,
//! as for two scrapes sharing one collection.
//!
//! Each client (by address) is timed apart, so two Prometheus servers of
//! an HA pair scraping one endpoint at offsets each keep their period.
//! Scrapes whose period wanders, and clients interleaved from one address
//! (behind one proxy, or the API server's), show no single period. Those
//! scrapes collect on demand, as before. After a client stops, at most one
//! collection is made for a scrape that does not come.

use std::future::Future;
use std::net::IpAddr;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::cgroup::Detail;
use super::provider::CACHE_TTL;

/// How many scrapes must come at one period before the next is collected
/// for: three equal intervals.
const ARRIVALS: usize = 4;
/// Intervals count as one period when they differ from the last by at
/// most `TOLERANCE_PART` of it, and never less than `TOLERANCE_MIN` (a
/// client that waits a fixed time after each answer has intervals that
/// differ by its answers' latencies) nor more than `TOLERANCE_MAX`. A
/// scrape that late still finds its snapshot fresh: `LEAD_MAX` plus
/// `TOLERANCE_MAX` is under `CACHE_TTL`; one that early collects itself.
const TOLERANCE_MIN: Duration = Duration::from_millis(50);
const TOLERANCE_MAX: Duration = Duration::from_millis(600);
const TOLERANCE_PART: u32 = 50;
/// Longer periods are not collected for. A snapshot made that far ahead
/// on a guess is not worth its reads.
const PERIOD_MAX: Duration = Duration::from_secs(600);
/// How long before the predicted scrape its collection starts: twice the
/// endpoint's last collection (or, when longer, the last work made ahead
/// for it: cAdvisor's text too) plus a margin, within these bounds. The
/// upper bound keeps the snapshot's age at the scrape well under
/// `CACHE_TTL`.
const LEAD_MIN: Duration = Duration::from_millis(30);
const LEAD_MAX: Duration = Duration::from_millis(300);
const LEAD_MARGIN: Duration = Duration::from_millis(20);
/// Clients timed per endpoint; a new one takes the place of the one heard
/// from least recently (a Prometheus HA pair, metrics-server, and a few
/// more fit).
pub const CLIENTS_MAX: usize = 8;

/// Who scraped: the client's address, when the server knows it.
pub type Client = Option<IpAddr>;

/// A collection to make ahead of a scrape: when to start it, for which
/// endpoint, and for which client's scrape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Due {
    pub at: Instant,
    pub endpoint: Endpoint,
    pub client: Client,
}

/// The endpoints whose scrapes are timed, each with the detail it
/// collects. `/metrics` reads the summary's pod figures for its log sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Cadvisor,
    Resource,
    Summary,
    SummaryCpuMemory,
    Metrics,
}

impl Endpoint {
    const ALL: [Endpoint; 5] = [
        Endpoint::Cadvisor,
        Endpoint::Resource,
        Endpoint::Summary,
        Endpoint::SummaryCpuMemory,
        Endpoint::Metrics,
    ];

    pub fn detail(self) -> Detail {
        match self {
            Endpoint::Cadvisor => Detail::Full,
            Endpoint::Resource => Detail::Resource,
            Endpoint::Summary | Endpoint::Metrics => Detail::Summary,
            Endpoint::SummaryCpuMemory => Detail::CpuMemory,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One client's recent scrapes of one endpoint.
#[derive(Debug, Default, Clone)]
struct Arrivals {
    client: Client,
    /// Oldest first, at most `ARRIVALS`.
    at: Vec<Instant>,
    /// The arrival after which a collection was last made ahead: one per
    /// arrival, so a client that stops costs at most one.
    fired_after: Option<Instant>,
}

impl Arrivals {
    fn push(&mut self, now: Instant) {
        if self.at.len() == ARRIVALS {
            self.at.remove(0);
        }
        self.at.push(now);
    }

    /// The period of the last `ARRIVALS` scrapes, when they had one.
    fn period(&self) -> Option<Duration> {
        if self.at.len() < ARRIVALS {
            return None;
        }
        let gap = |w: &[Instant]| w[1] - w[0];
        let last = gap(&self.at[ARRIVALS - 2..]);
        let tolerance = (last / TOLERANCE_PART).clamp(TOLERANCE_MIN, TOLERANCE_MAX);
        let steady = self
            .at
            .windows(2)
            .all(|w| gap(w).abs_diff(last) <= tolerance);
        // Shorter periods already share one collection through the cache.
        (steady && last > CACHE_TTL && last <= PERIOD_MAX).then_some(last)
    }
}

/// Every endpoint's scrapes by client, and each detail's last collection
/// time.
#[derive(Debug, Default)]
pub struct Cadences {
    /// Per endpoint, at most `CLIENTS_MAX` clients.
    endpoints: [Vec<Arrivals>; 5],
    /// Each detail's last collection.
    took: [Duration; 4],
    /// Each endpoint's last work made ahead.
    ahead_took: [Duration; 5],
}

impl Cadences {
    /// A scrape of `e` by `client` arrived at `now`.
    pub fn arrived(&mut self, e: Endpoint, client: Client, now: Instant) {
        let clients = &mut self.endpoints[e.index()];
        let i = match clients.iter().position(|a| a.client == client) {
            Some(i) => i,
            None => {
                if clients.len() == CLIENTS_MAX {
                    // The one heard from least recently goes.
                    let oldest = (0..clients.len()).min_by_key(|&i| clients[i].at.last().copied());
                    clients.swap_remove(oldest.unwrap_or(0));
                }
                clients.push(Arrivals {
                    client,
                    ..Default::default()
                });
                clients.len() - 1
            }
        };
        clients[i].push(now);
    }

    /// A collection of `d` took `took`, from the start of its CRI lists to
    /// its snapshot.
    pub fn collected(&mut self, d: Detail, took: Duration) {
        self.took[d as usize] = took;
    }

    /// The work made ahead of `e`'s scrape took `took`.
    pub fn made_ahead(&mut self, e: Endpoint, took: Duration) {
        self.ahead_took[e.index()] = took;
    }

    /// The next collection to make ahead of a scrape. The earliest, when
    /// several are due.
    pub fn due(&self) -> Option<Due> {
        Endpoint::ALL
            .iter()
            .flat_map(|&e| self.endpoints[e.index()].iter().map(move |a| (e, a)))
            .filter_map(|(e, a)| {
                let last = *a.at.last()?;
                if a.fired_after == Some(last) {
                    return None;
                }
                let period = a.period()?;
                let took = self.took[e.detail() as usize].max(self.ahead_took[e.index()]);
                let lead = (took * 2 + LEAD_MARGIN).clamp(LEAD_MIN, LEAD_MAX);
                Some(Due {
                    at: last + period - lead,
                    endpoint: e,
                    client: a.client,
                })
            })
            .min_by_key(|d| d.at)
    }

    /// The collection ahead of `client`'s next scrape of `e` is being made.
    pub fn fired(&mut self, e: Endpoint, client: Client) {
        let clients = &mut self.endpoints[e.index()];
        if let Some(a) = clients.iter_mut().find(|a| a.client == client) {
            a.fired_after = a.at.last().copied();
        }
    }
}

/// Makes the collections `Cadences::due` asks for, through `collect`, until
/// `token` is cancelled; `changed` is notified when a scrape arrives.
/// `expire` is called `CACHE_TTL` after each collection ahead, when what
/// was made for its scrape can no longer serve one.
pub async fn run<F, Fut>(
    cadences: &Mutex<Cadences>,
    changed: &Notify,
    collect: F,
    expire: impl Fn(),
    token: CancellationToken,
) where
    F: Fn(Endpoint, Client) -> Fut,
    Fut: Future<Output = ()>,
{
    async fn until(t: Option<Instant>) {
        match t {
            Some(t) => tokio::time::sleep_until(t).await,
            None => std::future::pending().await,
        }
    }
    let mut expire_at = None;
    loop {
        let due = cadences.lock().due();
        tokio::select! {
            _ = token.cancelled() => return,
            // A scrape came: the prediction is made again from it.
            _ = changed.notified() => continue,
            _ = until(expire_at) => {
                expire_at = None;
                expire();
                continue;
            }
            _ = until(due.map(|d| d.at)) => {}
        }
        let Some(Due {
            endpoint: e,
            client,
            ..
        }) = due
        else {
            continue;
        };
        cadences.lock().fired(e, client);
        tracing::trace!(endpoint = ?e, ?client, "collecting ahead of a steady scrape");
        // Cancelled mid-collection: the collection's own reads have their
        // deadline; shutdown does not wait on a scrape that will not come.
        let started = Instant::now();
        tokio::select! {
            _ = token.cancelled() => return,
            _ = collect(e, client) => {}
        }
        cadences.lock().made_ahead(e, started.elapsed());
        expire_at = Some(Instant::now() + CACHE_TTL);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn at(c: &mut Cadences, e: Endpoint, t0: Instant, ms: &[u64]) {
        for m in ms {
            c.arrived(e, None, t0 + Duration::from_millis(*m));
        }
    }

    fn due(c: &Cadences) -> Option<(Instant, Endpoint)> {
        c.due().map(|d| (d.at, d.endpoint))
    }

    #[test]
    fn a_steady_period_is_collected_for_once_per_scrape() {
        let t0 = Instant::now();
        let mut c = Cadences::default();
        // Three scrapes are two intervals: not yet a period.
        at(&mut c, Endpoint::Cadvisor, t0, &[0, 15_000, 30_010]);
        assert_eq!(due(&c), None);
        at(&mut c, Endpoint::Cadvisor, t0, &[44_990]);
        // The lead is the floor while no collection was timed.
        let want = t0 + Duration::from_millis(44_990 + 14_980) - LEAD_MIN;
        assert_eq!(due(&c), Some((want, Endpoint::Cadvisor)));
        c.fired(Endpoint::Cadvisor, None);
        assert_eq!(due(&c), None, "one collection per scrape");
        // The next scrape makes the next prediction; the lead follows the
        // collection's time.
        at(&mut c, Endpoint::Cadvisor, t0, &[59_980]);
        c.collected(Detail::Full, Duration::from_millis(40));
        let want = t0 + Duration::from_millis(59_980 + 14_990) - Duration::from_millis(100);
        assert_eq!(due(&c), Some((want, Endpoint::Cadvisor)));
        // Work made ahead that took longer (the text rendered too) sets it.
        c.made_ahead(Endpoint::Cadvisor, Duration::from_millis(60));
        let want = t0 + Duration::from_millis(59_980 + 14_990) - Duration::from_millis(140);
        assert_eq!(due(&c), Some((want, Endpoint::Cadvisor)));
        // A slow collection's lead is bounded.
        c.collected(Detail::Full, Duration::from_secs(2));
        let want = t0 + Duration::from_millis(59_980 + 14_990) - LEAD_MAX;
        assert_eq!(due(&c), Some((want, Endpoint::Cadvisor)));
    }

    #[test]
    fn no_period_no_collection_ahead() {
        let t0 = Instant::now();
        // Two Prometheus servers behind one address, 3 s apart: 3 s and
        // 12 s intervals in turn.
        let mut c = Cadences::default();
        at(&mut c, Endpoint::Cadvisor, t0, &[0, 3_000, 15_000, 18_000]);
        assert_eq!(due(&c), None);
        // A period that wanders by more than the tolerance.
        let mut c = Cadences::default();
        at(&mut c, Endpoint::Resource, t0, &[0, 15_000, 30_000, 45_500]);
        assert_eq!(due(&c), None);
        at(&mut c, Endpoint::Resource, t0, &[61_000]);
        assert_eq!(
            due(&c),
            None,
            "a 15 s interval is still among the last three"
        );
        // Three intervals of 15.5 s: a period again.
        at(&mut c, Endpoint::Resource, t0, &[76_500]);
        assert!(due(&c).is_some());
        // Within the tolerance (2 % of the last interval).
        let mut c = Cadences::default();
        at(&mut c, Endpoint::Resource, t0, &[0, 15_000, 30_100, 45_000]);
        assert!(due(&c).is_some());
        // A client that waits 1.1 s after each answer, answered in 5 to
        // 45 ms: a period.
        let mut c = Cadences::default();
        at(&mut c, Endpoint::Resource, t0, &[0, 1_145, 2_250, 3_395]);
        assert!(due(&c).is_some());
        // Scrapes closer than the cache's life share its snapshot.
        let mut c = Cadences::default();
        at(&mut c, Endpoint::Summary, t0, &[0, 900, 1_800, 2_700]);
        assert_eq!(due(&c), None);
        // Periods past `PERIOD_MAX`.
        let mut c = Cadences::default();
        at(
            &mut c,
            Endpoint::Summary,
            t0,
            &[0, 700_000, 1_400_000, 2_100_000],
        );
        assert_eq!(due(&c), None);
    }

    #[test]
    fn clients_are_timed_apart() {
        let t0 = Instant::now();
        let ip = |n: u8| Some(IpAddr::from([10, 0, 0, n]));
        let mut c = Cadences::default();
        // An HA pair of Prometheus servers, 3 s apart on a 15 s period:
        // each keeps its own.
        for k in 0..4u64 {
            let m = |ms: u64| t0 + Duration::from_millis(15_000 * k + ms);
            c.arrived(Endpoint::Cadvisor, ip(1), m(0));
            c.arrived(Endpoint::Cadvisor, ip(2), m(3_000));
        }
        let first = c.due().unwrap();
        let at = |ms: u64| t0 + Duration::from_millis(ms) - LEAD_MIN;
        assert_eq!(
            (first.at, first.endpoint, first.client),
            (at(60_000), Endpoint::Cadvisor, ip(1))
        );
        c.fired(Endpoint::Cadvisor, ip(1));
        let second = c.due().unwrap();
        assert_eq!((second.at, second.client), (at(63_000), ip(2)));
        c.fired(Endpoint::Cadvisor, ip(2));
        assert_eq!(c.due(), None, "one collection per client's scrape");
        // A client's scrape makes its next prediction only.
        c.arrived(
            Endpoint::Cadvisor,
            ip(1),
            t0 + Duration::from_millis(60_000),
        );
        assert_eq!(c.due().unwrap().client, ip(1));
        assert_eq!(c.due().unwrap().at, at(75_000));

        // A ninth client takes the place of the one heard from least
        // recently, which starts again from nothing.
        let mut c = Cadences::default();
        for n in 1..=8 {
            at_by(&mut c, ip(n), t0, &[n as u64 * 10, 2_000 + n as u64 * 10]);
        }
        at_by(&mut c, ip(9), t0, &[5_000]);
        assert_eq!(c.endpoints[Endpoint::Resource.index()].len(), CLIENTS_MAX);
        assert!(c.endpoints[Endpoint::Resource.index()]
            .iter()
            .all(|a| a.client != ip(1)));
        at_by(&mut c, ip(1), t0, &[6_000]);
        let one = c.endpoints[Endpoint::Resource.index()]
            .iter()
            .find(|a| a.client == ip(1))
            .unwrap();
        assert_eq!(one.at.len(), 1);
    }

    fn at_by(c: &mut Cadences, client: Client, t0: Instant, ms: &[u64]) {
        for m in ms {
            c.arrived(Endpoint::Resource, client, t0 + Duration::from_millis(*m));
        }
    }

    #[test]
    fn endpoints_are_timed_apart_and_the_earliest_is_due() {
        let t0 = Instant::now();
        let mut c = Cadences::default();
        // metrics-server's resource scrape every 15 s, Prometheus' cAdvisor
        // scrape every 30 s in between: neither breaks the other's period.
        at(&mut c, Endpoint::Resource, t0, &[0, 15_000, 30_000, 45_000]);
        at(
            &mut c,
            Endpoint::Cadvisor,
            t0,
            &[5_000, 35_000, 65_000, 95_000],
        );
        c.collected(Detail::Resource, Duration::from_millis(10));
        let resource = t0 + Duration::from_millis(60_000 - 40);
        assert_eq!(due(&c), Some((resource, Endpoint::Resource)));
        c.fired(Endpoint::Resource, None);
        let cadvisor = t0 + Duration::from_millis(125_000) - LEAD_MIN;
        assert_eq!(due(&c), Some((cadvisor, Endpoint::Cadvisor)));
        assert_eq!(Endpoint::Metrics.detail(), Detail::Summary);
        assert_eq!(Endpoint::SummaryCpuMemory.detail(), Detail::CpuMemory);
    }

    /// The task, on paused time: collections at the predicted instants, one
    /// after a client stops, none for an irregular one, and an end when
    /// cancelled.
    #[tokio::test(start_paused = true)]
    async fn the_task_collects_ahead_of_each_steady_scrape() {
        struct Shared {
            cadences: Mutex<Cadences>,
            changed: Notify,
            calls: Mutex<Vec<(Instant, Endpoint)>>,
            expired: Mutex<Vec<Instant>>,
        }
        let s = Arc::new(Shared {
            cadences: Mutex::default(),
            changed: Notify::new(),
            calls: Mutex::default(),
            expired: Mutex::default(),
        });
        let token = CancellationToken::new();
        let task = {
            let (s, token) = (s.clone(), token.clone());
            tokio::spawn(async move {
                let collect = |e, _| {
                    s.calls.lock().push((Instant::now(), e));
                    async {}
                };
                let expire = || s.expired.lock().push(Instant::now());
                run(&s.cadences, &s.changed, collect, expire, token).await;
            })
        };
        let t0 = Instant::now();
        let scrape = |ms: u64| {
            let s = s.clone();
            async move {
                tokio::time::sleep_until(t0 + Duration::from_millis(ms)).await;
                s.cadences
                    .lock()
                    .arrived(Endpoint::Resource, None, Instant::now());
                s.changed.notify_one();
            }
        };
        for ms in [0, 2_000, 4_000, 6_000] {
            scrape(ms).await;
        }
        assert!(s.calls.lock().is_empty(), "{:?}", s.calls.lock());
        scrape(8_000).await;
        let ahead = |ms: u64| {
            (
                t0 + Duration::from_millis(ms) - LEAD_MIN,
                Endpoint::Resource,
            )
        };
        assert_eq!(*s.calls.lock(), [ahead(8_000)]);
        assert!(s.expired.lock().is_empty());
        scrape(10_000).await;
        assert_eq!(*s.calls.lock(), [ahead(8_000), ahead(10_000)]);
        // What was made for the 8 s scrape is let go a cache life after.
        assert_eq!(*s.expired.lock(), [ahead(8_000).0 + CACHE_TTL]);
        // The client stops: one collection for the scrape that would have
        // come at 12 s, then none.
        tokio::time::sleep(Duration::from_secs(120)).await;
        assert_eq!(
            *s.calls.lock(),
            [ahead(8_000), ahead(10_000), ahead(12_000)]
        );
        assert_eq!(s.expired.lock().len(), 3);
        // An irregular client: nothing more.
        for ms in [130_000, 133_000, 145_000, 148_000, 160_000, 163_000] {
            scrape(ms).await;
        }
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(s.calls.lock().len(), 3);
        token.cancel();
        tokio::time::timeout(Duration::from_secs(1), task)
            .await
            .expect("the task ends when cancelled")
            .unwrap();
    }
}
