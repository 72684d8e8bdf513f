//! Postgres Changes bindings, as realtime-js asks for them:
//! `channel.on('postgres_changes', {event, schema, table, filter}, cb)` puts one binding per
//! call into the join's `config.postgres_changes`, and the join reply must echo each one,
//! in order, with an `id` (realtime-js compares event, schema, table and filter with `===`
//! and fails the subscription on a mismatch); each change event then lists in `ids` every
//! binding of the channel it matches.
//!
//! This file holds what a binding is and which changes it matches: parsing the bindings and
//! their filters (a binding that cannot be served is never ignored: `unserved.rs`), the reply,
//! and matching a drained change (`kind = 'change'`, `extension/src/change.rs`) by schema,
//! table, event and filter. Filters are evaluated here, on the change's record, before the
//! RLS check, as Supabase evaluates them; their values are those the join's check rendered
//! as the column's type renders them (`subscribable`), so a record's value and a filter's compare
//! as the same JSON. The patterns of `like`, `ilike`, `match` and `imatch` are the
//! exception: they mean what Postgres's `LIKE`, `ILIKE`, `~` and `~*` make of them (case
//! folding by the database's locale, POSIX regular expressions in Postgres's flavour), which
//! no Rust engine reproduces, so the database judges them in the delivery stage's call per
//! table (`deliver`, `realtime.match_patterns`); here they only need their column in the row.

use super::filter::{Change, Filter, Op};
use crate::client_text::{self, BadText};
use serde_json::{Map, Value};

/// Which change types a binding wants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    All,
    Insert,
    Update,
    Delete,
}

/// One `postgres_changes` binding of a join.
#[derive(Clone, Debug, PartialEq)]
pub struct Binding {
    /// Its place in the join's list, from 1.
    pub at: usize,
    pub id: u32,
    pub event: Event,
    /// `*` for every schema.
    pub schema: String,
    /// None for every table of the schema.
    pub table: Option<String>,
    /// Conditions that must all hold (none: every change).
    pub filters: Vec<Filter>,
    /// The columns to deliver (`select`, realtime-js 2.119); None: every column the
    /// subscriber's role may read.
    pub select: Option<Vec<String>>,
    /// What the client sent, echoed in the join reply (with `id`).
    pub(super) echo: Map<String, Value>,
}

/// Why a binding cannot be served (`unserved.rs`), or, `NotAList` and `OverLimit`, why a
/// join's bindings are refused whole (the join's error reply).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BindingError {
    NotAList,
    /// Neither `schema` nor `table`.
    NoParams {
        at: usize,
    },
    Malformed {
        at: usize,
        why: &'static str,
    },
    UnknownEvent {
        at: usize,
        event: String,
    },
    UnsupportedFilter {
        at: usize,
        op: String,
    },
    InvalidFilter {
        at: usize,
        filter: String,
    },
    /// A like or ilike pattern LIKE itself would refuse.
    InvalidPattern {
        at: usize,
        why: &'static str,
    },
    /// A match or imatch pattern over `MAX_FILTER_PATTERN_LENGTH` characters: a client's
    /// regular expression is evaluated for every change of its table.
    PatternTooLong {
        at: usize,
        op: &'static str,
        chars: usize,
        limit: usize,
    },
    /// The database's check refused it (`subscribable`): no such table, not published, a column
    /// the role may not read, a value of the wrong type...
    Rejected {
        at: usize,
        why: String,
    },
    /// A name or value no database call may carry (a NUL, a name longer than any
    /// identifier): refused before it reaches one (`client_text`).
    BadText {
        at: usize,
        bad: BadText,
    },
    /// Over one of the per-join bounds (`bounds`): the text names the setting.
    OverLimit(String),
}

impl BindingError {
    pub fn text(&self) -> String {
        match self {
            BindingError::NotAList => {
                "InvalidPostgresChanges: config.postgres_changes must be a list of bindings".into()
            }
            BindingError::Malformed { at, why } => {
                format!("InvalidPostgresChanges: binding {at}: {why}")
            }
            BindingError::NoParams { at } => {
                format!("InvalidPostgresChanges: binding {at}: a schema or a table is required")
            }
            BindingError::UnknownEvent { at, event } => format!(
                "InvalidPostgresChanges: binding {at}: event \"{event}\" is not one of *, INSERT, UPDATE, DELETE"
            ),
            BindingError::UnsupportedFilter { at, op } => format!(
                "PostgresChangesFilterNotSupported: binding {at}: operator \"{op}\" is not supported; use eq, neq, lt, lte, gt, gte, in, isdistinct, is, like, ilike, match or imatch, each optionally negated with not."
            ),
            BindingError::InvalidPattern { at, why } => {
                format!("InvalidPostgresChanges: binding {at}: {why}")
            }
            BindingError::PatternTooLong {
                at,
                op,
                chars,
                limit,
            } => format!(
                "InvalidPostgresChanges: binding {at}: the {op} pattern is {chars} characters long; MAX_FILTER_PATTERN_LENGTH allows {limit}"
            ),
            BindingError::Rejected { at, why } => {
                format!("InvalidPostgresChanges: binding {at}: {why}")
            }
            BindingError::BadText { at, bad } => {
                format!("InvalidPostgresChanges: binding {at}: {bad}")
            }
            BindingError::OverLimit(why) => format!("InvalidPostgresChanges: {why}"),
            BindingError::InvalidFilter { at, filter } => format!(
                "InvalidPostgresChanges: binding {at}: filter \"{filter}\" is not column=operator.value (several joined by commas)"
            ),
        }
    }
}

/// The bindings, or the first one's error (for the tests of what one binding parses to;
/// a join parses each on its own: `unserved::parse_each`).
pub fn parse_bindings(v: Option<&Value>) -> Result<Vec<Binding>, BindingError> {
    let list = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(BindingError::NotAList),
    };
    list.iter()
        .enumerate()
        .map(|(i, b)| parse_binding(i + 1, b))
        .collect()
}

pub(super) fn parse_binding(at: usize, b: &Value) -> Result<Binding, BindingError> {
    let Value::Object(o) = b else {
        return Err(BindingError::Malformed {
            at,
            why: "a binding must be an object",
        });
    };
    let text = |k: &str| -> Result<Option<String>, BindingError> {
        match o.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(BindingError::Malformed {
                at,
                why: "event, schema, table and filter must be strings",
            }),
        }
    };
    let event = match text("event")?.as_deref() {
        Some("*") => Event::All,
        Some(e) if e.eq_ignore_ascii_case("insert") => Event::Insert,
        Some(e) if e.eq_ignore_ascii_case("update") => Event::Update,
        Some(e) if e.eq_ignore_ascii_case("delete") => Event::Delete,
        Some(e) => {
            return Err(BindingError::UnknownEvent {
                at,
                event: e.to_owned(),
            })
        }
        // As Supabase: a binding without an event wants every one.
        None => Event::All,
    };
    let table = text("table")?;
    // As Supabase: a table without a schema is in `public`.
    let schema = match (text("schema")?, &table) {
        (Some(s), _) => s,
        (None, Some(_)) => "public".to_owned(),
        (None, None) => return Err(BindingError::NoParams { at }),
    };
    let table = table.filter(|t| t != "*");
    let select = match o.get("select") {
        None | Some(Value::Null) => None,
        Some(Value::Array(cols)) => Some(
            cols.iter()
                .map(|c| c.as_str().filter(|c| !c.is_empty()).map(str::to_owned))
                .collect::<Option<Vec<String>>>()
                .ok_or(BindingError::Malformed {
                    at,
                    why: "select must be a list of column names",
                })?,
        ),
        Some(_) => {
            return Err(BindingError::Malformed {
                at,
                why: "select must be a list of column names",
            })
        }
    };
    let filters = match text("filter")? {
        Some(f) if !f.is_empty() => parse_filters(at, &f)?,
        _ => Vec::new(),
    };
    // Every name and value here reaches `realtime.subscribable` and (the table) the
    // interest upload: one the database cannot take would fail those calls for everyone.
    let bad = |bad| BindingError::BadText { at, bad };
    if schema != "*" {
        client_text::identifier("schema", &schema).map_err(bad)?;
    }
    if let Some(t) = &table {
        client_text::identifier("table", t).map_err(bad)?;
    }
    for c in select.iter().flatten() {
        client_text::identifier("a select column", c).map_err(bad)?;
    }
    for f in &filters {
        client_text::identifier("a filter column", &f.column).map_err(bad)?;
        for v in &f.values {
            client_text::text("a filter value", v, usize::MAX).map_err(bad)?;
        }
    }
    let echo = echo_of(o);
    let id = binding_id(&echo, select.as_deref());
    Ok(Binding {
        at,
        id,
        event,
        schema,
        table,
        filters,
        select,
        echo,
    })
}

/// What the reply echoes of a binding: exactly the keys the client sent, so that `===` holds.
pub(super) fn echo_of(o: &Map<String, Value>) -> Map<String, Value> {
    let mut echo = Map::new();
    for k in ["event", "schema", "table", "filter"] {
        if let Some(v) = o.get(k).filter(|v| !v.is_null()) {
            echo.insert(k.to_owned(), v.clone());
        }
    }
    echo
}

/// A binding's id: a hash of what it asks for, `select` included (Supabase's is a phash2,
/// below 2^27), so the same binding has the same id in every join and two bindings that
/// differ only in their columns get events apart. (The reply echoes only event, schema,
/// table and filter: what realtime-js compares.)
pub(super) fn binding_id(echo: &Map<String, Value>, select: Option<&[String]>) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    let mut mix = |bytes: &[u8]| {
        for &b in bytes.iter().chain(&[0]) {
            h = (h ^ b as u32).wrapping_mul(0x0100_0193);
        }
    };
    for k in ["event", "schema", "table", "filter"] {
        mix(k.as_bytes());
        mix(echo
            .get(k)
            .and_then(Value::as_str)
            .unwrap_or("\u{0}")
            .as_bytes());
    }
    for c in select.unwrap_or_default() {
        mix(c.as_bytes());
    }
    h & ((1 << 27) - 1)
}

/// A binding's filter: conditions joined by commas outside quotes and parentheses, as
/// realtime-js's filter builder joins them.
fn parse_filters(at: usize, f: &str) -> Result<Vec<Filter>, BindingError> {
    let invalid = || BindingError::InvalidFilter {
        at,
        filter: f.to_owned(),
    };
    let mut parts = Vec::new();
    let (mut start, mut depth, mut quoted, mut escaped) = (0, 0i32, false, false);
    for (i, c) in f.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '(' if !quoted => depth += 1,
            ')' if !quoted => depth -= 1,
            ',' if !quoted && depth == 0 => {
                parts.push(&f[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if quoted || depth != 0 {
        return Err(invalid());
    }
    parts.push(&f[start..]);
    parts
        .into_iter()
        .map(|p| {
            parse_filter(at, p).map_err(|e| match e {
                BindingError::InvalidFilter { .. } => invalid(),
                other => other,
            })
        })
        .collect()
}

fn parse_filter(at: usize, f: &str) -> Result<Filter, BindingError> {
    let invalid = || BindingError::InvalidFilter {
        at,
        filter: f.to_owned(),
    };
    let (column, rest) = f.split_once('=').ok_or_else(invalid)?;
    let (negate, rest) = match rest.strip_prefix("not.") {
        Some(r) => (true, r),
        None => (false, rest),
    };
    let (op, value) = rest.split_once('.').ok_or_else(invalid)?;
    if column.is_empty() {
        return Err(invalid());
    }
    let op = match op {
        "eq" => Op::Eq,
        "neq" => Op::Neq,
        "lt" => Op::Lt,
        "lte" => Op::Lte,
        "gt" => Op::Gt,
        "gte" => Op::Gte,
        "in" => Op::In,
        "isdistinct" => Op::IsDistinct,
        "is" => Op::Is,
        "like" => Op::Like,
        "ilike" => Op::Ilike,
        "match" => Op::Match,
        "imatch" => Op::Imatch,
        other => {
            return Err(BindingError::UnsupportedFilter {
                at,
                op: other.to_owned(),
            })
        }
    };
    let values = match op {
        Op::In => {
            let inner = value
                .strip_prefix('(')
                .and_then(|v| v.strip_suffix(')'))
                .ok_or_else(invalid)?;
            split_list(inner).ok_or_else(invalid)?
        }
        Op::Is => {
            let v = value.to_ascii_lowercase();
            if !["null", "true", "false", "unknown"].contains(&v.as_str()) {
                return Err(invalid());
            }
            vec![v]
        }
        _ => vec![unquote(value).ok_or_else(invalid)?],
    };
    if matches!(op, Op::Like | Op::Ilike) && ends_with_escape(&values[0]) {
        // Postgres's own words; Supabase's check_equality_op raises them at every change.
        return Err(BindingError::InvalidPattern {
            at,
            why: "LIKE pattern must not end with escape character",
        });
    }
    Ok(Filter {
        column: column.to_owned(),
        op,
        negate,
        values,
        typed: None,
    })
}

/// Whether a LIKE pattern ends with a backslash that escapes nothing.
fn ends_with_escape(pattern: &str) -> bool {
    let trailing = pattern.chars().rev().take_while(|&c| c == '\\').count();
    trailing % 2 == 1
}

/// The binding's first match or imatch pattern over `limit` characters, as why it cannot be
/// served.
pub fn pattern_over(b: &Binding, limit: usize) -> Option<BindingError> {
    b.filters.iter().find_map(|f| {
        let chars = f.values.first()?.chars().count();
        (f.op.is_regex() && chars > limit).then(|| BindingError::PatternTooLong {
            at: b.at,
            op: f.op.name(),
            chars,
            limit,
        })
    })
}

/// A scalar as realtime-js's builder writes it: as is, or in double quotes (with `\"` and
/// `\\`) when it holds `,()"\` or surrounding spaces. None for an unclosed quote.
fn unquote(v: &str) -> Option<String> {
    let Some(inner) = v.strip_prefix('"') else {
        return Some(v.to_owned());
    };
    let inner = inner.strip_suffix('"')?;
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        out.push(if c == '\\' { chars.next()? } else { c });
    }
    Some(out)
}

/// The items of an `in.(...)` list: comma-separated, an item in double quotes may hold
/// commas and parentheses, `\"` and `\\` inside quotes are a quote and a backslash (as
/// postgrest-js quotes them). None when a quote is left open.
fn split_list(s: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = s.chars();
    let mut quoted = false;
    let mut was_quoted = false;
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') => quoted = false,
            (true, '\\') => cur.push(chars.next()?),
            (true, c) => cur.push(c),
            (false, '"') if cur.trim().is_empty() => {
                cur.clear();
                quoted = true;
                was_quoted = true;
            }
            (false, ',') => {
                out.push(if was_quoted {
                    cur.clone()
                } else {
                    cur.trim().to_owned()
                });
                cur.clear();
                was_quoted = false;
            }
            (false, c) => cur.push(c),
        }
    }
    if quoted {
        return None;
    }
    if !(s.is_empty() && out.is_empty()) {
        out.push(if was_quoted {
            cur
        } else {
            cur.trim().to_owned()
        });
    }
    Some(out)
}

impl Binding {
    /// Whether the change is one this binding asked for.
    pub fn matches(&self, c: &Change) -> bool {
        let event = match self.event {
            Event::All => true,
            Event::Insert => c.kind == "INSERT",
            Event::Update => c.kind == "UPDATE",
            Event::Delete => c.kind == "DELETE",
        };
        event
            && (self.schema == "*" || self.schema == c.schema)
            && self.table.as_deref().is_none_or(|t| t == c.table)
            && self.filters.iter().all(|f| f.matches(c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn bindings(v: Value) -> Result<Vec<Binding>, BindingError> {
        parse_bindings(Some(&v))
    }

    #[test]
    fn unsupported_or_malformed_bindings_are_refused_with_a_reason() {
        let err = |v: Value| bindings(v).unwrap_err().text();
        assert_eq!(
            err(json!([{"event": "*", "schema": "public", "table": "t", "filter": "name=regex.^a"}])),
            "PostgresChangesFilterNotSupported: binding 1: operator \"regex\" is not supported; use eq, neq, lt, lte, gt, gte, in, isdistinct, is, like, ilike, match or imatch, each optionally negated with not."
        );
        assert_eq!(
            err(
                json!([{"event": "*", "schema": "public", "table": "t", "filter": r"name=like.a\"}])
            ),
            "InvalidPostgresChanges: binding 1: LIKE pattern must not end with escape character"
        );
        assert!(bindings(
            json!([{"event": "*", "schema": "public", "filter": r"name=like.a\\\\"}])
        )
        .is_ok());
        assert!(
            err(json!([{"event": "*", "schema": "public", "filter": "ok=is.maybe"}]))
                .contains("InvalidPostgresChanges")
        );
        assert!(
            err(json!([{"event": "TRUNCATE", "schema": "public"}])).contains("event \"TRUNCATE\"")
        );
        assert!(err(json!([{"event": "*"}])).contains("a schema or a table is required"));
        assert!(
            err(json!([{"event": "*", "schema": "public", "filter": "nonsense"}]))
                .contains("not column=operator.value")
        );
        assert!(
            err(json!([{"event": "*", "schema": "public", "filter": "id=in.(1,\"2"}]))
                .contains("InvalidPostgresChanges")
        );
        assert!(err(json!({"event": "*"})).contains("must be a list"));
        assert_eq!(parse_bindings(None), Ok(vec![]));
    }

    #[test]
    fn match_and_imatch_are_left_to_the_database_and_capped_in_length() {
        let b = bindings(json!([
            {"event": "*", "schema": "public", "table": "todos", "filter": "name=match.^A(b|c)"},
            {"event": "*", "schema": "public", "table": "todos", "filter": "name=not.imatch.x,id=eq.3"}
        ]))
        .unwrap();
        assert_eq!(
            (b[0].filters[0].op, b[0].filters[0].negate),
            (Op::Match, false)
        );
        assert_eq!(b[0].filters[0].values, vec!["^A(b|c)"]);
        assert_eq!(
            (b[1].filters[0].op, b[1].filters[0].negate),
            (Op::Imatch, true)
        );
        // Only the column's presence and the other conditions are judged here.
        let rec = json!({"id": 3, "name": "zzz"});
        let ins = change("INSERT", &rec, &Value::Null);
        assert!(b[0].matches(&ins) && b[1].matches(&ins));
        let other = json!({"id": 4, "name": "zzz"});
        assert!(!b[1].matches(&change("INSERT", &other, &Value::Null)));
        let no_name = json!({"id": 3});
        assert!(!b[0].matches(&change("INSERT", &no_name, &Value::Null)));
        // The cap counts characters, not bytes, and names the setting.
        assert_eq!(pattern_over(&b[0], 7), None);
        assert_eq!(
            pattern_over(&b[0], 6).map(|e| e.text()),
            Some("InvalidPostgresChanges: binding 1: the match pattern is 7 characters long; MAX_FILTER_PATTERN_LENGTH allows 6".into())
        );
        let long_like = bindings(
            json!([{"event": "*", "schema": "public", "filter": format!("name=like.{}", "é".repeat(300))}]),
        )
        .unwrap();
        assert_eq!(
            pattern_over(&long_like[0], 6),
            None,
            "only regular expressions are capped"
        );
    }

    #[test]
    fn select_is_kept_for_delivery_and_not_echoed() {
        let b = bindings(
            json!([{"event": "*", "schema": "public", "table": "t", "select": ["id", "title"]}]),
        )
        .unwrap();
        assert_eq!(b[0].select, Some(vec!["id".to_owned(), "title".to_owned()]));
        assert!(b[0].echo.get("select").is_none());
        let all = bindings(json!([{"event": "*", "schema": "public", "table": "t"}])).unwrap();
        assert_ne!(
            all[0].id, b[0].id,
            "bindings that differ in select get events apart"
        );
        let bad =
            bindings(json!([{"event": "*", "schema": "public", "select": "id"}])).unwrap_err();
        assert!(
            bad.text().contains("select must be a list"),
            "{}",
            bad.text()
        );
        assert!(bindings(json!([{"event": "*", "schema": "public", "select": [1]}])).is_err());
    }

    #[test]
    fn in_lists_are_read_as_postgrest_js_quotes_them() {
        let f = |s: &str| parse_filter(1, s).unwrap().values;
        assert_eq!(f("id=in.(1,2,3)"), vec!["1", "2", "3"]);
        assert_eq!(
            f(r#"name=in.("a,b",c,"say \"hi\"","x)y")"#),
            vec!["a,b", "c", "say \"hi\"", "x)y"]
        );
        assert_eq!(f("id=in.()"), Vec::<String>::new());
        assert_eq!(f("name=eq.a.b=c"), vec!["a.b=c"]);
        // Scalars are quoted like list items when they hold reserved characters.
        assert_eq!(f(r#"name=eq." a,(b) \"c\" ""#), vec![r#" a,(b) "c" "#]);
    }

    #[test]
    fn several_conditions_split_at_top_level_commas_only() {
        let b = bindings(json!([{"event": "*", "schema": "public", "table": "t",
            "filter": r#"room=eq.1,name=in.("a,b",c),title=not.like."x,y%",done=is.TRUE"#}]))
        .unwrap();
        let f = &b[0].filters;
        assert_eq!(f.len(), 4);
        assert_eq!(
            (f[0].column.as_str(), f[0].op, f[0].negate),
            ("room", Op::Eq, false)
        );
        assert_eq!(f[1].values, vec!["a,b", "c"]);
        assert_eq!(
            (f[2].op, f[2].negate, f[2].values[0].as_str()),
            (Op::Like, true, "x,y%")
        );
        assert_eq!((f[3].op, f[3].values[0].as_str()), (Op::Is, "true"));
        // The reply echoes the filter text as sent.
        assert_eq!(
            b[0].echo["filter"],
            r#"room=eq.1,name=in.("a,b",c),title=not.like."x,y%",done=is.TRUE"#
        );
    }

    #[test]
    fn the_2026_operators_and_negation_follow_sql() {
        let rec = json!({"id": 3, "name": "Ab_c%d", "done": true, "gone": null});
        let ins = change("INSERT", &rec, &Value::Null);
        let one = |filter: &str| {
            bindings(
                json!([{"event": "*", "schema": "public", "table": "todos", "filter": filter}]),
            )
            .unwrap()
            .remove(0)
        };
        let holds = |filter: &str| one(filter).matches(&ins);
        // Patterns are the database's: here only their column's presence counts.
        assert!(holds("name=like.x%") && holds("name=not.ilike.%") && !holds("nope=like.%"));
        assert!(holds("done=is.true") && !holds("done=is.false") && holds("gone=is.null"));
        assert!(holds("done=not.is.false") && holds("name=not.is.null"));
        assert!(holds("id=isdistinct.4") && !holds("id=isdistinct.3"));
        // `null` is a value of the column's type (the text "null"), not NULL: Supabase's.
        assert!(holds("gone=isdistinct.1") && holds("gone=isdistinct.null"));
        assert!(holds("id=not.eq.4") && !holds("id=not.in.(1,3)"));
        // NULL compared stays unknown, and NOT unknown is not true either.
        assert!(!holds("gone=eq.1") && !holds("gone=not.eq.1"));
        assert!(holds("id=gt.1,done=is.true") && !holds("id=gt.1,done=is.false"));
        // The typed values the join's check rendered are what is compared.
        let mut typed = one("id=isdistinct.3");
        assert!(!typed.matches(&ins));
        typed.filters[0].typed = Some(vec![json!(4)]);
        assert!(typed.matches(&ins));
    }

    /// Supabase's verdicts on the operators evaluated here (`regress/fixtures/
    /// filter_verdicts.csv`: each row's `supabase` column is what its
    /// `realtime.check_equality_op` returned for that column type, value, operator, negation
    /// and filter value; NULL is no delivery). The rows of like, ilike, match and imatch are
    /// the database's and are compared in `regress/sql/filter_verdicts.sql`.
    #[test]
    fn verdicts_are_supabase_s_check_equality_op_s() {
        let facts = include_str!("../../../regress/fixtures/filter_verdicts.csv");
        let value = |typ: &str, v: &str| match (typ, v) {
            (_, "NULL") => Value::Null,
            ("integer", v) => json!(v.parse::<i64>().unwrap()),
            ("boolean", v) => json!(v == "true"),
            (_, v) => json!(v),
        };
        let mut checked = 0;
        for line in facts.lines().skip(1) {
            let f: Vec<&str> = line.split(',').collect();
            let [typ, v, op, negate, pattern, supabase] = f[..] else {
                panic!("{line}")
            };
            if matches!(op, "like" | "ilike" | "match" | "imatch") {
                continue;
            }
            let not = if negate == "t" { "not." } else { "" };
            let filter = format!("v={not}{op}.{pattern}");
            let mut b = bindings(
                json!([{"event": "*", "schema": "public", "table": "todos", "filter": filter}]),
            )
            .unwrap()
            .remove(0);
            let rec = json!({"v": value(typ, v)});
            let ins = change("INSERT", &rec, &Value::Null);
            let expected = supabase == "t";
            assert_eq!(b.matches(&ins), expected, "untyped: {line}");
            if op != "is" {
                // As the join's check renders the value for the column's type.
                b.filters[0].typed = Some(vec![value(typ, pattern)]);
                assert_eq!(b.matches(&ins), expected, "typed: {line}");
            }
            checked += 1;
        }
        assert_eq!(checked, 122);
    }

    fn change<'a>(kind: &'a str, record: &'a Value, old: &'a Value) -> Change<'a> {
        Change {
            schema: "public",
            table: "todos",
            kind,
            record: record.as_object(),
            old_record: old.as_object(),
        }
    }

    #[test]
    fn changes_match_by_schema_table_event_and_filter() {
        let rec =
            json!({"id": 9007199254740993u64, "n": 2.5, "done": false, "name": "b", "gone": null});
        let old = json!({"id": 7});
        let ins = change("INSERT", &rec, &Value::Null);
        let del = change("DELETE", &Value::Null, &old);
        let one = |v: Value| bindings(json!([v])).unwrap().remove(0);
        assert!(one(json!({"event": "*", "schema": "public"})).matches(&ins));
        assert!(one(json!({"event": "*", "schema": "*"})).matches(&del));
        assert!(!one(json!({"event": "UPDATE", "schema": "public"})).matches(&ins));
        assert!(!one(json!({"event": "*", "schema": "other"})).matches(&ins));
        assert!(!one(json!({"event": "*", "schema": "public", "table": "notes"})).matches(&ins));
        let filtered = |f: &str, c: &Change| {
            one(json!({"event": "*", "schema": "public", "table": "todos", "filter": f})).matches(c)
        };
        // Integers beyond 2^53 compare exactly.
        assert!(filtered("id=eq.9007199254740993", &ins));
        assert!(!filtered("id=eq.9007199254740992", &ins));
        assert!(
            filtered("n=gt.2", &ins) && filtered("n=lte.2.5", &ins) && !filtered("n=lt.2.5", &ins)
        );
        assert!(filtered("done=eq.false", &ins) && !filtered("done=eq.true", &ins));
        assert!(filtered("name=in.(a,b)", &ins) && !filtered("name=in.(a,c)", &ins));
        assert!(filtered("name=neq.a", &ins));
        // NULL and missing columns match nothing, as SQL comparisons with NULL do.
        assert!(!filtered("gone=eq.null", &ins) && !filtered("gone=neq.1", &ins));
        assert!(!filtered("missing=eq.1", &ins));
        // Deletes are filtered on the old row.
        assert!(filtered("id=eq.7", &del) && !filtered("id=eq.9007199254740993", &del));
    }
}
