//! edgestate's integration tests: what needs a real process.

mod lua_vectors;
mod shared_documents;
