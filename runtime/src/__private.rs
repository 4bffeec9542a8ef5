//! Not public API: what the attribute macros' expansions name, re-exported by the facade
//! as `tool_contracts::__private`. May change in any release; the facade pins the macro
//! crate to this exact version.

use core::fmt::Display;
use core::marker::PhantomData;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

pub use crate::engine::{
    execute, execute_caching_errors, execute_with, reconciling, Attempt, CacheErrors, Call,
    CallBuilder, ErrorPolicy, ReleaseErrors,
};
pub use crate::error::Error;
pub use crate::registry::{BoxFuture, Context, InvokeFn, KeyOfFn, ReconcileFn, ToolDescriptor};
pub use crate::spec::{Concurrent, Mismatch, OnUnknown, SourceLocation, ToolKind, ToolSpec};
pub use ::inventory;
pub use ::schemars;
pub use ::serde;
pub use ::serde_json;

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
    serde_path_to_error::deserialize(args).map_err(|e| {
        let path = e.path().to_string();
        Error::InvalidArguments {
            tool: spec.name.to_owned(),
            field: (path != ".").then_some(path),
            message: e.into_inner().to_string(),
        }
    })
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Encodes a tool's result for a registry call.
pub fn encode_result<T: Serialize, E: Display>(
    spec: &'static ToolSpec,
    result: Result<T, E>,
) -> Result<Value, Error> {
    match result {
        Ok(value) => serde_json::to_value(&value).map_err(|e| Error::Codec {
            tool: spec.name.to_owned(),
            key: crate::ambient::current_key().unwrap_or_default(),
            message: format!("the result cannot be encoded as JSON: {e}"),
        }),
        Err(e) => Err(Error::ToolFailed {
            tool: spec.name.to_owned(),
            key: String::new(),
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

/// A mutating tool's result must round-trip through the store.
pub fn assert_output<T: Serialize + DeserializeOwned>() {}
/// A read-only tool's result must encode to JSON.
pub fn assert_read_only_output<T: Serialize>() {}
/// Contract errors reach the caller through the tool's error type.
pub fn assert_error<E: From<Error>>() {}
/// A registered tool's error is shown to the caller through `Display`.
pub fn assert_error_display<E: Display>() {}
/// `cache_errors = true` stores the error, so it must round-trip.
pub fn assert_cacheable_error<E: Serialize + DeserializeOwned>() {}
