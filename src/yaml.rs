//! YAML decoding for manifests and configuration files, read as upstream reads them.
//!
//! Upstream turns YAML into JSON with sigs.k8s.io/yaml, which parses with go-yaml v2 (YAML 1.1
//! scalars: `0644` is octal, `yes`/`on` are booleans; a repeated key keeps its last value) and
//! then decodes the JSON. serde-saphyr (the YAML crate kube-rs uses) is told to read scalars and
//! repeated keys the same way, and is given a budget so that a hostile document (an alias bomb,
//! thousands of nesting levels, millions of nodes) is refused after bounded work and memory.
//! It also borrows long scalars from the input instead of copying them through a doubling,
//! zero-filled buffer as libyaml does, so a multi-megabyte string costs about its own size.

use serde::de::DeserializeOwned;

/// A document that did not decode; the message names the line and column.
pub type Error = serde_saphyr::Error;

/// Alias events one document may replay in all. go-yaml v2 bounds aliasing by ratio only, and
/// only above 400,000 decoded nodes; a pod manifest that shares env lists or probes through
/// anchors replays a few hundred, so this refuses a bomb long before it costs megabytes.
const MAX_REPLAYED_EVENTS: usize = 10_000;

/// Nesting levels one document may have: a pod is about 12 deep, and the untyped parts of a
/// configuration (a credential provider's env, feature gates) add little.
const MAX_DEPTH: usize = 64;

fn options() -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_depth = MAX_DEPTH;
    serde_saphyr::options! {
        budget: Some(budget),
        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::LastWins,
        legacy_octal_numbers: true,
        alias_limits: serde_saphyr::alias_limits! {
            max_total_replayed_events: MAX_REPLAYED_EVENTS,
        },
        // Errors end up in one log line or one event message, not a source excerpt.
        with_snippet: false,
    }
}

/// Decodes the YAML (or JSON) document held in `bytes`; of several, the first, as go-yaml
/// v2's Unmarshal reads only the first (a manifest ending in `---` is common).
pub fn from_slice<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Error> {
    match serde_saphyr::from_slice_with_options(bytes, options()) {
        Err(Error::MultipleDocuments { .. }) => first_document(bytes),
        r => r,
    }
}

/// As `from_slice`, for text.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, Error> {
    from_slice(text.as_bytes())
}

/// The first document that is not empty; the later ones are not parsed.
fn first_document<T: DeserializeOwned>(mut bytes: &[u8]) -> Result<T, Error> {
    serde_saphyr::read_with_options(&mut bytes, options())
        .next()
        .unwrap_or_else(|| Err(serde::de::Error::custom("no YAML document")))
}

/// Serializes `value` as a YAML document.
pub fn to_string<T: serde::Serialize>(value: &T) -> Result<String, serde_saphyr::SerializeError> {
    serde_saphyr::to_string(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    /// go-yaml v2 (through sigs.k8s.io/yaml) resolves a plain `0644` as octal and `yes` as a
    /// boolean, so `defaultMode: 0644` in a manifest means 420, as every upstream user expects.
    #[test]
    fn scalars_resolve_as_go_yaml_v2_does() {
        let v: Value = from_str("mode: 0644\nhex: 0x1F\ndec: 644\non: yes\noff: off\n").unwrap();
        assert_eq!(
            v,
            json!({"mode": 420, "hex": 31, "dec": 644, "on": true, "off": false})
        );
        let mode: std::collections::BTreeMap<String, i32> = from_str("m: 0755\n").unwrap();
        assert_eq!(mode["m"], 0o755);
    }

    /// go-yaml v2's non-strict decoding keeps the last value of a repeated key.
    #[test]
    fn a_repeated_key_keeps_its_last_value() {
        let v: Value = from_str("a: 1\nb: 2\na: 3\n").unwrap();
        assert_eq!(v, json!({"a": 3, "b": 2}));
    }

    #[test]
    fn hostile_documents_are_refused_with_a_short_message() {
        let mut bomb = String::from("a: &a [x, x, x, x, x, x, x, x, x]\n");
        for j in 1..10u8 {
            let (n, p) = ((b'a' + j) as char, (b'a' + j - 1) as char);
            bomb.push_str(&format!("{n}: &{n} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"));
        }
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        for doc in [bomb, deep] {
            let e = from_str::<Value>(&doc).unwrap_err().to_string();
            assert!(e.len() < 400, "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
        // One level fewer than the limit is fine.
        let ok = format!("{}{}", "[".repeat(MAX_DEPTH - 1), "]".repeat(MAX_DEPTH - 1));
        from_str::<Value>(&ok).unwrap();
    }

    /// go-yaml v2 decodes the first document and ignores the rest.
    #[test]
    fn of_several_documents_the_first_is_read() {
        for text in [
            "a: 1\n---\n",
            "---\na: 1\n---\nb: [\n",
            "# head\n---\na: 1\n---\nb: 2\n",
        ] {
            assert_eq!(
                from_str::<Value>(text).unwrap(),
                json!({"a": 1}),
                "{text:?}"
            );
        }
        assert_eq!(from_str::<Value>("---\na: 1\n").unwrap(), json!({"a": 1}));
    }

    #[test]
    fn writes_yaml_that_reads_back() {
        let v = json!({"kind": "Config", "users": [{"name": "a", "mode": "0644"}]});
        let text = to_string(&v).unwrap();
        assert_eq!(from_str::<Value>(&text).unwrap(), v);
    }
}
