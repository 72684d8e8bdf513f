//! JSON string literals, escaped as Postgres escapes them: shared by the payloads
//! (`payload`), the rows (`row_json`) and the changes (`change`), and importing none of them.

/// Appends `s` as a JSON string literal.
pub fn push_json_str(out: &mut String, s: &str) {
    // SAFETY: `s` is UTF-8 and only ASCII is added around and between its characters.
    push_json_bytes(unsafe { out.as_mut_vec() }, s.as_bytes());
}

/// Appends `s` as a JSON string literal, escaped as Postgres's `escape_json` does (bytes
/// of 0x80 and above are copied as they are, so text in the database's encoding stays so).
pub fn push_json_bytes(out: &mut Vec<u8>, s: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    for &b in s {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            b if b < 0x20 => {
                out.extend_from_slice(b"\\u00");
                out.push(HEX[(b >> 4) as usize]);
                out.push(HEX[(b & 0xf) as usize]);
            }
            b => out.push(b),
        }
    }
    out.push(b'"');
}
