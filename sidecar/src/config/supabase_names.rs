//! Supabase's names for settings that have ours, read from the environment as Supabase's
//! server reads them, so that an environment written for Supabase's `realtime` service
//! configures the sidecar too. Each sets ours when ours is not set (ours wins, and the log
//! says so); the scope of each may differ, as the table in `sidecar/README.md` says.
//! `TENANT_MAX_BYTES_PER_SECOND` has no counterpart (Supabase does not enforce it either):
//! it is accepted and the log says it is ignored.

use std::collections::HashMap;

/// (Supabase's name, ours or None, how the scope differs).
pub const NAMES: [(&str, Option<&str>, &str); 5] = [
    (
        "TENANT_MAX_CHANNELS_PER_CLIENT",
        Some("MAX_CHANNELS_PER_CLIENT"),
        "the same: per connection",
    ),
    (
        "TENANT_MAX_CONCURRENT_USERS",
        Some("MAX_CONNECTIONS"),
        "per sidecar process here, per project across Supabase's cluster there",
    ),
    (
        "TENANT_MAX_EVENTS_PER_SECOND",
        Some("MAX_EVENTS_PER_SECOND"),
        "per connection here, per project there",
    ),
    (
        "TENANT_MAX_JOINS_PER_SECOND",
        Some("MAX_SIDECAR_JOINS_PER_SECOND"),
        "per sidecar process here, per project there",
    ),
    (
        "TENANT_MAX_BYTES_PER_SECOND",
        None,
        "no counterpart: Supabase does not enforce it either",
    ),
];

/// From the environment `vars`: the settings of ours to set, and what to log.
pub fn translate(vars: &HashMap<String, String>) -> (Vec<(String, String)>, Vec<String>) {
    let (mut set, mut notes) = (Vec::new(), Vec::new());
    for (theirs, ours, scope) in NAMES {
        let Some(value) = vars.get(theirs) else {
            continue;
        };
        match ours {
            None => notes.push(format!("{theirs}={value} is accepted and ignored: {scope}")),
            Some(ours) => match vars.get(ours) {
                Some(own) => notes.push(format!(
                    "{theirs}={value} is ignored: {ours}={own} is set and wins"
                )),
                None => {
                    notes.push(format!("{theirs}={value} sets {ours} ({scope})"));
                    set.push((ours.to_owned(), value.clone()));
                }
            },
        }
    }
    (set, notes)
}

/// Applies `translate` to this process's environment; returns what to log. Call before the
/// settings are parsed, while the process has one thread.
pub fn apply() -> Vec<String> {
    let vars: HashMap<String, String> = std::env::vars().collect();
    let (set, notes) = translate(&vars);
    for (k, v) in set {
        std::env::set_var(k, v);
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn supabase_s_names_set_ours_unless_ours_are_set_and_the_one_without_is_ignored() {
        let vars: HashMap<String, String> = [
            ("TENANT_MAX_CHANNELS_PER_CLIENT", "50"),
            ("TENANT_MAX_JOINS_PER_SECOND", "7"),
            ("MAX_SIDECAR_JOINS_PER_SECOND", "9"),
            ("TENANT_MAX_BYTES_PER_SECOND", "100000"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let (set, notes) = translate(&vars);
        assert_eq!(
            set,
            [("MAX_CHANNELS_PER_CLIENT".to_owned(), "50".to_owned())]
        );
        assert_eq!(
            notes,
            [
                "TENANT_MAX_CHANNELS_PER_CLIENT=50 sets MAX_CHANNELS_PER_CLIENT (the same: per connection)",
                "TENANT_MAX_JOINS_PER_SECOND=7 is ignored: MAX_SIDECAR_JOINS_PER_SECOND=9 is set and wins",
                "TENANT_MAX_BYTES_PER_SECOND=100000 is accepted and ignored: no counterpart: Supabase does not enforce it either",
            ]
        );
    }
}
