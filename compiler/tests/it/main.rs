//! The compiler's one integration-test binary (matklad's layout).

mod acl;
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
mod router;
mod schema;
mod serve;
mod stream;
mod tls;
mod util;
