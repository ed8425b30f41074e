//! edgeform's operations clients, the logic behind the commands that talk
//! to running nodes: `status` and `exec` over MQTT ([`mqtt`]), `status
//! --from redis` and `history` ([`audit`]), `purge` ([`purge`]), the
//! read-only API `serve` ([`serve`]), `route`'s live health and output
//! ([`route`]) and `keygen` ([`keygen`]). The `edgeform` binary parses the
//! flags and calls these with plain option structs; nothing here knows
//! the command line parser.

pub mod audit;
pub mod keygen;
pub mod mqtt;
pub mod purge;
pub mod route;
pub mod serve;
