//! The compiler's one integration-test binary (matklad's layout).

mod anycast;
mod cli;
mod edge;
mod example;
mod heal;
mod hostile;
mod issue12;
mod issue19;
mod malformed;
mod mqtt;
mod ops;
mod purge;
mod push;
mod router;
mod schema;
mod stream;
mod tls;
mod util;
