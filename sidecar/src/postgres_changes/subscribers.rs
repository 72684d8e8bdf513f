//! Which channels of this sidecar listen to which tables: the one shared state of Postgres
//! Changes. A channel is registered when its join is admitted, its identity replaced when
//! its token is, and it is removed when it leaves (or its socket closes); the drainer asks,
//! per changed row, who might want the change.
//!
//! Channels whose every binding on a table is an `eq` filter (a room, a user: the common
//! case) are indexed by the value they want, so a change is matched against the channels
//! of its row's values, not against every channel of the table (1,000 subscribers in 10
//! rooms cost 100 checks per change, not 1,000).

use super::binding::Binding;
use super::filter::Op;
use crate::hub::ConnId;
use crate::out::Reach;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

/// One joined channel with `postgres_changes` bindings.
pub struct Subscriber {
    pub reach: Reach,
    pub bindings: Vec<Binding>,
    /// The JWT's role and claims (JSON): the identity RLS checks the changes for.
    pub role: String,
    pub claims: String,
    /// The channel asked for its position after each delivered batch (`position`).
    pub positions: bool,
}

impl Subscriber {
    /// The channel's key in this registry.
    fn key(&self) -> ChannelKey {
        (self.reach.conn, self.reach.topic.to_string())
    }
}

/// A channel: its connection and topic.
type ChannelKey = (ConnId, String);

/// Where a binding listens: (schema or `*`, table or None for every table).
type Place = (String, Option<String>);

/// A column and a value's canonical text (`canonical`).
type Wanted = (String, String);

/// The channels of one place.
#[derive(Default)]
struct Listeners {
    /// Channels matched against every change of the place.
    all: HashSet<ChannelKey>,
    /// Channels whose every binding here is `column=eq.value`, by what they want.
    by_value: HashMap<Wanted, HashSet<ChannelKey>>,
    /// How many indexed channels want each column (the columns a change is looked up by).
    columns: HashMap<String, usize>,
}

impl Listeners {
    fn is_empty(&self) -> bool {
        self.all.is_empty() && self.by_value.is_empty()
    }
}

#[derive(Default)]
struct Inner {
    channels: HashMap<ChannelKey, Arc<Subscriber>>,
    places: HashMap<Place, Listeners>,
}

/// A value's text for the index, the same for a filter's typed value and a record's: text
/// and booleans as they are, numbers with an integral value as integers (a numeric 5.0 in
/// a record equals a filter's 5). None for what is not indexed (other numbers, arrays,
/// objects, NULL): such a filter is matched by scan.
pub fn canonical(v: &serde_json::Value) -> Option<String> {
    use serde_json::Value;
    match v {
        Value::String(s) => Some(format!("s{s}")),
        Value::Bool(b) => Some(format!("b{b}")),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Some(format!("n{i}"))
            } else if let Some(u) = n.as_u64() {
                Some(format!("n{u}"))
            } else {
                let f = n.as_f64()?;
                (f.fract() == 0.0 && f.abs() < 9.0e15).then(|| format!("n{}", f as i64))
            }
        }
        _ => None,
    }
}

/// What a channel's bindings on one place want, if each has an indexable `eq` condition
/// (the others of a binding are checked by `matches`, as all must hold).
fn wanted(bindings: &[&Binding]) -> Option<Vec<Wanted>> {
    bindings
        .iter()
        .map(|b| {
            b.filters.iter().find_map(|f| {
                if f.op != Op::Eq || f.negate {
                    return None;
                }
                let value = canonical(f.typed.as_ref()?.first()?)?;
                Some((f.column.clone(), value))
            })
        })
        .collect()
}

#[derive(Default)]
pub struct Subscribers {
    inner: RwLock<Inner>,
    /// Changes whenever a channel is added or removed: the drainer then asks the database
    /// to decode the changes of a new set of tables (`tables`).
    generation: std::sync::atomic::AtomicU64,
}

/// Each place a channel listens at, with what it wants there (None: every change).
fn places(sub: &Subscriber) -> HashMap<Place, Option<Vec<Wanted>>> {
    let mut by_place: HashMap<Place, Vec<&Binding>> = HashMap::new();
    for b in &sub.bindings {
        by_place
            .entry((b.schema.clone(), b.table.clone()))
            .or_default()
            .push(b);
    }
    by_place
        .into_iter()
        .map(|(place, bindings)| (place, wanted(&bindings)))
        .collect()
}

impl Subscribers {
    /// Registers a channel (replacing its earlier registration, if any).
    pub fn add(&self, sub: Subscriber) {
        let key = sub.key();
        let mut inner = self.inner.write().unwrap();
        if let Some(old) = inner.channels.remove(&key) {
            remove_places(&mut inner, &key, &old);
        }
        for (place, wants) in places(&sub) {
            let l = inner.places.entry(place).or_default();
            match wants {
                None => {
                    l.all.insert(key.clone());
                }
                Some(wants) => {
                    for w in wants {
                        *l.columns.entry(w.0.clone()).or_default() += 1;
                        l.by_value.entry(w).or_default().insert(key.clone());
                    }
                }
            }
        }
        inner.channels.insert(key, Arc::new(sub));
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn remove(&self, conn: ConnId, topic: &str) {
        let key = (conn, topic.to_owned());
        let mut inner = self.inner.write().unwrap();
        if let Some(old) = inner.channels.remove(&key) {
            remove_places(&mut inner, &key, &old);
            self.generation
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The tables whose changes some channel may want, as (schema, table); None when a
    /// binding covers a whole schema or every schema (then every change is).
    pub fn tables(&self) -> Option<Vec<(String, String)>> {
        let inner = self.inner.read().unwrap();
        inner
            .places
            .keys()
            .map(|(schema, table)| match table {
                Some(t) if schema != "*" => Some((schema.clone(), t.clone())),
                _ => None,
            })
            .collect()
    }

    /// A new token on the channel: its changes are checked for the new identity from the
    /// next drained batch on.
    pub fn set_identity(&self, conn: ConnId, topic: &str, role: &str, claims: &str) {
        let key = (conn, topic.to_owned());
        let mut inner = self.inner.write().unwrap();
        if let Some(sub) = inner.channels.get_mut(&key) {
            let updated = Subscriber {
                role: role.to_owned(),
                claims: claims.to_owned(),
                bindings: sub.bindings.clone(),
                reach: sub.reach.clone(),
                positions: sub.positions,
            };
            *sub = Arc::new(updated);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.inner.read().unwrap().channels.is_empty()
    }

    /// Whether some channel may want changes of a table called `table`, in any schema: a
    /// look at the places, not at every channel.
    pub fn any_named(&self, table: &str) -> bool {
        let inner = self.inner.read().unwrap();
        inner
            .places
            .keys()
            .any(|(_, t)| t.as_deref().is_none_or(|t| t == table))
    }

    /// The channels with a binding that may name a table called `table`, in any schema
    /// (a change that could not be decoded knows only its table's name). A scan: rare.
    pub fn named(&self, table: &str) -> Vec<Arc<Subscriber>> {
        let inner = self.inner.read().unwrap();
        inner
            .channels
            .values()
            .filter(|s| {
                s.bindings
                    .iter()
                    .any(|b| b.table.as_deref().is_none_or(|t| t == table))
            })
            .cloned()
            .collect()
    }

    /// Whether changes of `schema.table` must have their row read to be matched: some
    /// channel listening there is indexed by a value of it, or has a binding with a filter.
    /// Otherwise the drain matches them by their place and kind alone (`deliver::matched`).
    pub fn reads_rows(&self, schema: &str, table: &str) -> bool {
        let inner = self.inner.read().unwrap();
        places_of(schema, table).into_iter().any(|(s, t)| {
            let place = (s.to_owned(), t.map(str::to_owned));
            inner.places.get(&place).is_some_and(|l| {
                !l.by_value.is_empty()
                    || l.all.iter().any(|k| {
                        inner.channels[k]
                            .bindings
                            .iter()
                            .any(|b| !b.filters.is_empty())
                    })
            })
        })
    }

    /// The channels that may want a change of table `schema.table` whose row (the new one;
    /// the old one for a DELETE) is `row`, each once: those listening to the whole table
    /// (by name, by schema or on every schema) and those whose `eq` filter wants a value of
    /// the row. Each still goes through `Binding::matches`.
    pub fn of(
        &self,
        schema: &str,
        table: &str,
        row: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Vec<Arc<Subscriber>> {
        let inner = self.inner.read().unwrap();
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for (s, t) in places_of(schema, table) {
            let place = (s.to_owned(), t.map(str::to_owned));
            let Some(l) = inner.places.get(&place) else {
                continue;
            };
            let mut keys: Vec<&ChannelKey> = l.all.iter().collect();
            if let Some(row) = row {
                for column in l.columns.keys() {
                    let Some(value) = row.get(column).and_then(canonical) else {
                        continue;
                    };
                    if let Some(set) = l.by_value.get(&(column.clone(), value)) {
                        keys.extend(set);
                    }
                }
            }
            for key in keys {
                if seen.insert(key) {
                    out.push(inner.channels[key].clone());
                }
            }
        }
        out
    }
}

/// The places a change of `schema.table` is heard at: the table by name, its schema, the
/// table's name on every schema, and every table of every schema.
fn places_of<'a>(schema: &'a str, table: &'a str) -> [(&'a str, Option<&'a str>); 4] {
    [
        (schema, Some(table)),
        (schema, None),
        ("*", Some(table)),
        ("*", None),
    ]
}

fn remove_places(inner: &mut Inner, key: &ChannelKey, old: &Subscriber) {
    for (place, wants) in places(old) {
        let Some(l) = inner.places.get_mut(&place) else {
            continue;
        };
        match wants {
            None => {
                l.all.remove(key);
            }
            Some(wants) => {
                for w in wants {
                    if let Some(n) = l.columns.get_mut(&w.0) {
                        *n -= 1;
                        if *n == 0 {
                            l.columns.remove(&w.0);
                        }
                    }
                    if let Some(set) = l.by_value.get_mut(&w) {
                        set.remove(key);
                        if set.is_empty() {
                            l.by_value.remove(&w);
                        }
                    }
                }
            }
        }
        if l.is_empty() {
            inner.places.remove(&place);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres_changes::parse_bindings;
    use serde_json::json;

    fn sub(conn: ConnId, topic: &str, bindings: serde_json::Value) -> Subscriber {
        let (tx, _) = crate::out::channel(1);
        let link = crate::out::Link::new(conn, crate::frame::Vsn::V2, conn as i64, tx);
        Subscriber {
            reach: link.reach(topic, None),
            bindings: parse_bindings(Some(&bindings)).unwrap(),
            role: "authenticated".into(),
            claims: "{}".into(),
            positions: false,
        }
    }

    fn who(subs: &Subscribers, schema: &str, table: &str) -> Vec<(ConnId, String)> {
        let mut v: Vec<_> = subs
            .of(schema, table, None)
            .iter()
            .map(|s| s.key())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_channel_is_found_once_by_table_schema_or_wildcard_until_it_leaves() {
        let subs = Subscribers::default();
        subs.add(sub(
            1,
            "realtime:a",
            json!([{"event": "*", "schema": "public", "table": "todos"},
                   {"event": "INSERT", "schema": "public"}]),
        ));
        subs.add(sub(2, "realtime:b", json!([{"event": "*", "schema": "*"}])));
        subs.add(sub(
            2,
            "realtime:c",
            json!([{"event": "*", "schema": "other", "table": "todos"}]),
        ));
        let a = (1, "realtime:a".to_owned());
        let b = (2, "realtime:b".to_owned());
        assert_eq!(who(&subs, "public", "todos"), vec![a.clone(), b.clone()]);
        assert_eq!(who(&subs, "public", "notes"), vec![a.clone(), b.clone()]);
        assert!(subs.any_named("todos") && subs.any_named("anything"));
        assert_eq!(
            who(&subs, "other", "todos"),
            vec![b.clone(), (2, "realtime:c".into())]
        );
        // A rejoin replaces the bindings; a leave removes every place.
        subs.add(sub(
            1,
            "realtime:a",
            json!([{"event": "*", "schema": "public", "table": "notes"}]),
        ));
        assert_eq!(who(&subs, "public", "todos"), vec![b.clone()]);
        // A binding on every schema: every change is wanted.
        assert_eq!(subs.tables(), None);
        let before = subs.generation();
        subs.remove(2, "realtime:b");
        assert_ne!(subs.generation(), before);
        let mut tables = subs.tables().unwrap();
        tables.sort();
        assert_eq!(
            tables,
            vec![
                ("other".to_owned(), "todos".to_owned()),
                ("public".to_owned(), "notes".to_owned())
            ]
        );
        assert!(subs.any_named("notes") && !subs.any_named("anything"));
        subs.remove(1, "realtime:a");
        subs.remove(2, "realtime:c");
        assert!(subs.is_empty());
        assert_eq!(subs.tables(), Some(vec![]));
        assert!(subs.inner.read().unwrap().places.is_empty());
    }

    #[test]
    fn eq_filters_are_found_by_the_row_s_value_and_others_by_scan() {
        let subs = Subscribers::default();
        let room = |conn: ConnId, filter: &str, typed: serde_json::Value| {
            let mut s = sub(
                conn,
                "realtime:r",
                json!([{"event": "*", "schema": "public", "table": "msgs", "filter": filter}]),
            );
            s.bindings[0].filters[0].typed = Some(vec![typed]);
            subs.add(s);
        };
        room(1, "room=eq.1", json!(1));
        room(2, "room=eq.2", json!(2));
        room(3, "name=eq.a", json!("a"));
        room(4, "room=gt.1", json!(1));
        let row = |v: serde_json::Value| v.as_object().cloned().unwrap();
        let conns = |r: serde_json::Map<String, serde_json::Value>| {
            let mut v: Vec<ConnId> = subs
                .of("public", "msgs", Some(&r))
                .iter()
                .map(|s| s.reach.conn)
                .collect();
            v.sort();
            v
        };
        // The eq channels of the row's values, plus the channel whose filter is not eq.
        assert_eq!(conns(row(json!({"room": 1, "name": "b"}))), vec![1, 4]);
        assert_eq!(conns(row(json!({"room": 2.0, "name": "a"}))), vec![2, 3, 4]);
        assert_eq!(conns(row(json!({"room": null}))), vec![4]);
        // Without a row (a change the stage cannot read) every channel is a candidate
        // only through `all`: eq channels need a value.
        subs.remove(1, "realtime:r");
        subs.remove(2, "realtime:r");
        subs.remove(3, "realtime:r");
        subs.remove(4, "realtime:r");
        assert!(subs.inner.read().unwrap().places.is_empty());
    }

    #[test]
    fn a_new_token_replaces_the_identity_checked() {
        let subs = Subscribers::default();
        subs.add(sub(
            1,
            "realtime:a",
            json!([{"event": "*", "schema": "public"}]),
        ));
        subs.set_identity(1, "realtime:a", "anon", "{\"sub\":\"x\"}");
        let s = &subs.of("public", "t", None)[0];
        assert_eq!(
            (s.role.as_str(), s.claims.as_str()),
            ("anon", "{\"sub\":\"x\"}")
        );
    }
}
