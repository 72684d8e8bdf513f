//! A binding's filters (`column=op.value`, Supabase's operators) and the change they judge:
//! evaluated on the change's record before the RLS check, as Supabase evaluates them, their
//! values those the join's check rendered as the column's type renders them (`subscribable`), so a
//! record's value and a filter's compare as the same JSON. Parsing them is `binding`'s.

use serde_json::{Map, Value};

/// A condition on one column, as realtime-js's filter builder writes it:
/// `column=[not.]op.value`; a binding's filter is several of them joined by `,` (all must
/// hold).
#[derive(Clone, Debug, PartialEq)]
pub struct Filter {
    pub column: String,
    pub op: Op,
    /// `not.`: the condition negated, as SQL's NOT (a NULL comparison stays not true).
    pub negate: bool,
    /// One value, or the list of `in.(a,b)`, as the client wrote them (unquoted).
    pub values: Vec<String>,
    /// The same values as the column's type renders them in a record (`subscribable`), for the
    /// comparison operators; None for a binding on a whole schema, whose column's type is
    /// known only change by change, and for like, ilike and is, whose value is no value of
    /// the column.
    pub typed: Option<Vec<Value>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Eq,
    Neq,
    Lt,
    Lte,
    Gt,
    Gte,
    In,
    /// `IS DISTINCT FROM`: neq that treats NULL as a value.
    IsDistinct,
    /// `IS NULL | TRUE | FALSE | UNKNOWN`.
    Is,
    /// SQL LIKE: `%` any run of characters, `_` any one, `\` escapes (`*` is a character,
    /// as in Supabase's `check_equality_op`, which hands the pattern to LIKE untouched).
    /// Judged by the database (`deliver`), as the next three.
    Like,
    Ilike,
    /// POSIX regular expressions as Postgres's `~` and `~*` read them.
    Match,
    Imatch,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Eq => "eq",
            Op::Neq => "neq",
            Op::Lt => "lt",
            Op::Lte => "lte",
            Op::Gt => "gt",
            Op::Gte => "gte",
            Op::In => "in",
            Op::IsDistinct => "isdistinct",
            Op::Is => "is",
            Op::Like => "like",
            Op::Ilike => "ilike",
            Op::Match => "match",
            Op::Imatch => "imatch",
        }
    }

    /// A pattern, judged by the database rather than here.
    pub fn is_pattern(self) -> bool {
        matches!(self, Op::Like | Op::Ilike | Op::Match | Op::Imatch)
    }

    /// A regular expression, whose length is capped (`MAX_FILTER_PATTERN_LENGTH`).
    pub fn is_regex(self) -> bool {
        matches!(self, Op::Match | Op::Imatch)
    }
}

/// What matching needs of a drained change (its `data`).
pub struct Change<'a> {
    pub schema: &'a str,
    pub table: &'a str,
    /// INSERT, UPDATE or DELETE.
    pub kind: &'a str,
    pub record: Option<&'a Map<String, Value>>,
    pub old_record: Option<&'a Map<String, Value>>,
}

impl<'a> Change<'a> {
    /// Reads the fields of a change's `data`; None when it is not a deliverable change (a
    /// table dropped or altered before it was drained carries only errors).
    pub fn from_data(data: &'a Value) -> Option<Change<'a>> {
        Some(Change {
            schema: data.get("schema")?.as_str()?,
            table: data.get("table")?.as_str()?,
            kind: data.get("type")?.as_str()?,
            record: data.get("record").and_then(Value::as_object),
            old_record: data.get("old_record").and_then(Value::as_object),
        })
    }
}

impl Filter {
    /// Whether the filter's values can be ordered, as lt, lte, gt and gte need: numbers,
    /// text and booleans can; arrays and JSON documents only compare for equality here.
    pub fn orderable(&self) -> bool {
        !matches!(self.op, Op::Lt | Op::Lte | Op::Gt | Op::Gte)
            || self
                .typed
                .iter()
                .flatten()
                .all(|v| matches!(v, Value::Number(_) | Value::String(_) | Value::Bool(_)))
    }

    /// Deletes are filtered on the old row, as Supabase filters them; the others on the new.
    /// A column the row does not carry holds no condition (not even a negated one).
    pub(super) fn matches(&self, c: &Change) -> bool {
        let row = if c.kind == "DELETE" {
            c.old_record
        } else {
            c.record
        };
        let Some(v) = row.and_then(|r| r.get(&self.column)) else {
            return false;
        };
        if self.op.is_pattern() {
            // Judged by the database (`deliver`), negation included.
            return true;
        }
        // SQL's three values: None is NULL, which NOT leaves NULL; only true matches.
        let holds = self.eval(v);
        holds.map(|h| h != self.negate).unwrap_or(false)
    }

    fn eval(&self, v: &Value) -> Option<bool> {
        use std::cmp::Ordering::*;
        let ord = |i: usize| match &self.typed {
            Some(typed) => compare_json(v, &typed[i]),
            None => compare(v, &self.values[i]),
        };
        match self.op {
            Op::In => {
                if v.is_null() {
                    return None;
                }
                Some((0..self.values.len()).any(|i| ord(i) == Some(Equal)))
            }
            Op::IsDistinct => {
                // `null` is the column type's value 'null' (Supabase's check_equality_op casts
                // it): the text "null", never NULL; is.null asks for NULL.
                let other_null = match &self.typed {
                    Some(typed) => typed[0].is_null(),
                    None => false,
                };
                Some(match (v.is_null(), other_null) {
                    (true, true) => false,
                    (true, false) | (false, true) => true,
                    (false, false) => ord(0) != Some(Equal),
                })
            }
            Op::Is => Some(match self.values[0].as_str() {
                "null" | "unknown" => v.is_null(),
                "true" => *v == Value::Bool(true),
                _ => *v == Value::Bool(false),
            }),
            // Never asked: `matches` leaves them to the database.
            Op::Like | Op::Ilike | Op::Match | Op::Imatch => None,
            op => {
                let ord = ord(0)?;
                Some(match op {
                    Op::Eq => ord == Equal,
                    Op::Neq => ord != Equal,
                    Op::Lt => ord == Less,
                    Op::Lte => ord != Greater,
                    Op::Gt => ord == Greater,
                    _ => ord != Less,
                })
            }
        }
    }
}

/// Compares a record's value with a filter's value as the column's type rendered it:
/// numbers as numbers (integers exactly), strings by their bytes (timestamps are rendered in
/// UTC, so their text order is their time order; text is ordered by code point, not by a
/// collation), booleans as booleans, other JSON (arrays, objects) by their text: only
/// equality is meaningful there, and the join refuses ordering operators on such columns
/// (`Filter::orderable`). None for NULL.
fn compare_json(v: &Value, w: &Value) -> Option<std::cmp::Ordering> {
    match (v, w) {
        (Value::Null, _) | (_, Value::Null) => None,
        (Value::Number(a), Value::Number(b)) => match (a.as_i64(), b.as_i64()) {
            (Some(a), Some(b)) => Some(a.cmp(&b)),
            _ => a.as_f64()?.partial_cmp(&b.as_f64()?),
        },
        (Value::String(a), Value::String(b)) => Some(a.cmp(b)),
        (Value::Bool(a), Value::Bool(b)) => Some(a.cmp(b)),
        (a, b) => Some(a.to_string().cmp(&b.to_string())),
    }
}

/// Compares a record's value with a filter's text as the column's type would: numbers as
/// numbers, booleans as booleans, the rest as text. None for NULL, or a value that cannot be
/// read as the column's kind.
fn compare(v: &Value, text: &str) -> Option<std::cmp::Ordering> {
    match v {
        Value::Null => None,
        Value::Number(n) => {
            // Integers exactly (ids beyond 2^53 are common), others as floats.
            if let (Some(a), Ok(b)) = (n.as_i64(), text.parse::<i64>()) {
                return Some(a.cmp(&b));
            }
            n.as_f64()?.partial_cmp(&text.parse::<f64>().ok()?)
        }
        Value::Bool(b) => match text {
            "true" | "t" => Some(b.cmp(&true)),
            "false" | "f" => Some(b.cmp(&false)),
            _ => None,
        },
        Value::String(s) => Some(s.as_str().cmp(text)),
        // Arrays and JSON objects: compared by their JSON text.
        other => Some(other.to_string().as_str().cmp(text)),
    }
}
