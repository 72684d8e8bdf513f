use super::*;
use realtime_packed::{
    F_BINARY, F_ID, F_ORIGIN, F_PAYLOAD, F_PRIVATE, KIND_CHANGE, KIND_FILTERED, KIND_GAP,
    KIND_MESSAGE, KIND_PRESENCE, MAGIC,
};

const HOW: As = As {
    epoch: 77,
    replayed: false,
    client_ids: false,
};

/// Builds packed values entry by entry, as the layout in `extension/src/packed.rs` says.
#[derive(Default)]
struct Value {
    entries: Vec<Vec<u8>>,
}

impl Value {
    fn head(kind: u8, flags: u8, seq: i64) -> Vec<u8> {
        let mut e = vec![kind, flags];
        e.extend_from_slice(&seq.to_le_bytes());
        e
    }
    fn str(e: &mut Vec<u8>, s: &[u8]) {
        e.extend_from_slice(&(s.len() as u32).to_le_bytes());
        e.extend_from_slice(s);
    }
    #[allow(clippy::too_many_arguments)]
    fn body(
        mut self,
        kind: u8,
        flags: u8,
        seq: i64,
        committed_us: i64,
        id: [u8; 16],
        origin: i64,
        topic: &str,
        event: &str,
        payload: &[u8],
    ) -> Self {
        let mut e = Self::head(kind, flags, seq);
        e.extend_from_slice(&committed_us.to_le_bytes());
        e.extend_from_slice(&id);
        e.extend_from_slice(&origin.to_le_bytes());
        Self::str(&mut e, topic.as_bytes());
        Self::str(&mut e, event.as_bytes());
        Self::str(&mut e, payload);
        self.entries.push(e);
        self
    }
    fn gap(mut self, first: i64, last: i64) -> Self {
        let mut e = Self::head(KIND_GAP, 0, last);
        e.extend_from_slice(&first.to_le_bytes());
        e.extend_from_slice(&last.to_le_bytes());
        self.entries.push(e);
        self
    }
    fn filtered(mut self, seq: i64) -> Self {
        self.entries.push(Self::head(KIND_FILTERED, 0, seq));
        self
    }
    fn bytes(&self) -> Vec<u8> {
        let mut v = MAGIC.to_vec();
        v.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        for e in &self.entries {
            v.extend_from_slice(e);
        }
        v
    }
}

const ID: [u8; 16] = [
    0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0x4d, 0xef, 0x80, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0xff,
];

/// One entry of every kind, as a drain could return them.
fn every_kind() -> Value {
    Value::default()
        .gap(3, 9)
        .body(
            KIND_MESSAGE,
            F_PRIVATE | F_PAYLOAD | F_ID,
            10,
            1_700_000_000_000_001,
            ID,
            0,
            "room:1",
            "INSERT",
            br#"{"id": "x", "record": {"a": "\u00e9"}}"#,
        )
        .body(
            KIND_MESSAGE,
            F_BINARY | F_PAYLOAD | F_ID | F_ORIGIN,
            11,
            5,
            ID,
            42,
            "bin",
            "blob",
            &[0, 0xff, 0x80],
        )
        .body(
            KIND_PRESENCE,
            F_PRIVATE | F_PAYLOAD | F_ID,
            12,
            6,
            ID,
            0,
            "lobby",
            "presence",
            br#"{"joins": {}}"#,
        )
        .body(
            KIND_CHANGE,
            F_PAYLOAD,
            13,
            7,
            [0; 16],
            0,
            "public.todos",
            "UPDATE",
            br#"{"type": "UPDATE"}"#,
        )
        .body(
            KIND_CHANGE,
            0,
            14,
            8,
            [0; 16],
            0,
            "public.other",
            "DELETE",
            b"",
        )
        .filtered(20)
}

#[test]
fn every_kind_is_read_as_the_row_form_reads_it() {
    let bytes = every_kind().bytes();
    let reads = read(&bytes, HOW).expect("well formed");
    let seqs: Vec<i64> = reads.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, [9, 10, 11, 12, 13, 14, 20]);
    assert!(matches!(reads[0].entry, Entry::Gap { first: 3, last: 9 }));
    match &reads[1].entry {
        Entry::Message {
            committed_us,
            message,
        } => {
            assert_eq!(*committed_us, 1_700_000_000_000_001);
            assert_eq!(message.topic, "room:1");
            assert_eq!(message.event, "INSERT");
            assert_eq!(
                message.payload,
                Payload::Json(r#"{"id": "x", "record": {"a": "\u00e9"}}"#.into())
            );
            assert!(message.private);
            // A database message keeps its id, printed as Postgres prints a uuid.
            assert_eq!(
                message.id.as_deref(),
                Some("12345678-9abc-4def-8001-0203040506ff")
            );
            assert_eq!(message.origin, None);
            assert_eq!(
                (message.epoch, message.seq, message.replayed),
                (77, 10, false)
            );
        }
        _ => panic!("a message"),
    }
    match &reads[2].entry {
        Entry::Message { message, .. } => {
            assert_eq!(
                message.payload,
                Payload::Binary(Bytes::from_static(&[0, 0xff, 0x80]))
            );
            assert!(!message.private);
            // A relayed client broadcast carries no id live, as in the row form.
            assert_eq!((message.origin, message.id.as_deref()), (Some(42), None));
        }
        _ => panic!("a message"),
    }
    match &reads[3].entry {
        Entry::Presence {
            committed_us,
            key,
            diff,
        } => {
            assert_eq!(*committed_us, 6);
            assert_eq!((key.topic.as_str(), key.private), ("lobby", true));
            assert_eq!(*diff, Some(r#"{"joins": {}}"#));
        }
        _ => panic!("a presence diff"),
    }
    match reads[4].entry {
        Entry::Change {
            committed_us,
            table,
            data,
        } => {
            assert_eq!(committed_us, 7);
            assert_eq!(table, Some("public.todos"));
            assert_eq!(data, Some(r#"{"type": "UPDATE"}"#));
        }
        _ => panic!("a change"),
    }
    // A change whose table was not decoded has no data (NULL in the row form).
    assert!(matches!(
        reads[5].entry,
        Entry::Change {
            data: None,
            table: Some("public.other"),
            ..
        }
    ));
    assert!(matches!(reads[6].entry, Entry::Filtered));
}

#[test]
fn text_is_borrowed_from_the_value_not_copied() {
    let bytes = every_kind().bytes();
    let reads = read(&bytes, HOW).unwrap();
    let within = |s: &str| bytes.as_ptr_range().contains(&s.as_ptr());
    match reads[4].entry {
        Entry::Change {
            table: Some(t),
            data: Some(d),
            ..
        } => assert!(within(t) && within(d)),
        _ => panic!("a change"),
    }
    match reads[3].entry {
        Entry::Presence { diff: Some(d), .. } => assert!(within(d)),
        _ => panic!("a presence diff"),
    }
}

#[test]
fn a_replay_keeps_client_ids() {
    let bytes = every_kind().bytes();
    let how = As {
        client_ids: true,
        replayed: true,
        ..HOW
    };
    match &read(&bytes, how).unwrap()[2].entry {
        Entry::Message { message, .. } => {
            assert_eq!(
                message.id.as_deref(),
                Some("12345678-9abc-4def-8001-0203040506ff")
            );
            assert!(message.replayed);
        }
        _ => panic!("a message"),
    }
}

#[test]
fn an_empty_batch_has_no_entries() {
    assert!(read(&Value::default().bytes(), HOW).unwrap().is_empty());
}

#[test]
fn every_truncation_is_an_error_never_a_panic() {
    let bytes = every_kind().bytes();
    for len in 0..bytes.len() {
        let err = read(&bytes[..len], HOW).err();
        let err = err.unwrap_or_else(|| panic!("{len} of {} bytes read as whole", bytes.len()));
        assert!(err.starts_with("malformed packed drain batch: "), "{err}");
    }
}

#[test]
fn malformed_values_say_what_is_wrong() {
    let good = every_kind().bytes();
    let err = |v: &[u8]| read(v, HOW).err().expect("an error");

    assert!(err(b"").contains("truncated"), "{}", err(b""));
    assert!(err(b"RTP2\0\0\0\0").contains("does not start with \"RTP1\""));

    let mut unknown = good.clone();
    unknown[8] = 9; // the first entry's kind
    assert!(
        err(&unknown).contains("entry 1 (at byte 8) has unknown kind 9"),
        "{}",
        err(&unknown)
    );

    let mut trailing = good.clone();
    trailing.push(0);
    assert!(err(&trailing).contains("1 bytes follow the last entry"));

    // A count larger than the entries there: truncated, and no allocation of its size.
    let mut counted = good.clone();
    counted[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(err(&counted).contains("truncated"));

    // A string length past the end.
    let mut long = Value::default()
        .body(KIND_CHANGE, F_PAYLOAD, 1, 0, [0; 16], 0, "t", "e", b"{}")
        .bytes();
    let at = long.len() - 2 - 4; // the payload's length
    long[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(err(&long).contains("truncated"), "{}", err(&long));

    let bad_text = Value::default()
        .body(
            KIND_MESSAGE,
            F_PAYLOAD,
            1,
            0,
            ID,
            0,
            "t",
            "e",
            &[b'"', 0xff, b'"'],
        )
        .bytes();
    assert!(
        err(&bad_text).contains("not valid UTF-8"),
        "{}",
        err(&bad_text)
    );
}

#[test]
fn corrupted_bytes_never_panic() {
    // Every single-byte change of a well-formed value reads or fails; none panics.
    let good = every_kind().bytes();
    for i in 0..good.len() {
        for b in [0u8, 1, 0x7f, 0x80, 0xff] {
            let mut v = good.clone();
            v[i] = b;
            let _ = read(&v, HOW);
        }
    }
}
