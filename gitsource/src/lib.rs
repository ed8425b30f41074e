//! The config repository as a git source the control host can trust:
//! fetching a private remote ([`remote`]: SSH key or ssh-agent with the
//! host key checked against known_hosts, or an HTTPS token) and checking
//! that history is signed by allowed keys ([`signed`]).

pub mod remote;
pub mod signed;
