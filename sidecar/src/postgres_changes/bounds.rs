//! What one join's bindings may cost, bounded before anything is asked of the database:
//! every binding of a schema-wide channel is run against every drained change on the
//! single drain task, every binding is a row of the join-time check, and every table a
//! binding names is a key listened to in the database (`interest`). Unbounded, four
//! anonymous sockets with 25 joins of 5,000 never-matching bindings each stalled delivery
//! for the whole sidecar (issue 25). The connection's total is bounded where joins are
//! admitted (`channels/join.rs`, MAX_BINDINGS_PER_CONNECTION).
//! realtime-js sends one binding per `channel.on('postgres_changes', ...)` with at most one
//! filter, so the defaults (`config`) are far above what an app asks.

use super::binding::{Binding, BindingError};
use crate::config::Config;
use std::collections::HashSet;

/// The per-join bounds, from their settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// MAX_BINDINGS_PER_JOIN
    pub bindings: usize,
    /// MAX_FILTER_CONDITIONS_PER_BINDING
    pub conditions: usize,
    /// MAX_FILTER_VALUE_BYTES: the bytes of one condition's value (an `in` list's items
    /// together).
    pub value_bytes: usize,
    /// MAX_TABLES_PER_JOIN: distinct table names, each a key listened to in the database.
    pub tables: usize,
    /// MAX_PATTERNS_PER_JOIN: pattern conditions (`Weight::patterns`).
    pub patterns: usize,
}

/// What a join's bindings hold against its connection's and its address's limits
/// (MAX_BINDINGS_PER_CONNECTION and _ADDRESS, MAX_PATTERNS_PER_CONNECTION and _ADDRESS).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Weight {
    pub bindings: usize,
    /// Conditions with `like`, `ilike`, `match` or `imatch`: each is asked, in the database,
    /// about every changed value of its column.
    pub patterns: usize,
    /// Bindings without a table (a schema's or every schema's changes): every change of
    /// their schemas is matched against them on the drain's loop (MAX_SCHEMA_WIDE_BINDINGS).
    pub schema_wide: usize,
}

impl Weight {
    pub fn of(bindings: &[Binding]) -> Weight {
        Weight {
            bindings: bindings.len(),
            patterns: bindings
                .iter()
                .flat_map(|b| &b.filters)
                .filter(|f| f.op.is_pattern())
                .count(),
            schema_wide: bindings.iter().filter(|b| b.table.is_none()).count(),
        }
    }
}

impl std::ops::Add for Weight {
    type Output = Weight;
    fn add(self, o: Weight) -> Weight {
        Weight {
            bindings: self.bindings + o.bindings,
            patterns: self.patterns + o.patterns,
            schema_wide: self.schema_wide + o.schema_wide,
        }
    }
}

impl std::ops::Sub for Weight {
    type Output = Weight;
    fn sub(self, o: Weight) -> Weight {
        Weight {
            bindings: self.bindings - o.bindings,
            patterns: self.patterns - o.patterns,
            schema_wide: self.schema_wide - o.schema_wide,
        }
    }
}

impl std::iter::Sum for Weight {
    fn sum<I: Iterator<Item = Weight>>(iter: I) -> Weight {
        iter.fold(Weight::default(), |a, b| a + b)
    }
}

impl Bounds {
    pub fn of(cfg: &Config) -> Bounds {
        Bounds {
            bindings: cfg.max_bindings_per_join,
            conditions: cfg.max_filter_conditions_per_binding,
            value_bytes: cfg.max_filter_value_bytes,
            tables: cfg.max_tables_per_join,
            patterns: cfg.max_patterns_per_join,
        }
    }

    /// The bounds of a sidecar with default settings (tests and fuzzing).
    #[cfg(test)]
    pub fn defaults() -> Bounds {
        use clap::Parser;
        let args = ["realtime-sidecar", "--jwt-secret", &"s".repeat(32)];
        Bounds::of(&Config::try_parse_from(args).expect("default settings"))
    }

    /// Ok, or MAX_BINDINGS_PER_JOIN's refusal of a join with `n` bindings. Judged before any
    /// binding is parsed (`binding::parse_bindings`): a join of 5,000 bindings cost its
    /// parsing, and the freeing of what it built, before this refused it (a fifth of the
    /// sidecar's CPU under the soak's two binding floods).
    pub fn count(&self, n: usize) -> Result<(), BindingError> {
        if n > self.bindings {
            return over(
                "the join has bindings:".into(),
                n,
                self.bindings,
                "MAX_BINDINGS_PER_JOIN",
            );
        }
        Ok(())
    }

    /// Ok, or the first bound `bindings` exceed, with its setting's name.
    pub fn check(&self, bindings: &[Binding]) -> Result<(), BindingError> {
        self.count(bindings.len())?;
        for (i, b) in bindings.iter().enumerate() {
            let at = i + 1;
            if b.filters.len() > self.conditions {
                return over(
                    format!("binding {at}: filter conditions:"),
                    b.filters.len(),
                    self.conditions,
                    "MAX_FILTER_CONDITIONS_PER_BINDING",
                );
            }
            for f in &b.filters {
                let bytes: usize = f.values.iter().map(String::len).sum();
                if bytes > self.value_bytes {
                    return over(
                        format!(
                            "binding {at}: the value of filter column {} in bytes:",
                            f.column
                        ),
                        bytes,
                        self.value_bytes,
                        "MAX_FILTER_VALUE_BYTES",
                    );
                }
            }
        }
        let patterns = Weight::of(bindings).patterns;
        if patterns > self.patterns {
            return over(
                "the join's bindings have pattern conditions (like, ilike, match, imatch):".into(),
                patterns,
                self.patterns,
                "MAX_PATTERNS_PER_JOIN",
            );
        }
        let tables: HashSet<&str> = bindings.iter().filter_map(|b| b.table.as_deref()).collect();
        if tables.len() > self.tables {
            return over(
                "the join's bindings name tables:".into(),
                tables.len(),
                self.tables,
                "MAX_TABLES_PER_JOIN",
            );
        }
        Ok(())
    }
}

fn over(what: String, n: usize, limit: usize, setting: &str) -> Result<(), BindingError> {
    Err(BindingError::OverLimit(format!(
        "{what} {n}; the limit is {limit} ({setting})"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres_changes::parse_bindings;
    use serde_json::{json, Value};

    const SMALL: Bounds = Bounds {
        bindings: 3,
        conditions: 2,
        value_bytes: 8,
        tables: 2,
        patterns: 2,
    };

    fn refused(list: Value) -> Option<String> {
        let b = parse_bindings(Some(&list)).unwrap();
        SMALL.check(&b).err().map(|e| e.text())
    }

    #[test]
    fn each_bound_refuses_one_past_it_with_its_setting_and_takes_it_at_the_limit() {
        let b =
            |t: &str, f: &str| json!({"event": "*", "schema": "public", "table": t, "filter": f});
        assert_eq!(
            refused(json!([b("a", "x=eq.1"), b("a", ""), b("b", "")])),
            None
        );
        assert_eq!(
            refused(json!([b("a", ""), b("a", ""), b("a", ""), b("a", "")])).unwrap(),
            "InvalidPostgresChanges: the join has bindings: 4; the limit is 3 (MAX_BINDINGS_PER_JOIN)"
        );
        assert_eq!(refused(json!([b("a", "x=eq.1,y=eq.2")])), None);
        assert!(refused(json!([b("a", "x=eq.1,y=eq.2,z=eq.3")]))
            .unwrap()
            .ends_with("the limit is 2 (MAX_FILTER_CONDITIONS_PER_BINDING)"));
        assert_eq!(refused(json!([b("a", "x=eq.12345678")])), None);
        assert_eq!(refused(json!([b("a", "x=in.(1234,5678)")])), None);
        assert_eq!(
            refused(json!([b("a", ""), b("a", "x=in.(1234,56789)")])).unwrap(),
            "InvalidPostgresChanges: binding 2: the value of filter column x in bytes: 9; the limit is 8 (MAX_FILTER_VALUE_BYTES)"
        );
        assert_eq!(
            refused(json!([b("a", "x=like.a%"), b("a", "y=imatch.b")])),
            None
        );
        assert_eq!(
            refused(json!([b("a", "x=like.a%,z=eq.1"), b("a", "y=ilike.b,w=match.c")])).unwrap(),
            "InvalidPostgresChanges: the join's bindings have pattern conditions (like, ilike, match, imatch): 3; the limit is 2 (MAX_PATTERNS_PER_JOIN)"
        );
        assert!(refused(json!([b("a", ""), b("b", ""), b("c", "")]))
            .unwrap()
            .ends_with("tables: 3; the limit is 2 (MAX_TABLES_PER_JOIN)"));
    }
}
