//! What a registered CSI driver tells the cluster about this node (upstream
//! `pkg/volume/csi/nodeinfomanager`): the Node's
//! `csi.volume.kubernetes.io/nodeid` annotation and topology labels, and
//! the driver's entry in the node's `CSINode` object (node ID, topology
//! keys, volume limit). Standalone mode has no API: nothing to do.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, VolumeNodeResources};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, PostParams};

use super::{Driver, Registry};

/// The Node annotation mapping driver names to their node IDs.
pub const NODE_ID_ANNOTATION: &str = "csi.volume.kubernetes.io/nodeid";
/// Optimistic-concurrency retries of a Node or CSINode update.
const RETRIES: usize = 5;

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// Upstream InstallCSIDriver: the Node first, then the CSINode.
pub(crate) async fn install(registry: &Registry, name: &str, d: &Driver) -> Result<(), String> {
    let Some(client) = registry.api_client()? else {
        return Ok(());
    };
    let node = registry.node_name();
    let c = client.client().await;
    update_node(&Api::<Node>::all(c.clone()), &node, |n| {
        set_node_id(n, name, Some(&d.node_id))?;
        set_topology_labels(n, &d.topology)
    })
    .await
    .map_err(|e| format!("error updating Node object with CSI driver node info: {e}"))?;
    update_csinode(&c, &node, name, Some(driver_entry(name, d)))
        .await
        .map_err(|e| format!("error updating CSINode object with CSI driver node info: {e}"))
}

/// Upstream UninstallCSIDriver: the CSINode entry and the annotation go;
/// topology labels stay.
pub(crate) async fn uninstall(registry: &Registry, name: &str) -> Result<(), String> {
    let Some(client) = registry.api_client()? else {
        return Ok(());
    };
    let node = registry.node_name();
    let c = client.client().await;
    update_csinode(&c, &node, name, None)
        .await
        .map_err(|e| format!("error uninstalling CSI driver from CSINode object: {e}"))?;
    update_node(&Api::<Node>::all(c), &node, |n| set_node_id(n, name, None))
        .await
        .map_err(|e| format!("error removing CSI driver node info from Node object: {e}"))
}

/// The driver's CSINode entry: topology keys sorted, the volume limit only
/// when the driver reports one.
fn driver_entry(name: &str, d: &Driver) -> CSINodeDriver {
    CSINodeDriver {
        name: name.to_string(),
        node_id: d.node_id.clone(),
        topology_keys: Some(d.topology.keys().cloned().collect()),
        allocatable: (d.max_volumes > 0).then(|| VolumeNodeResources {
            count: Some(i32::try_from(d.max_volumes).unwrap_or(i32::MAX)),
        }),
    }
}

/// Sets (or with None removes) the driver's node ID in the annotation.
/// Returns whether the node changed.
fn set_node_id(n: &mut Node, driver: &str, id: Option<&str>) -> Result<bool, String> {
    let ann = n.metadata.annotations.get_or_insert_with(Default::default);
    let mut ids: BTreeMap<String, String> = match ann.get(NODE_ID_ANNOTATION) {
        Some(s) => serde_json::from_str(s)
            .map_err(|e| format!("failed to parse node annotation {NODE_ID_ANNOTATION:?}: {e}"))?,
        None => BTreeMap::new(),
    };
    let before = ids.clone();
    match id {
        Some(id) => {
            ids.insert(driver.to_string(), id.to_string());
        }
        None => {
            ids.remove(driver);
        }
    }
    if ids == before {
        return Ok(false);
    }
    if ids.is_empty() {
        ann.remove(NODE_ID_ANNOTATION);
    } else {
        ann.insert(
            NODE_ID_ANNOTATION.to_string(),
            serde_json::to_string(&ids).map_err(|e| e.to_string())?,
        );
    }
    Ok(true)
}

/// Adds the driver's topology as node labels; a label already there with
/// another value is upstream's collision error.
fn set_topology_labels(n: &mut Node, topology: &BTreeMap<String, String>) -> Result<bool, String> {
    let labels = n.metadata.labels.get_or_insert_with(Default::default);
    let mut changed = false;
    for (k, v) in topology {
        match labels.get(k) {
            Some(old) if old == v => {}
            Some(old) => {
                return Err(format!(
                    "detected topology value collision: driver reported {k:?}:{v:?} but existing label is {k:?}:{old:?}"
                ))
            }
            None => {
                labels.insert(k.clone(), v.clone());
                changed = true;
            }
        }
    }
    Ok(changed)
}

/// Get, change, update; again on a conflict.
async fn update_node(
    api: &Api<Node>,
    name: &str,
    change: impl Fn(&mut Node) -> Result<bool, String>,
) -> Result<(), String> {
    for _ in 0..RETRIES {
        let mut n = api.get(name).await.map_err(|e| e.to_string())?;
        if !change(&mut n)? {
            return Ok(());
        }
        match api.replace(name, &PostParams::default(), &n).await {
            Ok(_) => return Ok(()),
            Err(e) if is_conflict(&e) => continue,
            Err(e) => return Err(e.to_string()),
        }
    }
    Err(format!("node {name}: too many update conflicts"))
}

/// Puts `entry` in place of the driver's entry (None: removes it); the
/// CSINode is created, owned by the Node, when missing.
async fn update_csinode(
    c: &kube::Client,
    node: &str,
    driver: &str,
    entry: Option<CSINodeDriver>,
) -> Result<(), String> {
    let api = Api::<CSINode>::all(c.clone());
    for _ in 0..RETRIES {
        let Some(mut cn) = api.get_opt(node).await.map_err(|e| e.to_string())? else {
            let Some(entry) = entry.clone() else {
                return Ok(());
            };
            let n = Api::<Node>::all(c.clone())
                .get(node)
                .await
                .map_err(|e| e.to_string())?;
            let mut cn = CSINode {
                spec: CSINodeSpec {
                    drivers: vec![entry],
                },
                ..Default::default()
            };
            cn.metadata.name = Some(node.to_string());
            cn.metadata.owner_references = Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node.to_string(),
                uid: n.metadata.uid.unwrap_or_default(),
                ..Default::default()
            }]);
            match api.create(&PostParams::default(), &cn).await {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => return Err(e.to_string()),
            }
        };
        let old = cn.spec.drivers.iter().find(|d| d.name == driver).cloned();
        if old == entry {
            return Ok(());
        }
        cn.spec.drivers.retain(|d| d.name != driver);
        cn.spec.drivers.extend(entry.clone());
        match api.replace(node, &PostParams::default(), &cn).await {
            Ok(_) => return Ok(()),
            Err(e) if is_conflict(&e) => continue,
            Err(e) => return Err(e.to_string()),
        }
    }
    Err(format!("CSINode {node}: too many update conflicts"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_id_annotation_is_a_json_map_merged_per_driver() {
        let mut n = Node::default();
        assert!(set_node_id(&mut n, "b.csi", Some("n-b")).unwrap());
        assert!(set_node_id(&mut n, "a.csi", Some("n-a")).unwrap());
        assert!(!set_node_id(&mut n, "a.csi", Some("n-a")).unwrap());
        let ann = n.metadata.annotations.as_ref().unwrap();
        assert_eq!(ann[NODE_ID_ANNOTATION], r#"{"a.csi":"n-a","b.csi":"n-b"}"#);
        set_node_id(&mut n, "a.csi", None).unwrap();
        set_node_id(&mut n, "b.csi", None).unwrap();
        assert!(!n
            .metadata
            .annotations
            .unwrap()
            .contains_key(NODE_ID_ANNOTATION));
    }

    #[test]
    fn topology_labels_are_added_and_collisions_refused() {
        let mut n = Node::default();
        let t: BTreeMap<String, String> = [("zone".to_string(), "z1".to_string())].into();
        assert!(set_topology_labels(&mut n, &t).unwrap());
        assert!(!set_topology_labels(&mut n, &t).unwrap());
        let other: BTreeMap<String, String> = [("zone".to_string(), "z2".to_string())].into();
        let e = set_topology_labels(&mut n, &other).unwrap_err();
        assert_eq!(
            e,
            "detected topology value collision: driver reported \"zone\":\"z2\" but existing label is \"zone\":\"z1\""
        );
    }

    #[test]
    fn the_csinode_entry_has_sorted_keys_and_a_limit_only_when_reported() {
        let mut d = Driver {
            endpoint: String::new(),
            version: super::super::Version::parse("1.0.0").unwrap(),
            node_id: "n".into(),
            max_volumes: 0,
            topology: [
                ("z".to_string(), "1".to_string()),
                ("a".to_string(), "2".to_string()),
            ]
            .into(),
        };
        let e = driver_entry("x", &d);
        assert_eq!(
            e.topology_keys,
            Some(vec!["a".to_string(), "z".to_string()])
        );
        assert!(e.allocatable.is_none());
        d.max_volumes = 7;
        assert_eq!(driver_entry("x", &d).allocatable.unwrap().count, Some(7));
    }
}
