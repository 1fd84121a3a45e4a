//! Volumes (upstream `pkg/volume`, `pkg/kubelet/volumemanager`): the
//! manager (`manager.rs`) sets them up under the pod's directory, and
//! `container_mounts` hands them to CRI as bind mounts with readOnly,
//! subPath and mountPropagation.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::cri::v1::{Mount, MountPropagation};

pub mod atomic_writer;
pub mod block;
pub mod csi;
pub(crate) mod locks;
pub mod manager;
pub mod ownership;
pub mod payload;
pub mod subpath;

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("volume {volume}: {path}: {source}")]
    Io {
        volume: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("volume {volume}: hostPath type check failed: {path} is not a {kind}")]
    HostPathType {
        volume: String,
        path: PathBuf,
        kind: String,
    },
    #[error("{message}{}", if errors.is_empty() { String::new() } else { format!(" ({errors})") })]
    Timeout { message: String, errors: String },
    #[error("volume {volume}: this volume type is not supported yet")]
    Unsupported { volume: String },
    #[error("error DevicePath `{0}` must be an absolute path")]
    DevicePathNotAbsolute(String),
    /// Upstream's makeBlockVolumes message.
    #[error("cannot find volume {volume:?} to pass into container {container:?}")]
    NoBlockVolume { container: String, volume: String },
    #[error("container {container}: volumeMount {volume:?} names no volume of the pod")]
    UnknownVolume { container: String, volume: String },
    /// Upstream ExpandContainerVolumeMounts' message, as is.
    #[error("{0}")]
    SubPathExpr(String),
    /// Upstream translateMountPropagation's message.
    #[error("invalid MountPropagation mode: {0:?}")]
    MountPropagation(String),
    #[error("container {container}: {source}")]
    SubPath {
        container: String,
        #[source]
        source: subpath::SubPathError,
    },
}

/// `<root>/pods/<uid>`: where everything rkubelet keeps for a pod lives.
pub fn pod_dir(root: &Path, uid: &str) -> PathBuf {
    root.join("pods").join(uid)
}

fn io_err(volume: &str, path: &Path) -> impl FnOnce(std::io::Error) -> VolumeError {
    let (volume, path) = (volume.to_string(), path.to_path_buf());
    move |source| VolumeError::Io {
        volume,
        path,
        source,
    }
}

pub(crate) fn check_host_path(volume: &str, p: &Path, kind: &str) -> Result<(), VolumeError> {
    let meta = std::fs::metadata(p);
    let bad = |k: &str| VolumeError::HostPathType {
        volume: volume.into(),
        path: p.into(),
        kind: k.into(),
    };
    use std::os::unix::fs::FileTypeExt;
    match kind {
        "" => Ok(()),
        "DirectoryOrCreate" => {
            if meta.is_err() {
                std::fs::create_dir_all(p).map_err(io_err(volume, p))?;
                std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755))
                    .map_err(io_err(volume, p))?;
                return Ok(());
            }
            meta.ok()
                .filter(|m| m.is_dir())
                .map(drop)
                .ok_or_else(|| bad("directory"))
        }
        "FileOrCreate" => {
            if meta.is_err() {
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .map_err(io_err(volume, p))?;
                return Ok(());
            }
            meta.ok()
                .filter(|m| m.is_file())
                .map(drop)
                .ok_or_else(|| bad("file"))
        }
        "Directory" => meta
            .ok()
            .filter(|m| m.is_dir())
            .map(drop)
            .ok_or_else(|| bad("directory")),
        "File" => meta
            .ok()
            .filter(|m| m.is_file())
            .map(drop)
            .ok_or_else(|| bad("file")),
        "Socket" => meta
            .ok()
            .filter(|m| m.file_type().is_socket())
            .map(drop)
            .ok_or_else(|| bad("socket")),
        "CharDevice" => meta
            .ok()
            .filter(|m| m.file_type().is_char_device())
            .map(drop)
            .ok_or_else(|| bad("character device")),
        "BlockDevice" => meta
            .ok()
            .filter(|m| m.file_type().is_block_device())
            .map(drop)
            .ok_or_else(|| bad("block device")),
        other => Err(bad(other)),
    }
}

/// `<pod dir>/volume-subpaths`: where subPath binds are mounted.
pub fn subpaths_dir(root: &Path, uid: &str) -> PathBuf {
    pod_dir(root, uid).join("volume-subpaths")
}

/// The pod's volume `name` in its spec.
pub fn pod_volume<'a>(pod: &'a Pod, name: &str) -> Option<&'a k8s_openapi::api::core::v1::Volume> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .find(|v| v.name == name)
}

/// Whether the pod's volume `name` is mounted read-only whatever its
/// volumeMount says: upstream makeMounts ORs the mount's readOnly with the
/// plugin's `GetAttributes().ReadOnly` (pkg/kubelet/kubelet_pods.go),
/// always true for configMap, secret, downwardAPI and projected
/// (pkg/volume/configmap, ...), the claim's or source's readOnly for
/// hostPath, local and CSI (pkg/volume/hostpath, local, csi).
fn must_mount_ro(pod: &Pod, name: &str) -> bool {
    let Some(v) = pod_volume(pod, name) else {
        return false;
    };
    v.config_map.is_some()
        || v.secret.is_some()
        || v.downward_api.is_some()
        || v.projected.is_some()
        || v.persistent_volume_claim.as_ref().and_then(|c| c.read_only) == Some(true)
        || v.csi.as_ref().and_then(|c| c.read_only) == Some(true)
}

/// CRI mounts for a container's volumeMounts, honouring readOnly, subPath
/// and subPathExpr (expanded by `expand` from the container's env; its
/// error is upstream's message). A subPath is resolved inside its volume
/// and bind-mounted under `subpaths` (see `subpath`); one that leaves the
/// volume is an error.
pub fn container_mounts(
    pod: &Pod,
    c: &Container,
    volumes: &HashMap<String, PathBuf>,
    subpaths: &Path,
    expand: &dyn Fn(&str) -> Result<String, String>,
) -> Result<Vec<Mount>, VolumeError> {
    let mut mounts = Vec::new();
    for (i, vm) in c.volume_mounts.iter().flatten().enumerate() {
        let base = volumes
            .get(&vm.name)
            .ok_or_else(|| VolumeError::UnknownVolume {
                container: c.name.clone(),
                volume: vm.name.clone(),
            })?;
        let sub = match (vm.sub_path.as_deref(), vm.sub_path_expr.as_deref()) {
            (Some(s), _) if !s.is_empty() => Some(s.to_string()),
            (_, Some(e)) if !e.is_empty() => Some(expand(e).map_err(VolumeError::SubPathExpr)?),
            _ => None,
        };
        let host = match sub {
            Some(sub) => {
                let target = subpaths.join(&vm.name).join(&c.name).join(i.to_string());
                subpath::bind_subpath(base, &sub, &target).map_err(|source| {
                    VolumeError::SubPath {
                        container: c.name.clone(),
                        source,
                    }
                })?
            }
            None => base.clone(),
        };
        // Upstream translateMountPropagation (pkg/kubelet/kubelet_pods.go).
        let propagation = match vm.mount_propagation.as_deref() {
            None | Some("None") => MountPropagation::PropagationPrivate,
            Some("HostToContainer") => MountPropagation::PropagationHostToContainer,
            Some("Bidirectional") => MountPropagation::PropagationBidirectional,
            Some(other) => return Err(VolumeError::MountPropagation(other.into())),
        };
        mounts.push(Mount {
            container_path: vm.mount_path.clone(),
            host_path: host.to_string_lossy().into_owned(),
            readonly: vm.read_only.unwrap_or(false) || must_mount_ro(pod, &vm.name),
            propagation: propagation as i32,
            ..Default::default()
        });
    }
    Ok(mounts)
}

/// The container's `volumeDevices` as CRI devices (upstream's
/// makeBlockVolumes): the host path is the pod's device link of the mapped
/// block volume, permissions `mrw`, or `r` for a read-only claim. A name
/// that is not a mapped block volume of the pod fails with upstream's
/// message; a link not (yet) there is left out, as upstream. Blocking (an
/// lstat).
pub fn container_devices(
    root: &Path,
    pod: &k8s_openapi::api::core::v1::Pod,
    c: &Container,
    volumes: &HashMap<String, PathBuf>,
) -> Result<Vec<crate::cri::v1::Device>, VolumeError> {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let mut out = Vec::new();
    for d in c.volume_devices.iter().flatten() {
        if !d.device_path.starts_with('/') {
            return Err(VolumeError::DevicePathNotAbsolute(d.device_path.clone()));
        }
        let link = volumes
            .get(&d.name)
            .filter(|p| block::is_pod_device_path(root, uid, p))
            .ok_or_else(|| VolumeError::NoBlockVolume {
                container: c.name.clone(),
                volume: d.name.clone(),
            })?;
        let is_link = std::fs::symlink_metadata(link).is_ok_and(|m| m.file_type().is_symlink());
        if !is_link {
            continue;
        }
        let read_only = pod
            .spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .find(|v| v.name == d.name)
            .and_then(|v| v.persistent_volume_claim.as_ref())
            .and_then(|p| p.read_only)
            .unwrap_or(false);
        out.push(crate::cri::v1::Device {
            container_path: d.device_path.clone(),
            host_path: link.to_string_lossy().into_owned(),
            permissions: if read_only { "r" } else { "mrw" }.into(),
        });
    }
    Ok(out)
}

/// Removes the pod's directory once its containers are gone: subPath binds
/// are unmounted first, symlinks are never followed, mounts never entered.
/// A CSI volume directory still there means its driver has not
/// unpublished: the directory stays (its mount is the driver's to undo).
pub fn cleanup_pod_dir(root: &Path, uid: &str) -> Result<(), subpath::SubPathError> {
    let csi = pod_dir(root, uid)
        .join("volumes")
        .join(csi::PLUGIN_NAME.replace('/', "~"));
    if std::fs::read_dir(&csi).is_ok_and(|mut d| d.next().is_some()) {
        return Err(subpath::SubPathError::MountedInside { path: csi });
    }
    subpath::remove_tree(&pod_dir(root, uid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_devices_become_cri_devices_on_the_pods_links() {
        use k8s_openapi::api::core::v1::{
            PersistentVolumeClaimVolumeSource, Pod, PodSpec, Volume, VolumeDevice,
        };
        let root = std::env::temp_dir().join(format!("rkubelet-devs-{}", std::process::id()));
        let dir = block::pod_device_map_dir(&root, "u1");
        std::fs::create_dir_all(&dir).unwrap();
        for pv in ["pv-rw", "pv-ro"] {
            std::os::unix::fs::symlink("/dev/null", dir.join(pv)).unwrap();
        }
        let claim = |name: &str, ro| Volume {
            name: name.into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: name.into(),
                read_only: ro,
            }),
            ..Default::default()
        };
        let mut pod = Pod {
            spec: Some(PodSpec {
                volumes: Some(vec![
                    claim("rw", None),
                    claim("ro", Some(true)),
                    claim("fs", None),
                ]),
                ..Default::default()
            }),
            ..Default::default()
        };
        pod.metadata.uid = Some("u1".into());
        let volumes: HashMap<String, PathBuf> = [
            ("rw".to_string(), dir.join("pv-rw")),
            ("ro".to_string(), dir.join("pv-ro")),
            // A file-system volume: its directory, not a device link.
            ("fs".to_string(), root.join("pods/u1/volumes/x/fs")),
        ]
        .into();
        let dev = |name: &str, path: &str| VolumeDevice {
            name: name.into(),
            device_path: path.into(),
        };
        let c = |devs: Vec<VolumeDevice>| Container {
            name: "c".into(),
            volume_devices: Some(devs),
            ..Default::default()
        };
        let got = container_devices(
            &root,
            &pod,
            &c(vec![dev("rw", "/dev/xvda"), dev("ro", "/dev/xvdb")]),
            &volumes,
        )
        .unwrap();
        let got: Vec<_> = got
            .iter()
            .map(|d| {
                (
                    d.container_path.as_str(),
                    d.host_path.clone(),
                    d.permissions.as_str(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("/dev/xvda", dir.join("pv-rw").display().to_string(), "mrw"),
                ("/dev/xvdb", dir.join("pv-ro").display().to_string(), "r"),
            ]
        );
        // Upstream's messages: a relative path; a volume that is not a
        // mapped block volume, or none at all.
        let e = container_devices(&root, &pod, &c(vec![dev("rw", "xvda")]), &volumes).unwrap_err();
        assert_eq!(
            e.to_string(),
            "error DevicePath `xvda` must be an absolute path"
        );
        for name in ["fs", "nope"] {
            let e = container_devices(&root, &pod, &c(vec![dev(name, "/dev/x")]), &volumes)
                .unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("cannot find volume \"{name}\" to pass into container \"c\"")
            );
        }
        // A link not there (yet) is left out, as upstream's IsSymlinkExist.
        std::fs::remove_file(dir.join("pv-rw")).unwrap();
        let got = container_devices(&root, &pod, &c(vec![dev("rw", "/dev/xvda")]), &volumes);
        assert!(got.unwrap().is_empty());
        // Containers without volumeDevices get none.
        assert!(container_devices(&root, &pod, &c(vec![]), &volumes)
            .unwrap()
            .is_empty());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn host_path_types_succeed_and_fail_as_upstream() {
        use std::os::unix::fs::FileTypeExt;
        let d = std::env::temp_dir().join(format!("rkubelet-hpt-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let ok = |p: &Path, t: &str| check_host_path("v", p, t);
        // The *OrCreate types make what is missing: a 0755 directory, an
        // empty file.
        let made = d.join("made/deep");
        ok(&made, "DirectoryOrCreate").unwrap();
        assert!(made.is_dir());
        assert_eq!(
            std::fs::metadata(&made).unwrap().permissions().mode() & 0o777,
            0o755
        );
        let f = d.join("f");
        ok(&f, "FileOrCreate").unwrap();
        assert!(f.is_file());
        // Each type accepts its kind and refuses the others.
        ok(&made, "Directory").unwrap();
        ok(&f, "File").unwrap();
        ok(&f, "").unwrap();
        ok(&d.join("missing"), "").unwrap();
        assert!(matches!(
            ok(&f, "Directory"),
            Err(VolumeError::HostPathType { .. })
        ));
        assert!(matches!(
            ok(&made, "File"),
            Err(VolumeError::HostPathType { .. })
        ));
        assert!(ok(&f, "DirectoryOrCreate").is_err());
        assert!(ok(&made, "FileOrCreate").is_err());
        assert!(ok(&d.join("missing"), "Directory").is_err());
        let sock = d.join("s.sock");
        let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        ok(&sock, "Socket").unwrap();
        assert!(ok(&f, "Socket").is_err());
        ok(Path::new("/dev/null"), "CharDevice").unwrap();
        assert!(ok(&f, "CharDevice").is_err());
        assert!(ok(Path::new("/dev/null"), "BlockDevice").is_err());
        let block = std::fs::read_dir("/dev")
            .unwrap()
            .flatten()
            .find(|e| e.file_type().is_ok_and(|t| t.is_block_device()));
        if let Some(b) = block {
            ok(&b.path(), "BlockDevice").unwrap();
            assert!(ok(&b.path(), "CharDevice").is_err());
        }
        let e = ok(&f, "Fifo").unwrap_err().to_string();
        assert!(e.contains("Fifo"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }
    use k8s_openapi::api::core::v1::{
        EmptyDirVolumeSource, HostPathVolumeSource, Pod, PodSpec, Volume, VolumeMount,
    };

    #[tokio::test]
    async fn empty_dir_and_host_path_become_mounts_with_read_only_and_sub_path() {
        let root = std::env::temp_dir().join(format!("rkubelet-vol-{}", std::process::id()));
        let host = root.join("host");
        let pod = Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                uid: Some("u1".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                volumes: Some(vec![
                    Volume {
                        name: "scratch".into(),
                        empty_dir: Some(EmptyDirVolumeSource::default()),
                        ..Default::default()
                    },
                    Volume {
                        name: "h".into(),
                        host_path: Some(HostPathVolumeSource {
                            path: host.to_string_lossy().into(),
                            type_: Some("DirectoryOrCreate".into()),
                        }),
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let vm = manager::VolumeManager::new(
            Default::default(),
            crate::kuberuntime::RuntimeOptions {
                root_dir: root.clone(),
                ..Default::default()
            },
        );
        let vols = vm.wait_for_attach_and_mount(&pod).await.unwrap();
        assert!(vols["scratch"].is_dir() && host.is_dir());
        let c = Container {
            name: "a".into(),
            volume_mounts: Some(vec![
                VolumeMount {
                    name: "scratch".into(),
                    mount_path: "/data".into(),
                    sub_path: Some("x".into()),
                    ..Default::default()
                },
                VolumeMount {
                    name: "h".into(),
                    mount_path: "/h".into(),
                    read_only: Some(true),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        };
        let sp = subpaths_dir(&root, "u1");
        let m = container_mounts(&pod, &c, &vols, &sp, &|s| Ok(s.to_string())).unwrap();
        assert!(m[0].host_path.ends_with("volume-subpaths/scratch/a/0") && !m[0].readonly);
        assert!(vols["scratch"].join("x").is_dir());
        assert!(m[1].readonly);
        let bad = Container {
            name: "b".into(),
            volume_mounts: Some(vec![VolumeMount {
                name: "nope".into(),
                mount_path: "/n".into(),
                ..Default::default()
            }]),
            ..Default::default()
        };
        assert!(matches!(
            container_mounts(&pod, &bad, &vols, &sp, &|s| Ok(s.to_string())),
            Err(VolumeError::UnknownVolume { .. })
        ));
        vm.unmount_pod("u1", std::time::Duration::from_secs(5))
            .await
            .unwrap();
        assert!(!vols["scratch"].exists(), "the emptyDir is torn down");
        assert!(host.is_dir(), "a hostPath is the host's: left alone");
        cleanup_pod_dir(&root, "u1").unwrap();
        std::fs::remove_dir_all(&root).unwrap();
    }
    /// Upstream makeMounts: API-data volumes and read-only claims are
    /// mounted read-only whatever the volumeMount says, mountPropagation is
    /// translated (an unknown mode is an error), and a subPathExpr is
    /// expanded, its expander's error failing the container. The old code
    /// took readOnly from the volumeMount alone, made an unknown mode
    /// private and could not fail an expansion.
    #[test]
    fn api_data_volumes_are_read_only_propagation_is_translated_and_sub_path_expr_expanded() {
        use k8s_openapi::api::core::v1::{
            ConfigMapVolumeSource, PersistentVolumeClaimVolumeSource, ProjectedVolumeSource,
            SecretVolumeSource,
        };
        let root = std::env::temp_dir().join(format!("rkubelet-ro-{}", std::process::id()));
        let vol = |name: &str| Volume {
            name: name.into(),
            ..Default::default()
        };
        let claim = |name: &str, ro: Option<bool>| Volume {
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: name.into(),
                read_only: ro,
            }),
            ..vol(name)
        };
        let pod = super::manager::tests::pod(
            "u2",
            vec![
                Volume {
                    empty_dir: Some(EmptyDirVolumeSource::default()),
                    ..vol("scratch")
                },
                Volume {
                    config_map: Some(ConfigMapVolumeSource::default()),
                    ..vol("cfg")
                },
                Volume {
                    secret: Some(SecretVolumeSource::default()),
                    ..vol("sec")
                },
                Volume {
                    projected: Some(ProjectedVolumeSource::default()),
                    ..vol("proj")
                },
                claim("ro-claim", Some(true)),
                claim("rw-claim", None),
            ],
        );
        let names = ["scratch", "cfg", "sec", "proj", "ro-claim", "rw-claim"];
        let vols: HashMap<String, PathBuf> = names
            .iter()
            .map(|n| (n.to_string(), root.join("vols").join(n)))
            .collect();
        std::fs::create_dir_all(&vols["scratch"]).unwrap();
        let mount = |name: &str, propagation: Option<&str>| VolumeMount {
            name: name.into(),
            mount_path: format!("/{name}"),
            read_only: Some(false),
            mount_propagation: propagation.map(String::from),
            ..Default::default()
        };
        let with = |mounts: Vec<VolumeMount>| Container {
            name: "a".into(),
            volume_mounts: Some(mounts),
            ..Default::default()
        };
        let sp = subpaths_dir(&root, "u2");
        let ok = |s: &str| Ok(s.replace("$(N)", "n1"));
        let c = with(names.iter().map(|n| mount(n, None)).collect());
        let m = container_mounts(&pod, &c, &vols, &sp, &ok).unwrap();
        let ro: Vec<bool> = m.iter().map(|m| m.readonly).collect();
        assert_eq!(ro, [false, true, true, true, true, false]);

        let c = with(vec![
            mount("scratch", Some("None")),
            mount("scratch", Some("HostToContainer")),
            mount("scratch", Some("Bidirectional")),
        ]);
        let m = container_mounts(&pod, &c, &vols, &sp, &ok).unwrap();
        let p: Vec<i32> = m.iter().map(|m| m.propagation).collect();
        assert_eq!(
            p,
            [
                MountPropagation::PropagationPrivate as i32,
                MountPropagation::PropagationHostToContainer as i32,
                MountPropagation::PropagationBidirectional as i32,
            ]
        );
        let e = container_mounts(
            &pod,
            &with(vec![mount("scratch", Some("Sideways"))]),
            &vols,
            &sp,
            &ok,
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "invalid MountPropagation mode: \"Sideways\"");

        let expr = |e: &str| VolumeMount {
            sub_path_expr: Some(e.into()),
            ..mount("scratch", None)
        };
        let m = container_mounts(&pod, &with(vec![expr("d-$(N)")]), &vols, &sp, &ok).unwrap();
        assert!(
            m[0].host_path.ends_with("volume-subpaths/scratch/a/0"),
            "{m:?}"
        );
        assert!(
            vols["scratch"].join("d-n1").is_dir(),
            "the expanded subPath is made"
        );
        let failing = |_: &str| Err("missing value for N".to_string());
        let e =
            container_mounts(&pod, &with(vec![expr("d-$(N)")]), &vols, &sp, &failing).unwrap_err();
        assert_eq!(e.to_string(), "missing value for N");
        cleanup_pod_dir(&root, "u2").unwrap();
        std::fs::remove_dir_all(&root).unwrap();
    }
}
