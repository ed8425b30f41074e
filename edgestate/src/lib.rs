//! What each edge holds in its own Redis.
//!
//! This crate is the API boundary between the compiler (which writes) and
//! the agent and the edge's Lua (which read). It owns:
//!
//! - [`bundle`]: what an edge's installed code reads (`edgeform:bundle`)
//!   and what documents use: the version-skew gate;
//! - [`keys`]: every Redis key name edgeform reads or writes;
//! - [`manifest`]: one manifest bucket's string (format 3), built and parsed;
//! - [`edge`]: the reference edge's per-request decision (`edgeform explain`);
//! - [`site`]: the per-hostname document (`site:<host>`), with exactly the
//!   fields the seed's `cdn_router.lua` reads;
//! - [`tls`]: the certificate document (`tls:<host>`) and its redaction;
//! - [`routing`]: the compiled routing table (`edgeform:routing`);
//! - [`mqtt`]: the MQTT channel's topics, health report, commands, results;
//! - [`cmdkey`]: ed25519 command keys and per-node result keys;
//! - [`untrusted`]: escaping text from outside before it is shown;
//! - [`backoff`]: jittered reconnect backoff (pure; the caller seeds it);
//! - [`target`]: how a node's Redis and the broker are reached, as
//!   configured (checked here, connected to by `edgeredis`/`edgemqtt`).
//! - [`tls`]: the certificate document (`tls:<host>`) and the TLS outcome
//!   of a handshake (`edgeform explain --scheme https`);
//! - [`lua`]: the Lua tables of the edge and the geo router, generated
//!   from the definitions here.
//!
//! **Architecture invariant:** this crate does no I/O and needs no runtime.
//! Every type here serializes deterministically (structs with fixed field
//! order, `BTreeMap`s), because `diff`, the manifest hashes and
//! byte-identical `build` output depend on it.

pub mod backoff;
pub mod bundle;
pub mod cmdkey;
pub mod edge;
pub mod exposition;
pub mod keys;
pub mod lpm;
pub mod lua;
pub mod manifest;
pub mod mqtt;
pub mod purge;
pub mod route;
pub mod routing;
pub mod site;
pub mod sites;
pub mod target;
pub mod time;
pub mod tls;
pub mod untrusted;
#[cfg(test)]
mod vectors;

/// Version of the compiled format, written to `edgeform:meta` as `format`
/// and into the routing table. Bump it when a reader must change.
/// 2: the manifest split into 256 bucket hashes with per-bucket digests,
/// SHA-1 content hashes, and the manifest's digest in the meta.
/// 3: each bucket a string of sorted `key NUL hash` records
/// ([`manifest`]) instead of a hash: a full write costs Redis ~1/60 of
/// the hash fields' work (bench/RESULTS.md, "Manifest layout cost").
pub const FORMAT_VERSION: u32 = 3;

/// Lowercase hex of `bytes`: signatures, key ids, certificate
/// fingerprints and the manifest's content hashes (what Redis's
/// `redis.sha1hex` prints), which a full apply computes for every
/// document.
#[must_use]
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(2 * bytes.len());
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    s
}

/// `500ms`, `5s`, `15m`, `1h` → milliseconds: durations as every edgeform
/// file and flag writes them.
#[must_use]
pub fn parse_duration_ms(text: &str) -> Option<u64> {
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (n, unit) = text.split_at(split);
    let n: u64 = n.parse().ok()?;
    let factor = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return None,
    };
    n.checked_mul(factor)
}
