//! The agent's one integration-test binary: the real `edgeform-agent`
//! process against real `redis-server`s, a real mosquitto and real
//! nginx-format cache files.

mod mqtt;
mod obs;
mod packaging;
mod probe;
mod purge;
mod replay;
mod route;
mod summary;
mod util;
