//! The compiler's one integration-test binary (matklad's layout).

mod cli;
mod example;
mod malformed;
mod schema;
mod util;
