//! What each edge holds in its own Redis.
//!
//! This crate is the API boundary between the compiler (which writes) and
//! the agent and the edge's Lua (which read). It owns:
//!
//! - [`keys`]: every Redis key name edgeform reads or writes;
//! - [`site`]: the per-hostname document (`site:<host>`), with exactly the
//!   fields the seed's `cdn_router.lua` reads;
//! - [`routing`]: the compiled routing table (`edgeform:routing`).
//!
//! **Architecture invariant:** this crate does no I/O and needs no runtime.
//! Every type here serializes deterministically (structs with fixed field
//! order, `BTreeMap`s), because `diff`, the manifest hashes and
//! byte-identical `build` output depend on it.

pub mod keys;
pub mod lpm;
pub mod purge;
pub mod route;
pub mod routing;
pub mod site;

/// Version of the compiled format, written to `edgeform:meta` as `format`
/// and into the routing table. Bump it when a reader must change.
pub const FORMAT_VERSION: u32 = 1;
