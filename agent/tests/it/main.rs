//! The agent's one integration-test binary: the real `edgeform-agent`
//! process against real `redis-server`s and real nginx-format cache files.

mod packaging;
mod purge;
mod route;
mod util;
