//! edgestate's integration tests: what needs a real process.

mod bundle;
mod edge_tls;
mod lua_vectors;
mod redis_client;
mod shared_documents;
