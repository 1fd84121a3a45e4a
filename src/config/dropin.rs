//! `--config-dir`: drop-in KubeletConfiguration files merged over the loaded
//! configuration, as upstream's `mergeKubeletConfigurations`
//! (`cmd/kubelet/app/server.go`): the configuration is written out as v1beta1
//! JSON, each `*.conf` file found by `filepath.WalkDir` (lexical order,
//! subdirectories included) is applied to it as an RFC 7386 JSON merge patch,
//! and the result is decoded and defaulted again. So maps merge per key, a
//! `null` deletes a key, and lists replace.

use std::path::Path;

use serde_json::{Map, Value};

use super::{
    detect_format, Format, KubeletConfiguration, RawKubeletConfiguration, API_VERSION, KIND,
};

/// Upstream's messages, so scripts matching the Go kubelet's output still match.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DropInError {
    #[error("failed to walk through kubelet dropin directory {dir:?}: {cause}")]
    Walk { dir: String, cause: WalkError },
    #[error("failed to unmarshal merged JSON into kubelet configuration: {0}")]
    Decode(String),
}

/// What stopped the walk: a directory that cannot be read, or a drop-in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WalkError {
    /// Go's `fs.PathError` text, e.g. `lstat /etc/x: no such file or directory`.
    #[error("{op} {path}: {reason}")]
    Io {
        op: &'static str,
        path: String,
        reason: String,
    },
    #[error("failed to load kubelet dropin file, path: {path}, error: {reason}")]
    Load { path: String, reason: String },
    #[error("failed to load kubelet dropin file, path: {path}, unknown apiVersion/kind: {gvk}")]
    UnknownKind { path: String, gvk: String },
}

/// Merges the drop-ins of `dir` into `cfg`. Returns warnings naming unknown
/// fields (upstream decodes the merged JSON leniently and says nothing).
pub fn merge_drop_ins(
    cfg: &mut KubeletConfiguration,
    dir: &Path,
) -> Result<Vec<String>, DropInError> {
    let mut merged = serde_json::to_value(&*cfg).map_err(|e| DropInError::Decode(e.to_string()))?;
    walk_dir(dir, &mut |file| {
        let patch = load_drop_in(file)?;
        merge_patch(&mut merged, patch);
        Ok(())
    })
    .map_err(|cause| DropInError::Walk {
        dir: dir.display().to_string(),
        cause,
    })?;
    let raw: RawKubeletConfiguration =
        serde_json::from_value(merged).map_err(|e| DropInError::Decode(e.to_string()))?;
    let warnings = raw.unknown_fields();
    // SetDefaults_KubeletConfiguration only: loadConfigFile's evictionHard
    // defaulting is not run again (the base already carries it).
    let mut out = raw.apply_defaults();
    // Command-line-only settings, never serialized (KubeletFlags upstream).
    out.image_credential_provider_config =
        std::mem::take(&mut cfg.image_credential_provider_config);
    out.image_credential_provider_bin_dir =
        std::mem::take(&mut cfg.image_credential_provider_bin_dir);
    *cfg = out;
    Ok(warnings)
}

/// Go's `filepath.WalkDir` calling back for every non-directory whose
/// `filepath.Ext` is `.conf`: entries sorted by name, symlinks not followed
/// (not even a symlinked root), the first error ends the walk.
fn walk_dir(
    root: &Path,
    visit: &mut dyn FnMut(&Path) -> Result<(), WalkError>,
) -> Result<(), WalkError> {
    let meta = std::fs::symlink_metadata(root).map_err(|e| path_error("lstat", root, &e))?;
    walk(root, meta.is_dir(), visit)
}

fn walk(
    path: &Path,
    is_dir: bool,
    visit: &mut dyn FnMut(&Path) -> Result<(), WalkError>,
) -> Result<(), WalkError> {
    if !is_dir {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default();
        if name.rfind('.').is_some_and(|i| &name[i..] == ".conf") {
            visit(path)?;
        }
        return Ok(());
    }
    let read = |e: std::io::Error| path_error("open", path, &e);
    let mut entries = Vec::new();
    for entry in std::fs::read_dir(path).map_err(read)? {
        let entry = entry.map_err(read)?;
        let is_dir = entry.file_type().map_err(read)?.is_dir();
        entries.push((entry.file_name(), is_dir));
    }
    // os.ReadDir sorts by name, byte-wise.
    entries.sort_by(|a, b| a.0.as_encoded_bytes().cmp(b.0.as_encoded_bytes()));
    for (name, is_dir) in entries {
        walk(&path.join(name), is_dir, visit)?;
    }
    Ok(())
}

/// Go's errno text: lowercase, no "(os error N)".
fn errno_text(e: &std::io::Error) -> String {
    let text = e.to_string();
    let text = match text.find(" (os error ") {
        Some(i) => &text[..i],
        None => &text,
    };
    let mut chars = text.chars();
    match chars.next() {
        Some(c) => c.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

fn path_error(op: &'static str, path: &Path, e: &std::io::Error) -> WalkError {
    WalkError::Io {
        op,
        path: path.display().to_string(),
        reason: errno_text(e),
    }
}

/// Upstream's `LoadIntoJSON` plus the type check in `mergeKubeletConfigurations`:
/// the document as JSON, decoded without a schema (no defaults, no relative
/// path resolution, unknown fields kept).
fn load_drop_in(path: &Path) -> Result<Value, WalkError> {
    let shown = path.display().to_string();
    let load = |reason: String| WalkError::Load {
        path: shown.clone(),
        reason,
    };
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let abs = abs.display();
    let bytes = std::fs::read(path).map_err(|e| {
        load(format!(
            "failed to read drop-in kubelet config file \"{abs}\", error: open {abs}: {}",
            errno_text(&e)
        ))
    })?;
    if bytes.is_empty() {
        return Err(load(format!("kubelet config file \"{abs}\" was empty")));
    }
    let text = String::from_utf8_lossy(&bytes);
    let value: Value = match detect_format(&text) {
        Format::Json => serde_json::from_str(&text).map_err(|e| e.to_string()),
        Format::Yaml => crate::yaml::from_str(&text).map_err(|e| e.to_string()),
    }
    .map_err(load)?;
    let missing_kind = || load(format!("Object 'Kind' is missing in '{text}'"));
    let Value::Object(map) = &value else {
        return Err(missing_kind());
    };
    let field = |k: &str| map.get(k).and_then(Value::as_str).unwrap_or("");
    let (kind, api_version) = (field("kind"), field("apiVersion"));
    // Unstructured.GroupVersionKind: an apiVersion with more than one '/'
    // does not parse, which leaves no kind either.
    if kind.is_empty() || api_version.matches('/').count() > 1 {
        return Err(missing_kind());
    }
    if (api_version, kind) != (API_VERSION, KIND) {
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        return Err(WalkError::UnknownKind {
            path: shown,
            gvk: format!("{group}/{version}, Kind={kind}"),
        });
    }
    Ok(value)
}

/// RFC 7386 merge patch as gopkg.in/evanphx/json-patch.v4's `MergePatch`:
/// objects merge key by key, `null` deletes, anything else replaces; a value
/// that lands where there was none or a non-object has its object nulls pruned.
fn merge_patch(doc: &mut Value, patch: Value) {
    let Value::Object(patch) = patch else {
        *doc = patch;
        return;
    };
    let Value::Object(doc) = doc else {
        let mut patch = Value::Object(patch);
        prune_nulls(&mut patch);
        *doc = patch;
        return;
    };
    merge_docs(doc, patch);
}

fn merge_docs(doc: &mut Map<String, Value>, patch: Map<String, Value>) {
    for (k, v) in patch {
        if v.is_null() {
            doc.remove(&k);
            continue;
        }
        match doc.get_mut(&k) {
            Some(cur) if !cur.is_null() => merge_patch(cur, v),
            _ => {
                let mut v = v;
                prune_nulls(&mut v);
                doc.insert(k, v);
            }
        }
    }
}

/// json-patch's pruneNulls: drops null members of objects at any depth
/// (through arrays too); nulls that are array elements stay.
fn prune_nulls(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|_, v| !v.is_null());
            m.values_mut().for_each(prune_nulls);
        }
        Value::Array(a) => a.iter_mut().for_each(prune_nulls),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::flags::parse_args;
    use crate::config::GoDuration;
    use std::path::PathBuf;

    const HEADER: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> TempDir {
            let dir =
                std::env::temp_dir().join(format!("rkubelet-dropin-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }

        fn write(&self, name: &str, text: &str) -> &Self {
            let path = self.0.join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
            self
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn file_config(body: &str) -> KubeletConfiguration {
        KubeletConfiguration::load_str(&format!("{HEADER}{body}"))
            .unwrap()
            .0
    }

    fn merged(mut cfg: KubeletConfiguration, dir: &TempDir) -> KubeletConfiguration {
        let warnings = merge_drop_ins(&mut cfg, &dir.0).unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        cfg
    }

    #[test]
    fn an_empty_dir_changes_nothing() {
        let dir = TempDir::new("empty");
        for cfg in [
            KubeletConfiguration::file_defaults(),
            KubeletConfiguration::default(),
            file_config(
                "maxPods: 20\nevictionHard:\n  memory.available: 1Gi\nfeatureGates:\n  KubeletPSI: true\n\
                 readOnlyPort: 10255\nreservedMemory:\n- numaNode: 0\n  limits:\n    memory: 1Gi\n\
                 staticPodURLHeader:\n  a: [x, y]\nlogging:\n  flushFrequency: 7s\n  verbosity: 3\n",
            ),
        ] {
            assert_eq!(merged(cfg.clone(), &dir), cfg);
        }
        // Non-file settings carried on the configuration survive the round trip.
        let cfg = KubeletConfiguration {
            image_credential_provider_config: "/etc/kubernetes/cp.yaml".into(),
            ..Default::default()
        };
        assert_eq!(merged(cfg.clone(), &dir), cfg);
    }

    #[test]
    fn drop_ins_apply_in_lexical_order_as_merge_patches() {
        let dir = TempDir::new("order");
        dir.write(
            "20-b.conf",
            &format!("{HEADER}maxPods: 30\nevictionHard:\n  memory.available: 300Mi\n  nodefs.available: null\nclusterDNS: [10.0.0.2]\n"),
        )
        .write(
            "10-a.conf",
            &format!("{HEADER}maxPods: 10\nsyncFrequency: 10s\nevictionHard:\n  memory.available: 200Mi\nclusterDNS: [10.0.0.1, 10.0.0.3]\n"),
        )
        // Subdirectories are walked too, in place: 15 sorts between 10 and 20.
        .write("15/x.conf", &format!("{HEADER}maxPods: 15\nport: 11250\n"))
        // Other names are not drop-ins.
        .write("30.yaml", "not even yaml: [")
        .write("40.conf.bak", "not even yaml: [");
        let cfg = merged(file_config("maxPods: 50\nclusterDNS: [10.96.0.10]\n"), &dir);
        assert_eq!(cfg.max_pods, 30);
        assert_eq!(cfg.port, 11250);
        assert_eq!(cfg.sync_frequency, GoDuration::from_secs(10));
        // Maps merge per key (the file's defaults stay), null deletes, lists replace.
        assert_eq!(cfg.eviction_hard["memory.available"], "300Mi");
        assert_eq!(cfg.eviction_hard["imagefs.available"], "15%");
        assert!(!cfg.eviction_hard.contains_key("nodefs.available"));
        assert_eq!(cfg.cluster_dns, ["10.0.0.2"]);
    }

    #[test]
    fn merged_fields_are_defaulted_again_and_flags_still_win() {
        let dir = TempDir::new("defaults");
        // An explicit zero is defaulted after the merge, as SetDefaults does.
        dir.write(
            "10.conf",
            &format!("{HEADER}syncFrequency: 0s\nmaxPods: 7\nstaticPodPath: manifests\nfeatureGates:\n  KubeletPSI: true\n"),
        );
        let flags =
            parse_args(["--max-pods=9", "--feature-gates=ImageVolume=true"].map(String::from))
                .unwrap();
        let mut cfg = merged(
            file_config("featureGates:\n  PodCertificateRequest: true\n"),
            &dir,
        );
        flags.apply(&mut cfg);
        assert_eq!(cfg.sync_frequency, GoDuration::from_mins(1));
        assert_eq!(cfg.max_pods, 9);
        // Drop-in paths are not resolved (LoadIntoJSON does not).
        assert_eq!(cfg.static_pod_path, "manifests");
        let gates: Vec<_> = cfg.feature_gates.keys().map(String::as_str).collect();
        assert_eq!(
            gates,
            ["ImageVolume", "KubeletPSI", "PodCertificateRequest"]
        );
        // Without --config the drop-ins go over the legacy command-line defaults.
        let cfg = merged(KubeletConfiguration::default(), &dir);
        assert_eq!(cfg.read_only_port, 10255);
        assert!(cfg.authentication.anonymous.enabled);
        assert!(cfg.eviction_hard.is_empty());
        assert_eq!(cfg.max_pods, 7);
    }

    #[test]
    fn bad_drop_ins_fail_with_upstreams_messages() {
        let err = |dir: &TempDir| {
            merge_drop_ins(&mut KubeletConfiguration::default(), &dir.0)
                .unwrap_err()
                .to_string()
        };
        let dir = TempDir::new("bad");
        let d = dir.0.display().to_string();
        dir.write("10.conf", "");
        assert_eq!(
            err(&dir),
            format!("failed to walk through kubelet dropin directory \"{d}\": failed to load kubelet dropin file, path: {d}/10.conf, error: kubelet config file \"{d}/10.conf\" was empty")
        );
        dir.write("10.conf", "maxPods: 5\n");
        assert!(
            err(&dir).ends_with(&format!(
                "path: {d}/10.conf, error: Object 'Kind' is missing in 'maxPods: 5\n'"
            )),
            "{}",
            err(&dir)
        );
        dir.write(
            "10.conf",
            "apiVersion: kubelet.config.k8s.io/v1\nkind: KubeletConfiguration\n",
        );
        assert!(err(&dir).ends_with(&format!(
            "path: {d}/10.conf, unknown apiVersion/kind: kubelet.config.k8s.io/v1, Kind=KubeletConfiguration"
        )));
        dir.write("10.conf", "kind: KubeletConfiguration\n");
        assert!(err(&dir).ends_with("unknown apiVersion/kind: /, Kind=KubeletConfiguration"));
        // Types are checked when the merged document is decoded.
        dir.write("10.conf", &format!("{HEADER}maxPods: many\n"));
        assert!(
            err(&dir).starts_with("failed to unmarshal merged JSON into kubelet configuration: ")
        );

        let missing = dir.0.join("nope");
        let e = merge_drop_ins(&mut KubeletConfiguration::default(), &missing).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("failed to walk through kubelet dropin directory \"{d}/nope\": lstat {d}/nope: no such file or directory")
        );
    }

    #[test]
    fn merge_patch_follows_json_patch_v4() {
        let j = |s: &str| serde_json::from_str::<Value>(s).unwrap();
        let mut doc = j(r#"{"a":{"b":1,"c":2},"l":[1,2],"s":"x","n":{"k":1}}"#);
        merge_patch(
            &mut doc,
            j(
                r#"{"a":{"b":null,"d":3},"l":[3],"s":{"x":null,"y":1},"n":null,"new":{"p":null,"q":[{"r":null},null]}}"#,
            ),
        );
        assert_eq!(
            doc,
            j(r#"{"a":{"c":2,"d":3},"l":[3],"s":{"y":1},"new":{"q":[{},null]}}"#)
        );
    }
}
