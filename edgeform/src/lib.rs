//! The `edgeform` command line: parses flags and runs one command of the
//! library crates (see ARCHITECTURE.md's code map). `main.rs` only calls
//! [`cli::main`].

pub mod cli;
