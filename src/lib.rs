//! rkubelet: the Kubernetes node agent (kubelet) rebuilt in Rust. Modules
//! mirror the upstream kubelet's parts; see docs/architecture.md.

pub mod allocation;
pub mod apiclient;
pub mod blocking;
pub mod certificate;
pub mod cm;
pub mod config;
pub mod cri;
pub mod events;
pub mod eviction;
pub mod images;
pub mod kubelet;
pub mod kuberuntime;
pub mod lifecycle;
pub mod lockfile;
pub mod logging;
pub mod logs;
pub mod memtrim;
pub mod metrics;
pub mod nodestatus;
pub mod objects;
pub mod pleg;
pub mod pod;
pub mod podworkers;
pub mod prober;
pub mod runtimestate;
pub mod sdnotify;
pub mod server;
pub mod source;
pub mod stats;
pub mod status;
pub mod syncloop;
#[cfg(test)]
mod testutil;
pub mod volume;
pub mod yaml;
