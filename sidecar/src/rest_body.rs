//! The batch route's body, `{"messages": [...]}`, read with a bound on what is built: at
//! most MAX_REST_MESSAGES_PER_REQUEST messages become JSON values; the rest of the list is
//! only scanned (checked as JSON, not allocated) and counted, so a batch too large is
//! refused at the cost of reading it. Built whole, a full 1 MB body of 18,000 messages cost
//! a tokio worker tens of milliseconds and was a sixth of the sidecar's CPU in the soak's two
//! REST floods (`pgbench/RESULTS.md`), while every message past the bound was refused anyway.

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use std::fmt;

/// The `messages` list: its first `max` items, and how many it has.
#[derive(Debug, PartialEq)]
pub struct Listed {
    pub items: Vec<Value>,
    pub count: usize,
}

/// The body's `messages` list (None when the body is not an object or the key is not a
/// list), or why the body is not JSON.
pub fn messages(body: &[u8], max: usize) -> Result<Option<Listed>, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let listed = Reader { max, top: true }.deserialize(&mut de)?;
    de.end()?;
    Ok(listed)
}

/// Reads the body's object (`top`), then the list under its `messages` key. Whatever
/// another kind of value stands in either place is scanned and read as None.
#[derive(Clone, Copy)]
struct Reader {
    max: usize,
    top: bool,
}

impl<'de> DeserializeSeed<'de> for Reader {
    type Value = Option<Listed>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Reader {
    type Value = Option<Listed>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        while let Some(key) = map.next_key::<String>()? {
            if self.top && key == "messages" {
                // A repeated key: the last one counts, as in a parsed object.
                found = map.next_value_seed(Reader { top: false, ..self })?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found.filter(|_| self.top))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        if !self.top {
            while items.len() < self.max {
                match seq.next_element::<Value>()? {
                    Some(v) => items.push(v),
                    None => {
                        let count = items.len();
                        return Ok(Some(Listed { items, count }));
                    }
                }
            }
        }
        let mut count = items.len();
        while seq.next_element::<IgnoredAny>()?.is_some() {
            count += 1;
        }
        Ok((!self.top).then_some(Listed { items, count }))
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(body: &str, max: usize) -> Option<Listed> {
        messages(body.as_bytes(), max).unwrap()
    }

    #[test]
    fn builds_at_most_max_messages_and_counts_the_rest() {
        let body = json!({"messages": [1, {"a": [2]}, "x", null], "other": {"k": []}});
        assert_eq!(
            read(&body.to_string(), 2),
            Some(Listed {
                items: vec![json!(1), json!({"a": [2]})],
                count: 4
            })
        );
        assert_eq!(read(&body.to_string(), 10).unwrap().items.len(), 4);
        assert_eq!(
            read(r#"{"messages": []}"#, 10),
            Some(Listed {
                items: vec![],
                count: 0
            })
        );
    }

    #[test]
    fn anything_but_an_object_with_a_list_reads_as_none() {
        for body in [
            "{}",
            "[]",
            "[[1]]",
            "3",
            "null",
            r#""messages""#,
            r#"{"messages": {"0": 1}}"#,
            r#"{"messages": "x"}"#,
            r#"{"nested": {"messages": [1]}}"#,
        ] {
            assert_eq!(read(body, 10), None, "{body}");
        }
    }

    #[test]
    fn json_past_the_bound_is_still_checked() {
        for body in [
            r#"{"messages": [1, 2, 3, }"#,
            r#"{"messages": [1, 2, 3]} trailing"#,
            r#"{"messages": [1, 2, "\x"]}"#,
        ] {
            assert!(messages(body.as_bytes(), 1).is_err(), "{body}");
        }
        // A repeated key: the last list is the one read, as a parsed object keeps it.
        assert_eq!(
            read(r#"{"messages": [1], "messages": [2, 3]}"#, 10)
                .unwrap()
                .count,
            2
        );
    }
}
