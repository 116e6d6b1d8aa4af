//! Errors of the sync layer: refused API uses and failed bridge calls.

use std::fmt;

pub(crate) use crate::shared::calls::CallFailed;

/// Errors of the sync layer: refused API uses and failed calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SyncError {
    /// `register` after `start`.
    AlreadyStarted,
    /// `start` with `enabled: false`.
    Disabled,
    /// A component's namespace was empty.
    EmptyNamespace,
    /// A namespace with braces or whitespace.
    InvalidNamespace(String),
    /// Two components with one namespace.
    DuplicateNamespace(String),
    /// `put`/`delete` for a namespace nobody registered.
    UnknownNamespace(String),
    /// `put`/`delete` while `write_through` is off.
    WriteThroughOff,
    /// The call never produced a reply body.
    Transport(CallFailed),
    /// The reply was cut short by the bridge.
    Truncated {
        /// Redis command that was cut.
        command: &'static str,
    },
    /// The bridge answered with no bytes at all: the connection to Redis
    /// was closed before any reply. Not a size problem, so never retried
    /// smaller (see [`SyncError::Truncated`]).
    EmptyReply {
        /// First Redis command of the call.
        command: &'static str,
    },
    /// The reply was malformed or not what the command returns.
    Protocol(String),
    /// Redis answered a command with an error.
    Redis(String),
    /// Redis refused AUTH.
    Auth(String),
    /// The cycle or poll outlived `op_timeout_ms`.
    Timeout {
        /// Calls still pending.
        pending: usize,
    },
}

impl fmt::Display for SyncError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SyncError::AlreadyStarted => write!(f, "sync engine already started"),
            SyncError::Disabled => write!(f, "sync is disabled (sync.enabled=false)"),
            SyncError::EmptyNamespace => write!(f, "empty namespace"),
            SyncError::InvalidNamespace(ns) => write!(f, "invalid namespace {ns:?}"),
            SyncError::DuplicateNamespace(ns) => write!(f, "namespace {ns:?} already registered"),
            SyncError::UnknownNamespace(ns) => write!(f, "namespace {ns:?} not registered"),
            SyncError::WriteThroughOff => write!(f, "write-through is off (sync.write_through)"),
            SyncError::Transport(e) => write!(f, "redis bridge call failed: {e}"),
            SyncError::Truncated { command } => {
                write!(f, "{command} reply truncated by the bridge")
            }
            SyncError::EmptyReply { command } => write!(
                f,
                "{command}: the bridge returned an empty reply (the connection to Redis closed \
                 before any answer)"
            ),
            SyncError::Protocol(msg) => write!(f, "unexpected redis reply: {msg}"),
            SyncError::Redis(msg) => write!(f, "redis error: {msg}"),
            SyncError::Auth(msg) => write!(f, "redis AUTH refused: {msg}"),
            SyncError::Timeout { pending } => {
                write!(f, "sync cycle timed out with {pending} calls pending")
            }
        }
    }
}

impl std::error::Error for SyncError {}
