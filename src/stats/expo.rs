//! `/metrics/resource` (upstream
//! `pkg/kubelet/metrics/collectors/resource_metrics.go`) and
//! `/metrics/cadvisor` (cAdvisor `lib/metrics/prometheus.go` and
//! `prometheus_machine.go`, labelled by the kubelet's
//! `containerPrometheusLabelsFunc` in `pkg/kubelet/server/server.go`).
//!
//! Written as Prometheus text 0.0.4 by hand rather than with
//! `prometheus-client`: upstream stamps most of these samples with their
//! collection time, and prometheus-client 0.25 has no per-sample
//! timestamps; it also only writes OpenMetrics, whose counter family
//! names drop the `_total` these names end with.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;

use axum::body::Bytes;

use super::cgroup::CgroupSample;
use super::provider::{CgroupRaw, Snapshot};
use super::summary;
use super::textpool::Text;

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
}

struct Family {
    /// The family's `# HELP`/`# TYPE` header, then its sample lines as they
    /// were added, back to back (from the buffer pool in cAdvisor's text).
    text: Text,
    /// Per sample: where its line starts in `text`, and where its rendered
    /// label set starts and ends (what samples are sorted by).
    lines: Vec<(usize, usize, usize)>,
    /// Where the header ends.
    head: usize,
}

/// Families kept sorted by name and samples by label set, as client_golang
/// gathers them. Each sample is rendered once, straight into its family's
/// text (no per-sample allocation: cAdvisor's text at 110 pods is about
/// 12,000 samples); the lines are put in label order when rendered, unless
/// they were added in that order (then the text is sent as it is).
#[derive(Default)]
pub struct Exposition {
    families: BTreeMap<String, Family>,
    /// Each family's text length and line count at the last rendering
    /// (see `remembering`).
    sizes: Option<(&'static SizeMemo, FamilySizes)>,
}

/// Family sizes remembered from one rendering to the next, so a family's
/// buffer is allocated once at about its final size rather than grown
/// (and copied) a dozen times on the way to a few hundred KiB.
pub type SizeMemo = parking_lot::Mutex<FamilySizes>;

/// Text length and line count by family name.
pub type FamilySizes = HashMap<String, (usize, usize)>;

/// Appends a label value with `\`, `"` and newlines escaped.
fn push_escaped(out: &mut String, v: &str) {
    if !v.bytes().any(|b| matches!(b, b'\\' | b'"' | b'\n')) {
        out.push_str(v);
        return;
    }
    for ch in v.chars() {
        match ch {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// Appends `k="v"` pairs, comma-separated, values escaped.
fn push_labels(out: &mut String, labels: &[(&str, &str)]) {
    for (i, (k, v)) in labels.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(k);
        out.push_str("=\"");
        push_escaped(out, v);
        out.push('"');
    }
}

/// Appends `n` in decimal, without the formatting machinery (two numbers
/// per sample, about 12,000 samples in cAdvisor's text at 110 pods).
fn push_int(out: &mut String, n: i64) {
    out.push_str(itoa::Buffer::new().format(n));
}

/// Integral values below this are written as integers: exactly what `{}`
/// writes for them (f64 holds every integer up to 2^53 exactly).
const EXACT_INT: f64 = 9_007_199_254_740_992.0;

fn write_value(out: &mut String, v: f64) {
    // Most values are byte and event counts; `-0.0` keeps its sign below.
    if v.fract() == 0.0 && v.abs() < EXACT_INT && (v != 0.0 || v.is_sign_positive()) {
        push_int(out, v as i64);
    } else if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else {
        let _ = write!(out, "{v}");
    }
}

/// Labels sorted by name on the stack when there are few (always, here).
const INLINE_LABELS: usize = 12;

impl Exposition {
    /// An exposition that sizes its families from `memo` and records their
    /// sizes there when rendered.
    pub fn remembering(memo: &'static SizeMemo) -> Self {
        Self {
            families: BTreeMap::new(),
            sizes: Some((memo, memo.lock().clone())),
        }
    }

    pub fn add(
        &mut self,
        name: &str,
        help: &str,
        kind: Kind,
        labels: &[(&str, &str)],
        value: f64,
        ts_ns: Option<i64>,
    ) {
        let mut inline = [("", ""); INLINE_LABELS];
        let mut spilled = Vec::new();
        let l: &mut [(&str, &str)] = if labels.len() <= INLINE_LABELS {
            inline[..labels.len()].copy_from_slice(labels);
            &mut inline[..labels.len()]
        } else {
            spilled.extend_from_slice(labels);
            &mut spilled
        };
        l.sort_by(|a, b| a.0.cmp(b.0));
        self.push(name, help, kind, value, ts_ns, |out| push_labels(out, l));
    }

    /// `add` with the label set rendered already: sorted by name, values
    /// escaped, without the braces (see `Base::render`). Most of a cAdvisor
    /// scrape's samples carry just a cgroup's six labels, so rendering them
    /// once per cgroup rather than once per sample saves most of the work.
    pub fn add_rendered(
        &mut self,
        name: &str,
        help: &str,
        kind: Kind,
        labels: &Rendered,
        value: f64,
        ts_ns: Option<i64>,
    ) {
        self.push(name, help, kind, value, ts_ns, |out| {
            out.push_str(&labels.0)
        });
    }

    /// `add` with a cgroup's base labels rendered already and `extra`
    /// (sorted by name) spliced in (see `BaseRendered`).
    #[allow(clippy::too_many_arguments)]
    fn add_spliced(
        &mut self,
        name: &str,
        help: &str,
        kind: Kind,
        base: &BaseRendered,
        extra: &[(&str, &str)],
        value: f64,
        ts_ns: Option<i64>,
    ) {
        self.push(name, help, kind, value, ts_ns, |out| {
            base.splice_into(out, extra)
        });
    }

    /// Appends one sample line to family `name`, its labels written by
    /// `labels` (nothing: no braces).
    fn push(
        &mut self,
        name: &str,
        help: &str,
        kind: Kind,
        value: f64,
        ts_ns: Option<i64>,
        labels: impl FnOnce(&mut String),
    ) {
        // One lookup for a family seen before (all but the first sample of
        // each): a scrape adds about 12,000 samples.
        let f = match self.families.get_mut(name) {
            Some(f) => f,
            None => {
                let kind_name = match kind {
                    Kind::Counter => "counter",
                    Kind::Gauge => "gauge",
                };
                // The header's length, then the last scrape's size.
                let mut cap = 2 * name.len() + help.len() + kind_name.len() + 18;
                let mut lines = Vec::new();
                if let Some((len, n)) = self.sizes.as_ref().and_then(|(_, m)| m.get(name)) {
                    // A little room for a pod or two more than last time.
                    cap = cap.max(len + len / 8);
                    lines.reserve(n + n / 8);
                }
                // A remembering exposition is cAdvisor's, whose buffers are
                // large: kept between scrapes.
                let mut text = Text::with_capacity(cap, self.sizes.is_some());
                for part in [
                    "# HELP ",
                    name,
                    " ",
                    help,
                    "\n# TYPE ",
                    name,
                    " ",
                    kind_name,
                    "\n",
                ] {
                    text.push_str(part);
                }
                self.families.entry(name.to_string()).or_insert(Family {
                    head: text.len(),
                    text,
                    lines,
                })
            }
        };
        let out = &mut f.text;
        let start = out.len();
        out.push_str(name);
        out.push('{');
        let ls = out.len();
        labels(out);
        let le = out.len();
        let (ls, le) = if ls == le {
            out.pop();
            (ls - 1, ls - 1)
        } else {
            out.push('}');
            (ls, le)
        };
        out.push(' ');
        write_value(out, value);
        if let Some(ts) = ts_ns.map(|t| t / 1_000_000) {
            out.push(' ');
            push_int(out, ts);
        }
        out.push('\n');
        f.lines.push((start, ls, le));
    }

    /// The text of this exposition's samples and then `later`'s, as if
    /// `later`'s had been added here after this one's own (see
    /// `Family::join`): one or two buffers per family.
    pub fn join_chunks(self, later: Exposition) -> Vec<Bytes> {
        self.record_sizes();
        later.record_sizes();
        let mine = self.families;
        let mut out = Vec::with_capacity(mine.len() + later.families.len());
        let mut rest = later.families.into_iter().peekable();
        for (name, f) in mine {
            // The later part's families named before this one.
            while let Some((_, g)) = rest.next_if(|(n, _)| *n < name) {
                out.push(g.into_sorted());
            }
            match rest.next_if(|(n, _)| *n == name) {
                Some((_, g)) => f.join(g, &mut out),
                None => out.push(f.into_sorted()),
            }
        }
        out.extend(rest.map(|(_, g)| g.into_sorted()));
        out
    }

    /// The text, one buffer per family (what the HTTP body is written from,
    /// without joining them).
    pub fn into_chunks(self) -> Vec<Bytes> {
        self.record_sizes();
        self.families
            .into_values()
            .map(Family::into_sorted)
            .collect()
    }

    /// Records the families' sizes in the memo, when remembering.
    fn record_sizes(&self) {
        if let Some((memo, _)) = self.sizes {
            *memo.lock() = self
                .families
                .iter()
                .map(|(k, f)| (k.clone(), (f.text.len(), f.lines.len())))
                .collect();
        }
    }

    pub fn render(self) -> String {
        let mut out = String::new();
        for c in self.into_chunks() {
            out.push_str(std::str::from_utf8(&c).unwrap_or_default());
        }
        out
    }
}

impl Family {
    /// The label set of one of its lines.
    fn labels(&self, &(_, ls, le): &(usize, usize, usize)) -> &str {
        &self.text[ls..le]
    }

    /// Whether its lines come in label order, strictly increasing (so no
    /// duplicate label sets to drop either).
    fn in_order(&self) -> bool {
        (self.lines.windows(2)).all(|w| self.labels(&w[0]) < self.labels(&w[1]))
    }

    /// Line `i`, newline included.
    fn line(&self, i: usize) -> &str {
        let end = self.lines.get(i + 1).map_or(self.text.len(), |l| l.0);
        &self.text[self.lines[i].0..end]
    }

    /// This family's lines and then `later`'s (the same family, from a part
    /// rendered apart) into `out`, as one family added to in that order. In
    /// cAdvisor's text the two parts usually come each in label order, the
    /// first ending before the second begins: then both buffers are sent
    /// as they are, the second without its header. Otherwise their lines
    /// are ordered into one buffer (see `merge_sorted`).
    fn join(self, later: Family, out: &mut Vec<Bytes>) {
        let in_turn = match (self.lines.last(), later.lines.first()) {
            (Some(a), Some(b)) => self.labels(a) < later.labels(b),
            _ => true,
        };
        if in_turn && self.in_order() && later.in_order() {
            let head = later.head;
            out.push(Bytes::from_owner(self.text));
            out.push(Bytes::from_owner(later.text).slice(head..));
        } else {
            out.push(merge_sorted(&[&self, &later]));
        }
    }

    /// Header and lines in label order. Samples added in that order (the
    /// common case: cAdvisor's cgroups are added sorted) need no copy.
    fn into_sorted(self) -> Bytes {
        if self.in_order() {
            Bytes::from_owner(self.text)
        } else {
            merge_sorted(&[&self])
        }
    }
}

/// The header of the first of `parts` (one family's lines, in the order
/// they were added) and all their lines in label order, into one buffer;
/// of lines with the same label set, the last added (a later add replaces
/// an earlier one).
fn merge_sorted(parts: &[&Family]) -> Bytes {
    let mut order: Vec<(usize, usize)> = (parts.iter().enumerate())
        .flat_map(|(p, f)| (0..f.lines.len()).map(move |i| (p, i)))
        .collect();
    let labels = |&(p, i): &(usize, usize)| parts[p].labels(&parts[p].lines[i]);
    // Stable, so the last added of equal label sets stays last.
    order.sort_by(|a, b| labels(a).cmp(labels(b)));
    let first = parts[0];
    let len = parts.iter().map(|f| f.text.len()).sum();
    let mut out = Text::with_capacity(len, first.text.pooled());
    out.push_str(&first.text[..first.head]);
    for (j, k) in order.iter().enumerate() {
        if order.get(j + 1).is_some_and(|n| labels(n) == labels(k)) {
            continue;
        }
        out.push_str(parts[k.0].line(k.1));
    }
    Bytes::from_owner(out)
}

/// A response body written from several buffers, with its length known
/// (so it is sent with a Content-Length, as one buffer would be).
pub struct ChunkBody {
    chunks: std::collections::VecDeque<Bytes>,
    left: u64,
}

impl ChunkBody {
    pub fn new(chunks: Vec<Bytes>) -> Self {
        let left = chunks.iter().map(|c| c.len() as u64).sum();
        Self {
            chunks: chunks.into_iter().filter(|c| !c.is_empty()).collect(),
            left,
        }
    }
}

impl hyper::body::Body for ChunkBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        let next = self.chunks.pop_front();
        if let Some(c) = &next {
            self.left -= c.len() as u64;
        }
        std::task::Poll::Ready(next.map(|c| Ok(hyper::body::Frame::data(c))))
    }

    fn is_end_stream(&self) -> bool {
        self.chunks.is_empty()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::SizeHint::with_exact(self.left)
    }
}

const NS: f64 = 1e9;

/// `/metrics/resource`: from the cpu-and-memory summary, as upstream.
/// `error` set means the collection failed: only the scrape error gauges.
pub fn resource(snap: Option<&Snapshot>, node_name: &str) -> String {
    use Kind::*;
    let mut e = Exposition::default();
    let err = if snap.is_some() { 0.0 } else { 1.0 };
    e.add(
        "scrape_error",
        "[ALPHA] (Deprecated since 1.29.0) 1 if there was an error while getting container metrics, 0 otherwise",
        Gauge,
        &[],
        err,
        None,
    );
    e.add(
        "resource_scrape_error",
        "[STABLE] 1 if there was an error while getting container metrics, 0 otherwise",
        Gauge,
        &[],
        err,
        None,
    );
    let Some(snap) = snap else {
        return e.render();
    };
    let s = summary::build(snap, node_name, true);
    let ts =
        |t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time| Some(t.0.as_nanosecond() as i64);
    if let Some(c) = &s.node.cpu {
        if let Some(u) = c.usage_core_nano_seconds {
            e.add(
                "node_cpu_usage_seconds_total",
                "[STABLE] Cumulative cpu time consumed by the node in core-seconds",
                Counter,
                &[],
                u as f64 / NS,
                ts(&c.time),
            );
        }
    }
    if let Some(m) = &s.node.memory {
        if let Some(ws) = m.working_set_bytes {
            e.add(
                "node_memory_working_set_bytes",
                "[STABLE] Current working set of the node in bytes",
                Gauge,
                &[],
                ws as f64,
                ts(&m.time),
            );
        }
        // Upstream stamps node swap with the memory sample's time.
        if let Some(u) = s.node.swap.as_ref().and_then(|sw| sw.swap_usage_bytes) {
            e.add(
                "node_swap_usage_bytes",
                "[ALPHA] Current swap usage of the node in bytes. Reported only on non-windows systems",
                Gauge,
                &[],
                u as f64,
                ts(&m.time),
            );
        }
    }
    for p in &s.pods {
        let (pod, ns) = (p.pod_ref.name.as_str(), p.pod_ref.namespace.as_str());
        for c in &p.containers {
            let l = [
                ("container", c.name.as_str()),
                ("pod", pod),
                ("namespace", ns),
            ];
            let start = c.start_time.0.as_nanosecond() as f64 / NS;
            if start > 0.0 {
                e.add(
                    "container_start_time_seconds",
                    "[STABLE] Start time of the container since unix epoch in seconds",
                    Gauge,
                    &l,
                    start,
                    None,
                );
            }
            if let Some(cpu) = &c.cpu {
                if let Some(u) = cpu.usage_core_nano_seconds {
                    e.add(
                        "container_cpu_usage_seconds_total",
                        "[STABLE] Cumulative cpu time consumed by the container in core-seconds",
                        Counter,
                        &l,
                        u as f64 / NS,
                        ts(&cpu.time),
                    );
                }
            }
            if let Some(m) = &c.memory {
                if let Some(ws) = m.working_set_bytes {
                    e.add(
                        "container_memory_working_set_bytes",
                        "[STABLE] Current working set of the container in bytes",
                        Gauge,
                        &l,
                        ws as f64,
                        ts(&m.time),
                    );
                }
            }
            if let Some(sw) = &c.swap {
                if let Some(u) = sw.swap_usage_bytes {
                    e.add(
                        "container_swap_usage_bytes",
                        "[ALPHA] Current amount of the container swap usage in bytes. Reported only on non-windows systems",
                        Gauge,
                        &l,
                        u as f64,
                        ts(&sw.time),
                    );
                }
                // Upstream adds the usage back to what is available.
                if let Some(a) = sw.swap_available_bytes {
                    e.add(
                        "container_swap_limit_bytes",
                        "[ALPHA] Current amount of the container swap limit in bytes. Reported only on non-windows systems",
                        Gauge,
                        &l,
                        a.saturating_add(sw.swap_usage_bytes.unwrap_or(0)) as f64,
                        ts(&sw.time),
                    );
                }
            }
        }
        let l = [("pod", pod), ("namespace", ns)];
        if let Some(u) = p.cpu.as_ref().and_then(|c| c.usage_core_nano_seconds) {
            e.add(
                "pod_cpu_usage_seconds_total",
                "[STABLE] Cumulative cpu time consumed by the pod in core-seconds",
                Counter,
                &l,
                u as f64 / NS,
                p.cpu.as_ref().and_then(|c| ts(&c.time)),
            );
        }
        if let Some(ws) = p.memory.as_ref().and_then(|m| m.working_set_bytes) {
            e.add(
                "pod_memory_working_set_bytes",
                "[STABLE] Current working set of the pod in bytes",
                Gauge,
                &l,
                ws as f64,
                p.memory.as_ref().and_then(|m| ts(&m.time)),
            );
        }
        if let Some(sw) = &p.swap {
            if let Some(u) = sw.swap_usage_bytes {
                e.add(
                    "pod_swap_usage_bytes",
                    "[ALPHA] Current amount of the pod swap usage in bytes. Reported only on non-windows systems",
                    Gauge,
                    &l,
                    u as f64,
                    ts(&sw.time),
                );
            }
        }
    }
    e.render()
}

/// The six base labels of every cAdvisor container metric.
struct Base<'a> {
    id: &'a str,
    name: &'a str,
    image: &'a str,
    pod: &'a str,
    namespace: &'a str,
    container: &'a str,
}

/// The base labels and up to four more, on the stack (a cAdvisor scrape
/// adds about 35 samples per cgroup).
struct Labels<'a> {
    l: [(&'a str, &'a str); 10],
    n: usize,
}

impl<'a> std::ops::Deref for Labels<'a> {
    type Target = [(&'a str, &'a str)];
    fn deref(&self) -> &Self::Target {
        &self.l[..self.n]
    }
}

impl<'a> Base<'a> {
    /// A cgroup that is no pod's or container's: only its `id`.
    fn bare(id: &'a str) -> Self {
        Base {
            id,
            name: "",
            image: "",
            pod: "",
            namespace: "",
            container: "",
        }
    }

    /// The labels in name order, so `Exposition::add` finds them sorted.
    fn with<'b>(&'b self, extra: &[(&'b str, &'b str)]) -> Labels<'b> {
        let base = [
            ("container", self.container),
            ("id", self.id),
            ("image", self.image),
            ("name", self.name),
            ("namespace", self.namespace),
            ("pod", self.pod),
        ];
        // container_blkio_device_usage_total has the most: four.
        debug_assert!(extra.len() <= 4, "{extra:?}");
        let mut more = [("", ""); 4];
        let n_more = extra.len().min(4);
        more[..n_more].copy_from_slice(&extra[..n_more]);
        more[..n_more].sort_unstable_by(|a, b| a.0.cmp(b.0));
        let mut l = [("", ""); 10];
        let (mut i, mut j) = (0, 0);
        for slot in l.iter_mut().take(6 + n_more) {
            if j < n_more && (i == 6 || more[j].0 < base[i].0) {
                *slot = more[j];
                j += 1;
            } else {
                *slot = base[i];
                i += 1;
            }
        }
        Labels { l, n: 6 + n_more }
    }
}

/// A label set rendered as `Exposition::add_rendered` takes it.
pub struct Rendered(String);

/// The base labels' names, in the order `Base::with` lays them out.
const BASE_KEYS: [&str; 6] = ["container", "id", "image", "name", "namespace", "pod"];

/// A cgroup's six base labels rendered once, with where each starts, so
/// the samples with more labels (a fifth of cAdvisor's text: task states,
/// memory failures, per-interface and per-device figures) splice theirs
/// in rather than sort and escape the whole set again per sample.
struct BaseRendered {
    labels: Rendered,
    /// Where each label of `BASE_KEYS` starts in `labels`.
    starts: [usize; 6],
}

impl std::ops::Deref for BaseRendered {
    type Target = Rendered;
    fn deref(&self) -> &Rendered {
        &self.labels
    }
}

impl BaseRendered {
    /// Writes the base labels with `extra` merged in by name: what
    /// `push_labels` writes for `Base::with(extra)`. `extra` is sorted by
    /// name and names no base label.
    fn splice_into(&self, out: &mut String, extra: &[(&str, &str)]) {
        debug_assert!(extra.windows(2).all(|w| w[0].0 < w[1].0), "{extra:?}");
        debug_assert!(!extra.iter().any(|(k, _)| BASE_KEYS.contains(k)));
        let text = &self.labels.0;
        // The first base label not written yet; whether a comma is due.
        let (mut next, mut comma) = (0, false);
        for &(k, v) in extra {
            let upto = next + BASE_KEYS[next..].iter().take_while(|b| **b < k).count();
            if upto > next {
                if comma {
                    out.push(',');
                }
                // Up to the comma before label `upto`, or the end.
                let end = self.starts.get(upto).map_or(text.len(), |s| s - 1);
                out.push_str(&text[self.starts[next]..end]);
                (next, comma) = (upto, true);
            }
            if comma {
                out.push(',');
            }
            out.push_str(k);
            out.push_str("=\"");
            push_escaped(out, v);
            out.push('"');
            comma = true;
        }
        if next < BASE_KEYS.len() {
            if comma {
                out.push(',');
            }
            out.push_str(&text[self.starts[next]..]);
        }
    }

    /// The labels with `extra` spliced in, for a set several families
    /// share (an interface's, a file system's).
    fn with(&self, extra: &[(&str, &str)]) -> Rendered {
        let more: usize = extra.iter().map(|(k, v)| k.len() + v.len() + 4).sum();
        let mut out = String::with_capacity(self.labels.0.len() + more);
        self.splice_into(&mut out, extra);
        Rendered(out)
    }
}

impl Base<'_> {
    /// The six base labels rendered once, in name order (what `with(&[])`
    /// gives `add`).
    fn render(&self) -> BaseRendered {
        let l = self.with(&[]);
        debug_assert!(l.iter().map(|(k, _)| *k).eq(BASE_KEYS));
        let mut out = String::with_capacity(l.iter().map(|(k, v)| k.len() + v.len() + 4).sum());
        let mut starts = [0; 6];
        for (i, kv) in l.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            starts[i] = out.len();
            push_labels(&mut out, std::slice::from_ref(kv));
        }
        BaseRendered {
            labels: Rendered(out),
            starts,
        }
    }
}

/// cAdvisor reports an unlimited memory limit as 0.
fn spec_memory(limit: Option<u64>) -> f64 {
    match limit {
        Some(l) if l < (1 << 62) => l as f64,
        _ => 0.0,
    }
}

struct CgEntry<'a> {
    base: Base<'a>,
    sample: &'a CgroupSample,
    start_ns: i64,
    interfaces: &'a [super::procfs::Interface],
    /// (device, usage, limit, inodes, inodes free)
    fs: Option<(String, f64, f64, f64, f64)>,
    /// OOM kills in this cgroup, when the kernel log is watched.
    oom: Option<u64>,
    /// Block device names by major:minor.
    disks: &'a super::blkio::DiskNames,
}

fn cadvisor_entry(e: &mut Exposition, c: &CgEntry, t: i64) {
    use Kind::*;
    let b = &c.base;
    let ts = Some(t);
    let s = c.sample;
    let block = b.render();
    e.add_rendered(
        "container_last_seen",
        "Last time a container was seen by the exporter",
        Gauge,
        &block,
        (t / 1_000_000_000) as f64,
        ts,
    );
    e.add_rendered(
        "container_start_time_seconds",
        "Start time of the container since unix epoch in seconds.",
        Gauge,
        &block,
        (c.start_ns / 1_000_000_000) as f64,
        None,
    );
    if let Some(shares) = s.cpu_shares {
        e.add_rendered(
            "container_spec_cpu_period",
            "CPU period of the container.",
            Gauge,
            &block,
            s.cpu_period.unwrap_or(100_000) as f64,
            None,
        );
        if let Some(q) = s.cpu_quota.filter(|q| *q > 0) {
            e.add_rendered(
                "container_spec_cpu_quota",
                "CPU quota of the container.",
                Gauge,
                &block,
                q as f64,
                None,
            );
        }
        e.add_rendered(
            "container_spec_cpu_shares",
            "CPU share of the container.",
            Gauge,
            &block,
            shares as f64,
            None,
        );
    }
    if let Some(cpu) = s.cpu {
        e.add_spliced(
            "container_cpu_usage_seconds_total",
            "Cumulative cpu time consumed in seconds.",
            Counter,
            &block,
            &[("cpu", "total")],
            cpu.usage_ns as f64 / NS,
            ts,
        );
        if let Some(u) = cpu.user_ns {
            e.add_rendered(
                "container_cpu_user_seconds_total",
                "Cumulative user cpu time consumed in seconds.",
                Counter,
                &block,
                u as f64 / NS,
                ts,
            );
        }
        if let Some(u) = cpu.system_ns {
            e.add_rendered(
                "container_cpu_system_seconds_total",
                "Cumulative system cpu time consumed in seconds.",
                Counter,
                &block,
                u as f64 / NS,
                ts,
            );
        }
    }
    if s.cpu.is_some() {
        // cAdvisor's load reader is off in the kubelet (it needs netlink
        // taskstats): these families are shown, always 0.
        for (name, help) in [
            (
                "container_cpu_load_average_10s",
                "Value of container cpu load average over the last 10 seconds.",
            ),
            (
                "container_cpu_load_d_average_10s",
                "Value of container cpu load.d average over the last 10 seconds.",
            ),
        ] {
            e.add_rendered(name, help, Gauge, &block, 0.0, ts);
        }
        // In label order, so the family needs no sorting when rendered.
        for state in [
            "iowaiting",
            "running",
            "sleeping",
            "stopped",
            "uninterruptible",
        ] {
            e.add_spliced(
                "container_tasks_state",
                "Number of tasks in given state",
                Gauge,
                &block,
                &[("state", state)],
                0.0,
                ts,
            );
        }
    }
    if let (Some((periods, throttled)), Some(_)) = (s.throttling, s.cpu_quota.filter(|q| *q > 0)) {
        e.add_rendered(
            "container_cpu_cfs_periods_total",
            "Number of elapsed enforcement period intervals.",
            Counter,
            &block,
            periods as f64,
            ts,
        );
        e.add_rendered(
            "container_cpu_cfs_throttled_periods_total",
            "Number of throttled period intervals.",
            Counter,
            &block,
            throttled as f64,
            ts,
        );
    }
    if let Some(m) = s.memory {
        e.add_rendered(
            "container_spec_memory_limit_bytes",
            "Memory limit for the container.",
            Gauge,
            &block,
            spec_memory(m.limit),
            None,
        );
        e.add_rendered(
            "container_spec_memory_swap_limit_bytes",
            "Memory swap limit for the container.",
            Gauge,
            &block,
            spec_memory(m.swap_limit),
            None,
        );
        e.add_rendered(
            "container_spec_memory_reservation_limit_bytes",
            "Memory reservation limit for the container.",
            Gauge,
            &block,
            spec_memory(m.reservation),
            None,
        );
        let gauges: [(&str, &str, f64); 9] = [
            ("container_memory_cache", "Number of bytes of page cache memory.", m.cache as f64),
            ("container_memory_kernel_usage", "Size of kernel memory allocated in bytes.", m.kernel.unwrap_or(0) as f64),
            ("container_memory_total_active_file_bytes", "Current total active file in bytes.", m.active_file as f64),
            ("container_memory_total_inactive_file_bytes", "Current total inactive file in bytes.", m.inactive_file as f64),
            ("container_memory_rss", "Size of RSS in bytes.", m.rss as f64),
            ("container_memory_mapped_file", "Size of memory mapped files in bytes.", m.mapped_file as f64),
            ("container_memory_swap", "Container swap usage in bytes.", m.swap.unwrap_or(0) as f64),
            (
                "container_memory_usage_bytes",
                "Current memory usage in bytes, including all memory regardless of when it was accessed",
                m.usage as f64,
            ),
            ("container_memory_working_set_bytes", "Current working set in bytes.", m.working_set as f64),
        ];
        for (name, help, v) in gauges {
            e.add_rendered(name, help, Gauge, &block, v, ts);
        }
        if let Some(max) = m.max_usage {
            e.add_rendered(
                "container_memory_max_usage_bytes",
                "Maximum memory usage recorded in bytes",
                Gauge,
                &block,
                max as f64,
                ts,
            );
        }
        e.add_rendered(
            "container_memory_failcnt",
            "Number of memory usage hits limits",
            Counter,
            &block,
            m.failcnt.unwrap_or(0) as f64,
            ts,
        );
        e.add_spliced(
            "container_memory_failures_total",
            "Cumulative count of memory allocation failures.",
            Counter,
            &block,
            &[("failure_type", "pgfault"), ("scope", "hierarchy")],
            m.pgfault as f64,
            ts,
        );
        e.add_spliced(
            "container_memory_failures_total",
            "Cumulative count of memory allocation failures.",
            Counter,
            &block,
            &[("failure_type", "pgmajfault"), ("scope", "hierarchy")],
            m.pgmajfault as f64,
            ts,
        );
    }
    for i in c.interfaces {
        let l = block.with(&[("interface", i.name.as_str())]);
        let counters: [(&str, &str, u64); 8] = [
            (
                "container_network_receive_bytes_total",
                "Cumulative count of bytes received",
                i.rx_bytes,
            ),
            (
                "container_network_receive_packets_total",
                "Cumulative count of packets received",
                i.rx_packets,
            ),
            (
                "container_network_receive_packets_dropped_total",
                "Cumulative count of packets dropped while receiving",
                i.rx_dropped,
            ),
            (
                "container_network_receive_errors_total",
                "Cumulative count of errors encountered while receiving",
                i.rx_errors,
            ),
            (
                "container_network_transmit_bytes_total",
                "Cumulative count of bytes transmitted",
                i.tx_bytes,
            ),
            (
                "container_network_transmit_packets_total",
                "Cumulative count of packets transmitted",
                i.tx_packets,
            ),
            (
                "container_network_transmit_packets_dropped_total",
                "Cumulative count of packets dropped while transmitting",
                i.tx_dropped,
            ),
            (
                "container_network_transmit_errors_total",
                "Cumulative count of errors encountered while transmitting",
                i.tx_errors,
            ),
        ];
        for (name, help, v) in counters {
            e.add_rendered(name, help, Counter, &l, v as f64, ts);
        }
    }
    if let Some((dev, usage, limit, inodes, free)) = &c.fs {
        let l = block.with(&[("device", dev.as_str())]);
        e.add_rendered(
            "container_fs_inodes_free",
            "Number of available Inodes",
            Gauge,
            &l,
            *free,
            ts,
        );
        e.add_rendered(
            "container_fs_inodes_total",
            "Number of Inodes",
            Gauge,
            &l,
            *inodes,
            ts,
        );
        e.add_rendered(
            "container_fs_limit_bytes",
            "Number of bytes that can be consumed by the container on this filesystem.",
            Gauge,
            &l,
            *limit,
            ts,
        );
        e.add_rendered(
            "container_fs_usage_bytes",
            "Number of bytes that are consumed by the container on this filesystem.",
            Gauge,
            &l,
            *usage,
            ts,
        );
    }
    if let Some(io) = &s.disk {
        disk_families(e, c, &block, io, ts);
    }
    if let Some(p) = &s.procs {
        let gauges = [
            (
                "container_processes",
                "Number of processes running inside the container.",
                p.processes,
            ),
            (
                "container_file_descriptors",
                "Number of open file descriptors for the container.",
                p.fds,
            ),
            (
                "container_sockets",
                "Number of open sockets for the container.",
                p.sockets,
            ),
            (
                "container_threads_max",
                "Maximum number of threads allowed inside the container, infinity if value is zero",
                p.threads_max,
            ),
            (
                "container_threads",
                "Number of threads running inside the container",
                p.threads,
            ),
        ];
        for (name, help, v) in gauges {
            e.add_rendered(name, help, Gauge, &block, v as f64, ts);
        }
        if let Some(soft) = p.max_open_files {
            e.add_spliced(
                "container_ulimits_soft",
                "Soft ulimit values for the container root process. Unlimited if -1, except priority and nice",
                Gauge,
                &block,
                &[("ulimit", "max_open_files")],
                soft as f64,
                ts,
            );
        }
    }
    if let Some(n) = c.oom {
        e.add_rendered(
            "container_oom_events_total",
            "Count of out of memory events observed for the container",
            Counter,
            &block,
            n as f64,
            ts,
        );
    }
    if let Some(psi) = s.psi {
        let us = |v: u64| v as f64 / 1e6;
        for (fam, p) in PSI_FAMILIES.iter().zip([psi.cpu, psi.memory, psi.io]) {
            let Some(p) = p else { continue };
            let [(stalled, stalled_help), (waiting, waiting_help)] = fam;
            e.add_rendered(stalled, stalled_help, Counter, &block, us(p.full.total), ts);
            e.add_rendered(waiting, waiting_help, Counter, &block, us(p.some.total), ts);
        }
    }
}

/// cAdvisor's per-device I/O families (`ioValues`): one sample per device
/// in the family's table, the operation's value (0 when the device has
/// none: v1's sector counts carry no operation, so their read and write
/// figures are 0 there too, as in cAdvisor).
fn disk_families(
    e: &mut Exposition,
    c: &CgEntry,
    block: &BaseRendered,
    io: &super::blkio::DiskIo,
    ts: Option<i64>,
) {
    use super::blkio::{per_device, Op};
    use Kind::*;
    let name = |k: (u32, u32)| c.disks.get(&k).map_or("", String::as_str);
    type Family<'t> = (
        &'t str,
        &'t str,
        Kind,
        &'t [super::blkio::DiskEntry],
        Op,
        f64,
    );
    let families: [Family; 12] = [
        (
            "container_fs_reads_bytes_total",
            "Cumulative count of bytes read",
            Counter,
            &io.service_bytes,
            Op::Read,
            1.0,
        ),
        (
            "container_fs_reads_total",
            "Cumulative count of reads completed",
            Counter,
            &io.serviced,
            Op::Read,
            1.0,
        ),
        (
            "container_fs_sector_reads_total",
            "Cumulative count of sector reads completed",
            Counter,
            &io.sectors,
            Op::Read,
            1.0,
        ),
        (
            "container_fs_reads_merged_total",
            "Cumulative count of reads merged",
            Counter,
            &io.merged,
            Op::Read,
            1.0,
        ),
        (
            "container_fs_read_seconds_total",
            "Cumulative count of seconds spent reading",
            Counter,
            &io.service_time,
            Op::Read,
            1e-9,
        ),
        (
            "container_fs_writes_bytes_total",
            "Cumulative count of bytes written",
            Counter,
            &io.service_bytes,
            Op::Write,
            1.0,
        ),
        (
            "container_fs_writes_total",
            "Cumulative count of writes completed",
            Counter,
            &io.serviced,
            Op::Write,
            1.0,
        ),
        (
            "container_fs_sector_writes_total",
            "Cumulative count of sector writes completed",
            Counter,
            &io.sectors,
            Op::Write,
            1.0,
        ),
        (
            "container_fs_writes_merged_total",
            "Cumulative count of writes merged",
            Counter,
            &io.merged,
            Op::Write,
            1.0,
        ),
        (
            "container_fs_write_seconds_total",
            "Cumulative count of seconds spent writing",
            Counter,
            &io.service_time,
            Op::Write,
            1e-9,
        ),
        (
            "container_fs_io_current",
            "Number of I/Os currently in progress",
            Gauge,
            &io.queued,
            Op::Total,
            1.0,
        ),
        // cAdvisor takes the service time's total here, not v1's io_time.
        (
            "container_fs_io_time_seconds_total",
            "Cumulative count of seconds spent doing I/Os",
            Counter,
            &io.service_time,
            Op::Total,
            1e-9,
        ),
    ];
    for (family, help, kind, table, op, scale) in families {
        for (dev, ops) in per_device(table) {
            let v = ops.iter().find(|(o, _)| *o == op).map_or(0, |(_, v)| *v);
            e.add_spliced(
                family,
                help,
                kind,
                block,
                &[("device", name(dev))],
                v as f64 * scale,
                ts,
            );
        }
    }
    for ((major, minor), ops) in per_device(&io.service_bytes) {
        let (ma, mi) = (major.to_string(), minor.to_string());
        for (op, v) in ops {
            e.add_spliced(
                "container_blkio_device_usage_total",
                "Blkio Device bytes usage",
                Counter,
                block,
                &[
                    ("device", name((major, minor))),
                    ("major", &ma),
                    ("minor", &mi),
                    ("operation", op.as_str()),
                ],
                v as f64,
                ts,
            );
        }
    }
}

/// The pressure families (name, help) per resource: (stalled, waiting) for
/// cpu, memory and io, spelt out so a scrape formats none of them.
const PSI_FAMILIES: [[(&str, &str); 2]; 3] = [
    [
        (
            "container_pressure_cpu_stalled_seconds_total",
            "Total time duration no tasks in the container could make progress due to CPU congestion.",
        ),
        (
            "container_pressure_cpu_waiting_seconds_total",
            "Total time duration tasks in the container have waited due to CPU congestion.",
        ),
    ],
    [
        (
            "container_pressure_memory_stalled_seconds_total",
            "Total time duration no tasks in the container could make progress due to memory congestion.",
        ),
        (
            "container_pressure_memory_waiting_seconds_total",
            "Total time duration tasks in the container have waited due to memory congestion.",
        ),
    ],
    [
        (
            "container_pressure_io_stalled_seconds_total",
            "Total time duration no tasks in the container could make progress due to IO congestion.",
        ),
        (
            "container_pressure_io_waiting_seconds_total",
            "Total time duration tasks in the container have waited due to IO congestion.",
        ),
    ],
];

/// Machine facts for `machine_*` (cAdvisor's MachineInfo).
pub struct Machine<'a> {
    pub machine_id: &'a str,
    pub system_uuid: &'a str,
    pub boot_id: &'a str,
    pub cores: usize,
    pub memory: u64,
    /// The rest of cAdvisor's MachineInfo, read once at start.
    pub facts: &'a super::procfs::MachineFacts,
}

/// cAdvisor's PrometheusMachineCollector with the kubelet's metric set
/// (`pkg/kubelet/server/server.go` includes no CPUTopologyMetrics, so no
/// `machine_cpu_cache_capacity_bytes`, `machine_thread_siblings_count` or
/// `machine_node_*`). Unstamped: the kubelet zeroes MachineInfo's timestamp
/// for this. The kubelet's cached MachineInfo never fails, so
/// `machine_scrape_error` is 0. NVM figures are 0: the kubelet's cAdvisor is
/// built without libipmctl.
fn machine_families(e: &mut Exposition, m: &Machine) {
    use Kind::*;
    let ml = [
        ("machine_id", m.machine_id),
        ("system_uuid", m.system_uuid),
        ("boot_id", m.boot_id),
    ];
    e.add(
        "machine_scrape_error",
        "1 if there was an error while getting machine metrics, 0 otherwise.",
        Gauge,
        &[],
        0.0,
        None,
    );
    let plain = [
        (
            "machine_cpu_physical_cores",
            "Number of physical CPU cores.",
            m.facts.physical_cores as f64,
        ),
        (
            "machine_cpu_cores",
            "Number of logical CPU cores.",
            m.cores as f64,
        ),
        (
            "machine_cpu_sockets",
            "Number of CPU sockets.",
            m.facts.sockets as f64,
        ),
        (
            "machine_memory_bytes",
            "Amount of memory installed on the machine.",
            m.memory as f64,
        ),
        (
            "machine_swap_bytes",
            "Amount of swap memory available on the machine.",
            m.facts.swap as f64,
        ),
        (
            "machine_nvm_avg_power_budget_watts",
            "NVM power budget.",
            0.0,
        ),
    ];
    for (name, help, v) in plain {
        e.add(name, help, Gauge, &ml, v, None);
    }
    for mode in ["memory_mode", "app_direct_mode"] {
        let mut l = ml.to_vec();
        l.push(("mode", mode));
        e.add(
            "machine_nvm_capacity",
            "NVM capacity value labeled by NVM mode (memory mode or app direct mode).",
            Gauge,
            &l,
            0.0,
            None,
        );
    }
    for (ty, (count, cap)) in &m.facts.memory_by_type {
        let mut l = ml.to_vec();
        l.push(("type", ty.as_str()));
        e.add(
            "machine_dimm_count",
            "Number of RAM DIMM (all types memory modules) value labeled by dimm type.",
            Gauge,
            &l,
            *count as f64,
            None,
        );
        e.add(
            "machine_dimm_capacity_bytes",
            "Total RAM DIMM capacity (all types memory modules) value labeled by dimm type.",
            Gauge,
            &l,
            *cap as f64,
            None,
        );
    }
}

/// The root container's file systems (cAdvisor's raw handler: every file
/// system of its fsInfo, `fsValues` and the file-system half of
/// `ioValues`). cAdvisor divides diskstats' milliseconds by a second's
/// nanoseconds, so its `*_seconds_total` figures here are milliseconds
/// over 1e9; kept so, as dashboards compare against that.
fn root_fs_families(e: &mut Exposition, b: &Base, fss: &[super::procfs::FsStat], ts: Option<i64>) {
    use Kind::*;
    const SECOND_NS: f64 = 1e9;
    let block = b.render();
    for f in fss {
        let l = block.with(&[("device", f.device.as_str())]);
        let (inodes, inodes_free) = f.inodes.unwrap_or((0, 0));
        let d = &f.disk.fields;
        let rows: [(&str, &str, Kind, f64); 15] = [
            (
                "container_fs_inodes_free",
                "Number of available Inodes",
                Gauge,
                inodes_free as f64,
            ),
            (
                "container_fs_inodes_total",
                "Number of Inodes",
                Gauge,
                inodes as f64,
            ),
            (
                "container_fs_limit_bytes",
                "Number of bytes that can be consumed by the container on this filesystem.",
                Gauge,
                f.capacity as f64,
            ),
            (
                "container_fs_usage_bytes",
                "Number of bytes that are consumed by the container on this filesystem.",
                Gauge,
                f.capacity.saturating_sub(f.free) as f64,
            ),
            (
                "container_fs_reads_total",
                "Cumulative count of reads completed",
                Counter,
                d[0] as f64,
            ),
            (
                "container_fs_reads_merged_total",
                "Cumulative count of reads merged",
                Counter,
                d[1] as f64,
            ),
            (
                "container_fs_sector_reads_total",
                "Cumulative count of sector reads completed",
                Counter,
                d[2] as f64,
            ),
            (
                "container_fs_read_seconds_total",
                "Cumulative count of seconds spent reading",
                Counter,
                d[3] as f64 / SECOND_NS,
            ),
            (
                "container_fs_writes_total",
                "Cumulative count of writes completed",
                Counter,
                d[4] as f64,
            ),
            (
                "container_fs_writes_merged_total",
                "Cumulative count of writes merged",
                Counter,
                d[5] as f64,
            ),
            (
                "container_fs_sector_writes_total",
                "Cumulative count of sector writes completed",
                Counter,
                d[6] as f64,
            ),
            (
                "container_fs_write_seconds_total",
                "Cumulative count of seconds spent writing",
                Counter,
                d[7] as f64 / SECOND_NS,
            ),
            (
                "container_fs_io_current",
                "Number of I/Os currently in progress",
                Gauge,
                d[8] as f64,
            ),
            (
                "container_fs_io_time_seconds_total",
                "Cumulative count of seconds spent doing I/Os",
                Counter,
                d[9] as f64 / SECOND_NS,
            ),
            (
                "container_fs_io_time_weighted_seconds_total",
                "Cumulative weighted I/O time in seconds",
                Counter,
                d[10] as f64 / SECOND_NS,
            ),
        ];
        for (name, help, kind, v) in rows {
            e.add_rendered(name, help, kind, &l, v, ts);
        }
    }
}

/// `/metrics/cadvisor`. `snap` None: the collection failed.
/// `/metrics/cadvisor` as one text (tests).
#[cfg(test)]
pub fn cadvisor(snap: Option<&Snapshot>, m: &Machine) -> String {
    let mut out = String::new();
    for c in cadvisor_chunks(snap, m) {
        out.push_str(std::str::from_utf8(&c).unwrap_or_default());
    }
    out
}

/// `/metrics/cadvisor`, one buffer per family.
pub fn cadvisor_chunks(snap: Option<&Snapshot>, m: &Machine) -> Vec<Bytes> {
    use Kind::*;
    static SIZES: std::sync::LazyLock<SizeMemo> = std::sync::LazyLock::new(Default::default);
    // The second thread's part, sized from its own last time (it was
    // grown from empty, a copy at each doubling, before).
    static LATER_SIZES: std::sync::LazyLock<SizeMemo> = std::sync::LazyLock::new(Default::default);
    let mut e = Exposition::remembering(&SIZES);
    e.add(
        "container_scrape_error",
        "1 if there was an error while getting container metrics, 0 otherwise",
        Gauge,
        &[],
        if snap.is_some() { 0.0 } else { 1.0 },
        None,
    );
    machine_families(&mut e, m);
    let Some(snap) = snap else {
        return e.into_chunks();
    };
    let t = snap.time_ns;
    let none: &[super::procfs::Interface] = &[];
    let oom = |cg: &str| snap.oom.as_ref().map(|o| o.get(cg).copied().unwrap_or(0));
    let mut entries = Vec::new();
    // Raw cgroups: "/" (with the host's interfaces), kubepods, QoS classes,
    // and the kubelet's and runtime's own cgroups (cAdvisor in the kubelet
    // watches those too), each once.
    let mut raw: Vec<&CgroupRaw> = snap.hierarchy.iter().collect();
    for (_, c) in &snap.system {
        if !raw.iter().any(|r| r.name == c.name) {
            raw.push(c);
        }
    }
    for h in raw {
        let CgroupRaw { name, sample, .. } = h;
        let root = name == "/";
        if root {
            root_fs_families(&mut e, &Base::bare(name), &snap.node.filesystems, Some(t));
        }
        entries.push(CgEntry {
            base: Base::bare(name),
            sample,
            start_ns: snap.node.boot_ns,
            interfaces: if root { &snap.node.interfaces } else { none },
            fs: None,
            disks: &snap.disk_names,
            oom: oom(name),
        });
    }
    let imagefs = snap.node.imagefs.as_ref().and_then(|(f, _, _)| *f);
    let dev = snap.node.imagefs_device.clone().unwrap_or_default();
    for p in &snap.pods {
        // The pod cgroup: matched to its pod by path, no container labels.
        if let Some(cg) = &p.cgroup {
            entries.push(CgEntry {
                base: Base {
                    id: cg,
                    name: "",
                    image: "",
                    pod: &p.name,
                    namespace: &p.namespace,
                    container: "",
                },
                sample: &p.sample,
                start_ns: p.created_ns,
                interfaces: none,
                fs: None,
                disks: &snap.disk_names,
                oom: oom(cg),
            });
        }
        // The sandbox carries the pod's network, as the pause container
        // does in cAdvisor; containerd gives it no container name.
        if let Some(sc) = &p.sandbox_cgroup {
            entries.push(CgEntry {
                base: Base {
                    id: sc,
                    name: &p.sandbox_id,
                    image: &snap.sandbox_image,
                    pod: &p.name,
                    namespace: &p.namespace,
                    container: "",
                },
                sample: &p.sandbox_sample,
                start_ns: p.created_ns,
                interfaces: &p.interfaces,
                fs: None,
                disks: &snap.disk_names,
                oom: oom(sc),
            });
        }
        for c in &p.containers {
            let Some(cg) = &c.cgroup else { continue };
            let fs = c.rootfs.and_then(|(u, _)| {
                let f = imagefs?;
                Some((
                    dev.clone(),
                    u.unwrap_or(0) as f64,
                    f.capacity as f64,
                    f.inodes as f64,
                    f.inodes_free as f64,
                ))
            });
            entries.push(CgEntry {
                base: Base {
                    id: cg,
                    name: &c.id,
                    image: &c.image,
                    pod: &p.name,
                    namespace: &p.namespace,
                    container: &c.name,
                },
                sample: &c.sample,
                start_ns: c.created_ns,
                interfaces: none,
                fs,
                disks: &snap.disk_names,
                oom: oom(cg),
            });
        }
    }
    // In the order of their label sets (`container`, then `id`), so most
    // families come out sorted and are sent without being reordered.
    entries.sort_by(|a, b| (a.base.container, a.base.id).cmp(&(b.base.container, b.base.id)));
    // At 110 pods about 20,000 samples: the later half rendered on a
    // second thread into an exposition of its own, sent after this one's
    // (so the lines keep the order one thread would give them).
    let (first, later) = entries.split_at(if entries.len() >= PARALLEL_MIN_ENTRIES {
        half_by_weight(&entries, snap.node.filesystems.len())
    } else {
        entries.len()
    });
    let render = |e: &mut Exposition, part: &[CgEntry]| {
        for c in part {
            cadvisor_entry(e, c, t);
        }
    };
    if later.is_empty() {
        render(&mut e, first);
        return e.into_chunks();
    }
    let mut other = Exposition::remembering(&LATER_SIZES);
    crate::blocking::halves(
        "stats-render",
        || render(&mut e, first),
        || render(&mut other, later),
    );
    e.join_chunks(other)
}

/// From this many cgroups cAdvisor's text is rendered on two threads.
const PARALLEL_MIN_ENTRIES: usize = 64;

/// Where to split `entries` so both parts take about as long to render: a
/// container's entry (file system, log and more families) costs about
/// twice a pod's, a sandbox's or an intermediate cgroup's, as profiled at
/// 110 pods; the containers sort last.
fn half_by_weight(entries: &[CgEntry], filesystems: usize) -> usize {
    // In halves of a pod's entry (about 45 samples): the root container's
    // file systems (15 samples each, with labels sorted per sample; over
    // 300 with 110 pods' mounts, a quarter of the text) are rendered
    // before the entries, on the first thread.
    crate::blocking::half_point_after(filesystems, entries, |c| {
        if c.base.container.is_empty() {
            2
        } else {
            4
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Samples added to two expositions, the second joined after the
    /// first, render as if all had been added to one in that order: lines
    /// in label order (across the two parts too), a repeated label set
    /// shown once with its later value, families only one part has kept.
    #[test]
    fn joined_expositions_render_as_one_added_to_in_order() {
        let adds: Vec<(&str, &str, f64)> = vec![
            ("a_total", "m", 1.0),
            ("a_total", "c", 2.0),
            ("b", "x", 3.0),
            ("a_total", "b", 4.0),
            ("c", "y", 5.0),
            ("a_total", "m", 6.0),
            ("a_total", "z", 7.0),
        ];
        let add = |e: &mut Exposition, (name, l, v): (&str, &str, f64)| {
            e.add(name, "help", Kind::Counter, &[("l", l)], v, Some(1_000_000));
        };
        let mut one = Exposition::default();
        for a in &adds {
            add(&mut one, *a);
        }
        let want = one.render();
        for cut in 0..=adds.len() {
            let (mut first, mut later) = (Exposition::default(), Exposition::default());
            for a in &adds[..cut] {
                add(&mut first, *a);
            }
            for a in &adds[cut..] {
                add(&mut later, *a);
            }
            let chunks = first.join_chunks(later);
            let text: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
            assert_eq!(String::from_utf8(text).unwrap(), want, "cut at {cut}");
        }
        assert!(want.contains("a_total{l=\"m\"} 6 1\n"), "{want}");
        assert!(!want.contains("} 1 1\n"), "{want}");
        // Parts each in order: two buffers when the first ends before the
        // second begins, one (merged) when they interleave.
        for (first, later, buffers) in [(["a", "b"], ["c", "d"], 2), (["a", "c"], ["b", "d"], 1)] {
            let (mut e1, mut e2) = (Exposition::default(), Exposition::default());
            for (e, ls) in [(&mut e1, first), (&mut e2, later)] {
                for l in ls {
                    add(e, ("x", l, 1.0));
                }
            }
            let chunks = e1.join_chunks(e2);
            assert_eq!(chunks.len(), buffers, "{first:?} {later:?}");
            let text: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
            let text = String::from_utf8(text).unwrap();
            let labels: Vec<_> = text.lines().skip(2).map(|l| &l[5..6]).collect();
            assert_eq!(labels, ["a", "b", "c", "d"], "{text}");
        }
    }

    #[test]
    fn the_weighted_half_puts_about_as_much_work_on_each_side() {
        let sample = CgroupSample::default();
        let disks = super::super::blkio::DiskNames::default();
        let entry = |container: &'static str| CgEntry {
            base: Base {
                id: "/x",
                name: "",
                image: "",
                pod: "",
                namespace: "",
                container,
            },
            sample: &sample,
            start_ns: 0,
            interfaces: &[],
            fs: None,
            disks: &disks,
            oom: None,
        };
        // 20 pod-level entries (weight 2) then 10 containers (weight 4).
        let mut entries: Vec<CgEntry> = (0..20).map(|_| entry("")).collect();
        entries.extend((0..10).map(|_| entry("app")));
        assert_eq!(half_by_weight(&entries, 0), 20);
        let all_pods: Vec<CgEntry> = (0..10).map(|_| entry("")).collect();
        assert_eq!(half_by_weight(&all_pods, 0), 5);
        assert_eq!(half_by_weight(&[], 0), 0);
        // The first thread's file systems (half a pod's entry each) move
        // the cut back: 40 of them weigh as 10 pods' entries, and with
        // more than all the entries weigh, every entry goes second.
        assert_eq!(half_by_weight(&entries, 40), 10);
        assert_eq!(half_by_weight(&all_pods, 40), 0);
    }

    /// Upstream's gathering as a map of rendered label sets per family
    /// (what `Exposition` did before it rendered lines straight away).
    type Add<'a> = (&'a str, &'a str, Vec<(&'a str, &'a str)>, f64, Option<i64>);

    fn reference(adds: &[Add]) -> String {
        let mut fams: BTreeMap<&str, (&str, BTreeMap<String, String>)> = BTreeMap::new();
        for (name, help, labels, v, ts) in adds {
            let mut l = labels.clone();
            l.sort_by(|a, b| a.0.cmp(b.0));
            let mut r = String::new();
            for (i, (k, v)) in l.iter().enumerate() {
                if i > 0 {
                    r.push(',');
                }
                r.push_str(k);
                r.push_str("=\"");
                push_escaped(&mut r, v);
                r.push('"');
            }
            let mut tail = String::new();
            write_value(&mut tail, *v);
            if let Some(ts) = ts {
                tail.push_str(&format!(" {}", ts / 1_000_000));
            }
            fams.entry(name)
                .or_insert((help, BTreeMap::new()))
                .1
                .insert(r, tail);
        }
        let mut out = String::new();
        for (name, (help, samples)) in fams {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} gauge\n"));
            for (l, tail) in samples {
                let l = if l.is_empty() { l } else { format!("{{{l}}}") };
                out.push_str(&format!("{name}{l} {tail}\n"));
            }
        }
        out
    }

    #[test]
    fn rendering_matches_a_map_of_label_sets() {
        let mut adds = Vec::new();
        let names = ["m_b", "m_a", "m_c"];
        for i in 0..300u32 {
            let pod = format!("p{}", (i * 7919) % 23);
            let ctr = format!("c{}\"{}", i % 5, (i * 31) % 7);
            let name = names[(i % 3) as usize];
            let labels: Vec<(&str, &str)> = match i % 4 {
                0 => vec![],
                1 => vec![("pod", leak(pod)), ("container", leak(ctr))],
                _ => vec![("z", "1"), ("pod", leak(pod)), ("a", leak(ctr))],
            };
            let ts = (i % 2 == 0).then_some(i as i64 * 1_000_000_007);
            adds.push((name, "help", labels, i as f64 / 7.0, ts));
        }
        adds.push(("m_a", "ignored", vec![], f64::NAN, None));
        let mut e = Exposition::default();
        for (name, help, labels, v, ts) in &adds {
            e.add(name, help, Kind::Gauge, labels, *v, *ts);
        }
        assert_eq!(e.render(), reference(&adds));
    }

    #[test]
    fn values_and_timestamps_are_written_as_formatting_writes_them() {
        let values = [
            0.0,
            -0.0,
            1.0,
            -1.0,
            12345.0,
            0.5,
            -2.25,
            1.0 / 3.0,
            4_294_967_296.0,
            9_007_199_254_740_991.0,
            9_007_199_254_740_992.0,
            1e20,
            -1e20,
            f64::MAX,
            f64::MIN_POSITIVE,
        ];
        for v in values {
            let mut out = String::new();
            write_value(&mut out, v);
            assert_eq!(out, format!("{v}"), "{v:e}");
        }
        for n in [0, 7, -7, 1_700_000_000_123, i64::MAX, i64::MIN] {
            let mut out = String::new();
            push_int(&mut out, n);
            assert_eq!(out, n.to_string());
        }
    }

    #[test]
    fn base_labels_come_sorted_with_their_extras() {
        let b = Base {
            id: "/kubepods/podu/abc",
            name: "abc",
            image: "busybox",
            pod: "p",
            namespace: "ns",
            container: "c",
        };
        let extras: [&[(&str, &str)]; 5] = [
            &[],
            &[("cpu", "total")],
            &[("interface", "eth0")],
            &[
                ("operation", "Read"),
                ("major", "8"),
                ("minor", "0"),
                ("device", "sda"),
            ],
            &[("zone", "z"), ("a", "1")],
        ];
        for extra in extras {
            let got: Vec<_> = b.with(extra).to_vec();
            let mut want: Vec<_> = [
                ("id", b.id),
                ("name", b.name),
                ("image", b.image),
                ("pod", b.pod),
                ("namespace", b.namespace),
                ("container", b.container),
            ]
            .into_iter()
            .chain(extra.iter().copied())
            .collect();
            want.sort();
            assert_eq!(got, want);
        }
    }

    #[test]
    fn a_rendered_label_set_writes_what_add_writes() {
        let bare = Base::bare("/");
        let b = Base {
            id: "/kubepods/podu/abc",
            name: "a\"b\\c\nd",
            image: "busybox",
            pod: "p",
            namespace: "ns",
            container: "",
        };
        let mut by_pairs = Exposition::default();
        let mut by_block = Exposition::default();
        for (i, base) in [&bare, &b].into_iter().enumerate() {
            by_pairs.add("m", "h", Kind::Gauge, &base.with(&[]), i as f64, Some(1));
            by_block.add_rendered("m", "h", Kind::Gauge, &base.render(), i as f64, Some(1));
        }
        // And a family with no labels at all: no braces.
        by_pairs.add("n", "h", Kind::Counter, &[], 1.5, None);
        by_block.add_rendered("n", "h", Kind::Counter, &Rendered(String::new()), 1.5, None);
        let text = by_block.render();
        assert_eq!(text, by_pairs.render());
        assert!(text.contains(r#"name="a\"b\\c\nd""#), "{text}");
        assert!(text.contains("\nn 1.5\n"), "{text}");
    }

    /// Extra labels spliced into a rendered base (one sample, or a set
    /// several families share) write what sorting and rendering the whole
    /// set writes: before, between and after the base labels, escaped.
    #[test]
    fn a_spliced_label_set_writes_what_add_writes() {
        let bases = [
            Base::bare("/"),
            Base {
                id: "/kubepods/podu/abc",
                name: "a\"b\\c\nd",
                image: "busybox",
                pod: "p",
                namespace: "ns",
                container: "",
            },
            Base {
                id: "/kubepods/podu/def",
                name: "def",
                image: "img",
                pod: "p",
                namespace: "ns",
                container: "app",
            },
        ];
        let extras: [&[(&str, &str)]; 9] = [
            &[],
            &[("a", "1")],
            &[("cpu", "total")],
            &[("failure_type", "pgfault"), ("scope", "hierarchy")],
            &[("interface", "eth\"0")],
            &[
                ("device", "/dev/sda"),
                ("major", "8"),
                ("minor", "0"),
                ("operation", "Read"),
            ],
            &[("state", "running")],
            &[("ulimit", "max_open_files")],
            &[("a", ""), ("zone", "z\n")],
        ];
        let mut by_pairs = Exposition::default();
        let mut spliced = Exposition::default();
        let mut shared = Exposition::default();
        for (i, b) in bases.iter().enumerate() {
            let block = b.render();
            for (j, extra) in extras.iter().enumerate() {
                let name = format!("m{j}");
                let v = i as f64;
                by_pairs.add(&name, "h", Kind::Gauge, &b.with(extra), v, None);
                spliced.add_spliced(&name, "h", Kind::Gauge, &block, extra, v, None);
                shared.add_rendered(&name, "h", Kind::Gauge, &block.with(extra), v, None);
            }
        }
        let want = by_pairs.render();
        assert!(want.contains(r#"m4{container="",id="/kubepods/podu/abc",image="busybox",interface="eth\"0",name="a\"b\\c\nd",namespace="ns",pod="p"} 1"#), "{want}");
        assert!(want.contains(r#"m8{a="",container="app",id="/kubepods/podu/def",image="img",name="def",namespace="ns",pod="p",zone="z\n"} 2"#), "{want}");
        assert_eq!(spliced.render(), want);
        assert_eq!(shared.render(), want);
    }

    #[test]
    fn a_remembered_exposition_renders_the_same_and_records_family_sizes() {
        static MEMO: std::sync::LazyLock<SizeMemo> = std::sync::LazyLock::new(Default::default);
        let fill = |e: &mut Exposition| {
            for i in 0..50 {
                let v = i.to_string();
                e.add("m_x", "h", Kind::Gauge, &[("i", &v)], i as f64, None);
            }
            e.add("m_y", "h", Kind::Counter, &[], 1.5, Some(2_000_000));
        };
        let mut plain = Exposition::default();
        fill(&mut plain);
        let want = plain.render();
        let mut first = Exposition::remembering(&MEMO);
        fill(&mut first);
        assert_eq!(first.render(), want);
        let sizes = MEMO.lock().clone();
        let x = want.split("# HELP m_y").next().unwrap();
        assert_eq!(sizes["m_x"], (x.len(), 50));
        assert_eq!(sizes["m_y"].1, 1);
        // The next rendering starts from those sizes and still says the same.
        let mut second = Exposition::remembering(&MEMO);
        fill(&mut second);
        assert_eq!(second.render(), want);
        // A part joined after another records its own sizes when it is.
        static LATER: std::sync::LazyLock<SizeMemo> = std::sync::LazyLock::new(Default::default);
        let mut later = Exposition::remembering(&LATER);
        later.add("m_y", "h", Kind::Counter, &[("i", "9")], 2.0, None);
        let mut whole = Exposition::default();
        fill(&mut whole);
        let chunks = whole.join_chunks(later);
        let later_sizes = LATER.lock().clone();
        assert_eq!(later_sizes.len(), 1);
        assert_eq!(later_sizes["m_y"].1, 1);
        // Both parts in order: sent from their own buffers, the second
        // without its header.
        assert_eq!(
            &chunks[chunks.len() - 2..],
            [
                "# HELP m_y h\n# TYPE m_y counter\nm_y 1.5 2\n",
                "m_y{i=\"9\"} 2\n"
            ]
        );
    }

    #[test]
    fn a_family_added_in_label_order_is_sent_from_its_own_buffer() {
        let mut e = Exposition::default();
        for pod in ["a", "b", "c"] {
            e.add("m", "help", Kind::Gauge, &[("pod", pod)], 1.0, None);
        }
        let f = &e.families["m"];
        let (at, len) = (f.text.as_ptr(), f.text.len());
        let chunks = e.into_chunks();
        assert_eq!(chunks.len(), 1);
        assert_eq!((chunks[0].as_ptr(), chunks[0].len()), (at, len));
        assert_eq!(
            std::str::from_utf8(&chunks[0]).unwrap(),
            "# HELP m help\n# TYPE m gauge\nm{pod=\"a\"} 1\nm{pod=\"b\"} 1\nm{pod=\"c\"} 1\n"
        );
        // Out of order, or a label set twice: reordered, the last one kept.
        let mut e = Exposition::default();
        for (pod, v) in [("b", 1.0), ("a", 2.0), ("b", 3.0)] {
            e.add("m", "help", Kind::Counter, &[("pod", pod)], v, None);
        }
        assert_eq!(
            e.render(),
            "# HELP m help\n# TYPE m counter\nm{pod=\"a\"} 2\nm{pod=\"b\"} 3\n"
        );
    }

    #[tokio::test]
    async fn a_chunk_body_has_its_length_and_its_chunks_in_order() {
        use http_body_util::BodyExt;
        let body = ChunkBody::new(vec![
            Bytes::from_static(b"ab"),
            Bytes::new(),
            Bytes::from_static(b"cde"),
        ]);
        assert_eq!(hyper::body::Body::size_hint(&body).exact(), Some(5));
        let got = body.collect().await.unwrap().to_bytes();
        assert_eq!(&got[..], b"abcde");
    }

    #[test]
    fn per_device_io_and_process_families_follow_cadvisor() {
        use super::super::blkio::{DiskEntry, DiskIo, Op};
        use super::super::processes::ProcessSample;
        use super::super::provider::{ContainerRaw, PodRaw};
        let e = |major, minor, op, value| DiskEntry {
            major,
            minor,
            op,
            value,
        };
        let sample = CgroupSample {
            cpu: Some(Default::default()),
            disk: Some(DiskIo {
                service_bytes: vec![e(8, 0, Op::Read, 4096), e(8, 0, Op::Total, 4096)],
                serviced: vec![e(8, 0, Op::Write, 3), e(9, 9, Op::Read, 1)],
                sectors: vec![e(8, 0, Op::Count, 16)],
                service_time: vec![
                    e(8, 0, Op::Read, 1_500_000_000),
                    e(8, 0, Op::Total, 2_000_000_000),
                ],
                ..Default::default()
            }),
            procs: Some(ProcessSample {
                processes: 2,
                fds: 9,
                sockets: 1,
                threads: 5,
                threads_max: 0,
                first_pid: Some(10),
                max_open_files: Some(1024),
            }),
            ..Default::default()
        };
        let snap = Snapshot {
            time_ns: 1_000_000_000_000,
            pods: vec![PodRaw {
                name: "p".into(),
                namespace: "ns".into(),
                containers: vec![ContainerRaw {
                    id: "cid".into(),
                    name: "c".into(),
                    image: "img".into(),
                    cgroup: Some("/kubepods/podu/cid".into()),
                    sample,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            disk_names: std::sync::Arc::new([((8, 0), "/dev/sda".to_string())].into()),
            ..Default::default()
        };
        let m = Machine {
            machine_id: "m",
            system_uuid: "s",
            boot_id: "b",
            cores: 1,
            memory: 1,
            facts: &Default::default(),
        };
        let text = cadvisor(Some(&snap), &m);
        // The sample of `name` whose labels include `extra`, as "value ts".
        let value = |name: &str, extra: &[(&str, &str)]| -> Option<String> {
            text.lines().find_map(|l| {
                let rest = l.strip_prefix(name)?.strip_prefix('{')?;
                let (labels, tail) = rest.split_once("} ")?;
                let all = extra
                    .iter()
                    .chain(&[("id", "/kubepods/podu/cid"), ("pod", "p")])
                    .all(|(k, v)| labels.split(',').any(|kv| kv == format!("{k}=\"{v}\"")));
                all.then(|| tail.to_string())
            })
        };
        let sda = [("device", "/dev/sda")];
        for (name, extra, want) in [
            ("container_fs_reads_bytes_total", &sda[..], "4096"),
            ("container_fs_writes_bytes_total", &sda, "0"),
            ("container_fs_writes_total", &sda, "3"),
            // A device the machine does not list: no name, as cAdvisor.
            ("container_fs_reads_total", &[("device", "")], "1"),
            // v1 sector counts have no operation: cAdvisor shows 0.
            ("container_fs_sector_reads_total", &sda, "0"),
            ("container_fs_read_seconds_total", &sda, "1.5"),
            ("container_fs_io_time_seconds_total", &sda, "2"),
            (
                "container_blkio_device_usage_total",
                &[
                    ("device", "/dev/sda"),
                    ("major", "8"),
                    ("minor", "0"),
                    ("operation", "Total"),
                ],
                "4096",
            ),
            ("container_processes", &[], "2"),
            ("container_file_descriptors", &[], "9"),
            ("container_sockets", &[], "1"),
            ("container_threads", &[], "5"),
            ("container_threads_max", &[], "0"),
            (
                "container_ulimits_soft",
                &[("ulimit", "max_open_files")],
                "1024",
            ),
            ("container_cpu_load_average_10s", &[], "0"),
            ("container_tasks_state", &[("state", "iowaiting")], "0"),
        ] {
            assert_eq!(
                value(name, extra).as_deref(),
                Some(format!("{want} 1000000").as_str()),
                "{name} {extra:?} in\n{text}"
            );
        }
        // No queued figures: no family.
        assert!(!text.contains("container_fs_io_current"));
        assert!(text.contains("# TYPE container_fs_reads_bytes_total counter\n"));
        assert!(text.contains("# TYPE container_processes gauge\n"));
    }

    fn leak(s: String) -> &'static str {
        Box::leak(s.into_boxed_str())
    }

    #[test]
    fn samples_render_sorted_escaped_and_stamped() {
        let mut e = Exposition::default();
        e.add(
            "b_total",
            "B.",
            Kind::Counter,
            &[("z", "1"), ("a", "x\"y\\z\nw")],
            1.5,
            Some(2_000_000),
        );
        e.add(
            "b_total",
            "ignored",
            Kind::Counter,
            &[("a", "p")],
            f64::INFINITY,
            None,
        );
        e.add("a", "A.", Kind::Gauge, &[], f64::NAN, None);
        assert_eq!(
            e.render(),
            "# HELP a A.\n# TYPE a gauge\na NaN\n\
             # HELP b_total B.\n# TYPE b_total counter\n\
             b_total{a=\"p\"} +Inf\n\
             b_total{a=\"x\\\"y\\\\z\\nw\",z=\"1\"} 1.5 2\n"
        );
    }

    #[test]
    fn machine_families_follow_cadvisor_with_the_kubelet_metric_set() {
        let mut facts = super::super::procfs::MachineFacts {
            physical_cores: 4,
            sockets: 1,
            swap: 2048,
            ..Default::default()
        };
        facts
            .memory_by_type
            .insert("Unbuffered-DDR4".into(), (2, 16 << 30));
        let m = Machine {
            machine_id: "m",
            system_uuid: "s",
            boot_id: "b",
            cores: 8,
            memory: 1 << 30,
            facts: &facts,
        };
        // Shown even when the container collection failed.
        let text = cadvisor(None, &m);
        let base = r#"boot_id="b",machine_id="m",system_uuid="s""#;
        for (line, help) in [
            (
                format!("machine_cpu_physical_cores{{{base}}} 4"),
                "# HELP machine_cpu_physical_cores Number of physical CPU cores.",
            ),
            (
                format!("machine_cpu_cores{{{base}}} 8"),
                "# HELP machine_cpu_cores Number of logical CPU cores.",
            ),
            (
                format!("machine_cpu_sockets{{{base}}} 1"),
                "# HELP machine_cpu_sockets Number of CPU sockets.",
            ),
            (
                format!("machine_swap_bytes{{{base}}} 2048"),
                "# HELP machine_swap_bytes Amount of swap memory available on the machine.",
            ),
            (
                format!("machine_nvm_avg_power_budget_watts{{{base}}} 0"),
                "# HELP machine_nvm_avg_power_budget_watts NVM power budget.",
            ),
            (
                r#"machine_nvm_capacity{boot_id="b",machine_id="m",mode="app_direct_mode",system_uuid="s"} 0"#.to_string(),
                "# TYPE machine_nvm_capacity gauge",
            ),
            (
                r#"machine_nvm_capacity{boot_id="b",machine_id="m",mode="memory_mode",system_uuid="s"} 0"#.to_string(),
                "# HELP machine_nvm_capacity NVM capacity value labeled by NVM mode (memory mode or app direct mode).",
            ),
            (
                format!(r#"machine_dimm_count{{{base},type="Unbuffered-DDR4"}} 2"#),
                "# HELP machine_dimm_count Number of RAM DIMM (all types memory modules) value labeled by dimm type.",
            ),
            (
                format!(r#"machine_dimm_capacity_bytes{{{base},type="Unbuffered-DDR4"}} 17179869184"#),
                "# HELP machine_dimm_capacity_bytes Total RAM DIMM capacity (all types memory modules) value labeled by dimm type.",
            ),
            (
                "machine_scrape_error 0".to_string(),
                "# HELP machine_scrape_error 1 if there was an error while getting machine metrics, 0 otherwise.",
            ),
        ] {
            assert!(text.lines().any(|l| l == line), "{line}\n{text}");
            assert!(text.lines().any(|l| l == help), "{help}");
        }
        assert!(text.contains("container_scrape_error 1\n"));
        // Topology families need cAdvisor's CPUTopologyMetrics, which the
        // kubelet does not include; no DIMMs, no dimm families.
        assert!(!text.contains("machine_thread_siblings_count"));
        assert!(!text.contains("machine_node_"));
        let no_dimms = super::super::procfs::MachineFacts::default();
        let m = Machine {
            facts: &no_dimms,
            ..m
        };
        assert!(!cadvisor(None, &m).contains("machine_dimm"));
    }

    #[test]
    fn root_container_reports_every_global_file_system_with_diskstats() {
        use super::super::procfs::{DiskStats, FsStat};
        let mut snap = Snapshot {
            time_ns: 1_000_000_000_000,
            hierarchy: vec![CgroupRaw {
                name: "/".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        snap.node.filesystems = vec![
            FsStat {
                device: "/dev/sda1".into(),
                capacity: 1000,
                free: 400,
                inodes: Some((50, 20)),
                disk: DiskStats {
                    major: 8,
                    minor: 1,
                    fields: [4, 1, 32, 2500, 6, 2, 48, 3000, 1, 4000, 5000],
                },
            },
            FsStat {
                device: "/run".into(),
                capacity: 10,
                free: 10,
                inodes: None,
                ..Default::default()
            },
        ];
        let facts = Default::default();
        let m = Machine {
            machine_id: "m",
            system_uuid: "s",
            boot_id: "b",
            cores: 1,
            memory: 1,
            facts: &facts,
        };
        let text = cadvisor(Some(&snap), &m);
        let sample = |name: &str, dev: &str| -> Option<String> {
            let pre = format!(
                r#"{name}{{container="",device="{dev}",id="/",image="",name="",namespace="",pod=""}} "#
            );
            text.lines()
                .find_map(|l| l.strip_prefix(pre.as_str()).map(str::to_string))
        };
        for (name, dev, v) in [
            ("container_fs_usage_bytes", "/dev/sda1", "600 1000000"),
            ("container_fs_limit_bytes", "/dev/sda1", "1000 1000000"),
            ("container_fs_inodes_total", "/dev/sda1", "50 1000000"),
            ("container_fs_inodes_free", "/dev/sda1", "20 1000000"),
            ("container_fs_reads_total", "/dev/sda1", "4 1000000"),
            ("container_fs_reads_merged_total", "/dev/sda1", "1 1000000"),
            ("container_fs_sector_reads_total", "/dev/sda1", "32 1000000"),
            // cAdvisor's scaling: diskstats milliseconds over 1e9.
            (
                "container_fs_read_seconds_total",
                "/dev/sda1",
                "0.0000025 1000000",
            ),
            ("container_fs_writes_total", "/dev/sda1", "6 1000000"),
            ("container_fs_writes_merged_total", "/dev/sda1", "2 1000000"),
            (
                "container_fs_sector_writes_total",
                "/dev/sda1",
                "48 1000000",
            ),
            (
                "container_fs_write_seconds_total",
                "/dev/sda1",
                "0.000003 1000000",
            ),
            ("container_fs_io_current", "/dev/sda1", "1 1000000"),
            (
                "container_fs_io_time_seconds_total",
                "/dev/sda1",
                "0.000004 1000000",
            ),
            (
                "container_fs_io_time_weighted_seconds_total",
                "/dev/sda1",
                "0.000005 1000000",
            ),
            ("container_fs_usage_bytes", "/run", "0 1000000"),
            ("container_fs_inodes_total", "/run", "0 1000000"),
            ("container_fs_reads_total", "/run", "0 1000000"),
        ] {
            assert_eq!(sample(name, dev).as_deref(), Some(v), "{name} {dev}");
        }
        assert!(text.contains("# TYPE container_fs_io_time_weighted_seconds_total counter\n"));
        assert!(text.contains("# TYPE container_fs_io_current gauge\n"));
        assert!(text.contains(
            "# HELP container_fs_io_time_weighted_seconds_total Cumulative weighted I/O time in seconds\n"
        ));
    }
}
