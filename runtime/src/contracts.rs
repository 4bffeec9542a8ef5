//! Every annotated tool's contract, free function or method, for the one rule that must
//! hold before any call is claimed: no two contracts share a name.
//!
//! Keys are derived from the tool's *name* (docs/key-spec.md), so two tools with one name
//! (`Stripe::refund` and `Paypal::refund`, or `billing::close` and `support::close`) would
//! share stored results. The registry lists free functions only (a method cannot be
//! invoked without its receiver), and a direct call never goes through the registry, so
//! the check cannot live there alone: every expansion submits a [`ContractEntry`], and the
//! engine, the registry and recovery all ask [`check_unique`].

use std::sync::OnceLock;

use crate::error::Error;
use crate::spec::ToolSpec;

/// One annotated tool's contract, submitted by the expansion of every `#[mutating_tool]`
/// and `#[read_only_tool]` (registered or not).
#[doc(hidden)]
pub struct ContractEntry(&'static ToolSpec);

impl ContractEntry {
    /// The entry of `spec`.
    pub const fn new(spec: &'static ToolSpec) -> Self {
        Self(spec)
    }
}

inventory::collect!(ContractEntry);

/// Pairs of contracts that share a name, each pair ordered by source location; built once.
fn duplicates() -> &'static [(&'static ToolSpec, &'static ToolSpec)] {
    static DUPLICATES: OnceLock<Vec<(&'static ToolSpec, &'static ToolSpec)>> = OnceLock::new();
    DUPLICATES
        .get_or_init(|| shared_names(inventory::iter::<ContractEntry>.into_iter().map(|e| e.0)))
}

/// The pairs of `specs` that share a name, sorted by name then source location: the one
/// rule for the whole program (above) and for a registry built by hand
/// ([`Registry::from_tools`](crate::Registry::from_tools)).
pub(crate) fn shared_names(
    specs: impl IntoIterator<Item = &'static ToolSpec>,
) -> Vec<(&'static ToolSpec, &'static ToolSpec)> {
    let mut specs: Vec<&'static ToolSpec> = specs.into_iter().collect();
    specs.sort_by(|a, b| {
        a.name
            .cmp(b.name)
            .then_with(|| a.location.file.cmp(b.location.file))
            .then_with(|| a.location.line.cmp(&b.location.line))
            .then_with(|| a.location.column.cmp(&b.location.column))
    });
    specs
        .windows(2)
        .filter_map(|pair| match pair {
            [a, b] if a.name == b.name => Some((*a, *b)),
            _ => None,
        })
        .collect()
}

/// The error for a name two contracts share.
pub(crate) fn duplicate_error(pair: &(&'static ToolSpec, &'static ToolSpec)) -> Error {
    Error::DuplicateTool {
        name: pair.0.name.to_owned(),
        first: pair.0.location,
        second: pair.1.location,
    }
}

/// `Ok` unless another contract in this program uses `name`: then
/// [`Error::DuplicateTool`] naming both source locations. A lookup in an empty list in the
/// usual case.
pub(crate) fn check_unique(name: &str) -> Result<(), Error> {
    match duplicates().iter().find(|(a, _)| a.name == name) {
        None => Ok(()),
        Some(pair) => Err(duplicate_error(pair)),
    }
}

/// The contract of the tool named `name` in this program, if exactly one has that name.
pub(crate) fn spec_of(name: &str) -> Option<&'static ToolSpec> {
    let mut specs = inventory::iter::<ContractEntry>
        .into_iter()
        .map(|e| e.0)
        .filter(|spec| spec.name == name);
    let spec = specs.next()?;
    specs.next().is_none().then_some(spec)
}

/// The first name shared by two contracts anywhere in the program, if any.
pub(crate) fn first_duplicate() -> Option<Error> {
    duplicates().first().map(duplicate_error)
}
