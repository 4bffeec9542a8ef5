//! What a call picks up from where it runs: the store, the scope, and (inside a tool
//! body) the key of the call being executed.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Once, RwLock};

use crate::store::{MemoryStore, Store};

tokio::task_local! {
    static STORE: Arc<dyn Store>;
    static SCOPE: Scope;
    static CURRENT_KEY: Arc<str>;
}

/// The scope folded into every key: one or more nested `with_scope` parts.
#[derive(Clone, Debug)]
pub(crate) struct Scope {
    /// The parts joined with [`SCOPE_SEPARATOR`] (scope parts may not contain control
    /// characters, so nesting is unambiguous); `Err` if a part was invalid, reported at the
    /// next call.
    pub(crate) joined: Result<Arc<str>, String>,
}

/// Joins nested scope parts (U+001F, the unit separator: a control character, which no
/// part may contain).
pub(crate) const SCOPE_SEPARATOR: char = '\u{1f}';

/// How a surface that accepts a client's own intent key (MCP `idempotencyKey`, an HTTP
/// `Idempotency-Key`) folds it into a call's identity: a scope part `client:<key>`,
/// nested inside the surface's own scope. [`may_read`] knows it by this prefix.
pub(crate) const CLIENT_SCOPE_PREFIX: &str = "client:";

/// The scope part for a client's intent key `key` (see [`CLIENT_SCOPE_PREFIX`]).
#[cfg_attr(not(any(feature = "mcp", feature = "http")), allow(dead_code))]
pub(crate) fn client_scope(key: &str) -> String {
    format!("{CLIENT_SCOPE_PREFIX}{key}")
}

/// The longest client intent key a surface accepts, in characters.
pub(crate) const CLIENT_KEY_MAX_CHARS: usize = 255;

/// The one rule for a client's intent key on every surface (MCP `idempotencyKey`, HTTP
/// `Idempotency-Key`): 1 to [`CLIENT_KEY_MAX_CHARS`] characters without control
/// characters. `field` names where the client sent it, for the error.
#[cfg_attr(not(any(feature = "mcp", feature = "http")), allow(dead_code))]
pub(crate) fn validate_client_key(tool: &str, field: &str, key: &str) -> Result<(), crate::Error> {
    let invalid = |message: String| crate::Error::InvalidArguments {
        tool: tool.to_owned(),
        field: Some(field.to_owned()),
        message,
    };
    let chars = key.chars().count();
    if chars == 0 || chars > CLIENT_KEY_MAX_CHARS {
        return Err(invalid(format!(
            "the client idempotency key has {chars} characters; it must have 1 to {CLIENT_KEY_MAX_CHARS}, nothing ran. Send a shorter id (a UUID fits), the same with every retry of one intent"
        )));
    }
    if let Some(c) = key.chars().find(|c| c.is_control()) {
        return Err(invalid(format!(
            "the client idempotency key contains the control character {c:?}; nothing ran. Send printable text, the same with every retry of one intent"
        )));
    }
    Ok(())
}

/// Whether a reader in scope `reader` may read a record made in scope `record` (both as
/// [`caller_scope`] gives them: `None` outside any `with_scope`). The one rule every read
/// of an operation keeps (docs/security.md, "Reading operations"):
///
/// - the same scope: `reader == record` (`None` reads only records made outside any
///   scope);
/// - or the record's scope is the reader's with exactly one more part, a client's intent
///   key (`client:…`), as a surface nests it inside its own scope: a client follows the
///   link to its own call without sending its key again.
///
/// Nothing else: not a parent reading a nested tenant's or run's records (`acme` does not
/// read `acme␟team`), nor a child reading its parent's (`acme␟client:k` does not read
/// `acme`).
pub(crate) fn may_read(reader: Option<&str>, record: Option<&str>) -> bool {
    let Some(record) = record else {
        return reader.is_none();
    };
    let rest = match reader {
        None => record,
        Some(reader) if reader == record => return true,
        Some(reader) => match record
            .strip_prefix(reader)
            .and_then(|rest| rest.strip_prefix(SCOPE_SEPARATOR))
        {
            Some(rest) => rest,
            None => return false,
        },
    };
    rest.starts_with(CLIENT_SCOPE_PREFIX) && !rest.contains(SCOPE_SEPARATOR)
}

static DEFAULT_STORE: RwLock<Option<Arc<dyn Store>>> = RwLock::new(None);
static FALLBACK_WARNING: Once = Once::new();

/// The default of [`set_max_argument_bytes`]: 1 MiB of canonical JSON.
pub const DEFAULT_MAX_ARGUMENT_BYTES: usize = 1024 * 1024;

static MAX_ARGUMENT_BYTES: AtomicUsize = AtomicUsize::new(DEFAULT_MAX_ARGUMENT_BYTES);

/// Sets the largest arguments document (the canonical JSON of a call's arguments, which
/// every store keeps with the record) that a mutating tool accepts, in bytes, for the whole
/// process. A larger call fails with [`Error::InvalidArguments`](crate::Error) before
/// anything is claimed or run. Default [`DEFAULT_MAX_ARGUMENT_BYTES`]: arguments are
/// stored with every record and read on reconciliation, so bulk content belongs behind a
/// reference (an id, a URL) rather than in a tool's arguments.
pub fn set_max_argument_bytes(limit: usize) {
    MAX_ARGUMENT_BYTES.store(limit, Ordering::Relaxed);
}

/// The limit [`set_max_argument_bytes`] set.
pub fn max_argument_bytes() -> usize {
    MAX_ARGUMENT_BYTES.load(Ordering::Relaxed)
}

/// Installs the store every call in this process uses, unless a task installed its own
/// with [`with_store`]. Replaces any store installed before.
pub fn set_default_store<S: Store>(store: S) {
    // With the `otel` feature, wrapped to time every store operation; else just boxed.
    let store = crate::telemetry::measured(store);
    let mut slot = DEFAULT_STORE
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    *slot = Some(store);
}

/// Runs `future` with `store` as the store of every call made inside it (and inside the
/// futures it awaits; not inside tasks it spawns). Tests use this to isolate themselves.
pub async fn with_store<S: Store, F: Future>(store: S, future: F) -> F::Output {
    let store = crate::telemetry::measured(store);
    STORE.scope(store, future).await
}

/// [`with_store`] for a store a surface wrapped once when it was configured
/// (`crate::telemetry::measured`): no wrapping per call (an allocation, and with the
/// `otel` feature a second layer of timing) and no `async` frame around the scope.
#[cfg(any(feature = "mcp", feature = "http"))]
pub(crate) fn with_measured_store<F: Future>(
    store: Arc<dyn Store>,
    future: F,
) -> tokio::task::futures::TaskLocalFuture<Arc<dyn Store>, F> {
    STORE.scope(store, future)
}

/// Runs `future` with `scope` (a tenant, a user, a run) folded into every key made inside
/// it, so the same intent in two scopes never shares a result. Nested scopes compose.
///
/// A scope must be non-empty and free of control characters; an invalid one makes every
/// call inside fail with [`Error::InvalidArguments`](crate::Error::InvalidArguments).
pub async fn with_scope<F: Future>(scope: impl Into<String>, future: F) -> F::Output {
    let part: String = scope.into();
    let joined = match SCOPE.try_with(|outer| outer.joined.clone()) {
        Ok(Err(e)) => Err(e),
        outer => validate_scope(&part).map(|()| match outer {
            Ok(Ok(outer)) => Arc::from(format!("{outer}{SCOPE_SEPARATOR}{part}")),
            _ => Arc::from(part.as_str()),
        }),
    };
    SCOPE.scope(Scope { joined }, future).await
}

/// Runs `future` in exactly the scope `joined` (the nested parts as a record keeps them,
/// [`Record::scope`](crate::store::Record)), replacing any scope around it: how a channel
/// that continues a stored call (an approval over HTTP) makes it under the key it was asked
/// with. `None` runs it in no scope.
#[cfg_attr(not(feature = "http"), allow(dead_code))]
pub(crate) async fn with_joined_scope<F: Future>(joined: Option<&str>, future: F) -> F::Output {
    match joined {
        Some(joined) => {
            let scope = Scope {
                joined: Ok(Arc::from(joined)),
            };
            SCOPE.scope(scope, future).await
        }
        None if SCOPE.try_with(|_| ()).is_ok() => {
            // No task-local can be unset: a scope made of no part is refused at the call,
            // never silently replaced by the outer one.
            let scope = Scope {
                joined: Err("a call continued outside any scope was made inside one; continue it from a task without `with_scope`".to_owned()),
            };
            SCOPE.scope(scope, future).await
        }
        None => future.await,
    }
}

pub(crate) fn validate_scope(part: &str) -> Result<(), String> {
    if part.is_empty() {
        return Err(
            "the scope given to `with_scope` is empty; pass the tenant, user or run it stands for"
                .to_owned(),
        );
    }
    if part.chars().any(char::is_control) {
        return Err(format!(
            "the scope {part:?} given to `with_scope` contains a control character; scopes are printable text"
        ));
    }
    Ok(())
}

fn current_scope() -> Option<Result<Arc<str>, String>> {
    SCOPE.try_with(|s| s.joined.clone()).ok()
}

/// The scope a call, run or read of `tool` is made in: `None` outside any `with_scope`,
/// and an invalid scope is [`Error::InvalidArguments`](crate::Error::InvalidArguments),
/// never dropped (a dropped scope would read or write another tenant's keys). The one
/// place that decides it: the engine, runs and `Run::status_of` all ask here.
pub(crate) fn caller_scope(tool: &str) -> Result<Option<Arc<str>>, crate::Error> {
    match current_scope() {
        None => Ok(None),
        Some(Ok(scope)) => Ok(Some(scope)),
        Some(Err(message)) => Err(crate::Error::InvalidArguments {
            tool: tool.to_owned(),
            field: None,
            message,
        }),
    }
}

/// `f` given this task's store by reference (a replay answered from the store's memory
/// then makes no change to the count of the store's `Arc`, which every worker thread's
/// calls share: two atomic operations on one cache line fewer), with the `Arc` it was
/// given when that was the default store: the caller goes on with that one, even if the
/// default is replaced meanwhile. Within the task's scope, [`current_store`] answers the
/// same store again.
pub(crate) fn with_current_store<R>(
    mut f: impl FnMut(&Arc<dyn Store>) -> R,
) -> (R, Option<Arc<dyn Store>>) {
    match STORE.try_with(|store| f(store)) {
        Ok(answer) => (answer, None),
        Err(_) => {
            let store = current_store();
            (f(&store), Some(store))
        }
    }
}

pub(crate) fn current_store() -> Arc<dyn Store> {
    if let Ok(store) = STORE.try_with(Arc::clone) {
        return store;
    }
    if let Some(store) = DEFAULT_STORE
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .as_ref()
    {
        return Arc::clone(store);
    }
    let mut slot = DEFAULT_STORE
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let store = slot.get_or_insert_with(|| crate::telemetry::measured(MemoryStore::new()));
    FALLBACK_WARNING.call_once(|| {
        tracing::warn!(
            "tool-contracts: no store installed; using a process-local MemoryStore, which forgets every key when the process exits. Call `tool_contracts::set_default_store` with a durable store in production."
        );
    });
    Arc::clone(store)
}

pub(crate) async fn with_current_key<F: Future>(key: Arc<str>, future: F) -> F::Output {
    CURRENT_KEY.scope(key, future).await
}

/// The idempotency key of the tool call being executed, inside a tool body; `None`
/// elsewhere. Forward it to downstream APIs that honour idempotency keys (a payment
/// provider's `Idempotency-Key` header): the innermost layer of protection.
pub fn current_key() -> Option<String> {
    CURRENT_KEY.try_with(|k| k.to_string()).ok()
}

/// [`current_key`] as a UUID (version 5, in a namespace fixed by the key spec), for
/// providers that demand UUID idempotency keys. Stable: the same key gives the same UUID.
pub fn current_key_uuid() -> Option<uuid::Uuid> {
    CURRENT_KEY
        .try_with(|k| uuid::Uuid::new_v5(&KEY_UUID_NAMESPACE, k.as_bytes()))
        .ok()
}

/// Namespace of [`current_key_uuid`]: UUIDv5 of the URL `https://tool-contracts.dev/key/v1`
/// in the standard URL namespace, written out so it never depends on a computation.
pub(crate) const KEY_UUID_NAMESPACE: uuid::Uuid =
    uuid::Uuid::from_u128(0x43e0e3a5_8d85_580b_8ff2_62fd4a344634);

/// This process's worker id for store history: host, pid and a per-process random part
/// (a restarted process with a reused pid is still another worker).
pub fn worker_id() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        use std::hash::BuildHasher;
        let host = gethostname::gethostname();
        let host = host.to_string_lossy();
        let host = match host.trim() {
            "" => "host",
            name => name,
        };
        let nonce = std::hash::RandomState::new().hash_one(std::time::SystemTime::now());
        format!("{host}-{}-{:08x}", std::process::id(), nonce as u32)
    })
}

/// What a run records of each tool call made inside it, before the call claims its key:
/// the hook through which runs see tool calls without the engine knowing about runs.
pub(crate) trait CallJournal: Send + Sync {
    /// Records (or checks, on resume) that the run's code calls `tool` with `key` next
    /// (and registers its undo, for a tool with `compensate`).
    fn record<'a>(
        &'a self,
        tool: &'static crate::spec::ToolSpec,
        key: &'a str,
    ) -> core::pin::Pin<Box<dyn Future<Output = Result<(), crate::Error>> + Send + 'a>>;
}

tokio::task_local! {
    static CALL_JOURNAL: Option<Arc<dyn CallJournal>>;
}

/// Runs `future` with `journal` recording its tool calls (`None`: no journaling, as
/// inside a run's step, whose result is journaled whole).
pub(crate) async fn with_call_journal<F: Future>(
    journal: Option<Arc<dyn CallJournal>>,
    future: F,
) -> F::Output {
    CALL_JOURNAL.scope(journal, future).await
}

/// Whether tool calls made here are journaled (made inside a run, outside a step): the
/// engine then hands each call to [`journal_call`] before it may be replayed.
pub(crate) fn journaling() -> bool {
    CALL_JOURNAL.try_with(Option::is_some).unwrap_or(false)
}

/// Called by the engine before a tool call claims its key: hands the call to the journal
/// of the run it is made in, if any.
pub(crate) async fn journal_call(
    tool: &'static crate::spec::ToolSpec,
    key: &str,
) -> Result<(), crate::Error> {
    let Some(journal) = CALL_JOURNAL.try_with(Clone::clone).ok().flatten() else {
        return Ok(());
    };
    journal.record(tool, key).await
}

/// Called after each renewal of a call's lease, while the call runs: the hook through which
/// the MCP server sends progress notifications without the lease layer knowing about MCP.
pub(crate) type ProgressHook = Arc<dyn Fn() + Send + Sync>;

tokio::task_local! {
    static PROGRESS: ProgressHook;
}

/// Runs `future` with `hook` told of every lease renewal of the calls made inside it.
#[cfg_attr(not(feature = "mcp"), allow(dead_code))]
pub(crate) async fn with_progress<F: Future>(hook: ProgressHook, future: F) -> F::Output {
    PROGRESS.scope(hook, future).await
}

/// The progress hook of the current task, if any. The lease heartbeat takes it when it
/// starts, since its renewals run in a task of their own, where task-locals are not seen.
pub(crate) fn current_progress() -> Option<ProgressHook> {
    PROGRESS.try_with(Arc::clone).ok()
}

#[cfg(test)]
mod tests {
    use super::may_read;

    #[test]
    fn a_reader_reads_its_own_scope_and_its_clients_calls_and_nothing_else() {
        let read = |reader, record| may_read(reader, record);
        // Same scope.
        assert!(read(None, None));
        assert!(read(Some("acme"), Some("acme")));
        assert!(read(Some("acme\u{1f}eu"), Some("acme\u{1f}eu")));
        // A client's key nested inside the reader's scope, one part deep.
        assert!(read(Some("acme"), Some("acme\u{1f}client:k-1")));
        assert!(read(None, Some("client:k-1")));
        // Another tenant, or no tenant against one: never.
        assert!(!read(Some("acme"), Some("globex")));
        assert!(!read(Some("acme"), None));
        assert!(!read(None, Some("acme")));
        assert!(!read(Some("acme"), Some("acme-2")));
        assert!(!read(Some("acme"), Some("acmeclient:k")));
        assert!(!read(Some("acme"), Some("globex\u{1f}client:k")));
        // A nested part that is not a client's key: a sub-tenant, a run's calls.
        assert!(!read(Some("acme"), Some("acme\u{1f}eu")));
        assert!(!read(Some("acme"), Some("acme\u{1f}run:k")));
        assert!(!read(None, Some("run:k")));
        // Deeper than one client part, or a client reading its tenant's records.
        assert!(!read(
            Some("acme"),
            Some("acme\u{1f}client:k\u{1f}client:j")
        ));
        assert!(!read(Some("acme"), Some("acme\u{1f}eu\u{1f}client:k")));
        assert!(!read(Some("acme\u{1f}client:k"), Some("acme")));
        assert!(!read(
            Some("acme\u{1f}client:k"),
            Some("acme\u{1f}client:j")
        ));
    }

    /// The worker id names the machine as the operating system does (`uname -n`, POSIX),
    /// then this process: an operator reading store history can find the worker.
    #[cfg(unix)]
    #[test]
    fn the_worker_id_starts_with_the_host_name_and_the_pid() {
        let out = std::process::Command::new("uname")
            .arg("-n")
            .output()
            .expect("uname -n runs on every POSIX system");
        let host = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let id = super::worker_id();
        assert!(
            id.starts_with(&format!("{host}-{}-", std::process::id())),
            "worker id {id:?} should start with host {host:?} and pid {}",
            std::process::id()
        );
    }
}
