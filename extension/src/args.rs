//! Reading the raw arguments of the hot SQL functions, which take `FunctionCallInfo`
//! directly to skip per-call conversions they do not need.

use crate::errors;
use pgrx::pg_sys;

/// The datum of argument `i`, or None when it is SQL NULL.
pub unsafe fn datum(fcinfo: pg_sys::FunctionCallInfo, i: usize) -> Option<pg_sys::Datum> {
    unsafe {
        if pgrx::fcinfo::pg_arg_is_null(fcinfo, i) {
            None
        } else {
            Some(pgrx::fcinfo::pg_getarg_datum_raw(fcinfo, i))
        }
    }
}

/// Text (or any varlena) bytes of a datum, detoasted into the current memory context.
pub unsafe fn varlena_bytes<'a>(d: pg_sys::Datum) -> &'a [u8] {
    unsafe {
        let v = pg_sys::pg_detoast_datum_packed(d.cast_mut_ptr());
        pgrx::varlena::varlena_to_byte_slice(v)
    }
}

/// A 4-byte-header varlena datum's bytes, header included (a composite datum, say).
pub unsafe fn varlena_bytes_with_header<'a>(d: pg_sys::Datum) -> &'a [u8] {
    unsafe {
        let p = d.cast_mut_ptr::<pg_sys::varlena>();
        std::slice::from_raw_parts(p.cast::<u8>(), pgrx::varlena::varsize_any(p))
    }
}

/// A text datum as UTF-8.
pub unsafe fn text<'a>(d: pg_sys::Datum, what: &str) -> &'a str {
    match std::str::from_utf8(unsafe { varlena_bytes(d) }) {
        Ok(s) => s,
        Err(_) => errors::invalid(
            format!("{what} is not valid UTF-8"),
            Some("pg_realtime requires a database with UTF8 encoding."),
        ),
    }
}

/// A required text argument: NULL is refused with an error naming the argument.
pub unsafe fn required_text<'a>(fcinfo: pg_sys::FunctionCallInfo, i: usize, what: &str) -> &'a str {
    match unsafe { datum(fcinfo, i) } {
        Some(d) => unsafe { text(d, what) },
        None => errors::null_arg(what),
    }
}

pub unsafe fn bool_or(fcinfo: pg_sys::FunctionCallInfo, i: usize, default: bool) -> bool {
    match unsafe { datum(fcinfo, i) } {
        Some(d) => d.value() != 0,
        None => default,
    }
}
