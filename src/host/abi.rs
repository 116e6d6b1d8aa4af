//! Hostcalls that never trap. proxy-wasm 0.2.5's getters `panic!` on any host
//! status they do not expect, and `get_map_value` unwraps the UTF-8 of a
//! header value. Both have been seen to kill a VM: reading `:status` of a
//! timed-out `dispatch_http_call` returns `BadArgument` (the sync singleton
//! trapped and stayed dead), and a client can send a header value that is not
//! UTF-8. These wrappers call the same ABI imports and turn every status into
//! a `Result`, so the callers decide.
//!
//! Only the getters whose status depends on what the host or a client did are
//! wrapped here; the SDK's setters and shared-data calls already return `Err`
//! for the statuses Envoy gives them.

use std::ptr::null_mut;

use proxy_wasm::types::{BufferType, MapType};

use crate::shared::calls::CallFailed;

/// A host status other than `Ok`/`NotFound` (the raw `WasmResult` code).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HostStatus(pub u32);

// Raw statuses of the proxy-wasm ABI (`proxy_wasm::types::Status`).
const OK: u32 = 0;
const NOT_FOUND: u32 = 1;

// The SDK declares the same imports with its own enums; at the wasm level
// both are i32 functions of the same name, so the linker merges them.
#[allow(clashing_extern_declarations)]
#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_get_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> u32;
    fn proxy_get_header_map_pairs(
        map_type: u32,
        return_map_data: *mut *mut u8,
        return_map_size: *mut usize,
    ) -> u32;
    fn proxy_get_buffer_bytes(
        buffer_type: u32,
        start: usize,
        max_size: usize,
        return_buffer_data: *mut *mut u8,
        return_buffer_size: *mut usize,
    ) -> u32;
    fn proxy_get_property(
        path_data: *const u8,
        path_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> u32;
    fn proxy_get_log_level(return_level: *mut u32) -> u32;
}

/// Takes ownership of a host-allocated buffer (allocated through the SDK's
/// exported `proxy_on_memory_allocate`, i.e. this module's allocator).
fn owned(status: u32, data: *mut u8, size: usize) -> Result<Option<Vec<u8>>, HostStatus> {
    match status {
        OK if data.is_null() => Ok(Some(Vec::new())),
        // SAFETY: on Ok the host wrote a buffer of `size` bytes that it
        // obtained from this module's allocator; we are its only owner.
        OK => Ok(Some(unsafe { Vec::from_raw_parts(data, size, size) })),
        NOT_FOUND => Ok(None),
        other => Err(HostStatus(other)),
    }
}

/// One header (or call-response header) value as raw bytes; `None` when absent.
pub(crate) fn map_value(map_type: MapType, key: &str) -> Result<Option<Vec<u8>>, HostStatus> {
    let mut data: *mut u8 = null_mut();
    let mut size: usize = 0;
    // SAFETY: pointers to live locals and to `key`'s bytes for the call's duration.
    let status = unsafe {
        proxy_get_header_map_value(
            map_type as u32,
            key.as_ptr(),
            key.len(),
            &mut data,
            &mut size,
        )
    };
    owned(status, data, size)
}

/// A whole header map in the proxy-wasm pair encoding, undecoded (the
/// SDK's `get_map` unwraps each value's UTF-8; the caller decodes without
/// trusting it, see [`crate::stream::RequestHead::decode`]).
pub(crate) fn map_pairs(map_type: MapType) -> Result<Vec<u8>, HostStatus> {
    let mut data: *mut u8 = null_mut();
    let mut size: usize = 0;
    // SAFETY: pointers to live locals for the call's duration.
    let status = unsafe { proxy_get_header_map_pairs(map_type as u32, &mut data, &mut size) };
    owned(status, data, size).map(Option::unwrap_or_default)
}

/// Up to `max` bytes of a buffer from `start`; `None` when there is none.
pub(crate) fn buffer(
    buffer_type: BufferType,
    start: usize,
    max: usize,
) -> Result<Option<Vec<u8>>, HostStatus> {
    let mut data: *mut u8 = null_mut();
    let mut size: usize = 0;
    // SAFETY: pointers to live locals for the call's duration.
    let status =
        unsafe { proxy_get_buffer_bytes(buffer_type as u32, start, max, &mut data, &mut size) };
    owned(status, data, size)
}

/// A property (`["plugin_root_id"]`, `["upstream", "address"]`, ...) as bytes.
pub(crate) fn property(path: &[&str]) -> Result<Option<Vec<u8>>, HostStatus> {
    // The ABI's path encoding: segments joined by NUL bytes.
    let encoded = path.join("\0");
    let mut data: *mut u8 = null_mut();
    let mut size: usize = 0;
    // SAFETY: pointers to live locals and to `encoded` for the call's duration.
    let status =
        unsafe { proxy_get_property(encoded.as_ptr(), encoded.len(), &mut data, &mut size) };
    owned(status, data, size)
}

/// The body of a `dispatch_http_call` reply, or why there is none. A timed-out or
/// reset call arrives without headers: reading `:status` then returns
/// BadArgument (the SDK's getter trapped the VM on it), so nothing is read.
pub(crate) fn call_reply(num_headers: usize, body_size: usize) -> Result<Vec<u8>, CallFailed> {
    call_ok(num_headers)?;
    Ok(buffer(BufferType::HttpCallResponseBody, 0, body_size)
        .ok()
        .flatten()
        .unwrap_or_default())
}

/// Whether a `dispatch_http_call` reply is a 200 (see [`call_reply`]); the
/// caller reads as much of the body as it wants.
pub(crate) fn call_ok(num_headers: usize) -> Result<(), CallFailed> {
    if num_headers == 0 {
        return Err(CallFailed::Timeout);
    }
    let status = map_value(MapType::HttpCallResponseHeaders, ":status")
        .ok()
        .flatten()
        .and_then(|s| std::str::from_utf8(&s).ok()?.parse::<u32>().ok());
    match status {
        Some(200) => Ok(()),
        Some(code) => Err(CallFailed::Status(code)),
        None => Err(CallFailed::Status(0)),
    }
}

/// The level of Envoy's `wasm` log component, as the ABI's number (0 trace
/// .. 5 critical; `proxy_wasm::types::LogLevel`'s order). The SDK's
/// `get_log_level` panics on any other status.
pub(crate) fn log_level() -> Result<u32, HostStatus> {
    let mut level: u32 = 0;
    // SAFETY: a pointer to a live local for the call's duration.
    match unsafe { proxy_get_log_level(&mut level) } {
        OK => Ok(level),
        other => Err(HostStatus(other)),
    }
}
