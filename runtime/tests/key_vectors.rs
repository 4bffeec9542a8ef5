//! Cross-implementation vectors for the key spec (`docs/key-spec.md`).
//!
//! `tests/key_vectors.json` at the workspace root is written by `tests/key_vectors.py`, an
//! independent Python implementation of the spec. Every vector must produce the same
//! canonical document and key here.

use std::path::PathBuf;

use serde::Deserialize;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use tool_contracts_runtime::key::{
    jcs_cmp, tool_key, KeyBuilder, KeyFieldError, TOOL_KEY_CONTRACT,
};

/// The file must keep at least this many vectors: shrinking it weakens the cross-check.
const MIN_VECTORS: usize = 12;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Vector {
    description: String,
    tool: String,
    version: u32,
    scope: Option<String>,
    fields: Map<String, Value>,
    /// The canonical document and key; absent on a refused vector.
    #[serde(default)]
    canonical: Option<String>,
    #[serde(default)]
    key: Option<String>,
    /// A refused vector: the key field that makes the call fail (no key exists).
    #[serde(default)]
    error: Option<String>,
}

impl Vector {
    /// `(canonical, key)` of an accepted vector.
    fn expected(&self) -> Option<(&str, &str)> {
        match (&self.canonical, &self.key, &self.error) {
            (Some(c), Some(k), None) => Some((c, k)),
            (None, None, Some(_)) => None,
            _ => panic!(
                "{}: a vector has either `canonical` and `key`, or `error`",
                self.description
            ),
        }
    }
}

fn load_vectors() -> Vec<Vector> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/key_vectors.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is malformed: {e}", path.display()))
}

#[test]
fn key_vectors_file_has_enough_vectors() {
    let vectors = load_vectors();
    assert!(
        vectors.len() >= MIN_VECTORS,
        "tests/key_vectors.json has {} vectors; at least {MIN_VECTORS} are required \
         (regenerate with `python3 tests/key_vectors.py`)",
        vectors.len()
    );
}

#[test]
fn the_file_has_refused_vectors() {
    assert!(
        load_vectors().iter().filter(|v| v.error.is_some()).count() >= 3,
        "the refused numbers of docs/key-spec.md section 3.3 are pinned"
    );
}

#[test]
fn tool_key_matches_every_vector() {
    for v in load_vectors() {
        let fields: Vec<(&str, &Value)> = v.fields.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let result = tool_key(&v.tool, v.version, v.scope.as_deref(), &fields);
        match (v.expected(), result) {
            (Some((_, want)), Ok(key)) => assert_eq!(key, want, "key of vector: {}", v.description),
            (None, Err(KeyFieldError::Encode { field, .. })) => {
                assert_eq!(Some(&field), v.error.as_ref(), "{}", v.description)
            }
            (_, other) => panic!("{}: got {other:?}", v.description),
        }
    }
}

#[test]
fn builder_document_matches_every_vector() {
    for v in load_vectors() {
        let Some((canonical, key)) = v.expected() else {
            continue;
        };
        let mut fields: Vec<(&String, &Value)> = v.fields.iter().collect();
        fields.sort_by(|a, b| jcs_cmp(a.0, b.0));
        let build = || {
            let mut builder = KeyBuilder::new(TOOL_KEY_CONTRACT);
            for (path, value) in &fields {
                builder
                    .field(path, *value)
                    .unwrap_or_else(|e| panic!("{}: {e}", v.description));
            }
            builder
        };
        let document = build().finish_document(v.scope.as_deref(), &v.tool, v.version);
        assert_eq!(
            String::from_utf8_lossy(&document),
            canonical,
            "canonical document of vector: {}",
            v.description
        );
        assert_eq!(
            build().finish(v.scope.as_deref(), &v.tool, v.version),
            key,
            "builder key of vector: {}",
            v.description
        );
        // The recorded key is the SHA-256 of the recorded document.
        let digest: String = Sha256::digest(canonical.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(digest, key, "vector is self-consistent: {}", v.description);
    }
}
