//! edgeform's operations clients, the logic behind the commands that talk
//! to running nodes: `status` and `exec` over MQTT ([`mqtt`]), `status
//! --from redis` and `history` ([`audit`]), `purge` ([`purge`]), the
//! read-only API `serve` ([`serve`]), `route`'s live health and output
//! ([`route`]), `keygen` ([`keygen`]), `top`, the per-site figures the agents
//! publish ([`top`]) and `explain`, the reference edge's
//! decision for a request made offline ([`explain`]; it reads a batch
//! file or stdin and the environment's challenge secret, hence here and
//! not in `compiler`). The `edgeform` binary parses the
//! flags and calls these with plain option structs; nothing here knows
//! the command line parser.

pub mod audit;
pub mod explain;
pub mod keygen;
pub mod mqtt;
pub mod purge;
pub mod route;
pub mod serve;
pub mod top;
