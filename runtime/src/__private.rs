//! Not public API: what the attribute macros' expansions name, re-exported by the facade
//! as `tool_contracts::__private`. May change in any release; the facade pins the macro
//! crate to this exact version.

use core::fmt::Display;
use core::marker::PhantomData;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

pub use crate::contracts::ContractEntry;
pub use crate::decoded::Keeper;
pub use crate::derived::Recall;
pub use crate::engine::{
    execute, execute_with, reconciling, replay_now, take_prepared, with_prepared, Attempt, Call,
    CallBuilder, Codec, Now, Ops,
};
pub use crate::error::Error;
pub use crate::registry::{
    BoxFuture, CallArgs, CallResult, Context, Fast, FastFn, InvokeFn, KeyOfFn, ReconcileFn,
    ToolDescriptor,
};
pub use crate::run::{CompensateFn, UndoContext};
pub use crate::spec::{
    ApprovalRule, Concurrent, Mismatch, OnUnknown, SourceLocation, TaskSupport, ToolKind, ToolSpec,
};
pub use ::inventory;
pub use ::schemars;
pub use ::serde;
pub use ::serde_json;

/// A tool's input schema compiled for the members check, on first use (a `static` in each
/// registered tool's expansion): every registry call walks its arguments against it.
pub struct SchemaCell(std::sync::OnceLock<crate::members::Members>);

impl SchemaCell {
    /// An empty cell, filled by the first call.
    #[allow(clippy::new_without_default)]
    pub const fn new() -> Self {
        Self(std::sync::OnceLock::new())
    }
}

/// Decodes a registry call's JSON arguments: first refuses a member, at any depth, that
/// the tool's input schema does not declare (serde would drop it silently inside the
/// user's own types), naming its path; then [`decode_args`].
pub fn decode_tool_args<A: DeserializeOwned>(
    spec: &'static ToolSpec,
    schema: &'static SchemaCell,
    input_schema: fn() -> Value,
    args: &Value,
) -> Result<A, Error> {
    let members = schema
        .0
        .get_or_init(|| crate::members::Members::compile(&input_schema()));
    if let Some(unknown) = members.unknown_member(args) {
        let (parent, name) = match unknown.path.rsplit_once('.') {
            Some((parent, name)) => (Some(parent), name),
            None => (None, unknown.path.as_str()),
        };
        let expected = unknown
            .expected
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let within = parent.map(|p| format!(" in `{p}`")).unwrap_or_default();
        return Err(Error::InvalidArguments {
            tool: spec.name.to_owned(),
            message: format!(
                "unknown field `{name}`{within}, expected one of {expected}; the tool does not take it (it would be dropped unseen), so nothing ran: remove it or fix its name"
            ),
            field: Some(unknown.path),
        });
    }
    decode_args(spec, args)
}

/// Decodes a registry call's arguments, given as a `Value` or as JSON text. Text is read
/// straight into the tool's argument type with the members rule checked in the same pass
/// (`Members::decode_text`), no `Value` built; text that pass refuses or cannot decide is
/// parsed and goes through [`decode_tool_args`], so every refusal and its message is the
/// `Value` path's.
pub fn decode_tool_input<A: DeserializeOwned>(
    spec: &'static ToolSpec,
    schema: &'static SchemaCell,
    input_schema: fn() -> Value,
    args: &CallArgs<'_>,
) -> Result<A, Error> {
    let text = match *args {
        CallArgs::Value(ref value) => return decode_tool_args(spec, schema, input_schema, value),
        CallArgs::Text(text) => text,
    };
    let members = schema
        .0
        .get_or_init(|| crate::members::Members::compile(&input_schema()));
    if let Some(decoded) = members.decode_text::<A>(text) {
        return Ok(decoded);
    }
    let value: Value = serde_json::from_str(text).map_err(|e| Error::InvalidArguments {
        tool: spec.name.to_owned(),
        field: None,
        message: shorten(format!(
            "the arguments are not JSON ({e}); nothing ran. Send them as one JSON object with the fields {}",
            spec.params.join(", ")
        )),
    })?;
    decode_tool_args(spec, schema, input_schema, &value)
}

/// The call a registry entry point made on this thread from the same JSON arguments for
/// this tool in this scope (`derived.rs`: the same keyed hash of the arguments as given), if
/// this thread kept it; the arguments are then decoded only if the body must run.
/// Otherwise their quick hash, for [`note_call`].
pub fn recall_call(spec: &'static ToolSpec, args: &CallArgs<'_>) -> Recall {
    crate::derived::recall(spec, args)
}

/// Notes a call a registry entry point derived from arguments [`recall_call`] missed
/// (with the hash it returned), for it to give back for the same arguments
/// (`derived.rs`); a refused call is never kept.
pub fn note_call(
    spec: &'static ToolSpec,
    args: &CallArgs<'_>,
    missed: Option<u64>,
    call: &Result<Call, Error>,
) {
    if let Ok(call) = call {
        crate::derived::note(spec, args, missed, call);
    }
}

/// Decodes a tool's JSON arguments, naming the offending field on failure.
pub fn decode_args<A: DeserializeOwned>(spec: &'static ToolSpec, args: &Value) -> Result<A, Error> {
    let empty;
    let args = match args {
        Value::Null => {
            empty = Value::Object(serde_json::Map::new());
            &empty
        }
        Value::Object(_) => args,
        other => {
            return Err(Error::InvalidArguments {
                tool: spec.name.to_owned(),
                field: None,
                message: format!(
                    "arguments must be a JSON object with the fields {}, not {}",
                    spec.params.join(", "),
                    json_kind(other)
                ),
            })
        }
    };
    // Without path tracking first (its wrappers cost more than the decoding itself), and
    // only for arguments that fail, once more with it to name the offending field.
    if let Ok(decoded) = A::deserialize(args) {
        return Ok(decoded);
    }
    serde_path_to_error::deserialize(args).map_err(|e| {
        let path = e.path().to_string();
        Error::InvalidArguments {
            tool: spec.name.to_owned(),
            field: (path != ".").then_some(path),
            message: shorten(e.into_inner().to_string()),
        }
    })
}

/// serde's messages quote the offending value whole; a 16 MiB string must not become a
/// 16 MiB error in an LLM's context or a log line. Keeps the head and the tail (which says
/// what was expected).
fn shorten(message: String) -> String {
    const HEAD: usize = 240;
    const TAIL: usize = 80;
    if message.len() <= HEAD + TAIL + 64 {
        return message;
    }
    let head_end = (0..=HEAD)
        .rev()
        .find(|&i| message.is_char_boundary(i))
        .unwrap_or(0);
    let tail_start = (message.len() - TAIL..message.len())
        .find(|&i| message.is_char_boundary(i))
        .unwrap_or(message.len());
    format!(
        "{}… ({} bytes elided) …{}",
        &message[..head_end],
        tail_start - head_end,
        &message[tail_start..]
    )
}

/// Decodes the JSON arguments the store kept for a call (the object `CallBuilder::arg`
/// wrote), for reconciling it without its caller.
pub fn decode_args_str<A: DeserializeOwned>(
    spec: &'static ToolSpec,
    args: &str,
) -> Result<A, Error> {
    let stale = |message: String| {
        Error::Codec {
        tool: spec.name.to_owned(),
        key: crate::ambient::current_key(),
        message: format!(
            "the stored arguments no longer decode ({message}); the tool's parameters changed since the call was stored: resolve the key by hand, and bump the tool's `version` when its parameters change"
        ),
    }
    };
    let value: Value = serde_json::from_str(args).map_err(|e| stale(e.to_string()))?;
    decode_args(spec, &value).map_err(|e| stale(e.to_string()))
}

/// Maps a `verify` verdict for the recovery task: `Some(result)` becomes the result's
/// JSON (the key is completed with it), `None` stays `None` (the key is released), and
/// the tool's error becomes [`Error::ToolFailed`] (the key stays unknown).
pub fn reconciled<T, E>(
    spec: &'static ToolSpec,
    verdict: Result<Option<T>, E>,
    output: Codec<T>,
    display: fn(&E) -> String,
) -> Result<Option<String>, Error> {
    let key = crate::ambient::current_key;
    match verdict {
        Ok(Some(value)) => output.encode(&value).map(Some).map_err(|e| Error::Codec {
            tool: spec.name.to_owned(),
            key: key(),
            message: format!("the result `verify` found cannot be stored as JSON: {e}"),
        }),
        Ok(None) => Ok(None),
        Err(e) => Err(Error::ToolFailed {
            tool: spec.name.to_owned(),
            key: key(),
            message: display(&e),
        }),
    }
}

/// Decodes, for a `compensate` undo, the JSON arguments the store kept with the call; a
/// failure is the undo's failure (stored under its key: the run needs intervention).
pub fn undo_args<A: DeserializeOwned>(spec: &'static ToolSpec, args: &str) -> Result<A, String> {
    decode_args_str(spec, args)
        .map_err(|e| format!("tool `{}`: its undo cannot run: {e}", spec.name))
}

/// Decodes, for a `compensate` undo, the call's stored result (with the tool's own codec,
/// from `assert_output`, so no bound is checked twice).
pub fn undo_output<T>(spec: &'static ToolSpec, output: &str, codec: Codec<T>) -> Result<T, String> {
    codec.decode(output).map_err(|e| {
        format!(
            "tool `{}`: its undo cannot run: the call's stored result does not decode ({e}); bump the tool's `version` when its result type changes",
            spec.name
        )
    })
}

/// A `compensate` undo's outcome as compensation stores it: its result as JSON, or its
/// error's message. The bounds are the undo's, checked here (at the `compensate` path).
pub fn undone<R: Serialize, E: Display>(outcome: Result<R, E>) -> Result<Value, String> {
    let result = outcome.map_err(|e| e.to_string())?;
    serde_json::to_value(result)
        .map_err(|e| format!("the undo's result cannot be stored as JSON: {e}"))
}

/// How a JSON value's kind reads in a message ("a string", "an array"): one wording for
/// decoding errors and the MCP server's invalid-params answers.
pub(crate) fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Encodes a tool's result for a registry call: as JSON text when the call's arguments
/// came as text (`text`), else as a `Value`.
pub fn encode_result<T: Serialize, E: Display>(
    spec: &'static ToolSpec,
    result: Result<T, E>,
    text: bool,
    stored: Option<String>,
) -> Result<CallResult, Error> {
    let codec = |e: serde_json::Error| Error::Codec {
        tool: spec.name.to_owned(),
        key: crate::ambient::current_key(),
        message: format!("the result cannot be encoded as JSON: {e}"),
    };
    match result {
        // A replay's result as the store kept it (the engine decoded it to this value:
        // given by `replay_now`, or left in the task's report), else the value encoded.
        Ok(value) if text => match stored.or_else(crate::engine::take_stored_text) {
            Some(stored) => Ok(CallResult::Text(stored)),
            None => serde_json::to_string(&value)
                .map(CallResult::Text)
                .map_err(codec),
        },
        Ok(value) => serde_json::to_value(&value)
            .map(CallResult::Value)
            .map_err(codec),
        Err(e) => Err(Error::ToolFailed {
            tool: spec.name.to_owned(),
            key: None,
            message: e.to_string(),
        }),
    }
}

/// JSON Schema of a tool's argument struct, without the generated struct's title.
pub fn input_schema<A: schemars::JsonSchema>() -> Value {
    let mut schema = Value::from(schemars::SchemaGenerator::default().into_root_schema_for::<A>());
    if let Value::Object(map) = &mut schema {
        map.remove("title");
    }
    schema
}

/// Autoref specialisation: `(&&OutputSchemaProbe::<T>::new()).output_schema()` is the
/// schema of `T` when `T: JsonSchema`, and `None` otherwise.
pub struct OutputSchemaProbe<T: ?Sized>(PhantomData<T>);

impl<T: ?Sized> OutputSchemaProbe<T> {
    /// A probe for `T`.
    pub const fn new() -> Self {
        Self(PhantomData)
    }
}

impl<T: ?Sized> Default for OutputSchemaProbe<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// Chosen when the result type implements `JsonSchema`.
pub trait OutputSchemaViaJsonSchema {
    /// The schema.
    fn output_schema(&self) -> Option<Value>;
}

impl<T: schemars::JsonSchema + ?Sized> OutputSchemaViaJsonSchema for &OutputSchemaProbe<T> {
    fn output_schema(&self) -> Option<Value> {
        Some(Value::from(
            schemars::SchemaGenerator::default().into_root_schema_for::<T>(),
        ))
    }
}

/// Chosen otherwise.
pub trait OutputSchemaFallback {
    /// No schema.
    fn output_schema(&self) -> Option<Value>;
}

impl<T: ?Sized> OutputSchemaFallback for OutputSchemaProbe<T> {
    fn output_schema(&self) -> Option<Value> {
        None
    }
}

/// Autoref specialisation: `(&&KeepProbe::<T>::new()).keeper()` is a [`Keeper`] when
/// `T: Clone + 'static` (a hot key's replays then clone a kept result rather than decode
/// it again), and `None` otherwise.
pub struct KeepProbe<T>(PhantomData<T>);

impl<T> KeepProbe<T> {
    /// A probe for `T`.
    pub const fn new() -> Self {
        Self(PhantomData)
    }
}

impl<T> Default for KeepProbe<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// Chosen when the result type is `Clone + 'static`.
pub trait KeepViaClone<T> {
    /// The keeper.
    fn keeper(&self) -> Option<Keeper<T>>;
}

impl<T: Clone + 'static> KeepViaClone<T> for &KeepProbe<T> {
    fn keeper(&self) -> Option<Keeper<T>> {
        Some(Keeper::cloning())
    }
}

/// Chosen otherwise: every replay decodes.
pub trait KeepFallback<T> {
    /// No keeper.
    fn keeper(&self) -> Option<Keeper<T>>;
}

impl<T> KeepFallback<T> for KeepProbe<T> {
    fn keeper(&self) -> Option<Keeper<T>> {
        None
    }
}

// Bound checks. The expansion calls each one with `quote_spanned!` at the user's type, so
// a missing trait is reported there, once. Those the engine relies on return the
// operation the bound provides, so the engine's entry points need no bounds of their own
// (which would report the same missing trait again, at the generated call).

/// A mutating tool's result must round-trip through the store.
pub fn assert_output<T: Serialize + DeserializeOwned>() -> Codec<T> {
    Codec::json()
}
/// A read-only tool's result must encode to JSON.
pub fn assert_read_only_output<T: Serialize>() {}
/// Contract errors reach the caller through the tool's error type.
pub fn assert_error<E: From<Error>>() -> fn(Error) -> E {
    E::from
}
/// A registered tool's error is shown to the caller through `Display`.
pub fn assert_error_display<E: Display>() -> fn(&E) -> String {
    E::to_string
}
/// `cache_errors = true` stores the error, so it must round-trip.
pub fn assert_cacheable_error<E: Serialize + DeserializeOwned>() -> Codec<E> {
    Codec::json()
}
