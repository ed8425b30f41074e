//! The compiler's one integration-test binary (matklad's layout).

mod anycast;
mod cli;
mod edge;
mod example;
mod heal;
mod hostile;
mod install;
mod issue12;
mod issue15;
mod issue19;
mod malformed;
mod mqtt;
mod obs;
mod ops;
mod private;
mod purge;
mod push;
mod role_gate;
mod router;
mod rule_regex_edge;
mod schema;
mod stream;
mod targets;
mod tls;
mod util;
