//! edgestate's integration tests: what needs a real process.

mod bundle;
mod lua_vectors;
mod redis_client;
