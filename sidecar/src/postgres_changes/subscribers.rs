//! Which channels of this sidecar listen to which tables: the one shared state of Postgres
//! Changes. A channel is registered when its join is admitted, its identity replaced when
//! its token is, and it is removed when it leaves (or its socket closes); the drainer asks,
//! per changed table, who might want the change.

use super::binding::Binding;
use crate::frame::Vsn;
use crate::hub::ConnId;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};
use tokio::sync::{mpsc, Notify};
use tokio_tungstenite::tungstenite::Message;

/// One joined channel with `postgres_changes` bindings.
pub struct Subscriber {
    pub conn: ConnId,
    pub vsn: Vsn,
    /// The channel's topic, `realtime:...`.
    pub topic: String,
    pub join_ref: Option<String>,
    pub bindings: Vec<Binding>,
    /// The JWT's role and claims (JSON): the identity RLS checks the changes for.
    pub role: String,
    pub claims: String,
    pub tx: mpsc::Sender<Message>,
    pub too_slow: Arc<Notify>,
}

/// A channel: its connection and topic.
type ChannelKey = (ConnId, String);

/// Where a binding listens: (schema or `*`, table or None for every table).
type Place = (String, Option<String>);

#[derive(Default)]
struct Inner {
    channels: HashMap<ChannelKey, Arc<Subscriber>>,
    places: HashMap<Place, HashSet<ChannelKey>>,
}

#[derive(Default)]
pub struct Subscribers {
    inner: RwLock<Inner>,
}

fn places(sub: &Subscriber) -> HashSet<Place> {
    sub.bindings
        .iter()
        .map(|b| (b.schema.clone(), b.table.clone()))
        .collect()
}

impl Subscribers {
    /// Registers a channel (replacing its earlier registration, if any).
    pub fn add(&self, sub: Subscriber) {
        let key = (sub.conn, sub.topic.clone());
        let mut inner = self.inner.write().unwrap();
        if let Some(old) = inner.channels.remove(&key) {
            remove_places(&mut inner, &key, &old);
        }
        for place in places(&sub) {
            inner.places.entry(place).or_default().insert(key.clone());
        }
        inner.channels.insert(key, Arc::new(sub));
    }

    pub fn remove(&self, conn: ConnId, topic: &str) {
        let key = (conn, topic.to_owned());
        let mut inner = self.inner.write().unwrap();
        if let Some(old) = inner.channels.remove(&key) {
            remove_places(&mut inner, &key, &old);
        }
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
                topic: sub.topic.clone(),
                join_ref: sub.join_ref.clone(),
                tx: sub.tx.clone(),
                too_slow: sub.too_slow.clone(),
                ..**sub
            };
            *sub = Arc::new(updated);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.inner.read().unwrap().channels.is_empty()
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

    /// The channels with a binding on table `schema.table` (by name, by schema or on every
    /// schema), each once.
    pub fn of(&self, schema: &str, table: &str) -> Vec<Arc<Subscriber>> {
        let inner = self.inner.read().unwrap();
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        let candidates = [
            (schema, Some(table)),
            (schema, None),
            ("*", Some(table)),
            ("*", None),
        ];
        for (s, t) in candidates {
            let place = (s.to_owned(), t.map(str::to_owned));
            for key in inner.places.get(&place).into_iter().flatten() {
                if seen.insert(key) {
                    out.push(inner.channels[key].clone());
                }
            }
        }
        out
    }
}

fn remove_places(inner: &mut Inner, key: &ChannelKey, old: &Subscriber) {
    for place in places(old) {
        if let Some(set) = inner.places.get_mut(&place) {
            set.remove(key);
            if set.is_empty() {
                inner.places.remove(&place);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres_changes::parse_bindings;
    use serde_json::json;

    fn sub(conn: ConnId, topic: &str, bindings: serde_json::Value) -> Subscriber {
        let (tx, _) = mpsc::channel(1);
        Subscriber {
            conn,
            vsn: Vsn::V2,
            topic: topic.into(),
            join_ref: None,
            bindings: parse_bindings(Some(&bindings)).unwrap(),
            role: "authenticated".into(),
            claims: "{}".into(),
            tx,
            too_slow: Arc::new(Notify::new()),
        }
    }

    fn who(subs: &Subscribers, schema: &str, table: &str) -> Vec<(ConnId, String)> {
        let mut v: Vec<_> = subs
            .of(schema, table)
            .iter()
            .map(|s| (s.conn, s.topic.clone()))
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
        subs.remove(1, "realtime:a");
        subs.remove(2, "realtime:b");
        subs.remove(2, "realtime:c");
        assert!(subs.is_empty());
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
        let s = &subs.of("public", "t")[0];
        assert_eq!(
            (s.role.as_str(), s.claims.as_str()),
            ("anon", "{\"sub\":\"x\"}")
        );
    }
}
