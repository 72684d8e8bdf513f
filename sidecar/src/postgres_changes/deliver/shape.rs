//! The last stage, pure: a change shaped for a channel's role (its readable columns, its
//! `select`), and trimmed to its small values past MAX_RECORD_BYTES.

use super::outgoing::Candidate;
use serde_json::{Map, Value};

/// A value kept in a record over the size cap is at most this long (JSON text), as in
/// Supabase.
pub(super) const SMALL_VALUE_BYTES: usize = 64;

/// The `select` of a candidate's bindings: None (every readable column) unless every
/// matched binding names its columns; then their union.
pub(super) fn common_select(c: &Candidate) -> Option<Vec<String>> {
    let mut all: Vec<String> = Vec::new();
    for &b in &c.bindings {
        let s = c.sub.bindings[b].select.as_ref()?;
        for col in s {
            if !all.contains(col) {
                all.push(col.clone());
            }
        }
    }
    Some(all)
}

/// The record's primary key as JSON, what `realtime.visible` looks rows up by.
pub(super) fn key_only(data: &Value, key: &[String]) -> String {
    let row = data
        .get("record")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let kept: Map<String, Value> = row.into_iter().filter(|(k, _)| key.contains(k)).collect();
    Value::Object(kept).to_string()
}

/// The change as one role sees it: columns it may read (and selected), old_record trimmed
/// to the key when asked, small values only past the size cap.
pub(super) fn shape(
    data: &Value,
    readable: &[String],
    select: Option<&[String]>,
    trim_to_key: Option<&[String]>,
    max_record_bytes: usize,
) -> String {
    let keep = |name: &str| {
        readable.iter().any(|c| c == name) && select.is_none_or(|s| s.iter().any(|c| c == name))
    };
    let mut d = data.clone();
    if let Some(Value::Array(cols)) = d.get_mut("columns") {
        cols.retain(|c| c.get("name").and_then(Value::as_str).is_some_and(keep));
    }
    if let Some(Value::Object(r)) = d.get_mut("record") {
        r.retain(|k, _| keep(k));
    }
    if let Some(Value::Object(r)) = d.get_mut("old_record") {
        r.retain(|k, _| keep(k) && trim_to_key.is_none_or(|key| key.iter().any(|c| c == k)));
    }
    let text = d.to_string();
    if text.len() <= max_record_bytes {
        return text;
    }
    for field in ["record", "old_record"] {
        if let Some(Value::Object(r)) = d.get_mut(field) {
            r.retain(|_, v| v.to_string().len() <= SMALL_VALUE_BYTES);
        }
    }
    let too_large = Value::from("Error 413: Payload Too Large");
    match d.get_mut("errors") {
        Some(Value::Array(e)) => e.push(too_large),
        _ => d["errors"] = Value::Array(vec![too_large]),
    }
    d.to_string()
}
