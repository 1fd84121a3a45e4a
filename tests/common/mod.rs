//! Helpers for the real-containerd integration tests: start the rkubelet
//! binary against the machine's containerd, read `/pods`, poll with a
//! deadline, and clean up every pod a test made. Tests that use containerd
//! take a global lock, because a kubelet owns every CRI pod on its node and
//! two of them at once would clean up each other's pods as orphans.

#![allow(dead_code)]

pub mod apiserver;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rkubelet::cri::client::RemoteRuntime;
use rkubelet::cri::RuntimeService;
use serde_json::Value;

pub const ENDPOINT: &str = "unix:///run/containerd/containerd.sock";
pub const BUSYBOX: &str = "docker.io/library/busybox:1.36";

static CONTAINERD_LOCK: Mutex<()> = Mutex::new(());

/// Polls `f` every 100 ms until it returns Some or the deadline passes.
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A loopback port nothing listens on now, for a server to bind.
///
/// Never the same port twice in one test process: the probe's listener is
/// closed at once, so the kernel may hand its port out again to the next
/// probe (two servers of one kubelet once got one port, and the second
/// failed with "Address already in use").
pub fn free_port() -> u16 {
    static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut handed = HANDED_OUT.lock().unwrap();
        if !handed.contains(&port) {
            handed.push(port);
            return port;
        }
    }
}

/// A blocking HTTP/1.1 GET against 127.0.0.1; returns (status, body).
pub fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr.parse().ok()?, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).ok()?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Some((status, body))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// A CRI client on the machine's containerd, with its own tokio runtime.
pub struct Cri {
    pub rt: tokio::runtime::Runtime,
    pub client: RemoteRuntime,
}

impl Cri {
    pub fn new() -> Self {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = rt.block_on(async {
            RemoteRuntime::connect_lazy(ENDPOINT, Duration::from_secs(10)).unwrap()
        });
        let v = rt.block_on(client.version());
        assert!(
            v.is_ok(),
            "containerd must be running at {ENDPOINT} (run scripts/setup.sh as root): {v:?}"
        );
        Cri { rt, client }
    }

    /// Removes every sandbox and container whose pod name ends in `-<node>`.
    pub fn remove_pods_of_node(&self, node: &str) {
        let suffix = format!("-{node}");
        self.rt.block_on(async {
            for c in self.client.list_containers(None).await.unwrap_or_default() {
                if c.labels
                    .get("io.kubernetes.pod.name")
                    .is_some_and(|n| n.ends_with(&suffix))
                {
                    let _ = self.client.stop_container(&c.id, 0).await;
                    let _ = self.client.remove_container(&c.id).await;
                }
            }
            for s in self.client.list_pod_sandbox(None).await.unwrap_or_default() {
                if s.labels
                    .get("io.kubernetes.pod.name")
                    .is_some_and(|n| n.ends_with(&suffix))
                {
                    let _ = self.client.stop_pod_sandbox(&s.id).await;
                    let _ = self.client.remove_pod_sandbox(&s.id).await;
                }
            }
        });
    }

    /// Stops the sandboxes of a pod UID, as a dead pause process or a lost
    /// network would leave them.
    pub fn stop_sandboxes_of(&self, uid: &str) {
        self.rt.block_on(async {
            for s in self.client.list_pod_sandbox(None).await.unwrap() {
                if s.labels
                    .get("io.kubernetes.pod.uid")
                    .is_some_and(|u| u == uid)
                {
                    self.client.stop_pod_sandbox(&s.id).await.unwrap();
                }
            }
        });
    }

    /// Stops a container at once, as a crash or an OOM kill would.
    pub fn kill(&self, id: &str) {
        self.rt.block_on(self.client.stop_container(id, 0)).unwrap();
    }

    /// (sandbox count, container count) the runtime has for a pod UID.
    pub fn count_for_uid(&self, uid: &str) -> (usize, usize) {
        self.count_labelled("io.kubernetes.pod.uid", uid, false)
    }

    /// (sandboxes, containers) whose label `key` is `value`; with `live`,
    /// only ready sandboxes and running containers.
    pub fn count_labelled(&self, key: &str, value: &str, live: bool) -> (usize, usize) {
        self.rt.block_on(async {
            let has = |l: &std::collections::HashMap<String, String>| {
                l.get(key).is_some_and(|v| v == value)
            };
            let s = self
                .client
                .list_pod_sandbox(None)
                .await
                .unwrap()
                .iter()
                .filter(|s| has(&s.labels) && (!live || s.state == 0))
                .count();
            let c = self
                .client
                .list_containers(None)
                .await
                .unwrap()
                .iter()
                .filter(|c| has(&c.labels) && (!live || c.state == 1))
                .count();
            (s, c)
        })
    }
}

/// One rkubelet process with its own manifest dir, root dir and ports.
pub struct Kubelet {
    pub node: String,
    pub dir: PathBuf,
    pub manifests: PathBuf,
    pub read_only: String,
    pub healthz: String,
    /// The authenticated port (:10250 upstream), TLS.
    pub api: String,
    /// Appended to the KubeletConfiguration on the next `spawn`.
    pub extra_config: String,
    /// Added to the command line on the next `spawn`.
    pub extra_args: Vec<String>,
    child: Option<Child>,
    pub cri: Cri,
    _lock: MutexGuard<'static, ()>,
}

impl Kubelet {
    /// Starts rkubelet as node `node` (pod names end in `-<node>`).
    pub fn start(node: &str) -> Self {
        let mut k = Self::new(node);
        k.spawn();
        k
    }

    /// As `start`, without starting the process: set `extra_config` and
    /// `extra_args`, then `spawn`.
    pub fn new(node: &str) -> Self {
        let lock = CONTAINERD_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let cri = Cri::new();
        cri.remove_pods_of_node(node);
        let dir = std::env::temp_dir().join(format!("rkubelet-it-{node}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let manifests = dir.join("manifests");
        std::fs::create_dir_all(&manifests).unwrap();
        Kubelet {
            node: node.into(),
            read_only: format!("127.0.0.1:{}", free_port()),
            healthz: format!("127.0.0.1:{}", free_port()),
            api: format!("127.0.0.1:{}", free_port()),
            dir,
            manifests,
            extra_config: String::new(),
            extra_args: Vec::new(),
            child: None,
            cri,
            _lock: lock,
        }
    }

    pub fn spawn(&mut self) {
        self.launch();
        let hz = self.healthz.clone();
        wait_for("rkubelet /healthz ok", Duration::from_secs(30), || {
            http_get(&hz, "/healthz")
                .filter(|(s, _)| *s == 200)
                .map(|_| ())
        });
    }

    /// Starts the process without waiting for /healthz (for tests of a
    /// kubelet that starts unhealthy).
    pub fn launch(&mut self) {
        let ro_port = self.read_only.rsplit(':').next().unwrap();
        let hz_port = self.healthz.rsplit(':').next().unwrap();
        let api_port = self.api.rsplit(':').next().unwrap();
        let config = self.dir.join("config.yaml");
        // Without an API server, :10250 needs authentication and
        // authorization that do not call one (upstream refuses to start
        // otherwise); tests that set their own keep theirs.
        let mut auth = String::new();
        if !self.extra_config.contains("authentication:") {
            auth.push_str("authentication:\n  anonymous:\n    enabled: true\n  webhook:\n    enabled: false\n");
        }
        if !self.extra_config.contains("authorization:") {
            auth.push_str("authorization:\n  mode: AlwaysAllow\n");
        }
        // The file's default disk thresholds (imagefs.available<15%...)
        // would turn on DiskPressure, which refuses every pod, whenever the
        // test machine's disk is that full: tests keep the memory one only.
        if !self.extra_config.contains("evictionHard:") {
            auth.push_str("evictionHard:\n  memory.available: 100Mi\n");
        }
        // Nor may image garbage collection take the shared test images
        // from other tests when that disk is over 85% full.
        if !self.extra_config.contains("imageGCHighThresholdPercent:") {
            auth.push_str("imageGCHighThresholdPercent: 100\n");
        }
        std::fs::write(
            &config,
            format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nstaticPodPath: {}\nfileCheckFrequency: 5s\nreadOnlyPort: {ro_port}\naddress: 127.0.0.1\nport: {api_port}\nhealthzPort: {hz_port}\nfailSwapOn: false\ncontainerRuntimeEndpoint: {ENDPOINT}\n{auth}{}",
                self.manifests.display(),
                self.extra_config
            ),
        )
        .unwrap();
        let mut args = self.extra_args.clone();
        if !args.iter().any(|a| a.starts_with("--cert-dir")) {
            args.push(format!("--cert-dir={}", self.dir.join("pki").display()));
        }
        let log = std::fs::File::create(self.dir.join("rkubelet.log")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_rkubelet"))
            .arg("--config")
            .arg(&config)
            .arg("--root-dir")
            .arg(self.dir.join("root"))
            .arg("--hostname-override")
            .arg(&self.node)
            // Unless the test sets the config file's verbosity, which the
            // flag would override.
            .args((!self.extra_config.contains("verbosity:")).then_some("--v=2"))
            .args(&args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start rkubelet");
        self.child = Some(child);
    }

    /// Stops the process (SIGTERM) and waits for it; pods keep running.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(c.id().to_string())
                .status();
            let deadline = Instant::now() + Duration::from_secs(15);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The running process's pid.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    pub fn write_manifest(&self, file: &str, yaml: &str) {
        // Write then rename, as editors and config tools do, so the source
        // never reads half a file.
        let tmp = self.dir.join(format!(".{file}.tmp"));
        std::fs::write(&tmp, yaml).unwrap();
        std::fs::rename(&tmp, self.manifests.join(file)).unwrap();
    }

    pub fn remove_manifest(&self, file: &str) {
        std::fs::remove_file(self.manifests.join(file)).unwrap();
    }

    pub fn pods(&self) -> Vec<Value> {
        let Some((200, body)) = http_get(&self.read_only, "/pods") else {
            return vec![];
        };
        let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        v["items"].as_array().cloned().unwrap_or_default()
    }

    /// The pod named `<name>-<node>` as listed on /pods.
    pub fn pod(&self, name: &str) -> Option<Value> {
        let full = format!("{name}-{}", self.node);
        self.pods()
            .into_iter()
            .find(|p| p["metadata"]["name"] == full.as_str())
    }

    /// Waits until `pred` holds for the pod, returning it.
    pub fn wait_pod(
        &self,
        name: &str,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        wait_for(&format!("pod {name}: {what}"), timeout, || {
            self.pod(name).filter(|p| pred(p))
        })
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("rkubelet.log")).unwrap_or_default()
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!("---- rkubelet log ({}) ----\n{}", self.node, self.log());
        }
        self.cri.remove_pods_of_node(&self.node);
        // The killed kubelet's volume mounts (tmpfs, subPath binds) would
        // stay on the host, and remove_dir_all would empty them in place.
        rkubelet::volume::subpath::detach_all_below(&self.dir);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn phase(p: &Value) -> &str {
    p["status"]["phase"].as_str().unwrap_or("")
}

pub fn container_status<'a>(p: &'a Value, name: &str) -> Option<&'a Value> {
    p["status"]["containerStatuses"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == name)
}

/// The runtime's ID of a container status (its containerID without the
/// `containerd://` scheme).
pub fn runtime_id(status: &Value) -> String {
    status["containerID"]
        .as_str()
        .unwrap()
        .trim_start_matches("containerd://")
        .to_string()
}

pub fn init_status<'a>(p: &'a Value, name: &str) -> Option<&'a Value> {
    p["status"]["initContainerStatuses"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == name)
}

pub fn running(p: &Value, name: &str) -> bool {
    container_status(p, name).is_some_and(|c| c["state"]["running"].is_object())
}

/// A one-container busybox pod manifest.
pub fn simple_pod(name: &str, command: &str, restart_policy: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  restartPolicy: {restart_policy}\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: main\n    image: {BUSYBOX}\n    command: [\"sh\", \"-c\", {command:?}]\n"
    )
}

pub fn path_exists(p: &Path) -> bool {
    p.exists()
}

/// Runs `sh -c cmd` in the container through CRI ExecSync: stdout, trimmed.
pub fn sh(k: &Kubelet, id: &str, cmd: &str) -> String {
    let r = k
        .cri
        .rt
        .block_on(
            k.cri
                .client
                .exec_sync(id, vec!["sh".into(), "-c".into(), cmd.into()], 10),
        )
        .unwrap();
    String::from_utf8_lossy(&r.stdout).trim().to_string()
}

/// A loop device on a backing file, detached when dropped (also when the
/// test fails; a device still bound is detached by the kernel once free).
pub struct LoopDevice(pub String);

impl LoopDevice {
    pub fn new(backing: &Path) -> LoopDevice {
        let out = std::process::Command::new("losetup")
            .args(["-f", "--show"])
            .arg(backing)
            .output()
            .expect("losetup");
        assert!(out.status.success(), "losetup: {out:?}");
        LoopDevice(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup")
            .args(["-d", &self.0])
            .status();
    }
}

/// Mount points of this process's view whose path contains `part`.
pub fn mounts_containing(part: &str) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| p.contains(part))
        .map(str::to_string)
        .collect()
}

/// A 16 MiB disk image at `backing` whose first bytes are `HOST-WROTE-IT`,
/// behind a loop device (the raw block tests' device).
pub fn marked_loop_disk(backing: &Path) -> LoopDevice {
    let mut disk = vec![0u8; 16 << 20];
    disk[..13].copy_from_slice(b"HOST-WROTE-IT");
    std::fs::write(backing, &disk).unwrap();
    LoopDevice::new(backing)
}

/// A pod on `node` whose container gets claim `claim` (volume `disk`) as
/// the device `/dev/xvda`.
pub fn block_pod(name: &str, node: &str, claim: &str) -> Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node, "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "disk", "persistentVolumeClaim": {"claimName": claim}}],
            "containers": [{
                "name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "exec sleep 3600"],
                "volumeDevices": [{"name": "disk", "devicePath": "/dev/xvda"}]
            }]
        }
    })
}

/// Pod `uid`'s entry for volume `volume` in `/stats/summary`, once there
/// (within `timeout`).
pub fn summary_volume(k: &Kubelet, uid: &str, volume: &str, timeout: Duration) -> Value {
    wait_for(
        &format!("volume {volume} in /stats/summary"),
        timeout,
        || {
            let (code, body) = http_get(&k.read_only, "/stats/summary")?;
            if code != 200 {
                return None;
            }
            let s: Value = serde_json::from_str(&body).ok()?;
            s["pods"]
                .as_array()?
                .iter()
                .find(|p| p["podRef"]["uid"] == uid)?["volume"]
                .as_array()?
                .iter()
                .find(|v| v["name"] == volume)
                .cloned()
        },
    )
}

/// In container `id` of a [`block_pod`] on a [`marked_loop_disk`]:
/// `/dev/xvda` is a block device with the host's mark, and what the
/// container writes at 4096 reaches `backing` (the loop device writes
/// through to its file).
pub fn device_is_shared_with_the_host(k: &Kubelet, id: &str, backing: &Path, timeout: Duration) {
    assert_eq!(sh(k, id, "test -b /dev/xvda && echo block"), "block");
    assert_eq!(
        sh(k, id, "dd if=/dev/xvda bs=13 count=1 2>/dev/null"),
        "HOST-WROTE-IT"
    );
    sh(
        k,
        id,
        "printf CONTAINER-WROTE-IT | dd of=/dev/xvda bs=4096 seek=1 conv=notrunc,fsync 2>/dev/null; sync",
    );
    wait_for("the container's write in the backing file", timeout, || {
        let got = std::fs::read(backing).unwrap();
        (&got[4096..4096 + 18] == b"CONTAINER-WROTE-IT").then_some(())
    });
}
