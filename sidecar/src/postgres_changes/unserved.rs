//! A binding the server cannot serve, as Supabase treats one: the channel still joins (its
//! broadcast and presence work), the join reply lists the binding in its place with an id
//! (realtime-js compares the reply's bindings with its own one by one and fails the channel
//! on a mismatch), it receives nothing, and a `system` message `{extension:
//! "postgres_changes", status: "error", message}` says why, in Supabase's words with ours
//! after them. Unlike Supabase, whose one subscription query fails every binding of the
//! channel with the first bad one, the channel's other bindings are served.
//!
//! Cannot be served: what does not parse (an unknown event or operator, a malformed filter,
//! neither schema nor table, a name or value no database call may carry, a regular
//! expression over MAX_FILTER_PATTERN_LENGTH) and what the database's check refuses
//! (`subscribable`: no such table, not published, a column the role may not read, a value
//! of the wrong type...). What bounds a join as a whole (MAX_BINDINGS_PER_JOIN and the
//! connection's, address's and sidecar's shares) still refuses the join.

use super::binding::{binding_id, echo_of, parse_binding, Binding, BindingError};
use serde_json::{json, Map, Value};

/// Parses a join's `config.postgres_changes` (absent or null: no bindings), each binding on
/// its own: those that cannot be served are kept apart with why. Err only
/// when the list is no list.
pub fn parse_each(v: Option<&Value>) -> Result<(Vec<Binding>, Vec<Unserved>), BindingError> {
    let list = match v {
        None | Some(Value::Null) => return Ok((Vec::new(), Vec::new())),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(BindingError::NotAList),
    };
    let (mut served, mut unserved) = (Vec::new(), Vec::new());
    for (i, b) in list.iter().enumerate() {
        match parse_binding(i + 1, b) {
            Ok(b) => served.push(b),
            Err(e) => unserved.push(Unserved::new(i + 1, b.as_object(), e)),
        }
    }
    Ok((served, unserved))
}

/// The join reply's `postgres_changes`: every binding in the client's order as the client
/// sent it, with its id, the unserved in their places.
pub fn reply(bindings: &[Binding], unserved: &[Unserved]) -> Value {
    let mut all: Vec<(usize, Value)> = bindings
        .iter()
        .map(|b| {
            let mut o = b.echo.clone();
            o.insert("id".into(), json!(b.id));
            (b.at, Value::Object(o))
        })
        .chain(unserved.iter().map(|u| (u.at, u.reply_entry())))
        .collect();
    // In the client's order, the unserved in their places.
    all.sort_by_key(|e| e.0);
    Value::Array(all.into_iter().map(|e| e.1).collect())
}

#[derive(Clone, Debug, PartialEq)]
pub struct Unserved {
    /// Its place in the join's list, from 1.
    pub at: usize,
    pub id: u32,
    /// What the client sent, echoed in the reply.
    echo: Map<String, Value>,
    pub error: BindingError,
}

impl Unserved {
    /// `binding` is what the client sent (None: not even an object).
    pub fn new(at: usize, binding: Option<&Map<String, Value>>, error: BindingError) -> Self {
        let echo = binding.map(echo_of).unwrap_or_default();
        Unserved {
            at,
            id: binding_id(&echo, None),
            echo,
            error,
        }
    }

    /// A binding that parsed but cannot be served (a pattern too long, the database's check).
    pub fn of(b: &Binding, error: BindingError) -> Self {
        Unserved {
            at: b.at,
            id: b.id,
            echo: b.echo.clone(),
            error,
        }
    }

    /// Its entry in the join reply, as a served binding's.
    pub fn reply_entry(&self) -> Value {
        let mut o = self.echo.clone();
        o.insert("id".into(), json!(self.id));
        Value::Object(o)
    }

    /// The `system` message's text: Supabase's for the kind of failure, then ours.
    pub fn message(&self) -> String {
        let ours = self.error.text();
        match &self.error {
            BindingError::NoParams { .. } => format!(
                "No subscription params provided. Please provide at least a `schema` or `table` to subscribe to: {}",
                Value::Object(self.echo.clone())
            ),
            BindingError::UnsupportedFilter { .. }
            | BindingError::InvalidFilter { .. }
            | BindingError::InvalidPattern { .. }
            | BindingError::PatternTooLong { .. } => {
                format!("Error parsing `filter` params: {ours}")
            }
            BindingError::Rejected { .. } => format!(
                "Unable to subscribe to changes with given parameters. Please check Realtime is enabled for the given connect parameters: [{}]. {ours}",
                self.params()
            ),
            _ => format!("Unable to subscribe to changes with given parameters: {ours}"),
        }
    }

    /// The binding's parameters as Supabase logs them: `event: *, schema: public, table: t`.
    fn params(&self) -> String {
        ["event", "schema", "table", "filter"]
            .iter()
            .filter_map(|k| {
                let v = self.echo.get(*k)?;
                Some(format!(
                    "{k}: {}",
                    v.as_str().map_or(v.to_string(), str::to_owned)
                ))
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::super::binding::parse_bindings;
    use super::{parse_each, reply};
    use serde_json::{json, Value};

    #[test]
    fn the_reply_echoes_each_binding_in_order_with_a_stable_id() {
        let b = parse_bindings(Some(&json!([
            {"event": "*", "schema": "public", "table": "todos", "filter": "id=eq.5"},
            {"event": "INSERT", "schema": "public"},
            {"event": "DELETE", "schema": "public", "table": "todos"}
        ])))
        .unwrap();
        let r = reply(&b, &[]);
        let ids: Vec<u64> = r
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["id"].as_u64().unwrap())
            .collect();
        assert_eq!(
            r,
            json!([
                {"id": ids[0], "event": "*", "schema": "public", "table": "todos", "filter": "id=eq.5"},
                {"id": ids[1], "event": "INSERT", "schema": "public"},
                {"id": ids[2], "event": "DELETE", "schema": "public", "table": "todos"}
            ])
        );
        // No filter key when the client sent none: realtime-js compares with ===.
        assert!(r[1].get("filter").is_none() && r[1].get("table").is_none());
        assert!(ids.iter().all(|&id| id < 1 << 27));
        assert_eq!(
            ids[0],
            parse_bindings(Some(&json!([
                {"event": "*", "schema": "public", "table": "todos", "filter": "id=eq.5"}
            ])))
            .unwrap()[0]
                .id as u64
        );
        assert_ne!(ids[0], ids[2]);
    }

    #[test]
    fn a_bad_binding_keeps_its_place_and_id_and_says_why_in_supabase_s_words() {
        let (served, unserved) = parse_each(Some(&json!([
            {"event": "*", "schema": "public", "table": "todos"},
            {"event": "*", "schema": "public", "table": "todos", "filter": "id=regex.5"},
            {"event": "BOGUS", "schema": "public"},
            {"event": "INSERT"},
            {"table": "notes"},
            "not an object"
        ])))
        .unwrap();
        // A missing event means every one, a missing schema `public` (as Supabase).
        assert_eq!(served.iter().map(|b| b.at).collect::<Vec<_>>(), [1, 5]);
        assert_eq!(served[1].schema, "public");
        assert_eq!(served[1].event, super::super::binding::Event::All);
        assert_eq!(
            unserved.iter().map(|u| u.at).collect::<Vec<_>>(),
            [2, 3, 4, 6]
        );
        assert!(unserved[0].message().starts_with("Error parsing `filter` params: PostgresChangesFilterNotSupported: binding 2: operator \"regex\""));
        assert_eq!(
            unserved[2].message(),
            "No subscription params provided. Please provide at least a `schema` or `table` to subscribe to: {\"event\":\"INSERT\"}"
        );
        let r = reply(&served, &unserved);
        let entries = r.as_array().unwrap();
        assert_eq!(entries.len(), 6);
        assert_eq!(entries[1]["filter"], "id=regex.5");
        assert_eq!(entries[2]["event"], "BOGUS");
        assert_eq!(entries[5], json!({"id": entries[5]["id"]}));
        assert!(entries.iter().all(|e| e["id"].as_u64().is_some()));
        assert_eq!(
            entries[4].get("schema"),
            None::<&Value>,
            "echoes only what was sent"
        );
    }
}
