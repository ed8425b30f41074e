//! edgestate's integration tests: what needs a real process.

mod edge_tls;
mod lua_vectors;
