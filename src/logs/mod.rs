//! Container logs: `/containerLogs/{ns}/{pod}/{container}` as upstream's
//! getContainerLogs and kuberuntime's ReadLogs (the CRI log format, tail,
//! since, limitBytes, timestamps, previous, follow across rotations), and
//! `/logs/` (files under /var/log, never outside it).

pub mod cri_format;
pub mod files;
pub mod podlogs;
pub mod rotation;

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::sync::mpsc;

use crate::server::{restful_text as text, ServerState};

/// `/containerLogs/{ns}/{pod}/{container}` and `/logs/`.
pub fn routes() -> Router<ServerState> {
    Router::new()
        .route(
            "/containerLogs/{namespace}/{pod}/{container}",
            get(container_logs),
        )
        .route("/logs", get(files::root))
        .route("/logs/", get(files::root))
        .route("/logs/{*path}", get(files::path))
}

/// `v1.PodLogOptions` as the kubelet reads them from the query.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct LogOptions {
    pub follow: bool,
    pub previous: bool,
    pub timestamps: bool,
    pub tail_lines: Option<i64>,
    pub limit_bytes: Option<i64>,
    /// Only lines at or after this time (from sinceSeconds or sinceTime).
    pub since: Option<k8s_openapi::jiff::Timestamp>,
    /// `stream`: one of the two streams only (None: both).
    pub stream: Option<cri_format::Stream>,
}

/// Why a query was refused, as upstream's getContainerLogs tells them
/// apart.
#[derive(Debug, PartialEq)]
pub enum OptionsError {
    /// Not decodable into `v1.PodLogOptions`: 400.
    Decode(String),
    /// Refused by ValidatePodLogOptions: 422.
    Invalid(String),
    /// A single stream asked for with `PodLogsQuerySplitStreams` off: 400.
    StreamsNotSplit(String),
}

impl OptionsError {
    fn response(&self) -> Response {
        tracing::debug!(reason = ?self, "container logs query refused");
        // Upstream's bodies; the JSON-looking ones are written as text.
        let (code, body) = match self {
            OptionsError::Decode(_) => (
                StatusCode::BAD_REQUEST,
                r#"{"message": "Unable to decode query."}"#.to_string(),
            ),
            OptionsError::Invalid(_) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                r#"{"message": "Invalid request."}"#.to_string(),
            ),
            OptionsError::StreamsNotSplit(s) => (
                StatusCode::BAD_REQUEST,
                format!(
                    "unable to return the given log stream: {s:?}. Please enable PodLogsQuerySplitStreams feature gate in kubelet"
                ),
            ),
        };
        text(code, body)
    }
}

/// apimachinery's Convert_Slice_string_To_bool: only `0` and `false` (in
/// any case) are false; anything else, the empty string too, is true.
fn go_bool(v: &str) -> bool {
    !(v == "0" || v.eq_ignore_ascii_case("false"))
}

/// The query as upstream decodes and validates it: the first value of a
/// repeated key counts; the legacy `tail` (a count, or `all`) overrides
/// `tailLines`; unparsable numbers and times are decode errors; negative
/// tailLines, limitBytes or sinceSeconds below 1, both since forms, an
/// unknown stream, or a single stream with tailLines are invalid.
/// `split_streams` is the `PodLogsQuerySplitStreams` gate.
pub fn parse_options(
    query: &str,
    now: k8s_openapi::jiff::Timestamp,
    split_streams: bool,
) -> Result<LogOptions, OptionsError> {
    let mut first: std::collections::HashMap<String, String> = Default::default();
    for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
        first
            .entry(k.into_owned())
            .or_insert_with(|| v.into_owned());
    }
    if let Some(tail) = first.get("tail").filter(|t| !t.is_empty()).cloned() {
        if tail == "all" {
            first.remove("tailLines");
        } else {
            first.insert("tailLines".into(), tail);
        }
    }
    let get = |k: &str| first.get(k).map(String::as_str);
    let int = |k: &str| -> Result<Option<i64>, OptionsError> {
        get(k)
            .map(|v| {
                v.parse::<i64>()
                    .map_err(|_| OptionsError::Decode(format!("{k}: invalid integer {v:?}")))
            })
            .transpose()
    };
    let mut o = LogOptions {
        follow: get("follow").is_some_and(go_bool),
        previous: get("previous").is_some_and(go_bool),
        timestamps: get("timestamps").is_some_and(go_bool),
        tail_lines: int("tailLines")?,
        limit_bytes: int("limitBytes")?,
        ..Default::default()
    };
    let since_seconds = int("sinceSeconds")?;
    // metav1.Time's query form: empty or `null` is the zero time, and set.
    let since_time = match get("sinceTime") {
        None => None,
        Some("" | "null") => Some(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        Some(v) => Some(v.parse::<k8s_openapi::jiff::Timestamp>().map_err(|e| {
            OptionsError::Decode(format!("sinceTime: invalid RFC3339 time {v:?}: {e}"))
        })?),
    };
    let invalid = |m: &str| Err(OptionsError::Invalid(m.into()));
    if o.tail_lines.is_some_and(|n| n < 0) {
        return invalid("tailLines: Invalid value: must be greater than or equal to 0");
    }
    if o.limit_bytes.is_some_and(|n| n < 1) {
        return invalid("limitBytes: Invalid value: must be greater than 0");
    }
    if since_seconds.is_some() && since_time.is_some() {
        return invalid("at most one of `sinceTime` or `sinceSeconds` may be specified");
    }
    if let Some(s) = since_seconds {
        if s < 1 {
            return invalid("sinceSeconds: Invalid value: must be greater than 0");
        }
        o.since = now
            .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(s))
            .ok();
    }
    if since_time.is_some() {
        o.since = since_time;
    }
    // The gate defaults `stream` to All; without it, only a given one is
    // checked (upstream decodes without defaults when the gate is off).
    let stream = get("stream").or(split_streams.then_some("All"));
    if let Some(stream) = stream {
        o.stream = match stream {
            "All" => None,
            "Stdout" => Some(cri_format::Stream::Stdout),
            "Stderr" => Some(cri_format::Stream::Stderr),
            other => return invalid(&format!("stream: Unsupported value: {other:?}")),
        };
        if o.stream.is_some() && o.tail_lines.is_some() {
            return invalid("`tailLines` and specific `stream` are mutually exclusive for now");
        }
        if o.stream.is_some() && !split_streams {
            return Err(OptionsError::StreamsNotSplit(stream.into()));
        }
    }
    Ok(o)
}

/// The container instance whose log is read: its log file and whether it
/// still runs.
struct Instance {
    id: String,
    log_path: PathBuf,
}

async fn container_logs(
    State(s): State<ServerState>,
    Path((namespace, pod_name, container)): Path<(String, String, String)>,
    RawQuery(q): RawQuery,
) -> Response {
    let opts = match parse_options(
        q.as_deref().unwrap_or_default(),
        k8s_openapi::jiff::Timestamp::now(),
        s.config.feature_gate("PodLogsQuerySplitStreams"),
    ) {
        Ok(o) => o,
        Err(e) => return e.response(),
    };
    // Upstream GetPodByName: a pod in its grace period has logs too.
    let Some(pod) = s.pods.by_name(&namespace, &pod_name) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("pod {pod_name:?} does not exist"),
        );
    };
    let spec = pod.spec.clone().unwrap_or_default();
    let known = spec
        .containers
        .iter()
        .map(|c| &c.name)
        .chain(spec.init_containers.iter().flatten().map(|c| &c.name))
        .chain(spec.ephemeral_containers.iter().flatten().map(|c| &c.name))
        .any(|n| *n == container);
    if !known {
        return text(
            StatusCode::NOT_FOUND,
            format!("container {container:?} not found in pod {pod_name:?}"),
        );
    }
    // The status the status manager holds, else the pod's own (a kubelet
    // just restarted), as upstream's GetKubeletContainerLogs reads it.
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let status = match s.status.get(&uid) {
        Some(st) => (*st).clone(),
        None => pod.status.clone().unwrap_or_default(),
    };
    let picked = log_container_id(&pod_name, &status, &container, opts.previous);
    let instance = match picked {
        Ok(id) => find_instance(&s, id, &pod_name, &container).await,
        Err(e) => Err(e),
    };
    let instance = match instance {
        Ok(i) => i,
        Err(e) => return text(StatusCode::BAD_REQUEST, e),
    };
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    let runtime = s.runtime.clone();
    tokio::spawn(tracing::Instrument::instrument(
        stream_log(instance, opts, runtime, tx),
        tracing::debug_span!("container-logs", pod = %pod_name, container = %container),
    ));
    let body = Body::from_stream(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
    }));
    // No Content-Type: upstream sets none and Go does not sniff a
    // chunked answer.
    body.into_response()
}

/// The runtime ID of the instance whose log is read, picked from the
/// pod's status as upstream's validateContainerLogStatus does: with
/// `previous` the last terminated one; otherwise the running one, else the
/// terminated one, else the last terminated one. A waiting container has
/// no log yet, and the message says why.
fn log_container_id(
    pod_name: &str,
    status: &k8s_openapi::api::core::v1::PodStatus,
    container: &str,
    previous: bool,
) -> Result<String, String> {
    let cs = [
        &status.container_statuses,
        &status.init_container_statuses,
        &status.ephemeral_container_statuses,
    ]
    .into_iter()
    .flat_map(|l| l.iter().flatten())
    .find(|c| c.name == container)
    .ok_or_else(|| format!("container {container:?} in pod {pod_name:?} is not available"))?;
    let state = cs.state.clone().unwrap_or_default();
    let last_terminated = cs.last_state.as_ref().and_then(|l| l.terminated.as_ref());
    let last = last_terminated
        .and_then(|t| t.container_id.clone())
        .filter(|id| !id.is_empty());
    let terminated = || format!("container {container:?} in pod {pod_name:?} is terminated");
    let id = if previous {
        last.ok_or_else(|| {
            format!("previous terminated container {container:?} in pod {pod_name:?} not found")
        })?
    } else if state.running.is_some() {
        cs.container_id.clone().unwrap_or_default()
    } else if let Some(t) = &state.terminated {
        // The next instance did not start: the last one's log.
        match t.container_id.clone().filter(|id| !id.is_empty()) {
            Some(id) => id,
            None => last.ok_or_else(terminated)?,
        }
    } else if last_terminated.is_some() {
        last.ok_or_else(terminated)?
    } else if let Some(w) = &state.waiting {
        let why = match w.reason.as_deref().unwrap_or_default() {
            "ErrImagePull" => "image can't be pulled".to_string(),
            "ImagePullBackOff" => "trying and failing to pull image".to_string(),
            other => other.to_string(),
        };
        return Err(format!(
            "container {container:?} in pod {pod_name:?} is waiting to start: {why}"
        ));
    } else {
        return Err(format!(
            "container {container:?} in pod {pod_name:?} is waiting to start - no logs yet"
        ));
    };
    // "containerd://<id>": the runtime's own ID.
    Ok(id
        .split_once("://")
        .map_or(id.as_str(), |(_, id)| id)
        .to_string())
}

/// The log file of instance `id`, from the runtime.
async fn find_instance(
    s: &ServerState,
    id: String,
    pod_name: &str,
    container: &str,
) -> Result<Instance, String> {
    let st = s
        .runtime
        .container_status(&id)
        .await
        .map_err(|e| e.to_string())?;
    if st.log_path.is_empty() {
        return Err(format!(
            "container {container:?} in pod {pod_name:?} has no log file"
        ));
    }
    Ok(Instance {
        id,
        log_path: PathBuf::from(st.log_path),
    })
}

/// How often a followed log is checked for new data and rotation.
const FOLLOW_POLL: Duration = Duration::from_millis(200);
/// How often a followed container is asked whether it still runs.
const RUNNING_CHECK: Duration = Duration::from_secs(1);
/// A line longer than this is cut (bounded memory for hostile logs).
const MAX_LINE: usize = 1 << 20;

/// Reads, filters and sends the log; ends when the client goes, the
/// limit is reached, or (follow) the container stopped and the file is
/// drained. File reads happen on the blocking pool.
async fn stream_log(
    inst: Instance,
    opts: LogOptions,
    runtime: std::sync::Arc<dyn crate::cri::RuntimeService>,
    tx: mpsc::Sender<Bytes>,
) {
    let mut out = Emitter {
        opts: &opts,
        budget: opts.limit_bytes.map(|n| n as u64),
        in_line: false,
        format: None,
        tx: &tx,
    };
    // Tail first: the last N lines, read from the end.
    let path = inst.log_path.clone();
    let tail = opts.tail_lines;
    let start = tokio::task::spawn_blocking(move || start_offset(&path, tail)).await;
    let Ok(Ok((mut reader, mut ino, to_end))) = start else {
        let _ = tx
            .send(Bytes::from(format!(
                "failed to open log file {:?}\n",
                inst.log_path
            )))
            .await;
        return;
    };
    let mut partial: Vec<u8> = Vec::new();
    // None: the first end of the file asks at once (upstream's waitLogs
    // checks at its first EOF), so following a stopped container ends
    // without waiting out a check period.
    let mut last_check: Option<tokio::time::Instant> = None;
    // Without follow, the log as it was when the request came: lines
    // appended meanwhile are not part of the answer (tailLines is exact).
    let mut left: Option<u64> = (!opts.follow).then_some(to_end);
    loop {
        // Read what is there now.
        let cap = left.map_or(64 * 1024, |l| l.min(64 * 1024) as usize);
        let r = tokio::task::spawn_blocking(move || {
            let mut buf = vec![0u8; cap];
            let n = reader.read(&mut buf).map(|n| {
                buf.truncate(n);
                buf
            });
            (reader, n)
        })
        .await;
        let Ok((r, chunk)) = r else { return };
        reader = r;
        let chunk = match chunk {
            Ok(c) => c,
            Err(_) => return,
        };
        if let Some(l) = &mut left {
            *l -= (chunk.len() as u64).min(*l);
        }
        if !chunk.is_empty() {
            partial.extend_from_slice(&chunk);
            while let Some(nl) = partial.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = partial.drain(..=nl).collect();
                if !out.emit(&line[..line.len() - 1], true).await {
                    return;
                }
            }
            if partial.len() > MAX_LINE {
                let line = std::mem::take(&mut partial);
                if !out.emit(&line, true).await {
                    return;
                }
            }
            continue;
        }
        if !opts.follow {
            // A last line the runtime has not ended is passed on as it
            // is, as upstream's ReadLogs does; with tailLines it is not
            // one of the lines counted, so it is left out.
            if !partial.is_empty() && opts.tail_lines.is_none() {
                out.emit(&partial, false).await;
            }
            return;
        }
        // At the end: a rotated file means reopening the path; a stopped
        // container with nothing more to read means the end.
        let path = inst.log_path.clone();
        let moved =
            tokio::task::spawn_blocking(move || std::fs::metadata(&path).map(|m| m.ino()).ok())
                .await
                .ok()
                .flatten();
        if let Some(new_ino) = moved.filter(|i| *i != ino) {
            let path = inst.log_path.clone();
            if let Ok(Ok(f)) = tokio::task::spawn_blocking(move || std::fs::File::open(&path)).await
            {
                reader = f;
                ino = new_ino;
                continue;
            }
        }
        if last_check.is_none_or(|t| t.elapsed() >= RUNNING_CHECK) {
            last_check = Some(tokio::time::Instant::now());
            let running = runtime
                .container_status(&inst.id)
                .await
                .map(|st| st.state == crate::cri::ContainerState::ContainerRunning as i32)
                .unwrap_or(false);
            if !running {
                // One more read catches what was written before it stopped.
                let r = tokio::task::spawn_blocking(move || {
                    let mut rest = Vec::new();
                    let _ = reader.read_to_end(&mut rest);
                    rest
                })
                .await
                .unwrap_or_default();
                partial.extend_from_slice(&r);
                // Whole lines only: upstream's follow ends at the last
                // newline once the container has stopped.
                let ended = partial
                    .iter()
                    .rposition(|b| *b == b'\n')
                    .map_or(0, |i| i + 1);
                for line in partial[..ended]
                    .split(|b| *b == b'\n')
                    .filter(|l| !l.is_empty())
                {
                    if !out.emit(line, true).await {
                        return;
                    }
                }
                return;
            }
        }
        if tx.is_closed() {
            return;
        }
        tokio::time::sleep(FOLLOW_POLL).await;
    }
}

/// Opens the log and seeks to where `tail` lines before the end start;
/// also returns the inode and the bytes from there to the current end.
fn start_offset(
    path: &std::path::Path,
    tail: Option<i64>,
) -> std::io::Result<(std::fs::File, u64, u64)> {
    let mut f = std::fs::File::open(path)?;
    let ino = f.metadata()?.ino();
    let len = f.metadata()?.len();
    let Some(n) = tail else {
        return Ok((f, ino, len));
    };
    // Read backwards in blocks until n+1 newlines are seen (the last line
    // ends with one), keeping memory to one block.
    let mut pos = len;
    let mut newlines = 0i64;
    let mut block = vec![0u8; 64 * 1024];
    let mut start = 0;
    'outer: while pos > 0 {
        let size = block.len().min(pos as usize);
        pos -= size as u64;
        f.seek(SeekFrom::Start(pos))?;
        f.read_exact(&mut block[..size])?;
        for i in (0..size).rev() {
            if block[i] == b'\n' {
                newlines += 1;
                if newlines > n {
                    start = pos + i as u64 + 1;
                    break 'outer;
                }
            }
        }
    }
    f.seek(SeekFrom::Start(start))?;
    Ok((f, ino, len - start))
}

/// Formats log lines as upstream's log writer does and sends them: the
/// timestamp prefix (RFC3339NanoFixed) only at the start of a line,
/// fragments joined, `limitBytes` cut exactly (the prefix counts), lines
/// of the other stream neither sent nor counted.
struct Emitter<'a> {
    opts: &'a LogOptions,
    budget: Option<u64>,
    in_line: bool,
    /// The file's format, told by its first line.
    format: Option<cri_format::Format>,
    tx: &'a mpsc::Sender<Bytes>,
}

impl Emitter<'_> {
    /// Sends one line read from the file (without its newline);
    /// `terminated` is false for a last line the runtime has not ended
    /// yet, which upstream passes on without a newline. False when the
    /// client left, the byte limit was reached, or the file is in no
    /// format upstream reads.
    async fn emit(&mut self, raw: &[u8], terminated: bool) -> bool {
        let format = match self.format {
            Some(f) => f,
            None => match cri_format::Format::detect(raw) {
                Some(f) => *self.format.insert(f),
                None => {
                    // Upstream's ReadLogs fails here, after the 200: its
                    // error ends the body.
                    let msg = format!(
                        "failed to get parse function: unsupported log format: {:?}",
                        String::from_utf8_lossy(raw)
                    );
                    let _ = self.tx.send(Bytes::from(msg)).await;
                    return false;
                }
            },
        };
        let Some(line) = format.parse(raw) else {
            return true;
        };
        if self.opts.stream.is_some_and(|s| s != line.stream) {
            return true;
        }
        if let (Some(since), Some(ts)) = (self.opts.since, line.timestamp) {
            if ts < since {
                return true;
            }
        }
        let mut out = Vec::with_capacity(line.content.len() + 40);
        if self.opts.timestamps && !self.in_line && line.timestamp.is_some() {
            out.extend_from_slice(line.fixed_time().as_bytes());
            out.push(b' ');
        }
        out.extend_from_slice(&line.content);
        let ended = terminated && !line.partial;
        if ended {
            out.push(b'\n');
        }
        self.in_line = !ended;
        if let Some(left) = &mut self.budget {
            if *left == 0 {
                return false;
            }
            if (out.len() as u64) > *left {
                out.truncate(*left as usize);
            }
            *left -= out.len() as u64;
        }
        self.tx.send(Bytes::from(out)).await.is_ok() && self.budget.is_none_or(|b| b > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> k8s_openapi::jiff::Timestamp {
        "2026-11-23T10:00:00Z".parse().unwrap()
    }

    #[test]
    fn options_are_validated_as_upstream() {
        let parse = |q: &str| parse_options(q, now(), false);
        let o = parse("follow=true&tailLines=5&timestamps=1&limitBytes=10").unwrap();
        assert!(o.follow && o.timestamps && !o.previous);
        assert_eq!((o.tail_lines, o.limit_bytes), (Some(5), Some(10)));
        let o = parse("sinceSeconds=60").unwrap();
        assert_eq!(o.since, Some("2026-11-23T09:59:00Z".parse().unwrap()));
        let o = parse("sinceTime=2026-11-23T09%3A00%3A00Z").unwrap();
        assert_eq!(o.since, Some("2026-11-23T09:00:00Z".parse().unwrap()));
        // Go's query booleans: only 0 and false (any case) are false.
        let o = parse("follow=maybe&previous=&timestamps=FALSE").unwrap();
        assert!(o.follow && o.previous && !o.timestamps);
        assert!(!parse("follow=0").unwrap().follow);
        // The first of a repeated key counts.
        assert_eq!(
            parse("tailLines=1&tailLines=2").unwrap().tail_lines,
            Some(1)
        );
        assert!(parse("follow=false&follow=true")
            .map(|o| !o.follow)
            .unwrap());
        // The legacy tail overrides tailLines; `all` removes it.
        assert_eq!(parse("tailLines=1&tail=7").unwrap().tail_lines, Some(7));
        assert_eq!(parse("tailLines=1&tail=all").unwrap().tail_lines, None);
        for (bad, why) in [
            ("tailLines=x", "decode"),
            ("tailLines=", "decode"),
            ("sinceTime=yesterday", "decode"),
            ("tailLines=-1", "invalid"),
            ("limitBytes=0", "invalid"),
            ("sinceSeconds=0", "invalid"),
            ("sinceSeconds=5&sinceTime=2026-11-23T09:00:00Z", "invalid"),
            ("sinceSeconds=5&sinceTime=", "invalid"),
            ("stream=Both", "invalid"),
            ("stream=Stdout&tailLines=1", "invalid"),
        ] {
            let got = match parse(bad) {
                Err(OptionsError::Decode(_)) => "decode",
                Err(OptionsError::Invalid(_)) => "invalid",
                other => panic!("{bad}: {other:?}"),
            };
            assert_eq!(got, why, "{bad}");
        }
        // A single stream needs PodLogsQuerySplitStreams.
        assert_eq!(
            parse("stream=Stderr"),
            Err(OptionsError::StreamsNotSplit("Stderr".into()))
        );
        assert_eq!(parse("stream=All").unwrap().stream, None);
        let split = parse_options("stream=Stderr", now(), true).unwrap();
        assert_eq!(split.stream, Some(cri_format::Stream::Stderr));
        assert_eq!(
            parse_options("tailLines=2", now(), true).unwrap().stream,
            None
        );
    }

    /// Upstream's statuses and bodies: 400 for what does not decode, 422
    /// for what does not validate (they were all 400s, with the reason).
    #[test]
    fn refused_queries_answer_as_upstream() {
        let r = parse_options("tailLines=x", now(), false)
            .unwrap_err()
            .response();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        let r = parse_options("tailLines=-1", now(), false)
            .unwrap_err()
            .response();
        assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
        let r = parse_options("stream=Stdout", now(), false)
            .unwrap_err()
            .response();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    }

    /// The instance read is the one the pod's status names, as upstream's
    /// validateContainerLogStatus picks it. Before, `previous` took the
    /// second-newest runtime container: during a crash loop, the crash
    /// before the last one (or none after the first crash).
    #[test]
    fn the_instance_read_is_the_one_the_status_names() {
        let status = |cs: serde_json::Value| -> k8s_openapi::api::core::v1::PodStatus {
            serde_json::from_value(serde_json::json!({ "containerStatuses": [cs] })).unwrap()
        };
        let pick = |st: &k8s_openapi::api::core::v1::PodStatus, previous| {
            log_container_id("web", st, "app", previous)
        };
        // A crash loop: waiting to restart, the last crash's log.
        let looping = status(serde_json::json!({
            "name": "app", "image": "i", "imageID": "", "ready": false, "restartCount": 3,
            "containerID": "containerd://c3",
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 1, "containerID": "containerd://c3"}},
        }));
        assert_eq!(pick(&looping, false).unwrap(), "c3");
        assert_eq!(pick(&looping, true).unwrap(), "c3");
        // Running after one crash: now and the one before.
        let running = status(serde_json::json!({
            "name": "app", "image": "i", "imageID": "", "ready": true, "restartCount": 1,
            "containerID": "containerd://c2",
            "state": {"running": {}},
            "lastState": {"terminated": {"exitCode": 1, "containerID": "containerd://c1"}},
        }));
        assert_eq!(pick(&running, false).unwrap(), "c2");
        assert_eq!(pick(&running, true).unwrap(), "c1");
        // Never terminated: no previous.
        let fresh = status(serde_json::json!({
            "name": "app", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
            "containerID": "containerd://c1", "state": {"running": {}},
        }));
        let e = pick(&fresh, true).unwrap_err();
        assert_eq!(
            e,
            r#"previous terminated container "app" in pod "web" not found"#
        );
        // Waiting: why, in upstream's words.
        let pulling = status(serde_json::json!({
            "name": "app", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ImagePullBackOff"}},
        }));
        assert_eq!(
            pick(&pulling, false).unwrap_err(),
            r#"container "app" in pod "web" is waiting to start: trying and failing to pull image"#
        );
        let creating = status(serde_json::json!({
            "name": "app", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ContainerCreating"}},
        }));
        assert!(pick(&creating, false)
            .unwrap_err()
            .ends_with("is waiting to start: ContainerCreating"));
        // Terminated for good (restartPolicy Never): its own log.
        let done = status(serde_json::json!({
            "name": "app", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 0, "containerID": "containerd://c9"}},
        }));
        assert_eq!(pick(&done, false).unwrap(), "c9");
        // No status for it yet.
        assert_eq!(
            log_container_id("web", &Default::default(), "app", false).unwrap_err(),
            r#"container "app" in pod "web" is not available"#
        );
    }

    fn log_file(lines: &[&str]) -> (tempfile_path::TempPath, PathBuf) {
        let dir = tempfile_path::TempPath::new();
        let p = dir.0.join("0.log");
        std::fs::write(
            &p,
            lines.iter().map(|l| format!("{l}\n")).collect::<String>(),
        )
        .unwrap();
        (dir, p)
    }

    mod tempfile_path {
        pub struct TempPath(pub std::path::PathBuf);
        impl TempPath {
            pub fn new() -> Self {
                let p = std::env::temp_dir().join(format!(
                    "rkubelet-logs-test-{}-{}",
                    std::process::id(),
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap()
                        .as_nanos()
                ));
                std::fs::create_dir_all(&p).unwrap();
                TempPath(p)
            }
        }
        impl Drop for TempPath {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    /// Following a container that is not running ends at the first end of
    /// its file; it waited out a 1 s check period before.
    #[tokio::test(start_paused = true)]
    async fn following_a_stopped_container_ends_at_once() {
        let (_d, p) = log_file(&["2026-11-23T09:00:00.000000001Z stdout F one"]);
        let t0 = tokio::time::Instant::now();
        let all = collect(
            p,
            LogOptions {
                follow: true,
                ..Default::default()
            },
        )
        .await;
        assert_eq!(all, "one\n");
        assert!(t0.elapsed() < FOLLOW_POLL, "{:?}", t0.elapsed());
    }

    async fn collect(path: PathBuf, opts: LogOptions) -> String {
        let fake = std::sync::Arc::new(crate::cri::fake::FakeRuntime::new());
        let (tx, mut rx) = mpsc::channel(16);
        stream_log(
            Instance {
                id: "none".into(),
                log_path: path,
            },
            opts,
            fake,
            tx,
        )
        .await;
        let mut out = Vec::new();
        while let Some(b) = rx.recv().await {
            out.extend_from_slice(&b);
        }
        String::from_utf8(out).unwrap()
    }

    #[tokio::test]
    async fn tail_since_limit_and_timestamps_as_upstream() {
        let (_d, p) = log_file(&[
            "2026-11-23T09:00:00.000000001Z stdout F one",
            "2026-11-23T09:00:01.000000000Z stderr P tw",
            "2026-11-23T09:00:01.100000000Z stderr F o",
            "2026-11-23T09:00:02.000000000Z stdout F three",
        ]);
        let all = collect(p.clone(), LogOptions::default()).await;
        assert_eq!(all, "one\ntwo\nthree\n");
        let tail = collect(
            p.clone(),
            LogOptions {
                tail_lines: Some(1),
                ..Default::default()
            },
        )
        .await;
        assert_eq!(tail, "three\n");
        let since = collect(
            p.clone(),
            LogOptions {
                since: Some("2026-11-23T09:00:01.5Z".parse().unwrap()),
                ..Default::default()
            },
        )
        .await;
        assert_eq!(since, "three\n");
        let ts = collect(
            p.clone(),
            LogOptions {
                timestamps: true,
                tail_lines: Some(1),
                ..Default::default()
            },
        )
        .await;
        // RFC3339NanoFixed: nine fraction digits, zeros kept.
        assert_eq!(ts, "2026-11-23T09:00:02.000000000Z three\n");
        let limited = collect(
            p,
            LogOptions {
                limit_bytes: Some(6),
                ..Default::default()
            },
        )
        .await;
        assert_eq!(limited, "one\ntw");
    }

    /// A last line the runtime has not ended is passed on without a
    /// newline, unless tailLines counts lines or the container stopped
    /// while followed (upstream's ReadLogs); it was dropped before.
    #[tokio::test]
    async fn an_unended_last_line_is_passed_on_as_upstream() {
        let (_d, p) = log_file(&["2026-11-23T09:00:00.000000001Z stdout F one"]);
        let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        std::io::Write::write_all(&mut f, b"2026-11-23T09:00:01Z stdout F tw").unwrap();
        assert_eq!(collect(p.clone(), LogOptions::default()).await, "one\ntw");
        let tail = LogOptions {
            tail_lines: Some(1),
            ..Default::default()
        };
        assert_eq!(collect(p.clone(), tail).await, "one\n");
        let follow = LogOptions {
            follow: true,
            ..Default::default()
        };
        assert_eq!(collect(p, follow).await, "one\n");
    }

    /// `stream` keeps one stream's lines (the gate on).
    #[tokio::test]
    async fn one_stream_only() {
        let (_d, p) = log_file(&[
            "2026-11-23T09:00:00Z stdout F out",
            "2026-11-23T09:00:01Z stderr F err",
        ]);
        let only = |stream| LogOptions {
            stream: Some(stream),
            limit_bytes: Some(100),
            ..Default::default()
        };
        assert_eq!(
            collect(p.clone(), only(cri_format::Stream::Stderr)).await,
            "err\n"
        );
        assert_eq!(collect(p, only(cri_format::Stream::Stdout)).await, "out\n");
    }

    /// Docker json-file logs are read too; a file in neither format ends
    /// the answer with upstream's error.
    #[tokio::test]
    async fn docker_json_logs_and_unknown_formats() {
        let (_d, p) = log_file(&[
            r#"{"log":"a","stream":"stdout","time":"2026-11-23T09:00:00Z"}"#,
            r#"{"log":"b\n","stream":"stdout","time":"2026-11-23T09:00:00.5Z"}"#,
            r#"{"log":"c\n","stream":"stderr","time":"2026-11-23T09:00:01Z"}"#,
        ]);
        let ts = LogOptions {
            timestamps: true,
            ..Default::default()
        };
        assert_eq!(
            collect(p, ts).await,
            "2026-11-23T09:00:00.000000000Z ab\n2026-11-23T09:00:01.000000000Z c\n"
        );
        let (_d, p) = log_file(&["not a log line", "2026-11-23T09:00:00Z stdout F x"]);
        assert_eq!(
            collect(p, LogOptions::default()).await,
            r#"failed to get parse function: unsupported log format: "not a log line""#
        );
    }
}
