//! The two models of a config repository.
//!
//! [`raw`] mirrors the YAML files field for field (it is also the source of
//! the JSON Schemas in `schemas/`); [`resolved`] is what is left after
//! validation: defaults applied, addresses and networks parsed, references
//! checked. `compile` reads only `resolved`.

pub mod raw;
pub mod resolved;
