//! The PLEG's relist, decoded lean. Every second the PLEG asks for every
//! sandbox and container (`ListPodSandbox`, `ListContainers`, as upstream's
//! generic PLEG does) but needs only each one's id, state and pod UID
//! label. Decoded as the full CRI messages, each item's labels and
//! annotations became two hash maps of owned strings: at 110 pods some
//! 8,000 allocations a second, the largest share of an idle kubelet's CPU.
//! These decode-only messages read the same bytes and keep those three
//! fields; annotations and the other fields are skipped without copying
//! (so, unlike the full decoder, a non-UTF-8 annotation is not an error).

use prost::bytes::{Buf, BufMut};
use prost::encoding::{self, DecodeContext, WireType};
use prost::DecodeError;

use crate::kuberuntime::labels::POD_UID;

/// One sandbox or container as the relist sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RelistItem {
    pub id: String,
    /// The CRI state (`PodSandboxState` or `ContainerState`).
    pub state: i32,
    /// The `io.kubernetes.pod.uid` label; items without it are not the
    /// kubelet's.
    pub pod_uid: Option<String>,
}

/// `ListPodSandboxResponse` or `ListContainersResponse` (both a repeated
/// field 1, each item's id its field 1), for decoding only: encoding it
/// writes nothing, and it is never sent.
#[derive(Debug, Default)]
pub struct RelistList<const STATE: u32, const LABELS: u32> {
    pub items: Vec<RelistItem>,
    /// The label entry being decoded, its strings reused from item to item.
    label: LabelEntry,
}

/// `runtime.v1.PodSandbox`: state is field 3, labels field 5.
pub type SandboxList = RelistList<3, 5>;
/// `runtime.v1.Container`: state is field 6, labels field 8.
pub type ContainerList = RelistList<6, 8>;

/// One item being decoded, with the list's buffer for its label entries.
#[derive(Debug)]
struct ItemMsg<'a, const STATE: u32, const LABELS: u32> {
    item: RelistItem,
    label: &'a mut LabelEntry,
}

/// A `map<string, string>` entry (key 1, value 2), decoded into strings
/// kept from entry to entry (checked as UTF-8, as the full decoder checks
/// labels, without an allocation per label).
#[derive(Clone, PartialEq, prost::Message)]
struct LabelEntry {
    #[prost(string, tag = "1")]
    key: String,
    #[prost(string, tag = "2")]
    value: String,
}

impl<const STATE: u32, const LABELS: u32> prost::Message for ItemMsg<'_, STATE, LABELS> {
    fn encode_raw(&self, _buf: &mut impl BufMut) {}

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        if tag == 1 {
            return encoding::string::merge(wire_type, &mut self.item.id, buf, ctx);
        }
        if tag == STATE {
            return encoding::int32::merge(wire_type, &mut self.item.state, buf, ctx);
        }
        if tag == LABELS {
            // An entry without a key or value has it empty, as a map entry
            // decodes: the buffer is cleared for each.
            prost::Message::clear(self.label);
            encoding::message::merge(wire_type, self.label, buf, ctx)?;
            if self.label.key == POD_UID {
                self.item.pod_uid = Some(self.label.value.clone());
            }
            return Ok(());
        }
        encoding::skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        0
    }

    fn clear(&mut self) {
        self.item = RelistItem::default();
        prost::Message::clear(self.label);
    }
}

impl<const STATE: u32, const LABELS: u32> prost::Message for RelistList<STATE, LABELS> {
    fn encode_raw(&self, _buf: &mut impl BufMut) {}

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        if tag != 1 {
            return encoding::skip_field(wire_type, tag, buf, ctx);
        }
        let mut msg = ItemMsg::<STATE, LABELS> {
            item: RelistItem::default(),
            label: &mut self.label,
        };
        encoding::message::merge(wire_type, &mut msg, buf, ctx)?;
        self.items.push(msg.item);
        Ok(())
    }

    fn encoded_len(&self) -> usize {
        0
    }

    fn clear(&mut self) {
        self.items.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::v1;
    use prost::Message;
    use std::collections::HashMap;

    fn labels(uid: Option<&str>) -> HashMap<String, String> {
        let mut m: HashMap<String, String> = [
            ("io.kubernetes.pod.name", "web"),
            ("io.kubernetes.pod.namespace", "default"),
            ("io.kubernetes.container.name", "main"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        if let Some(u) = uid {
            m.insert(POD_UID.into(), u.into());
        }
        m
    }

    #[test]
    fn the_lean_lists_read_what_the_full_messages_say() {
        let annotations: HashMap<String, String> = [
            ("io.kubernetes.container.hash", "abc"),
            (POD_UID, "an annotation, not the label"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let containers = v1::ListContainersResponse {
            containers: vec![
                v1::Container {
                    id: "c1".into(),
                    pod_sandbox_id: "s1".into(),
                    metadata: Some(v1::ContainerMetadata {
                        name: "main".into(),
                        attempt: 2,
                    }),
                    image: Some(v1::ImageSpec {
                        image: "sha256:1".into(),
                        ..Default::default()
                    }),
                    image_ref: "busybox".into(),
                    state: v1::ContainerState::ContainerExited as i32,
                    created_at: 1_700_000_000_000_000_000,
                    labels: labels(Some("uid-1")),
                    annotations: annotations.clone(),
                    image_id: "sha256:1".into(),
                },
                // Not the kubelet's: no UID label (the annotation of the
                // same name does not count).
                v1::Container {
                    id: "c2".into(),
                    state: v1::ContainerState::ContainerRunning as i32,
                    labels: labels(None),
                    annotations,
                    ..Default::default()
                },
                // Created (state 0 is not written on the wire).
                v1::Container {
                    id: "c3".into(),
                    labels: labels(Some("uid-2")),
                    ..Default::default()
                },
            ],
        };
        let bytes = containers.encode_to_vec();
        let lean = ContainerList::decode(bytes.as_slice()).unwrap();
        let want: Vec<RelistItem> = containers
            .containers
            .iter()
            .map(|c| RelistItem {
                id: c.id.clone(),
                state: c.state,
                pod_uid: c.labels.get(POD_UID).cloned(),
            })
            .collect();
        assert_eq!(lean.items, want);
        assert_eq!(lean.items[0].pod_uid.as_deref(), Some("uid-1"));
        assert_eq!(lean.items[1].pod_uid, None);
        // Read with the sandbox's field numbers, "state" (3) is the
        // container's metadata message: the numbers matter.
        assert!(SandboxList::decode(bytes.as_slice()).is_err());

        let sandboxes = v1::ListPodSandboxResponse {
            items: vec![v1::PodSandbox {
                id: "s1".into(),
                metadata: Some(v1::PodSandboxMetadata {
                    name: "web".into(),
                    uid: "uid-1".into(),
                    namespace: "default".into(),
                    attempt: 0,
                }),
                state: v1::PodSandboxState::SandboxNotready as i32,
                created_at: 5,
                labels: labels(Some("uid-1")),
                annotations: HashMap::new(),
                runtime_handler: "runc".into(),
            }],
        };
        let lean = SandboxList::decode(sandboxes.encode_to_vec().as_slice()).unwrap();
        assert_eq!(
            lean.items,
            vec![RelistItem {
                id: "s1".into(),
                state: v1::PodSandboxState::SandboxNotready as i32,
                pod_uid: Some("uid-1".into()),
            }]
        );
    }

    #[test]
    fn label_entries_are_read_in_any_order_and_damage_is_an_error() {
        // A map entry may carry its value before its key, or lack either;
        // each entry starts from empty (no key carried over from the last).
        let mut item = Vec::new();
        encoding::string::encode(1, &"c1".to_string(), &mut item);
        let entry = |fields: &[(u32, &str)]| {
            let mut e = Vec::new();
            for (tag, v) in fields {
                encoding::string::encode(*tag, &v.to_string(), &mut e);
            }
            e
        };
        for e in [
            entry(&[(1, POD_UID), (2, "first")]),
            entry(&[(2, "reversed"), (1, POD_UID)]),
            entry(&[(2, "keyless")]),
        ] {
            encoding::bytes::encode(8, &e, &mut item);
        }
        let mut list = Vec::new();
        encoding::bytes::encode(1, &item, &mut list);
        let lean = ContainerList::decode(list.as_slice()).unwrap();
        assert_eq!(lean.items[0].pod_uid.as_deref(), Some("reversed"));

        // Cut short: an error, as the full message's decoder gives.
        let cut = &list[..list.len() - 3];
        assert!(ContainerList::decode(cut).is_err());
        assert!(v1::ListContainersResponse::decode(cut).is_err());
        // A label that is not UTF-8 is refused, as the full decoder does.
        let mut bad = Vec::new();
        let mut e = Vec::new();
        encoding::string::encode(1, &POD_UID.to_string(), &mut e);
        encoding::bytes::encode(2, &vec![0xff, 0xfe], &mut e);
        let mut it = Vec::new();
        encoding::bytes::encode(8, &e, &mut it);
        encoding::bytes::encode(1, &it, &mut bad);
        assert!(ContainerList::decode(bad.as_slice()).is_err());
    }
}
