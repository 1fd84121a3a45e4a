//! Config honesty: every `KubeletConfiguration` field and flag rkubelet
//! accepts but does not act on yet is named once at start, so nothing a
//! user sets is silently ignored. Fields are compared with their defaults:
//! only what the user set (in the file or by a flag) is reported.

use super::flags::KubeletFlags;
use super::KubeletConfiguration;

/// Fields parsed, defaulted and validated, but not acted on yet (their
/// serialized names). Keep in step with README's list.
/// Not listed though upstream 1.34's kubelet reads them: `hairpinMode`,
/// `iptablesMasqueradeBit` and `iptablesDropBit` are only validated there
/// too (with a CRI runtime the network plugin does hairpinning, and
/// kube-proxy owns the masquerade and drop marks).
pub const UNIMPLEMENTED_FIELDS: &[&str] = &[
    "imagePullCredentialsVerificationPolicy",
    "preloadedImagesVerificationAllowlist",
    "enableContentionProfiling",
    "cgroupsPerQOS",
    "memoryManagerPolicy",
    "topologyManagerPolicy",
    "topologyManagerScope",
    "topologyManagerPolicyOptions",
    "qosReserved",
    "runOnce",
    "contentType",
    "volumePluginDir",
    "kernelMemcgNotification",
    "logging",
    "enableSystemLogQuery",
    "shutdownGracePeriod",
    "shutdownGracePeriodCriticalPods",
    "shutdownGracePeriodByPodPriority",
    "reservedMemory",
    "enableProfilingHandler",
    "memoryThrottlingFactor",
    "tracing",
    "userNamespaces",
];

const HEADER: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

/// What rkubelet runs with when the user sets nothing: the v1beta1 file
/// defaults with a config file, the internal defaults without one.
pub fn baseline(with_file: bool) -> KubeletConfiguration {
    if with_file {
        if let Ok((c, _)) = KubeletConfiguration::load_str(HEADER) {
            return c;
        }
    }
    KubeletConfiguration::default()
}

/// One warning line per accepted-but-ignored setting the user made:
/// fields that differ from `baseline`, and local flags that were given.
pub fn unimplemented_settings(
    cfg: &KubeletConfiguration,
    baseline: &KubeletConfiguration,
    flags: &KubeletFlags,
) -> Vec<String> {
    let mut set = serde_json::to_value(cfg).unwrap_or_default();
    let mut default = serde_json::to_value(baseline).unwrap_or_default();
    // `logging.verbosity` and `logging.format` are acted on
    // (`crate::logging`); the rest of `logging` is not.
    for v in [&mut set, &mut default] {
        if let Some(l) = v.get_mut("logging").and_then(|l| l.as_object_mut()) {
            l.remove("verbosity");
            l.remove("format");
        }
    }
    let mut out: Vec<String> = UNIMPLEMENTED_FIELDS
        .iter()
        .filter(|f| set.get(**f) != default.get(**f))
        .map(|f| format!("field {f} is accepted but not implemented"))
        .collect();
    out.extend(
        super::features::unfollowed(&cfg.feature_gates)
            .into_iter()
            .map(|g| format!("feature gate {g} is accepted but not implemented")),
    );
    let mut flag = |set: bool, name: &str, what: &str| {
        if set {
            out.push(format!(
                "flag --{name} is accepted but not implemented: {what}"
            ));
        }
    };
    flag(flags.cloud_provider.is_some(), "cloud-provider", "ignored");
    flag(
        flags.experimental_mounter_path.is_some(),
        "experimental-mounter-path",
        "volumes are mounted without a mounter binary",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_settings_the_user_made_are_reported() {
        let base = baseline(true);
        let (cfg, _) = KubeletConfiguration::load_str(&format!(
            "{HEADER}memoryThrottlingFactor: 0.8\nstaticPodPath: /etc/kubernetes/manifests\nenableServer: false\n"
        ))
        .unwrap();
        let mut flags = KubeletFlags::default();
        let w = unimplemented_settings(&cfg, &base, &flags);
        assert_eq!(
            w,
            vec!["field memoryThrottlingFactor is accepted but not implemented".to_string()]
        );
        let (gated, _) = KubeletConfiguration::load_str(&format!(
            "{HEADER}featureGates:\n  ImageVolume: true\n  PodCertificateRequest: true\n"
        ))
        .unwrap();
        assert_eq!(
            unimplemented_settings(&gated, &base, &flags),
            vec!["feature gate ImageVolume is accepted but not implemented".to_string()]
        );
        flags.cloud_provider = Some("external".into());
        let w = unimplemented_settings(&cfg, &base, &flags);
        assert!(w[1].starts_with("flag --cloud-provider is accepted but not implemented"));
        let w = unimplemented_settings(&base, &base, &KubeletFlags::default());
        assert!(w.is_empty(), "{w:?}");
    }

    #[test]
    fn the_deprecated_mounter_flag_is_reported_only_off_default() {
        let base = baseline(false);
        let parse = |args: &[&str]| {
            super::super::flags::parse_args(args.iter().map(|s| s.to_string())).unwrap()
        };
        // Upstream's defaults, given explicitly, are not reported.
        let flags = parse(&[
            "--maximum-dead-containers=-1",
            "--maximum-dead-containers-per-container=1",
            "--minimum-container-ttl-duration=0s",
            "--experimental-mounter-path=",
            "--experimental-allocatable-ignore-eviction",
        ]);
        assert!(unimplemented_settings(&base, &base, &flags).is_empty());
        let flags = parse(&[
            "--maximum-dead-containers=10",
            "--maximum-dead-containers-per-container=2",
            "--minimum-container-ttl-duration=1m",
            "--experimental-mounter-path=/bin/mount",
        ]);
        let w = unimplemented_settings(&base, &base, &flags);
        let names: Vec<&str> = w
            .iter()
            .map(|l| l.split_whitespace().nth(1).unwrap())
            .collect();
        // The container GC flags are followed (kuberuntime::gc).
        assert_eq!(names, ["--experimental-mounter-path"]);
    }

    #[test]
    fn every_listed_field_is_a_real_field() {
        // Setting each listed field to something must not be an unknown
        // field (load_str warns about those).
        for f in UNIMPLEMENTED_FIELDS {
            let (_, warnings) =
                KubeletConfiguration::load_str(&format!("{HEADER}{f}: null\n")).unwrap();
            assert!(
                !warnings.iter().any(|w| w.contains("unknown")),
                "{f}: {warnings:?}"
            );
        }
    }
}
