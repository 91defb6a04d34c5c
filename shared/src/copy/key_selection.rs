//! `spec.keys`: which keys of `data` and `binaryData` travel and under which name, and what that
//! does to a Secret's `type`. Exclude wins over include; renames apply to the keys that travel.
//!
//! A Secret keeps its `type` only while the keys the apiserver requires of that type remain
//! ([`SECRET_TYPE_RULES`]); otherwise it becomes `Opaque` when `allowTypeChange` says so, and the
//! copy is refused when not, rather than written as an object the apiserver would reject.

use crate::{api::copy_spec::KeySelection, copy::globs::matches_any};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};

/// The maps whose keys `spec.keys` selects.
const DATA_MAPS: [&str; 2] = ["data", "binaryData"];

/// What a built-in Secret type requires of its keys.
#[derive(Clone, Copy, Debug)]
pub enum Requires {
    /// Every one of these keys.
    All(&'static [&'static str]),
    /// At least one of these keys.
    Any(&'static [&'static str]),
}

/// The key rules of the built-in Secret types (as the apiserver validates them; bootstrap tokens as
/// the token authenticator reads them). Types not listed have no key rule.
pub const SECRET_TYPE_RULES: &[(&str, Requires)] = &[
    ("kubernetes.io/tls", Requires::All(&["tls.crt", "tls.key"])),
    (
        "kubernetes.io/dockerconfigjson",
        Requires::All(&[".dockerconfigjson"]),
    ),
    ("kubernetes.io/dockercfg", Requires::All(&[".dockercfg"])),
    (
        "kubernetes.io/basic-auth",
        Requires::Any(&["username", "password"]),
    ),
    ("kubernetes.io/ssh-auth", Requires::All(&["ssh-privatekey"])),
    (
        "bootstrap.kubernetes.io/token",
        Requires::All(&["token-id", "token-secret"]),
    ),
];

/// The keys `secret_type` requires that `keys` lacks, described; `None` when the type is satisfied.
pub fn unmet_type_rule(secret_type: &str, keys: &BTreeSet<String>) -> Option<String> {
    let (_, requires) = SECRET_TYPE_RULES.iter().find(|(t, _)| *t == secret_type)?;
    match requires {
        Requires::All(needed) => {
            let missing: Vec<&str> = needed.iter().copied().filter(|k| !keys.contains(*k)).collect();
            (!missing.is_empty()).then(|| {
                format!(
                    "needs the keys {} (missing: {})",
                    needed.join(" and "),
                    missing.join(", ")
                )
            })
        }
        Requires::Any(options) => (!options.iter().any(|k| keys.contains(*k)))
            .then(|| format!("needs at least one of the keys {}", options.join(", "))),
    }
}

/// Why `spec.keys` gives no copy of a source, with a message naming the spec field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeysRefused {
    /// The copy would be an invalid object (one key twice, a Secret type without its keys): refused
    /// at admission when the source is known.
    InvalidObject(String),
    /// The source has none of the selected keys: reported, not written empty.
    NothingSelected(String),
}

/// Applies `selection` to the `data` and `binaryData` of built `content` (and to a Secret's
/// `type`). Returns why no copy can be built when the result would be empty (unless `allowEmpty`),
/// would hold one key twice, or would break the Secret's type.
pub fn select_keys(content: &mut Value, selection: &KeySelection) -> Result<(), KeysRefused> {
    let Some(object) = content.as_object_mut() else {
        return Ok(());
    };
    let include = selection.include.as_deref();
    let exclude = selection.exclude.as_deref().unwrap_or_default();
    let no_renames = BTreeMap::new();
    let renames = selection.rename.as_ref().unwrap_or(&no_renames);

    let mut source_keys = 0;
    // Final name → the source key it came from, across both maps (a key must be unique in both).
    let mut named: BTreeMap<String, String> = BTreeMap::new();
    for map_name in DATA_MAPS {
        let Some(map) = object.get_mut(map_name).and_then(Value::as_object_mut) else {
            continue;
        };
        source_keys += map.len();
        let mut selected = Map::new();
        for (key, value) in std::mem::take(map) {
            let travels = include.is_none_or(|globs| matches_any(globs, &key)) && !matches_any(exclude, &key);
            if !travels {
                continue;
            }
            let name = renames.get(&key).cloned().unwrap_or_else(|| key.clone());
            if let Some(earlier) = named.insert(name.clone(), key.clone()) {
                let (a, b) = if earlier < key {
                    (earlier, key)
                } else {
                    (key, earlier)
                };
                return Err(KeysRefused::InvalidObject(format!(
                    "spec.keys.rename: the keys {a:?} and {b:?} would both be named {name:?} in the copy; \
                     rename one of them to a free name or exclude one"
                )));
            }
            selected.insert(name, value);
        }
        *map = selected;
    }

    if named.is_empty() && (source_keys > 0 || include.is_some()) && selection.allow_empty != Some(true) {
        return Err(KeysRefused::NothingSelected(format!(
            "spec.keys: the source has none of the selected keys (it has {source_keys}); nothing was \
             written (fix spec.keys.include/exclude, or set spec.keys.allowEmpty: true to copy an empty object)"
        )));
    }

    let is_secret = object.get("apiVersion").and_then(Value::as_str) == Some("v1")
        && object.get("kind").and_then(Value::as_str) == Some("Secret");
    if is_secret {
        let secret_type = object
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("Opaque")
            .to_owned();
        let keys: BTreeSet<String> = named.into_keys().collect();
        if let Some(unmet) = unmet_type_rule(&secret_type, &keys) {
            if selection.allow_type_change != Some(true) {
                return Err(KeysRefused::InvalidObject(format!(
                    "spec.keys: a Secret of type {secret_type} {unmet} after spec.keys; set \
                     spec.keys.allowTypeChange: true to copy it as type Opaque, or keep those keys"
                )));
            }
            object.insert("type".into(), Value::String("Opaque".into()));
        }
    }
    Ok(())
}
