//! Reaching a node's own Redis master: the compiler's pusher and the agent
//! both connect through here.
//!
//! By URL, or through the node's own Sentinels: the master is resolved
//! anew for every connection, so a run after a failover lands on the new
//! master. The password comes only from the environment variable the node
//! names (`redis.password_env`), never from the repository. An ACL user is
//! named by `username` (or the URL's user part, without a password); the
//! default user otherwise.
//!
//! Connections are dedicated (never shared between tasks, so WATCH state is
//! ours) and have no response timeout: the redis crate's default 500 ms
//! would fail a 100,000-key MULTI/EXEC client-side while the server still
//! applies it. A connect timeout bounds unreachable targets instead.
//!
//! TLS: a `rediss://` URL, or Sentinels with a `tls` block, connect with
//! TLS (native-tls, i.e. OpenSSL). The server certificate is always
//! verified — against `tls.ca_file` when given, else the system trust
//! store; `#insecure` URLs are refused. `cert_file` + `key_file` add a
//! client certificate. Over Sentinel with TLS the master is resolved here
//! (`SENTINEL get-master-addr-by-name` over TLS), because the redis crate
//! passes custom certificates to Sentinels only with rustls.
//!
//! The description of a target ([`RedisTarget`], its validation, the
//! messages) is pure and always built; connecting needs the `client`
//! feature (default), so the config compiler links no Redis client.

mod target;
pub use target::*;

#[cfg(feature = "client")]
mod client;
#[cfg(feature = "client")]
pub use client::*;
